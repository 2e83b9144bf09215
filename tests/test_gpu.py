"""The CUDA backend end to end: on a real GPU when there is one, else on the CPU stand-in.

What a GPU adds to tests/test_gpu_backend.py: the device arena, NVRTC, cuBLAS inside a
capture, stream fork/join, and CUDA-graph replay; benchmarks/gpu_device_check.py runs this
file on the device machine. Without a GPU the same tests run with CuPy replaced by the
stand-in of tests/cuda_emulator.py (kernels compiled by g++, CUDA's capture rules kept), so
the task -> device("cuda") -> GpuExecutor path and these tests' own logic are checked in CI.
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest

import renaissance_nb.gpu.device as device_module
import renaissance_nb.gpu.executor as executor_module
from renaissance_nb import (Adam, AdamW, CosineAnnealingLR, CrossEntropyLoss, DeepLearningTask, NumericalError,
                            dropout, fc, relu, seq)
from renaissance_nb.gpu import DeviceInfo, probe

import cuda_emulator  # noqa: E402  (tests/ is on sys.path)

INFO, REASON = probe()


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    if shutil.which("g++") is None:
        pytest.skip(f"no GPU ({REASON}) and no g++ to build the CPU stand-in")
    return cuda_emulator.EmulatedModule(tmp_path_factory.mktemp("emu"))


@pytest.fixture(autouse=True, params=["cuda" if INFO is not None else "stand-in"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The real GPU, or (without one) device("cuda") served by the CPU stand-in for CuPy."""
    if request.param == "stand-in":
        module = request.getfixturevalue("stand_in")
        info = DeviceInfo("CPU stand-in", "90", 1.0, "-", 0, 0)
        monkeypatch.setattr(device_module, "probe", lambda: (info, ""))
        monkeypatch.setattr(executor_module, "cupy_runtime", lambda: cuda_emulator.emulated_runtime(module))
    return request.param


RNG = np.random.default_rng(0)
X, Y = RNG.normal(size=(1000, 64)).astype(np.float32), RNG.integers(0, 10, 1000)
XV, YV = RNG.normal(size=(200, 64)).astype(np.float32), RNG.integers(0, 10, 200)


def task(device: str, epochs: int = 2, drop: float = 0.0, batch: int = 100, data: str = "auto",
         capture: str = "entry") -> DeepLearningTask:
    layers = [fc(256, bias=True), relu()] + ([dropout(drop)] if drop else []) + [fc(128, bias=True), relu(),
                                                                                 fc(10, bias=True)]
    return (DeepLearningTask().model(seq(*layers)).data(train=(X, Y), val=(XV, YV), batch_size=batch)
            .loss(CrossEntropyLoss().label_smoothing(0.1)).optimizer(AdamW().weight_decay(1e-2))
            .scheduler(CosineAnnealingLR().base_lr(1e-3).warmup(1)).total_epochs(epochs).seed(11)
            .device(device, data=data, capture=capture))


def test_auto_picks_the_gpu_and_captures_every_entry() -> None:
    t = task("auto").compile()
    assert t.device_kind == "cuda"
    rx = t.runner.replay
    captured = [g for g in rx.graphs if g is not None]
    assert captured and len(rx.graphs) == len(t.compiled.atlas.captures)
    dot = rx.debug_dot(rx.graphs.index(captured[0]))
    assert "digraph" in dot


def test_gpu_losses_match_the_cpu_from_the_same_weights() -> None:
    """20 steps (2 epochs of 10) from the same initial weights (same seed, same Philox init)."""
    cpu, gpu = task("cpu"), task("cuda")
    rc, rg = cpu.run(progress=False), gpu.run(progress=False)
    assert len(rc.step_losses) == len(rg.step_losses) == 20
    rel = np.abs(rc.step_losses - rg.step_losses) / np.abs(rc.step_losses)
    assert rel.max() < 1e-4, rel
    sc, sg = cpu.state_dict(), gpu.state_dict()
    for k in sc:
        assert np.allclose(sc[k], sg[k], rtol=1e-3, atol=1e-5), k
    assert [r.val_top1 for r in rc.history] == pytest.approx([r.val_top1 for r in rg.history], abs=0.011)


@pytest.mark.parametrize("capture", ["entry", "step"])
def test_clip_grad_norm_on_the_gpu_matches_the_cpu(capture: str) -> None:
    """Every step clipped (max_norm 0.05): the 264-block norm, the scaling, and their place in a
    captured step; the last step's [norm, factor] and the losses as on the CPU."""
    cpu, gpu = task("cpu").clip_grad_norm(0.05), task("cuda", capture=capture).clip_grad_norm(0.05)
    rc, rg = cpu.run(progress=False), gpu.run(progress=False)
    rel = np.abs(rc.step_losses - rg.step_losses) / np.abs(rc.step_losses)
    assert rel.max() < 1e-4, rel
    nc, ng = (t.executor.view("train_base", "clip.norm") for t in (cpu, gpu))
    assert nc[1] < 1 and np.allclose(nc, ng, rtol=1e-4)
    sc, sg = cpu.state_dict(), gpu.state_dict()
    for k in sc:
        assert np.allclose(sc[k], sg[k], rtol=1e-3, atol=1e-5), k


def test_padded_weight_rows_train_as_on_the_cpu() -> None:
    """fc2.weight (10, 1024) has rows of 4 KiB: the plan pads them to 1040 floats, so cuBLAS gets
    a leading dimension longer than the rows for W (forward, dx) and for dW (a padded result)."""
    def wide(device: str) -> DeepLearningTask:
        return (DeepLearningTask().model(seq(fc(1024, bias=True), relu(), fc(10, bias=True)))
                .data(train=(X, Y), val=(XV, YV), batch_size=100).optimizer(AdamW().weight_decay(1e-2))
                .total_epochs(2).seed(5).device(device))
    cpu, gpu = wide("cpu"), wide("cuda")
    rc, rg = cpu.run(progress=False), gpu.run(progress=False)
    assert gpu.memory["fc2.weight"].pitch == 1040 and gpu.memory["fc2.weight@grad"].pitch == 1040
    rel = np.abs(rc.step_losses - rg.step_losses) / np.abs(rc.step_losses)
    assert rel.max() < 1e-4, rel
    sc, sg = cpu.state_dict(), gpu.state_dict()
    for k in sc:
        assert np.allclose(sc[k], sg[k], rtol=1e-3, atol=1e-5), k


def test_dropout_masks_are_the_cpu_ones() -> None:
    cpu, gpu = task("cpu", drop=0.3, batch=128), task("cuda", drop=0.3, batch=128)
    cpu.run(progress=False)
    gpu.run(progress=False)
    name = next(k for k in cpu.compiled.ids if k.endswith(".mask"))
    assert np.array_equal(cpu.executor.view("train_last", name), gpu.executor.view("train_last", name))


def test_two_gpu_runs_are_byte_identical() -> None:
    a, b = task("cuda", drop=0.2), task("cuda", drop=0.2)
    a.run(progress=False)
    b.run(progress=False)
    sa, sb = a.state_dict(), b.state_dict()
    assert all(sa[k].tobytes() == sb[k].tobytes() for k in sa)


def test_pinned_staging_gives_the_same_bytes_as_device_data() -> None:
    a, b = task("cuda", drop=0.2, data="device"), task("cuda", drop=0.2, data="pinned")
    a.run(progress=False)
    b.run(progress=False)
    assert (a.runner.replay.data, b.runner.replay.data) == ("device", "pinned")
    sa, sb = a.state_dict(), b.state_dict()
    assert all(sa[k].tobytes() == sb[k].tobytes() for k in sa)


@pytest.mark.parametrize("data", ["device", "pinned"])
def test_one_graph_per_step_gives_the_same_bytes(data: str) -> None:
    a, b = task("cuda", drop=0.2, data=data), task("cuda", drop=0.2, data=data, capture="step")
    a.run(progress=False)
    b.run(progress=False)
    assert b.runner.replay.program_graphs and b.runner.replay.capture == "step"
    sa, sb = a.state_dict(), b.state_dict()
    assert all(sa[k].tobytes() == sb[k].tobytes() for k in sa)


def test_gpu_checkpoint_resume_is_exact(tmp_path) -> None:  # type: ignore[no-untyped-def]
    whole = task("cuda", epochs=2)
    whole.run(progress=False)
    half = task("cuda", epochs=2)
    half.run(epochs=1, progress=False)
    half.save(str(tmp_path / "c.npz"))
    again = task("cuda", epochs=2).compile().load_state(str(tmp_path / "c.npz"))
    again.run(progress=False)
    sa, sb = whole.state_dict(), again.state_dict()
    assert all(sa[k].tobytes() == sb[k].tobytes() for k in sa)


@pytest.mark.parametrize("data,capture,opt", [("device", "entry", Adam().betas(0.0, 0.99)),
                                              ("pinned", "step", AdamW().betas(0.3, 0.9)),
                                              ("device", "step", Adam().betas(0.5, 0.999).weight_decay(1e-2))])
def test_class_weights_and_small_beta1_on_the_gpu_match_the_cpu(data: str, capture: str, opt) -> None:  # type: ignore[no-untyped-def]
    """CrossEntropyLoss(weight=...) read from the arena, and Adam's other lerp formula (beta1 <= 0.5)."""
    weighted = CrossEntropyLoss().label_smoothing(0.1).weight([1.0, 0.5, 2.0, 0.0, 1.0, 3.0, 1.0, 1.0, 0.25, 1.0])
    cpu = task("cpu").loss(weighted).optimizer(opt)
    gpu = task("cuda", data=data, capture=capture).loss(weighted).optimizer(opt)
    rc, rg = cpu.run(progress=False), gpu.run(progress=False)
    assert type(gpu.runner.replay).__name__ == "GpuExecutor"
    assert np.abs(rc.step_losses - rg.step_losses).max() / np.abs(rc.step_losses).max() < 1e-4
    assert rg.history[-1].val_loss == pytest.approx(rc.history[-1].val_loss, rel=1e-4)
    assert gpu.evaluate(X, Y)["loss"] == pytest.approx(cpu.evaluate(X, Y)["loss"], rel=1e-4)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_gpu_nan_raise_keeps_the_weights_of_before() -> None:
    t = task("cuda")
    x = t.splits.train.x
    keep = x[5, 0].copy()
    x[5, 0] = np.inf  # x may be the module's X itself: put the value back for the tests after this one
    try:
        with pytest.raises(NumericalError, match="found on the GPU"):
            t.run(progress=False)
    finally:
        x[5, 0] = keep
    assert all(np.isfinite(v).all() for v in t.state_dict().values())


def conv_task(device: str) -> DeepLearningTask:
    from renaissance_nb.blueprint import cbr, gap, maxpool
    rng = np.random.default_rng(1)
    xi, yi = rng.normal(size=(256, 1, 12, 12)).astype(np.float32), rng.integers(0, 10, 256)
    return (DeepLearningTask().model(seq(cbr(16, 3, 1, 1), maxpool(2), cbr(32, 3, 1, 1), gap(), fc(10, bias=True)))
            .data(train=(xi, yi), val=(xi[:64], yi[:64]), batch_size=64).augment(crop_pad=1, flip=True)
            .optimizer(AdamW().lr(1e-3)).total_epochs(2).seed(4).ema(0.9).device(device))


def test_conv_net_matches_the_cpu_and_reruns_byte_for_byte() -> None:
    cpu, gpu, again = conv_task("cpu"), conv_task("cuda"), conv_task("cuda")
    rc, rg = cpu.run(progress=False), gpu.run(progress=False)
    again.run(progress=False)
    assert gpu.device_kind == "cuda" and len(rg.step_losses) == 8
    assert (np.abs(rc.step_losses - rg.step_losses) / np.abs(rc.step_losses)).max() < 1e-4
    sc, sg, sa = cpu.state_dict(), gpu.state_dict(), again.state_dict()
    for k in sc:
        assert np.allclose(sc[k], sg[k], rtol=1e-3, atol=1e-5), k
        assert sg[k].tobytes() == sa[k].tobytes(), k



# ---- #29: every entry on its GraphId's stream, ordered by the plan's byte conflicts (gpu/deps.py) ------
@pytest.mark.parametrize("capture", ["entry", "step"])
def test_overlapping_streams_give_the_cpu_weights_and_the_same_bytes_three_times(capture: str) -> None:
    """The transfer, the metrics and the EMA run beside the rest (on a GPU for real: a missing edge would
    show as a changed byte between runs); on the stand-in its race detector checks every access."""
    cpu = task("cpu", drop=0.2)
    rc = cpu.run(progress=False)
    runs = [task("cuda", drop=0.2, capture=capture) for _ in range(3)]
    results = [r.run(progress=False) for r in runs]
    rx = runs[0].runner.replay
    used = {k.gid.stream.name for k, g in zip(rx.atlas.captures, rx.graphs) if g is not None}
    assert used == {"TRANS", "COMP_1", "COMP_2", "UPDATE"}
    assert len(rx.gemm.by_stream) == 4  # a cuBLAS workspace per stream that may multiply
    if capture == "entry":
        assert rx.order.waits > 0
    assert {e[2] for e in rx.stream_graph().edges} == {"within", "across"}
    rel = np.abs(rc.step_losses - results[0].step_losses) / np.abs(rc.step_losses)
    assert rel.max() < 1e-4, rel
    sc, states = cpu.state_dict(), [r.state_dict() for r in runs]
    for k in sc:
        assert np.allclose(sc[k], states[0][k], rtol=1e-3, atol=1e-5), k
        assert all(s[k].tobytes() == states[0][k].tobytes() for s in states[1:]), k


def test_a_conv_net_on_overlapping_streams_in_one_graph_per_step_reruns_byte_for_byte() -> None:
    cpu = conv_task("cpu")
    rc = cpu.run(progress=False)
    runs = [conv_task("cuda").device("cuda", capture="step") for _ in range(3)]
    for r in runs:
        r.run(progress=False)
    assert runs[0].runner.replay.program_graphs
    assert (np.abs(rc.step_losses - runs[0].result.step_losses) / np.abs(rc.step_losses)).max() < 1e-4
    sc, states = cpu.state_dict(), [r.state_dict() for r in runs]
    for k in sc:
        assert np.allclose(sc[k], states[0][k], rtol=1e-3, atol=1e-5), k
        assert all(s[k].tobytes() == states[0][k].tobytes() for s in states[1:]), k

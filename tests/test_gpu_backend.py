"""The GPU backend, checked without a GPU.

Three layers: device selection (clear errors, state kept); the CUDA source, compiled for the
GPU by nvcc when it is installed and compiled for the CPU by g++ (tests/cuda_emulator.py);
and the real GpuExecutor driven by ``task.run()``, with a CPU stand-in for CuPy that keeps
CUDA's capture rules (work on a capturing stream is recorded, forks must be joined, no syncs
or host copies inside a capture), compared with the CPU backend. Speed and true concurrency
need a GPU: tests/test_gpu.py runs there.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from renaissance_nb import (SGD, AdamW, CosineAnnealingLR, CrossEntropyLoss, DeepLearningTask, DeviceError,
                            NumericalError, Phase, PhaseError, conv, dropout, fc, flatten, gelu, leaky_relu, relu,
                            seq, silu, tanh)
from renaissance_nb.gpu import probe, resolve_device
from renaissance_nb.gpu.executor import GpuExecutor
from renaissance_nb.gpu.kernels import GPU_KERNELS, kernel_source
from renaissance_nb.kernels import fused

import cuda_emulator  # noqa: E402  (tests/ is on sys.path, as for helpers.py)
no_gpu = pytest.mark.skipif(probe()[0] is not None, reason="a GPU is present: tests/test_gpu.py covers it")

RNG = np.random.default_rng(0)
X, Y = RNG.normal(size=(300, 20)).astype(np.float32), RNG.integers(0, 5, 300)
XV, YV = RNG.normal(size=(70, 20)).astype(np.float32), RNG.integers(0, 5, 70)


@pytest.fixture(scope="module")
def module(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    if shutil.which("g++") is None:
        pytest.skip("g++ is needed to build the CPU harness")
    return cuda_emulator.EmulatedModule(tmp_path_factory.mktemp("emu"))


def mlp_task(net=None, optimizer=None, epochs: int = 3, **opts) -> DeepLearningTask:  # type: ignore[no-untyped-def]
    net = net or seq(fc(32, bias=True), relu(), dropout(0.2), fc(16, bias=True), tanh(), fc(5, bias=True))
    t = (DeepLearningTask().model(net).data(train=(X, Y), val=(XV, YV), batch_size=64)
         .loss(CrossEntropyLoss().label_smoothing(0.1)).optimizer(optimizer or AdamW().weight_decay(1e-2))
         .scheduler(CosineAnnealingLR().base_lr(1e-2).warmup(1)).total_epochs(epochs).seed(7).ema(0.9))
    if opts:
        t.options(**opts)
    return t


def emulated(task: DeepLearningTask, module, data: str = "device", capture: str = "entry"  # type: ignore[no-untyped-def]
             ) -> DeepLearningTask:
    """The task on the real GpuExecutor, with the CPU stand-in for CuPy (capture rules included)."""
    task.compile()
    task.runner.replay = GpuExecutor(task.compiled, task.executor, task.runner.env, task.config.nan_policy, data,
                               runtime=cuda_emulator.emulated_runtime(module), capture=capture)
    return task


# ---- device selection ---------------------------------------------------------------------------
@no_gpu
def test_cuda_without_a_gpu_is_a_clear_error_and_keeps_the_task() -> None:
    t = mlp_task().device("cuda")
    t.lock_memory()
    with pytest.raises(DeviceError, match=r"device\('cuda'\).*Fix: .*device\('cpu'\)"):
        t.compile()
    assert t.phase is Phase.MEMORY_LOCKED and t.compiled is None
    assert probe()[1], "the probe gives a reason"


@no_gpu
def test_auto_falls_back_to_the_cpu() -> None:
    t = mlp_task(epochs=2).device("auto")
    t.run(progress=False)
    assert t.device_kind == "cpu" and resolve_device("auto") == "cpu"


def test_device_rejects_unknown_names_and_late_changes() -> None:
    with pytest.raises(DeviceError, match=r"device=.*'tpu'.*expected one of"):
        DeepLearningTask().device("tpu")
    with pytest.raises(DeviceError, match=r"data='disk'.*expected one of.*pinned"):
        DeepLearningTask().device("cuda", data="disk")
    t = mlp_task()
    t.plan()
    with pytest.raises(PhaseError):
        t.device("cpu")
    assert t.settings["device"] == "cpu"


def test_models_with_ops_the_gpu_lacks_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from renaissance_nb.blueprint import avgpool
    from renaissance_nb.gpu import kernels as gpu_kernels
    from renaissance_nb.gpu.executor import check_supported
    from renaissance_nb.runtime.bind import KERNELS  # the shared CPU table and every op's own kernels
    # every op the CPU backend runs has a GPU kernel but the MPI all-reduce (data-parallel training on GPUs,
    # NCCL, is not built, and plan() refuses distributed("mpi") with device("cuda")) and the language model's
    # (no CUDA twins yet: a GPT on device("cuda") is refused by name, below)
    lm = {"embedding_fwd", "embedding_bwd", "pos_embedding_fwd", "pos_embedding_bwd", "pos_embedding_decode",
          "layernorm_fwd", "layernorm_bwd", "attn_scores", "attn_scores_bwd", "attn_mix", "attn_mix_bwd",
          "flash_attn_fwd", "flash_attn_bwd", "attn_decode"}
    assert set(KERNELS) - set(GPU_KERNELS) == {"allreduce_mean", "allreduce_start", "allreduce_wait"} | lm
    assert set(GPU_KERNELS) <= set(KERNELS)
    imgs = RNG.normal(size=(32, 1, 8, 8)).astype(np.float32)
    t = (DeepLearningTask().model(seq(conv(4, 3, 1, 1), relu(), avgpool(2), flatten(), fc(3)))
         .data(train=(imgs, RNG.integers(0, 3, 32)), batch_size=16).total_epochs(1))
    t.compile()
    check_supported(t.compiled)
    table = {k: v for k, v in GPU_KERNELS.items() if not k.startswith("avgpool")}
    monkeypatch.setattr(gpu_kernels, "GPU_KERNELS", table)  # as if an op had no GPU kernel
    with pytest.raises(DeviceError, match=r"no GPU kernel yet: \['avgpool_bwd', 'avgpool_fwd'\].*device\('auto'\)"):
        check_supported(t.compiled)


def test_every_kernel_the_table_launches_exists_in_the_source() -> None:
    src = kernel_source()
    defined = set(re.findall(r'extern "C" __global__ void (\w+)\(', src))
    table = Path(__file__).resolve().parents[1] / "renaissance_nb" / "gpu" / "kernels.py"
    used = set(re.findall(r'"(rnb_\w+)"', table.read_text()))
    assert used and used <= defined, sorted(used - defined)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (CUDA toolkit) is not installed")
def test_cuda_source_compiles_for_hopper(tmp_path: Path) -> None:
    (tmp_path / "k.cu").write_text(kernel_source())
    r = subprocess.run(["nvcc", "-arch=sm_90", "--ptx", "-fmad=false", "-std=c++17", "-o", str(tmp_path / "k.ptx"),
                        str(tmp_path / "k.cu")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    entries = set(re.findall(r"\.entry (\w+)\(", (tmp_path / "k.ptx").read_text()))
    assert entries == set(re.findall(r'extern "C" __global__ void (\w+)\(', kernel_source()))


# ---- kernels against the CPU's, bit for bit where the formulas are the same -----------------------
def _run(module, name: str, n: int, *args):  # type: ignore[no-untyped-def]
    module.get_function(name)((max(1, -(-n // 7)),), (7,), args)  # odd sizes: exercise the grid-stride loops


@pytest.mark.parametrize("kind,beta1", [("adamw", 0.9), ("adam", 0.9), ("adam_wd_max", 0.9), ("adamw", 0.3),
                                        ("adam", 0.0)])  # beta1 <= 0.5: torch's other lerp formula
def test_adam_kernel_is_the_cpu_update_bit_for_bit(module, kind: str, beta1: float) -> None:  # type: ignore[no-untyped-def]
    n = 1001
    w, g, m, v = (RNG.normal(size=n).astype(np.float32) for _ in range(4))
    v = np.abs(v)
    lr = np.array([1e-3, 5e-3, 2e-3], np.float32)
    wd, decoupled, maximize = (0.01, 1, 0) if kind == "adamw" else ((0.0, 0, 0) if kind == "adam" else (0.05, 0, 1))
    cpu = [a.copy() for a in (w, g, m, v)]
    gpu = [a.copy() for a in (w, g, m, v)]
    step_c, step_g, flag = np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(1, np.int64)
    for _ in range(5):  # past the end of the lr table too
        fused.adam_update(*cpu, lr, step_c, beta1, 0.999, 1e-8, wd, bool(decoupled), bool(maximize))
        _run(module, "rnb_adam", n, gpu[0], gpu[1], gpu[2], gpu[3], np.int64(n), lr, np.int64(3), step_g, flag,
             np.float64(beta1), np.float64(0.999), np.float64(1e-8), np.float64(wd), np.int32(decoupled),
             np.int32(maximize))
        module.get_function("rnb_optimizer_done")((1,), (1,), (step_g, flag))
    assert step_g[0] == step_c[0] == 5
    for a, b in zip(cpu, gpu):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("nesterov,wd", [(False, 0.0), (True, 1e-3)])
def test_sgd_kernel_is_the_cpu_update_bit_for_bit(module, nesterov: bool, wd: float) -> None:  # type: ignore[no-untyped-def]
    n = 517
    w, g, m = (RNG.normal(size=n).astype(np.float32) for _ in range(3))
    cpu, gpu = [w.copy(), g, m.copy()], [w.copy(), g, m.copy()]
    lr = np.array([0.1, 0.05], np.float32)
    sc, sg, flag = np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(1, np.int64)
    for _ in range(3):
        fused.sgd_update(cpu[0], cpu[1], cpu[2], lr, sc, 0.9, 0.1, wd, nesterov, False)
        _run(module, "rnb_sgd", n, gpu[0], gpu[1], gpu[2], np.int64(n), lr, np.int64(2), sg, flag, np.float32(0.9),
             np.float32(0.9), np.float32(wd), np.int32(wd != 0), np.int32(1), np.int32(nesterov), np.int32(0))
        module.get_function("rnb_optimizer_done")((1,), (1,), (sg, flag))
    assert np.array_equal(cpu[0], gpu[0]) and np.array_equal(cpu[2], gpu[2])


@pytest.mark.parametrize("max_norm", [0.5, 1e6])  # clipped, and a norm below max_norm: left alone
def test_clip_grad_norm_kernels_match_the_cpu(module, max_norm: float) -> None:  # type: ignore[no-untyped-def]
    from renaissance_nb.compiler.layers import CLIP_BLOCKS
    from renaissance_nb.kernels.cpu import KERNELS, BindEnv
    n = 1003
    g = (RNG.normal(size=n) * 10.0 ** RNG.uniform(-6, 0, n)).astype(np.float32)
    cpu, gpu = g.copy(), g.copy()
    clip_c, clip_g, flag = np.zeros(2, np.float32), np.zeros(2, np.float32), np.zeros(1, np.int64)
    env = BindEnv(range_view=lambda first, last, dtype: cpu)
    KERNELS["clip_grad_norm"]([clip_c, np.zeros(CLIP_BLOCKS)], [flag], {"max_norm": max_norm, "first": "G_A", "last": "G_B"}, env)()
    partial = np.full(CLIP_BLOCKS, np.nan)  # every block writes its own

    def norm(bound: float) -> None:
        module.get_function("rnb_grad_sq_partials")((CLIP_BLOCKS,), (256,), (gpu, np.int64(n), flag, partial))
        module.get_function("rnb_grad_norm")((1,), (1,), (partial, np.int32(CLIP_BLOCKS), flag, np.float32(bound),
                                                          clip_g))
    norm(max_norm)
    assert np.isfinite(partial).all() and partial.sum() == pytest.approx(np.sum(g.astype(np.float64) ** 2), rel=1e-14)
    _run(module, "rnb_grad_scale", n, gpu, np.int64(n), flag, clip_g)
    # the float64 sums differ in order only: the float32 norms agree to an ulp; each side scales by its own factor
    assert abs(clip_c[0] - clip_g[0]) <= np.spacing(clip_c[0])
    assert np.array_equal(gpu, g * clip_g[1]) and np.array_equal(cpu, g * clip_c[1])
    assert (clip_c[1] < 1) == (max_norm < 1)
    flag[0] = 1  # a step the NaN check skips is not clipped
    before, clip_before = gpu.copy(), clip_g.copy()
    norm(1e-3)
    _run(module, "rnb_grad_scale", n, gpu, np.int64(n), flag, clip_g)
    assert np.array_equal(clip_g, clip_before)
    assert np.array_equal(gpu, before)


def test_ema_kernel_matches_the_cpu_warmup_and_decay(module) -> None:  # type: ignore[no-untyped-def]
    n = 300
    e, w = RNG.normal(size=n).astype(np.float32), RNG.normal(size=n).astype(np.float32)
    for t in (0, 3, 500):
        ec, eg = e.copy(), e.copy()
        d = min(0.99, (1.0 + t) / (10.0 + t))
        fused.ema_(ec, w, d)
        _run(module, "rnb_ema", n, eg, w, np.int64(n), np.array([t], np.int64), np.zeros(1, np.int64), np.float64(0.99))
        assert np.array_equal(ec, eg)


@pytest.mark.parametrize("act", ["none", "relu", "leaky_relu", "tanh", "sigmoid"])
def test_fused_bias_activation_and_its_gradient(module, act: str) -> None:  # type: ignore[no-untyped-def]
    code = fused.ACT_CODES[act]
    y0, b = RNG.normal(size=(9, 13)).astype(np.float32), RNG.normal(size=13).astype(np.float32)
    yc, yg = y0.copy(), y0.copy()
    fused.bias_act_(yc, b, code, 0.1)
    _run(module, "rnb_bias_act", yg.size, yg, b, np.int32(9), np.int32(13), np.int32(1), np.int32(code),
         np.float64(0.1))
    exact = act in ("none", "relu", "leaky_relu")
    assert np.array_equal(yc, yg) if exact else np.allclose(yc, yg, rtol=2e-7, atol=1e-7)
    d0 = RNG.normal(size=(9, 13)).astype(np.float32)
    dc, dg = d0.copy(), d0.copy()
    fused.act_grad_from_output_(dc, yc, code, 0.1)
    _run(module, "rnb_act_grad", dg.size, dg, yc, np.int64(dg.size), np.int32(code), np.float64(0.1))
    assert np.array_equal(dc, dg)


@pytest.mark.parametrize("act", ["relu", "tanh", "sigmoid", "leaky_relu", "silu", "gelu"])
def test_standalone_activation_kernels(module, act: str) -> None:  # type: ignore[no-untyped-def]
    code = fused.ACT_CODES[act]
    x, dy = RNG.normal(size=257).astype(np.float32) * 3, RNG.normal(size=257).astype(np.float32)
    yc, yg, dxc, dxg = (np.zeros(257, np.float32) for _ in range(4))
    fused.act_forward(x, yc, code, 0.1)
    fused.act_backward(dy, x, dxc, code, 0.1)
    _run(module, "rnb_act_fwd", 257, x, yg, np.int64(257), np.int32(code), np.float64(0.1))
    _run(module, "rnb_act_bwd", 257, dy, x, dxg, np.int64(257), np.int32(code), np.float64(0.1))
    assert np.allclose(yc, yg, rtol=2e-7, atol=1e-7) and np.allclose(dxc, dxg, rtol=2e-7, atol=1e-7)


def test_softmax_xent_kernel_matches_the_cpu_loss(module) -> None:  # type: ignore[no-untyped-def]
    logits = RNG.normal(size=(37, 11)).astype(np.float32) * 4
    logits[3, :] = logits[3, 0]  # ties: the lower index wins, as on the CPU
    logits[5, :] = np.nan  # NaN comes before every number, as on the CPU (fused.ranks_ahead)
    logits[6, 2] = logits[7, 9] = np.nan
    labels = RNG.integers(0, 11, 37).astype(np.int32)
    labels[6] = 2
    rc, rg = np.zeros(3, np.float32), np.zeros(3, np.float32)
    dc, dg = np.zeros_like(logits), np.zeros_like(logits)
    fused.softmax_xent(logits, labels, 0.1, np.zeros(0, np.float32), rc, dc, True)
    module.get_function("rnb_softmax_xent")((1,), (256,), (logits, labels, logits, np.int32(0), np.int32(37), np.int32(11),
                                                          np.float64(0.1), rg, dg, np.int32(1)))
    assert np.allclose(rc[1:], rg[1:], rtol=1e-7) and rc[1] == rg[1] and rc[2] == rg[2]
    assert np.isnan(rc[0]) and np.isnan(rg[0])  # NaN rows make the loss NaN on both
    assert rc[1] == (logits.argmax(axis=1) == labels).sum()
    ok = ~np.isnan(logits).any(axis=1)
    assert np.allclose(dc[ok], dg[ok], rtol=1e-6, atol=1e-9)


def test_class_weighted_loss_kernel_matches_the_cpu(module, blocks) -> None:  # type: ignore[no-untyped-def]
    """CrossEntropyLoss(weight=...) on the device: the CPU's loss and gradient, in any thread order."""
    logits = RNG.normal(size=(300, 11)).astype(np.float32) * 3  # more rows than threads
    labels = RNG.integers(0, 11, 300).astype(np.int32)
    weight = RNG.uniform(0, 2, 11).astype(np.float32)
    weight[3] = 0
    rc, dc = np.zeros(3, np.float32), np.zeros_like(logits)
    fused.softmax_xent(logits, labels, 0.1, weight, rc, dc, True)
    rg, dg = np.zeros(3, np.float32), np.zeros_like(logits)
    module.get_function("rnb_softmax_xent")((1,), (256,), (logits, labels, weight, np.int32(1), np.int32(300),
                                                          np.int32(11), np.float64(0.1), rg, dg, np.int32(1)))
    assert rg[0] == pytest.approx(rc[0], rel=1e-6) and (rg[1:] == rc[1:]).all()
    np.testing.assert_allclose(dg, dc, rtol=1e-6, atol=1e-9)
    plain = np.zeros(3, np.float32)
    fused.softmax_xent(logits, labels, 0.1, np.zeros(0, np.float32), plain, np.zeros_like(logits), False)
    assert plain[0] != pytest.approx(rc[0], rel=1e-3)  # the weights mattered
    from renaissance_nb.gpu.kernels import THREADS
    runs = []
    for order in ("forward", "reverse", "random"):
        r, d = np.zeros(3, np.float32), np.zeros_like(logits)
        blocks.call("rnb_softmax_xent", 1, THREADS, logits, labels, weight, np.int32(1), np.int32(300), np.int32(11),
                    np.float64(0.1), r, d, np.int32(1), order=order)
        assert blocks.divergent == 0
        runs.append((r, d))
    assert all(np.array_equal(runs[0][0], r) and np.array_equal(runs[0][1], d) for r, d in runs[1:])
    assert runs[0][0][0] == pytest.approx(rc[0], rel=1e-6)
    none = np.zeros(11, np.float32)  # a batch whose targets all weigh 0: loss 0, no gradient (torch: 0/0)
    none[(labels[0] + 1) % 11] = 1.0
    one = np.full(4, labels[0], np.int32)
    for run in ("cpu", "gpu"):
        r, d = np.zeros(3, np.float32), np.zeros((4, 11), np.float32)
        if run == "cpu":
            fused.softmax_xent(logits[:4], one, 0.1, none, r, d, True)
        else:
            module.get_function("rnb_softmax_xent")((1,), (256,), (logits[:4].copy(), one, none, np.int32(1), np.int32(4),
                                                                  np.int32(11), np.float64(0.1), r, d, np.int32(1)))
        assert r[0] == 0 and not d.any() and r[1] == (logits[:4].argmax(1) == one).sum(), run


def test_dropout_kernel_draws_the_cpu_philox_masks(module) -> None:  # type: ignore[no-untyped-def]
    from renaissance_nb.train.rng import StreamId, dropout_mask_into
    n, seed, offset = 1003, 2**40 + 17, 2**33 + 5  # both 32-bit halves of seed and offset in use
    x = RNG.normal(size=n).astype(np.float32)
    mc, mg, yg = np.zeros(n, np.float32), np.zeros(n, np.float32), np.zeros(n, np.float32)
    dropout_mask_into(mc, seed, int(StreamId.DROPOUT), offset, 0.7)
    off = np.array([offset], np.int64)
    _run(module, "rnb_dropout", (n + 3) // 4, x, yg, mg, np.int64(n), off, np.uint64(seed),
         np.uint32(int(StreamId.DROPOUT)), np.float32(0.7), np.float32(1 / 0.7))
    assert np.array_equal(mc, mg) and np.array_equal(yg, x * mc)
    assert 0.6 < (mg > 0).mean() < 0.8


def assert_same_run(cpu, rc, gpu, rg, rtol_loss: float, rtol_w: float, atol_w: float) -> None:  # type: ignore[no-untyped-def]
    """The emulated GPU run followed the CPU run: per-step losses, final weights, val and EMA top-1."""
    assert len(rc.step_losses) == len(rg.step_losses)
    assert np.allclose(rc.step_losses, rg.step_losses, rtol=rtol_loss)
    sc, sg = cpu.state_dict(), gpu.state_dict()
    for k in sc:
        assert np.allclose(sc[k], sg[k], rtol=rtol_w, atol=atol_w), k
    for a, b in zip(rc.history, rg.history):
        assert a.val_top1 == b.val_top1 and a.ema_top1 == b.ema_top1


# ---- the GPU kernel table driven by task.run() ----------------------------------------------------------
@pytest.mark.parametrize("data,capture", [("device", "entry"), ("pinned", "entry"), ("device", "step"),
                                          ("pinned", "step")])
def test_emulated_gpu_training_matches_the_cpu_backend(module, data: str, capture: str) -> None:  # type: ignore[no-untyped-def]
    cpu = mlp_task()
    rc = cpu.run(progress=False)
    gpu = emulated(mlp_task(), module, data, capture)
    rg = gpu.run(progress=False)
    assert len(rc.step_losses) == 15  # 5 steps (the last one partial) x 3 epochs
    assert_same_run(cpu, rc, gpu, rg, rtol_loss=1e-6, rtol_w=1e-5, atol_w=1e-6)
    for a, b in zip(rc.history, rg.history):
        assert a.val_loss == pytest.approx(b.val_loss, rel=1e-6)
    # the dropout mask of the last (partial) step is the CPU's, bit for bit: Philox, offset in the arena
    name = _mask_name(cpu)
    assert np.array_equal(cpu.executor.view("train_last", name), gpu.executor.view("train_last", name))
    assert module.launches.get("rnb_dropout", 0) >= 15


def test_the_executor_captures_every_entry_once_and_restores_the_arena(module) -> None:  # type: ignore[no-untyped-def]
    t = emulated(mlp_task(), module)
    rx = t.runner.replay
    before = t.executor.arena.bytes.copy()
    # warm-ups changed the device arena (cursors, step, dropout offsets); the upload after them undid it
    assert np.array_equal(rx.bytes, t.executor.arena.bytes) and np.array_equal(before, rx.bytes)
    captured = [g for g in rx.graphs if g is not None]
    assert len(rx.graphs) == len(rx.atlas.captures) and len(captured) >= 10
    assert all(g.nodes for g in captured)
    opt = rx.atlas.captures.index(next(k for k in rx.atlas.captures if k.gid.name == "OPTIMIZER"))
    dot = rx.debug_dot(opt)
    # the task has an EMA: the optimizer only counts the step, the EMA update after it clears the NaN flag
    assert "rnb_adam" in dot and "rnb_optimizer_count" in dot and dot.startswith("digraph")
    ema = rx.atlas.captures.index(next(k for k in rx.atlas.captures if k.gid.name == "EMA_UPDATE"))
    assert "rnb_ema" in rx.debug_dot(ema) and "rnb_skip_done" in rx.debug_dot(ema)
    deep = next(i for i, k in enumerate(rx.atlas.captures) if k.gid.name == "DEEP_FWD_BWD")
    assert "sgemm" in rx.debug_dot(deep) and "rnb_softmax_xent" in rx.debug_dot(deep)
    # replaying a captured graph runs its kernels: one optimizer graph launch, one rnb_adam launch
    n = module.launches.get("rnb_adam", 0)
    rx.graphs[opt].launch(rx.primary)
    assert module.launches["rnb_adam"] == n + 1


@pytest.mark.parametrize("data", ["device", "pinned"])
def test_step_capture_is_one_launch_per_step_and_the_same_bytes(module, data: str) -> None:  # type: ignore[no-untyped-def]
    entry = emulated(mlp_task(), module, data)
    entry.run(progress=False)
    step = emulated(mlp_task(), module, data, capture="step")
    rs = step.run(progress=False)
    se, ss = entry.state_dict(), step.state_dict()
    assert all(se[k].tobytes() == ss[k].tobytes() for k in se)
    rx = step.runner.replay
    # train: steps of parity 0/1 with a full next batch, the one before the partial batch, the partial
    # one, and the prologue; val and EMA eval programs: each captured once, each one closure
    train = [k for k in rx.program_graphs if k[0] == "train"]
    assert len(train) == 4 and all(len(rx._programs[k]) == 1 for k in rx.program_graphs)
    assert len(rs.step_losses) == 15
    # a step graph holds the whole step: transfer, both first-layer graphs, the deep graph, the update
    dot = rx.program_graphs[train[0]].debug_dot_str()
    assert all(name in dot for name in ("sgemm", "rnb_softmax_xent", "rnb_adam", "rnb_nonfinite_probe"))
    assert ("memcpy" if data == "pinned" else "rnb_gather") in dot


def test_the_graph_view_draws_the_graph_the_executor_captured(module) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("anywidget")
    from renaissance_nb.display import GraphView
    t = emulated(mlp_task(), module)
    gv = GraphView(t, graph="train", gid="OPTIMIZER")
    assert "OPTIMIZER" in gv.captured_caption and "rnb_adam" in gv.captured


def test_device_rejects_a_bad_capture_mode() -> None:
    t = mlp_task()
    with pytest.raises(DeviceError, match=r"capture.*'entry'.*'step'"):
        t.device("auto", capture="graph")
    assert t.phase is Phase.PLANNING


def test_the_stand_in_enforces_cudas_capture_rules(module) -> None:  # type: ignore[no-untyped-def]
    """What makes the emulated runs above a check of the executor: work queued on a capturing
    stream does not run; forks must be joined; no syncs, host copies or allocations in a capture."""
    rt = cuda_emulator.emulated_runtime(module)
    p, side, fork, join = rt.stream(), rt.stream(), rt.event(), rt.event()
    x = np.zeros(4, np.float32)
    fill = module.get_function("rnb_advance")  # counter[0] += n
    counter = np.zeros(1, np.int64)
    p.begin_capture(cuda_emulator.CAPTURE_THREAD_LOCAL)
    fork.record(p)
    side.wait_event(fork)
    with side:
        fill((1,), (1,), (counter, np.int64(5)))
    assert counter[0] == 0  # recorded, not run
    for bad in (p.synchronize, rt.synchronize, lambda: rt.zeros(8), lambda: rt.upload(x, x, p)):
        with pytest.raises(cuda_emulator.CaptureError):
            bad()
    with pytest.raises(cuda_emulator.CaptureError, match="Unjoined"):
        p.end_capture()  # the side stream's work was never joined back
    p.begin_capture()
    fork.record(p)
    side.wait_event(fork)
    with side:
        fill((1,), (1,), (counter, np.int64(5)))
    join.record(side)
    p.wait_event(join)
    graph = p.end_capture()
    assert counter[0] == 0
    graph.launch(p)
    graph.launch(p)
    assert counter[0] == 10
    p.begin_capture()  # CuPy's default, relaxed: an allocation goes through (the risk thread-local closes)
    rt.zeros(8)
    with pytest.raises(cuda_emulator.CaptureError):
        p.synchronize()  # conflicts with any capture
    p.end_capture()


def _allocating_ops(rt):  # type: ignore[no-untyped-def]
    """The stand-in's memory ops, with a memset whose launch allocates first (as a CuPy call that
    grows the memory pool inside a launcher would)."""
    plain = rt.memory_ops

    def ops():  # type: ignore[no-untyped-def]
        base = plain()

        def memset0(views):  # type: ignore[no-untyped-def]
            launch = base.memset0(views)
            return lambda stream: (rt.zeros(64), launch(stream))
        return type(base)(base.memcpy, base.h2d, memset0, base.fill, base.add)
    return ops


def test_every_capture_is_thread_local_and_an_allocation_inside_one_is_refused(module) -> None:  # type: ignore[no-untyped-def]
    """#29: captures begin in thread-local mode (CuPy's default is relaxed), so a launcher that
    allocates while capturing fails at compile() instead of leaving a pool pointer in the graph."""
    from dataclasses import replace

    t = mlp_task(epochs=2, zero_grad=True).compile()
    cuda_emulator.CAPTURE_MODES_SEEN.clear()
    GpuExecutor(t.compiled, t.executor, t.runner.env, "raise", "device", runtime=cuda_emulator.emulated_runtime(module))
    seen = set(cuda_emulator.CAPTURE_MODES_SEEN)
    assert seen == {cuda_emulator.CAPTURE_THREAD_LOCAL}, seen
    strict = cuda_emulator.emulated_runtime(module)
    with pytest.raises(cuda_emulator.CaptureError, match="allocation while a stream captures in thread-local mode"):
        GpuExecutor(t.compiled, t.executor, t.runner.env, "raise", "device",
                    runtime=replace(strict, memory_ops=_allocating_ops(strict)))
    relaxed = cuda_emulator.emulated_runtime(module, capture_mode=cuda_emulator.CAPTURE_RELAXED)
    GpuExecutor(t.compiled, t.executor, t.runner.env, "raise", "device",  # relaxed lets it through unseen
                runtime=replace(relaxed, memory_ops=_allocating_ops(relaxed)))


def test_data_auto_streams_through_pinned_memory_when_the_gpu_is_small(module) -> None:  # type: ignore[no-untyped-def]
    t = mlp_task().compile()
    rx = GpuExecutor(t.compiled, t.executor, t.runner.env, t.config.nan_policy, "auto",
                     runtime=cuda_emulator.emulated_runtime(module, free_bytes=1 << 10))
    assert rx.data == "pinned" and rx.sources == {} and len(rx._pinned) >= 2
    big = GpuExecutor(t.compiled, t.executor, t.runner.env, t.config.nan_policy, "auto",
                      runtime=cuda_emulator.emulated_runtime(module))
    assert big.data == "device" and set(big.sources) == {"train", "val"}


def _mask_name(task: DeepLearningTask) -> str:
    return next(k for k in task.compiled.ids if k.endswith(".mask"))


def test_callbacks_see_the_device_loss_log_as_it_grows(module) -> None:  # type: ignore[no-untyped-def]
    t = emulated((DeepLearningTask().model(seq(fc(16, bias=True), relu(), fc(5, bias=True)))
                  .data(train=(X, Y), batch_size=16).total_epochs(1).seed(2)), module)
    seen = []

    def cb(event: str, payload) -> None:  # type: ignore[no-untyped-def]
        if event == "step":  # what the live monitor reads: the host arena's log
            seen.append(t.executor.view("train_base", "loss_log")[: payload["step"]].copy())
    r = t.run(progress=False, callbacks=[cb])
    assert len(seen) == 1 and len(seen[0]) == 16 and np.array_equal(seen[0], r.step_losses[:16])
    assert np.all(seen[0] > 0)


def test_emulated_gpu_runs_are_byte_identical(module) -> None:  # type: ignore[no-untyped-def]
    a = emulated(mlp_task(epochs=2), module)
    a.run(progress=False)
    b = emulated(mlp_task(epochs=2), module)
    b.run(progress=False)
    sa, sb = a.state_dict(), b.state_dict()
    assert all(sa[k].tobytes() == sb[k].tobytes() for k in sa)


def test_emulated_gpu_trains_padded_weight_rows_like_the_cpu(module) -> None:  # type: ignore[no-untyped-def]
    """fc2.weight (16, 1024) has rows of 4 KiB: the plan pads them (and their G/M/V/E copies) to
    1040 floats, so cuBLAS gets leading dimensions longer than the rows, and the flat optimizer
    and EMA kernels run over the padding."""
    net = seq(fc(1024, bias=True), relu(), fc(16, bias=True), tanh(), fc(5, bias=True))
    cpu = mlp_task(net, epochs=2)
    rc = cpu.run(progress=False)
    gpu = emulated(mlp_task(net, epochs=2), module)
    rg = gpu.run(progress=False)
    assert gpu.memory["fc2.weight"].pitch == 1040 and gpu.memory["fc2.weight@grad"].pitch == 1040
    assert gpu.runner.replay.view("train_base", "fc2.weight").strides == (1040 * 4, 4)
    assert_same_run(cpu, rc, gpu, rg, rtol_loss=1e-6, rtol_w=1e-5, atol_w=1e-6)


def test_host_hand_over_copies_padded_rows_whole(module) -> None:  # type: ignore[no-untyped-def]
    """push/pull and the host twin of a padded view cover every row (not nbytes from the start)."""
    net = seq(fc(1024, bias=True), relu(), fc(5, bias=True))
    gpu = emulated(mlp_task(net, epochs=2), module)
    rx = gpu.runner.replay
    host, dev = gpu.executor.view("train_base", "fc2.weight"), rx.view("train_base", "fc2.weight")
    host[...] = np.arange(host.size, dtype=np.float32).reshape(host.shape)
    rx.push(host)
    assert np.array_equal(dev, host)
    dev[...] = -dev
    rx.pull(host)
    assert np.array_equal(host, -np.arange(host.size, dtype=np.float32).reshape(host.shape))
    twin = rx._host_twin(dev)
    assert twin.strides == host.strides and np.shares_memory(twin, host) and np.array_equal(twin, host)


def test_emulated_gpu_sgd_and_unfused_activations(module) -> None:  # type: ignore[no-untyped-def]
    net = seq(fc(24, bias=True), gelu(), fc(16, bias=False), silu(), fc(12), leaky_relu(0.05), fc(5))
    opt = SGD().lr(1e-2).momentum(0.9).nesterov(True).weight_decay(1e-3)  # the schedule (base_lr 1e-2) scales it
    cpu = mlp_task(net, opt, epochs=2)
    rc = cpu.run(progress=False)
    gpu = emulated(mlp_task(net, opt, epochs=2), module)
    rg = gpu.run(progress=False)
    assert np.allclose(rc.step_losses, rg.step_losses, rtol=1e-6)
    assert module.launches.get("rnb_act_fwd", 0) and module.launches.get("rnb_act_bwd", 0)
    assert module.launches.get("rnb_sgd", 0)


def test_emulated_gpu_trains_with_class_weights_like_the_cpu(module) -> None:  # type: ignore[no-untyped-def]
    """The class weights live in the arena (loss.weight, written at compile), so the device reads them."""
    weighted = CrossEntropyLoss().label_smoothing(0.1).weight([1.0, 0.5, 2.0, 0.0, 1.0])
    cpu = mlp_task(epochs=2).loss(weighted)
    rc = cpu.run(progress=False)
    gpu = emulated(mlp_task(epochs=2).loss(weighted), module)
    rg = gpu.run(progress=False)
    np.testing.assert_allclose(rc.step_losses, rg.step_losses, rtol=1e-6)
    assert rc.history[-1].val_loss == pytest.approx(rg.history[-1].val_loss, rel=1e-6)
    plain = mlp_task(epochs=2).run(progress=False)
    assert not np.allclose(plain.step_losses, rc.step_losses, rtol=1e-3)


def test_emulated_gpu_follows_reduce_lr_on_plateau_like_the_cpu(module) -> None:  # type: ignore[no-untyped-def]
    """The host lowers the table at an epoch's end and pushes it: the device's next steps read it."""
    from renaissance_nb import ReduceLROnPlateau
    plateau = ReduceLROnPlateau(monitor="train_loss", mode="max", patience=0, factor=0.5)
    cpu = mlp_task(epochs=3).scheduler(plateau)
    rc = cpu.run(progress=False)
    gpu = emulated(mlp_task(epochs=3).scheduler(plateau), module)
    rg = gpu.run(progress=False)
    assert [r.lr for r in rc.history] == [r.lr for r in rg.history] and len({r.lr for r in rc.history}) == 2
    np.testing.assert_allclose(rc.step_losses, rg.step_losses, rtol=1e-6)


@pytest.mark.parametrize("data", ["device", "pinned"])
def test_emulated_gpu_resumes_a_mid_epoch_checkpoint_exactly(module, data: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """load_state writes the host's data order; the device's own copy (data="device") must follow it
    when the run resumes inside the epoch (it kept the order the device made at construction)."""
    from renaissance_nb import StopTraining

    def stop(kind: str, info) -> None:  # type: ignore[no-untyped-def]
        if kind == "step" and info["epoch"] == 2:
            raise StopTraining("stop")
    def make() -> DeepLearningTask:  # 16-sample batches: step callbacks come inside the epoch
        return emulated(mlp_task(epochs=2).data(train=(X, Y), batch_size=16), module, data=data)
    ref = make()
    ref.run(progress=False)
    a = make()
    a.run(progress=False, callbacks=[stop])
    assert a.run_state.resume_at == (1, 16)
    path = a.save(str(tmp_path / "mid.npz"))
    b = make()
    b.load_state(path)
    b.run(progress=False)
    assert all(b.state_dict()[k].tobytes() == v.tobytes() for k, v in ref.state_dict().items())


def _poisoned(policy: str, epochs: int = 2) -> DeepLearningTask:
    t = (DeepLearningTask().model(seq(fc(16, bias=True), relu(), fc(5, bias=True)))
         .data(train=(X.copy(), Y), batch_size=64).optimizer(AdamW().lr(1e-2)).total_epochs(epochs).seed(3)
         .options(nan_policy=policy))
    t.splits.train.x[140, 3] = np.inf  # one poisoned sample (data() rejects it; a fault mid-training would not)
    return t


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_emulated_gpu_nan_policy_raise_stops_with_the_weights_of_before(module) -> None:  # type: ignore[no-untyped-def]
    cpu = _poisoned("raise").ema(0.9)
    with pytest.raises(NumericalError) as ec:
        cpu.run(progress=False)
    gpu = emulated(_poisoned("raise").ema(0.9), module, data="pinned")  # batches gathered from the host's (repairable) data
    with pytest.raises(NumericalError,
                       match=r"found on the GPU.*weights, moments and EMA weights are those before step.*"
                             r"nan_policy=.skip.") as eg:
        gpu.run(progress=False)
    step = re.search(r"step (\d+)", str(ec.value)).group(1)
    assert re.search(r"step (\d+)", str(eg.value)).group(1) == step
    sc, sg = cpu.state_dict(), gpu.state_dict()
    assert all(np.isfinite(sg[k]).all() and np.allclose(sc[k], sg[k], rtol=1e-5, atol=1e-6) for k in sc)
    sc, sg = cpu.state_dict(ema=True), gpu.state_dict(ema=True)  # the EMA stopped with the weights: the
    assert all(np.allclose(sc[k], sg[k], rtol=1e-5, atol=1e-6) for k in sc)  # halted steps are not averaged in
    # the halt is cleared: with the data repaired, both train on from the start of that epoch, and say so
    assert gpu.executor.view("train_base", "nan.flag")[0] == 0
    for t in (cpu, gpu):
        t.splits.train.x[140, 3] = 0.0
        with pytest.warns(UserWarning, match="stopped inside step"):
            t.run(progress=False)
    assert int(gpu.executor.view("train_base", "step")[0]) == int(cpu.executor.view("train_base", "step")[0]) > 4
    sc, sg = cpu.state_dict(), gpu.state_dict()
    assert all(np.allclose(sc[k], sg[k], rtol=1e-4, atol=1e-5) for k in sc)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("clip", [None, 0.05])
def test_emulated_gpu_nan_policy_skip_counts_like_the_cpu(module, clip) -> None:  # type: ignore[no-untyped-def]
    cpu = _poisoned("skip").clip_grad_norm(clip)
    cpu.run(progress=False)
    gpu = emulated(_poisoned("skip").clip_grad_norm(clip), module)
    gpu.run(progress=False)
    assert cpu.skipped_updates == gpu.skipped_updates == 2  # one poisoned batch per epoch
    if clip:  # the last step was clipped on both
        norms = [t.executor.view("train_base", "clip.norm").copy() for t in (cpu, gpu)]
        assert norms[0][1] < 1 and np.allclose(norms[0], norms[1], rtol=1e-5)
        assert module.launches.get("rnb_grad_norm", 0) and module.launches.get("rnb_grad_scale", 0)
    sc, sg = cpu.state_dict(), gpu.state_dict()
    assert all(np.allclose(sc[k], sg[k], rtol=1e-5, atol=1e-6) for k in sc)


def test_every_op_of_an_mlp_plan_has_a_gpu_kernel() -> None:
    t = mlp_task().compile()
    ops = {n.op for g in (t.graphs.train, t.graphs.inference) for gid in g.ids() for n in g.nodes(gid)}
    assert ops <= set(GPU_KERNELS), sorted(ops - set(GPU_KERNELS))


# ---- image models: conv, batch norm, pooling, flatten, image batches ------------------------------
def _images(n: int, seed: int, c: int = 2, hw: int = 8, classes: int = 4):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = rng.standard_normal((n, c, hw, hw)).astype(np.float32) * 0.5
    for k in range(classes):  # each class brightens one quadrant: learnable
        r, q = divmod(k, 2)
        x[y == k, :, r * hw // 2:(r + 1) * hw // 2, q * hw // 2:(q + 1) * hw // 2] += 1.0
    return x, y


def conv_task(net=None, prefetch: bool = False, epochs: int = 2) -> DeepLearningTask:  # type: ignore[no-untyped-def]
    from renaissance_nb.blueprint import cbr, gap, maxpool
    net = net or seq(cbr(6, 3, 1, 1), maxpool(2), cbr(8, 3, 1, 1), gap(), fc(4, bias=True))
    (x, y), (xv, yv) = _images(120, 1), _images(40, 2)
    return (DeepLearningTask().model(net).data(train=(x, y), val=(xv, yv), batch_size=32)
            .augment(crop_pad=1, flip=True).loss(CrossEntropyLoss().label_smoothing(0.1))
            .optimizer(AdamW().lr(3e-3)).total_epochs(epochs).seed(5).ema(0.9).options(prefetch=prefetch))


@pytest.mark.parametrize("prefetch,capture", [(False, "entry"), (True, "step")])
def test_emulated_gpu_conv_net_matches_the_cpu_backend(module, prefetch: bool, capture: str) -> None:  # type: ignore[no-untyped-def]
    """Conv+BN+ReLU, max pooling, global average pooling, fc; augmented image batches gathered on the
    host with the CPU's Philox crops and flips; validation with folded BN, and the EMA model."""
    cpu = conv_task(prefetch=prefetch)
    rc = cpu.run(progress=False)
    gpu = emulated(conv_task(prefetch=prefetch), module, capture=capture)
    assert gpu.runner.replay.data == "pinned"  # image batches always come from the host
    rg = gpu.run(progress=False)
    assert len(rc.step_losses) == 8
    # BN statistics are summed in a different (fixed) order on the GPU: float64 rounding apart
    assert_same_run(cpu, rc, gpu, rg, rtol_loss=1e-5, rtol_w=1e-4, atol_w=1e-5)
    for name in ("rnb_im2col", "rnb_col2im", "rnb_bn_stats_part", "rnb_bn_grad_final", "rnb_maxpool_bwd",
                 "rnb_gap_fwd", "rnb_bn_fold"):
        assert module.launches.get(name, 0) > 0, name


def test_emulated_gpu_resnet_and_flatten_match_the_cpu_backend(module) -> None:  # type: ignore[no-untyped-def]
    """Stride-2 and 1x1 convolutions, residual adds, average pooling, and flatten in PyTorch's (C, H, W) order.

    No conv feeding a BN has a bias: BN subtracts the batch mean, so that bias's gradient is
    rounding noise (a sum of terms that cancel), and two BLAS libraries give different noise.
    The weights get atol 1e-4 (lr / 30): the CPU sums a conv's dW over tiles of images
    (kernels/conv_tiled.py), the emulated GPU in one product, and AdamW turns a gradient's
    relative rounding error into a weight difference of up to lr times it; one weight of
    conv6, whose gradient nearly cancels, ended 1.8e-5 apart after the epoch."""
    from renaissance_nb import flatten
    from renaissance_nb.blueprint import RESNET_3_3, RESNET_3_3_DS, add2, avgpool, block, bn, cbr, conv, gap, maxpool
    for net in (seq(cbr(8, 3, 1, 1), block(8, RESNET_3_3), block(16, RESNET_3_3_DS),
                    add2(avgpool(1), seq(conv(16, 1, 1, 0, bias=False), bn())), gap(), fc(4)),
                seq(cbr(4, 3, 2, 1), maxpool(3, 2, 1), avgpool(3, 1, 1), flatten(), fc(4))):
        cpu = conv_task(net, epochs=1)
        rc = cpu.run(progress=False)
        gpu = emulated(conv_task(net, epochs=1), module)
        rg = gpu.run(progress=False)
        assert_same_run(cpu, rc, gpu, rg, rtol_loss=1e-5, rtol_w=1e-4, atol_w=1e-4)


def test_image_gathers_are_the_cpu_kernels_bit_for_bit(module) -> None:  # type: ignore[no-untyped-def]
    """im2col, col2im and the pooling gradients (written as gathers, in the CPU scatter's order),
    max and average pooling, global average pooling and flatten give the CPU kernels' bytes, with
    overlapping windows (k=3, stride 2, padding 1)."""
    from renaissance_nb.kernels import conv as cpu_conv
    rng = np.random.default_rng(4)
    n, h, w, c, k, s, p = 2, 7, 6, 3, 3, 2, 1
    ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    x = rng.standard_normal((n, h, w, c)).astype(np.float32)
    x[0, 1, 1, 0] = np.nan
    f = module.get_function
    cols_c, cols_g = (np.zeros((n * ho * wo, k * k * c), np.float32) for _ in range(2))
    cpu_conv.im2col_(x.reshape(n, h, w * c), cols_c, c, k, s, p, ho, wo)
    f("rnb_im2col")((1,), (64,), (x, cols_g, *map(np.int32, (n, h, w, c, k, s, p, ho, wo))))
    assert np.array_equal(cols_c, cols_g, equal_nan=True)
    dcols = rng.standard_normal(cols_c.shape).astype(np.float32)
    dx_c, dx_g = np.zeros_like(x), np.full_like(x, 9.0)
    cpu_conv.col2im_(dcols, dx_c.reshape(n, h, w * c), c, k, s, p, ho, wo)
    f("rnb_col2im")((3,), (32,), (dcols, dx_g, *map(np.int32, (n, h, w, c, k, s, p, ho, wo))))
    assert np.array_equal(dx_c, dx_g)
    y_c, y_g = (np.zeros((n, ho, wo, c), np.float32) for _ in range(2))
    a_c, a_g = (np.zeros((n, ho, wo, c), np.int32) for _ in range(2))
    aff = np.stack([np.linspace(-1, 2, c), np.linspace(0.5, -0.5, c)]).astype(np.float32)
    for bn_relu in (1, 0):  # with bn_relu, of a batch norm's relu output made from its input x and affine
        cpu_conv.maxpool_fwd_(x, y_c, a_c, k, s, p, aff, bool(bn_relu))
        f("rnb_maxpool_fwd")((2,), (16,), (x, aff, y_g, a_g, *map(np.int32, (n, h, w, c, k, s, p, ho, wo, bn_relu))))
        assert np.array_equal(y_c, y_g, equal_nan=True) and np.array_equal(a_c, a_g)
    dy = rng.standard_normal(y_c.shape).astype(np.float32)
    for relu in (0, 1):  # with relu, windows whose max is not above 0 pass no gradient
        cpu_conv.maxpool_bwd_(dy, a_c, dx_c.reshape(n, h * w, c), y_c, bool(relu))
        f("rnb_maxpool_bwd")((2,), (16,), (dy, a_g, y_g, dx_g, *map(np.int32, (n, h, w, c, k, s, p, ho, wo, relu))))
        assert np.array_equal(dx_c, dx_g)
    xf = np.nan_to_num(x)
    cpu_conv.avgpool_fwd_(xf, y_c, k, s, p, np.float32(k * k))
    f("rnb_avgpool_fwd")((2,), (16,), (xf, y_g, *map(np.int32, (n, h, w, c, k, s, p, ho, wo)), np.float32(k * k)))
    assert np.array_equal(y_c, y_g)
    cpu_conv.avgpool_bwd_(dy, dx_c, k, s, p, np.float32(k * k))
    f("rnb_avgpool_bwd")((2,), (16,), (dy, dx_g, *map(np.int32, (n, h, w, c, k, s, p, ho, wo)), np.float32(k * k)))
    assert np.array_equal(dx_c, dx_g)
    g_c, g_g = np.zeros((n, c), np.float32), np.zeros((n, c), np.float32)
    cpu_conv.gap_fwd_(xf.reshape(n, h * w, c), g_c, np.float32(h * w))
    f("rnb_gap_fwd")((1,), (8,), (xf, g_g, *map(np.int32, (n, h * w, c)), np.float32(h * w)))
    assert np.array_equal(g_c, g_g)
    flat = np.zeros((n, c * h * w), np.float32)
    f("rnb_nhwc_to_nchw")((1,), (64,), (x, flat, *map(np.int32, (n, h, w, c, 1))))
    assert np.array_equal(flat, x.transpose(0, 3, 1, 2).reshape(n, -1), equal_nan=True)


class _DevArray(np.ndarray):
    """A host array that answers .data.ptr as a CuPy array does (its address)."""

    @property
    def data(self):  # type: ignore[override]
        return type("Mem", (), {"ptr": self.ctypes.data})()


class _RecordingCublas:
    """libcublas's entry points as recorders: what Gemm asks of cuBLAS, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        def call(*args):  # type: ignore[no-untyped-def]
            self.calls.append((name, args))
            if name == "cublasCreate_v2":
                args[0]._obj.value = 0xBEEF  # the new handle, written through the pointer
            return 0
        return call


def test_every_captured_gemm_sets_its_workspace_after_its_stream(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """cublasSetStream resets the handle to cuBLAS's default workspace pool (which allocates inside
    a capture), so each launch sets the preallocated workspace again, after the stream."""
    from renaissance_nb.gpu import cublas

    lib = _RecordingCublas()
    monkeypatch.setattr(cublas, "_find_libcublas", lambda: lib)
    workspace = np.zeros(4096, np.uint8).view(_DevArray)
    gemm = cublas.Gemm(workspace)
    a, b = np.ones((3, 4), np.float32).view(_DevArray), np.ones((4, 5), np.float32).view(_DevArray)
    c = np.zeros((3, 5), np.float32).view(_DevArray)
    launch = gemm.bind(c, a, b)
    lib.calls.clear()
    for ptr in (111, 222):
        launch(type("Stream", (), {"ptr": ptr})())
    names = [n for n, _ in lib.calls]
    assert names == ["cublasSetStream_v2", "cublasSetWorkspace_v2", "cublasSgemm_v2"] * 2
    for i in (1, 4):
        _, (handle, ptr, size) = lib.calls[i]
        assert ptr.value == workspace.ctypes.data and size.value == 4096
    assert [args[1].value for n, args in lib.calls if n == "cublasSetStream_v2"] == [111, 222]


@pytest.mark.parametrize("device", ["auto", "cuda"])
def test_a_gpu_backend_that_fails_to_start_falls_back_under_auto(monkeypatch, device: str) -> None:  # type: ignore[no-untyped-def]
    """The probe can find a GPU whose backend then fails (no NVRTC or cuBLAS, no memory): "auto"
    trains on the CPU and says why; "cuda" is a DeviceError; neither leaves the task half-compiled."""
    from renaissance_nb import DeviceError, Phase
    from renaissance_nb.gpu import device as dev, executor

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise ModuleNotFoundError("No module named 'cupy_backends.cuda.libs.nvrtc'")

    monkeypatch.setattr(dev, "resolve_device", lambda wanted: "cuda")
    monkeypatch.setattr(executor.GpuExecutor, "__init__", broken)
    task = mlp_task(epochs=2).device(device)
    if device == "cuda":
        with pytest.raises(DeviceError, match=r"failed to start: ModuleNotFoundError.*Fix:"):
            task.compile()
        assert task.phase is Phase.PLANNING
        return
    task.compile()
    assert task.device_kind == "cpu"
    assert any(n.startswith("device: auto chose the CPU: No module named") for n in task.runner.notes)
    task.run(progress=False)
    assert np.isfinite(task.result.history[-1].train_loss)


def test_a_launcher_failing_mid_capture_raises_its_own_error(module) -> None:  # type: ignore[no-untyped-def]
    """Ending a capture with a stream still forked reports cudaErrorStreamCaptureUnjoined, which
    used to replace the launcher's error; the capture is abandoned cleanly and later ones work."""
    task = emulated(mlp_task(epochs=2), module)
    gpu = task.runner.replay
    stream = next(iter(gpu.streams.values()))

    def broken(s) -> None:  # type: ignore[no-untyped-def]
        raise RuntimeError("kernel launch failed: too many resources requested")

    kept = gpu.launchers
    gpu.launchers = [kept[0], [broken], *kept[2:]]  # the step mode's capture: entry 1 fails after entry 0 ran
    try:
        with pytest.raises(RuntimeError, match="too many resources"):
            gpu._capture(1, stream)
        with pytest.raises(RuntimeError, match="too many resources"):
            gpu._capture_program([0, 1])
    finally:
        gpu.launchers = kept
    task.run(progress=False)  # captures and replays still work
    assert len(task.result.history) == 2 and np.isfinite(task.result.history[-1].train_loss)


def test_the_cublas_handle_is_released_when_its_executor_goes(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from renaissance_nb.gpu import cublas

    lib = _RecordingCublas()
    monkeypatch.setattr(cublas, "_find_libcublas", lambda: lib)
    gemm = cublas.Gemm(np.zeros(64, np.uint8).view(_DevArray))
    del gemm
    import gc
    gc.collect()
    assert [n for n, _ in lib.calls].count("cublasDestroy_v2") == 1


def test_a_validation_set_smaller_than_a_batch_gathers_no_row_past_the_order(module) -> None:  # type: ignore[no-untyped-def]
    """The executor's warm-up runs val_base's transfer (a full batch) even when the validation set is
    smaller: rows past the order are zeros, not perm's neighbours used as row indices (a real GPU
    could fault there and lose its context). Training then matches the CPU."""
    xv, yv = XV[:10].copy(), YV[:10].copy()

    def small_val() -> DeepLearningTask:
        return (DeepLearningTask().model(seq(fc(16, bias=True), relu(), fc(5, bias=True)))
                .data(train=(X, Y), val=(xv, yv), batch_size=64).optimizer(AdamW().lr(1e-2)).total_epochs(2).seed(3))
    source = kernel_source()
    assert "perm_n" in source and "start + i >= perm_n" in source
    cpu, gpu = small_val(), emulated(small_val(), module, data="device")
    rc, rg = cpu.run(progress=False), gpu.run(progress=False)
    assert np.allclose(rc.step_losses, rg.step_losses, rtol=1e-5)
    assert [r.val_top1 for r in rc.history] == [r.val_top1 for r in rg.history]


def test_step_callbacks_see_the_clip_norm_of_the_device(module) -> None:  # type: ignore[no-untyped-def]
    seen = {}

    def run(t: DeepLearningTask) -> list:
        got = []
        t.run(progress=False, callbacks=[lambda kind, info: got.append(t.executor.view("train_base", "clip.norm").copy())
                                         if kind == "step" else None])
        return got
    def small_batches() -> DeepLearningTask:  # 17 steps an epoch: a callback at step 16
        return (DeepLearningTask().model(seq(fc(16, bias=True), relu(), fc(5, bias=True)))
                .data(train=(X[:136], Y[:136]), batch_size=8).optimizer(AdamW().lr(1e-2)).total_epochs(2).seed(3)
                .clip_grad_norm(0.05))
    seen["cpu"] = run(small_batches())
    seen["gpu"] = run(emulated(small_batches(), module))
    assert len(seen["cpu"]) == len(seen["gpu"]) > 0
    assert all(np.allclose(a, b, rtol=1e-5) and a[1] < 1 for a, b in zip(seen["cpu"], seen["gpu"]))


# ---- the block reductions with all 256 threads of a block (tests/cuda_block_emulator.py) -----------------
@pytest.fixture(scope="module")
def blocks(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    if shutil.which("g++") is None:
        pytest.skip("g++ is needed to build the CPU harness")
    import cuda_block_emulator
    return cuda_block_emulator.BlockModule(tmp_path_factory.mktemp("blocks"))


def test_the_gradient_norm_blocks_meet_at_every_barrier_in_any_thread_order(blocks) -> None:  # type: ignore[no-untyped-def]
    """rnb_grad_sq_partials with 256 threads a block, run forward, reversed and shuffled at every
    barrier: the same partial sums each time (the tree's order is fixed), their total the float64
    sum, every barrier reached by the whole block; a flagged step writes nothing and meets none."""
    from renaissance_nb.gpu.kernels import THREADS
    grid, n = 6, 6 * 256 * 3 + 77  # a short grid: a block strides over several rows of the range
    g = (RNG.normal(size=n) * 10.0 ** RNG.uniform(-6, 0, n)).astype(np.float32)
    runs = []
    for order in ("forward", "reverse", "random"):
        partial, flag = np.full(grid, np.nan), np.zeros(1, np.int64)
        blocks.call("rnb_grad_sq_partials", grid, THREADS, g, np.int64(n), flag, partial, order=order, seed=n)
        assert blocks.divergent == 0 and blocks.barriers == grid * 9  # 1 + log2(256) barriers a block
        runs.append(partial)
    assert all(np.array_equal(runs[0], r) for r in runs[1:])
    assert runs[0].sum() == pytest.approx(np.sum(g.astype(np.float64) ** 2), rel=1e-13)
    clip = np.zeros(2, np.float32)
    blocks.call("rnb_grad_norm", 1, 1, runs[0], np.int32(grid), np.zeros(1, np.int64), np.float32(0.5), clip)
    assert clip[0] == np.float32(np.sqrt(runs[0].sum())) and clip[1] == np.float32(0.5) / (clip[0] + np.float32(1e-6))
    untouched = np.full(grid, 7.0)
    blocks.call("rnb_grad_sq_partials", grid, THREADS, g, np.int64(n), np.ones(1, np.int64), untouched)
    assert blocks.divergent == 0 and blocks.barriers == 0 and (untouched == 7.0).all()


def test_the_loss_block_meets_at_every_barrier_in_any_thread_order(blocks) -> None:  # type: ignore[no-untyped-def]
    from renaissance_nb.gpu.kernels import THREADS
    logits = RNG.normal(size=(300, 11)).astype(np.float32)  # more rows than threads
    labels = RNG.integers(0, 11, 300).astype(np.int32)
    rc = np.zeros(3, np.float32)
    fused.softmax_xent(logits, labels, 0.1, np.zeros(0, np.float32), rc, np.zeros_like(logits), True)
    runs = []
    for order in ("forward", "reverse", "random"):
        rg, dg = np.zeros(3, np.float32), np.zeros_like(logits)
        blocks.call("rnb_softmax_xent", 1, THREADS, logits, labels, logits, np.int32(0), np.int32(300), np.int32(11),
                    np.float64(0.1), rg, dg, np.int32(1), order=order)
        assert blocks.divergent == 0 and blocks.barriers > 0
        runs.append(rg)
    assert all(np.array_equal(runs[0], r) for r in runs[1:])
    assert runs[0][0] == pytest.approx(rc[0], rel=1e-6) and (runs[0][1:] == rc[1:]).all()


def test_a_skipped_update_leaves_the_ema_on_the_gpu_too(module) -> None:  # type: ignore[no-untyped-def]
    """rnb_ema skips a flagged step and rnb_skip_done clears the flag after it (the optimizer only counts)."""
    batch, rng = 8, np.random.default_rng(0)
    x, y = rng.standard_normal((3 * batch, 6)).astype(np.float32), rng.integers(0, 3, 3 * batch)

    def run(xx, yy, poison: bool):  # type: ignore[no-untyped-def]
        t = (DeepLearningTask().model(seq(fc(8, bias=True), relu(), fc(3, bias=True)))
             .data(train=(xx, yy), batch_size=batch, shuffle=False).optimizer(SGD(lr=0.1)).ema(0.9)
             .total_epochs(1).seed(1).options(nan_policy="skip"))
        t = emulated(t, module, data="pinned")  # batches streamed from the host: the poison is seen
        if poison:
            t.config.data.train.x[batch + 2, 3] = np.inf
        t.run(progress=False)
        return t
    skipping = run(x, y, True)
    keep = np.r_[0:batch, 2 * batch:3 * batch]
    clean = run(x[keep], y[keep], False)
    assert skipping.skipped_updates == 1
    for name in ("fc1.weight", "fc1.weight@ema", "fc2.bias@ema"):
        assert skipping.read(name).tobytes() == clean.read(name).tobytes(), name

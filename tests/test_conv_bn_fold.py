"""options(fold_bn=True): each conv + bn pair runs as one convolution at inference, by weights the
batch norm is folded into (ops/conv_bn.py). Training is untouched (the same bytes); inference gives the
unfolded logits to float32 rounding, in one pass fewer per pair, on the CPU and on the CUDA stand-in."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from renaissance_nb import (RESNET_3_3, RESNET_3_3_DS, CheckpointError, DeepLearningTask, GraphId, add2, block, bn,
                            cbr, conv, fc, gap, identity, relu, seq)
from renaissance_nb.memory.region import Region

RNG = np.random.default_rng(0)
X, Y = RNG.normal(size=(96, 3, 12, 12)).astype(np.float32), RNG.integers(0, 4, 96)
NET = seq(cbr(16, 3, 1, 1), block(16, RESNET_3_3), block(32, RESNET_3_3_DS), conv(8, 1), bn(), gap(), fc(4))


def task(fold: bool, net=NET, ema: float | None = None) -> DeepLearningTask:  # type: ignore[no-untyped-def]
    t = (DeepLearningTask().model(net).data(train=(X, Y), val=(X[:32], Y[:32]), batch_size=32).total_epochs(2)
         .seed(0).options(fold_bn=fold))
    return t.ema(ema) if ema else t


@pytest.fixture(scope="module")
def runs() -> tuple[DeepLearningTask, DeepLearningTask]:
    plain, folded = task(False, ema=0.9), task(True, ema=0.9)
    plain.run(progress=False)
    folded.run(progress=False)
    return plain, folded


def test_training_is_untouched_and_inference_gives_the_same_logits(runs) -> None:  # type: ignore[no-untyped-def]
    plain, folded = runs
    for name, w in plain.state_dict().items():
        assert np.array_equal(w, folded.state_dict()[name]), name
    for ema in (False, True):
        a, b = plain.predict_logits(X[:32], ema=ema), folded.predict_logits(X[:32], ema=ema)
        assert np.abs(a - b).max() <= 1e-5 * np.abs(a).max()  # W*s then the product, vs the product then *s
    for a, b in zip(plain.result.history, folded.result.history):
        assert a.val_loss == pytest.approx(b.val_loss, rel=1e-6) and a.ema_loss == pytest.approx(b.ema_loss, rel=1e-6)


def test_every_pair_is_one_convolution_and_no_batch_norm_runs_at_inference(runs) -> None:  # type: ignore[no-untyped-def]
    plain, folded = runs
    arch = folded.compiled.arch
    assert arch.folded == tuple((f"conv{i}", f"bn{i}") for i in range(1, 8))
    assert "folded at inference: conv1+bn1" in repr(arch)
    ops = [n.op for n in folded.compiled.graphs.inference.nodes(GraphId.INF_MAIN_A)]
    plain_ops = [n.op for n in plain.compiled.graphs.inference.nodes(GraphId.INF_MAIN_A)]
    assert "bn_inf" not in ops and plain_ops.count("bn_inf") == 7 and len(ops) == len(plain_ops) - 7
    folds = [n for n in folded.compiled.graphs.inference.nodes(GraphId.UPDATE_BN_INF_PARAMS) if n.op == "conv_bn_fold"]
    assert len(folds) == 14  # the model's and the EMA model's
    weights = {s.name: s for s in folded.compiled.shapes.tables["train_base"].specs}
    assert weights["conv2.weight@folded"].region is Region.W_EQ_SCALE
    assert weights["conv2.weight@folded"].shape == weights["conv2.weight"].shape
    assert weights["conv7.bias@folded@ema"].region is Region.W_EQ_BIAS


def test_only_a_conv_whose_one_reader_is_the_batch_norm_folds() -> None:
    """A conv read twice (conv1: a residual) or fusing its own relu (conv2) keeps its batch norm; so does a
    grouped conv (conv3); conv4's bn4 folds."""
    net = seq(conv(8, 3, p=1), add2(identity(), seq(bn(), relu())), conv(8, 3, p=1), relu(), bn(),
              conv(8, 3, p=1, groups=8), bn(), conv(8, 1), bn(), gap(), fc(4))
    arch = task(True, net).plan()
    assert arch.folded == (("conv4", "bn4"),)


def test_a_checkpoint_says_which_option_its_plan_needs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    t = task(True)
    t.run(progress=False)
    path = t.save(str(tmp_path / "folded.npz"))
    back = DeepLearningTask.load(path, t.splits)  # options travel with the checkpoint
    assert back.config.fold_bn and np.array_equal(back.predict_logits(X[:8]), t.predict_logits(X[:8]))
    plain = task(False)
    plain.compile()
    with pytest.raises(CheckpointError, match=r"options\(fold_bn=True\)"):
        plain.load_state(path)
    plain_path = task(False).compile().save(str(tmp_path / "plain.npz"))
    with pytest.raises(CheckpointError, match=r"options\(fold_bn=False\)"):
        task(True).compile().load_state(plain_path)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ builds the CUDA stand-in")
def test_the_fold_kernel_gives_the_cpus_bytes_on_the_stand_in(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import cuda_emulator
    from renaissance_nb.ops.conv_bn import bind_fold
    module = cuda_emulator.EmulatedModule(tmp_path)
    w = RNG.normal(size=(5, 3, 3, 4)).astype(np.float32)
    scale, shift, b = (RNG.normal(size=5).astype(np.float32) for _ in range(3))
    for bias in (True, False):
        wf, bf = np.empty_like(w), np.empty(5, np.float32)
        bind_fold([wf, bf], [w, scale, shift] + ([b] if bias else []), {"bias": bias}, None)()
        gw, gb = np.full_like(w, np.nan), np.full(5, np.nan, np.float32)
        module.get_function("rnb_conv_bn_fold")((7,), (7,), (w, scale, shift, b if bias else shift, gw, gb,
                                                             np.int64(5), np.int64(36), np.int32(bias)))
        assert np.array_equal(wf, gw) and np.array_equal(bf, gb)
        assert np.array_equal(wf, w * scale[:, None, None, None])
        assert np.array_equal(bf, (b * scale if bias else np.float32(0)) + shift)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ builds the CUDA stand-in")
def test_an_emulated_gpu_run_folds_as_the_cpu_does(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import cuda_emulator
    from renaissance_nb.gpu.executor import GpuExecutor
    module = cuda_emulator.EmulatedModule(tmp_path)
    cpu, gpu = task(True), task(True)
    rc = cpu.run(progress=False)
    gpu.compile()
    gpu.runner.replay = GpuExecutor(gpu.compiled, gpu.executor, gpu.runner.env, gpu.config.nan_policy, "device",
                                    runtime=cuda_emulator.emulated_runtime(module), capture="entry")
    rg = gpu.run(progress=False)
    assert module.launches.get("rnb_conv_bn_fold", 0) > 0
    for a, b in zip(rc.history, rg.history):  # BN statistics are summed in another fixed order on the GPU
        assert a.val_loss == pytest.approx(b.val_loss, rel=1e-4)

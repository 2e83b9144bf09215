"""Mixed precision on the GPU backend, checked without a GPU (tests/cuda_emulator.py).

The casts of gpu/src/rnb_amp.cu are compiled by g++ and compared byte for byte with the CPU's
(kernels/lowp.py's reference, lowp.c through kernels/amp.py's cast); whole runs of a bf16 MLP and an
fp16 MLP with an overflow provoked go through the real GpuExecutor, whose 16-bit fc products are the
emulator's cublasGemmEx (widened operands, NumPy's float32 sums), against the CPU backend's runs.
"""
from __future__ import annotations

import shutil
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from renaissance_nb import SGD, DeepLearningTask, conv, fc, flatten, maxpool, relu, seq, tanh
from renaissance_nb.gpu import amp_kernels
from renaissance_nb.gpu.base import GpuBindEnv
from renaissance_nb.gpu.executor import GpuExecutor
from renaissance_nb.kernels import lowp
from renaissance_nb.kernels.amp import cast as cpu_cast

import cuda_emulator  # noqa: E402  (tests/ is on sys.path, as for helpers.py)

RNG = np.random.default_rng(3)
X, Y = RNG.normal(size=(300, 20)).astype(np.float32), RNG.integers(0, 5, 300)
BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture(scope="module")
def module(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    if shutil.which("g++") is None:
        pytest.skip("g++ is needed to build the CPU harness")
    return cuda_emulator.EmulatedModule(tmp_path_factory.mktemp("emu"))


def gpu_cast(module: Any, src: np.ndarray, dst: np.ndarray, via: str | None = None,
             scale: np.ndarray | None = None) -> np.ndarray:
    """gpu/amp_kernels.py's cast launcher run on the emulated module (at once: no capture)."""
    env = GpuBindEnv(module, None, None)
    amp_kernels.cast_launch(env, src, dst, via, scale)(cuda_emulator.NULL_STREAM)  # one stream: in order
    return dst


def edge_floats() -> np.ndarray:
    """float32 values at every rounding rule of bf16 and fp16: zeros, fp32 and fp16 subnormals and their
    ties, the fp16 overflow threshold (65504, 65519.99, 65520), ties to even, infinities, NaNs with payloads,
    then random bit patterns of every kind."""
    bits = [0, 0x80000000, 1, 0x807FFFFF, 0x00800000, 0x33000000, 0x33000001, 0x32FFFFFF, 0x33800000, 0x33C00000,
            0x38800000, 0x387FFFFF, 0x387FE000, 0x387FF000, 0x38000000, 0x477FE000, 0x477FEFFF, 0x477FF000,
            0x477FF001, 0x47800000, 0x7F7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001,
            0x7FBFFFFF, 0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001, 0x3F801000, 0x3F803000, 0x3F802000,
            0xC0000800, 0x3F7FFFFF]
    rand = RNG.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32)
    near = (np.arange(0x33000000, 0x38900000, 0x1000, dtype=np.uint32) + RNG.integers(0, 0x2000, 1, dtype=np.uint32))
    ties = (np.arange(0, 1 << 16, dtype=np.uint32) << 16) | 0x8000  # every bf16 tie
    return np.concatenate([np.array(bits, np.uint32), rand, near, ties]).view(np.float32)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("fmt", ["bf16", "fp16"])
def test_the_casts_give_the_cpus_bytes_for_edges_and_every_16_bit_pattern(module, fmt: str) -> None:  # type: ignore[no-untyped-def]
    store = BF16 if fmt == "bf16" else np.dtype(np.float16)
    x = edge_floats()
    want = lowp.round_to(x, fmt).view(np.uint16)
    got = gpu_cast(module, x, np.full(x.size, 7, np.uint16).view(store)).view(np.uint16)
    assert np.array_equal(got, want), np.flatnonzero(got != want)[:5]
    cpu = np.zeros(x.size, store)
    cpu_cast([cpu], [x], {}, None)()  # the CPU backend's cast kernel (lowp.c where built)
    assert np.array_equal(got, cpu.view(np.uint16))
    # widening: all 65536 patterns, NaNs included (fp16's come back quiet, as vcvtph2ps makes them)
    h = np.arange(1 << 16, dtype=np.uint16).view(store)
    wide = gpu_cast(module, h, np.zeros(h.size, np.float32))
    assert np.array_equal(wide.view(np.uint32), lowp.widen(h.view(np.uint16) if fmt == "bf16" else h, fmt)
                          .view(np.uint32))
    cpu_wide = np.zeros(h.size, np.float32)
    cpu_cast([cpu_wide], [h], {}, None)()
    assert np.array_equal(wide.view(np.uint32), cpu_wide.view(np.uint32))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("via", ["bfloat16", "float16"])
def test_round_trips_scaling_padded_rows_and_in_place_casts_match_the_cpu(module, via: str) -> None:  # type: ignore[no-untyped-def]
    x = (RNG.normal(size=(6, 40)) * 1e3).astype(np.float32)
    x[0, :4] = [70000.0, -1e-7, np.inf, 3e-8]
    scale = np.array([2.0 ** 16], np.float32)
    for s in (None, scale):
        ins = [x] if s is None else [x, s]
        cpu = np.zeros_like(x)
        cpu_cast([cpu], ins, {"via": via}, None)()
        got = gpu_cast(module, x, np.zeros_like(x), via, s)
        assert np.array_equal(got.view(np.uint32), cpu.view(np.uint32))
    # the scaled logits' gradient in place (fp32 logits), and a weight matrix with padded rows into its copy
    inplace, cpu = x.copy(), x.copy()
    cpu_cast([cpu], [cpu, scale], {}, None)()
    gpu_cast(module, inplace, inplace, None, scale)
    assert np.array_equal(inplace, cpu)
    padded = np.zeros((6, 48), np.float32)
    padded[:, :40] = x
    half = gpu_cast(module, padded[:, :40], np.zeros((6, 40), np.uint16).view(BF16))
    assert np.array_equal(half.view(np.uint16), lowp.round_to(x, "bf16"))
    back = np.full((6, 48), -1.0, np.float32)
    gpu_cast(module, half, back[:, :40])
    assert np.array_equal(back[:, :40], lowp.widen(half.view(np.uint16), "bf16")) and (back[:, 40:] == -1).all()


def mlp(precision: str, x: np.ndarray, y: np.ndarray, epochs: int, batch: int = 64) -> DeepLearningTask:
    return (DeepLearningTask().model(seq(fc(32), relu(), fc(16), tanh(), fc(5)))
            .data(train=(x, y), val=(X[:70], Y[:70]), batch_size=batch).optimizer(SGD().lr(0.05).momentum(0.9))
            .total_epochs(epochs).seed(7).precision(precision))


def emulated(task: DeepLearningTask, module: Any) -> DeepLearningTask:  # type: ignore[no-untyped-def]
    task.compile()
    task.runner.replay = GpuExecutor(task.compiled, task.executor, task.runner.env, task.config.nan_policy,
                                     "device", runtime=cuda_emulator.emulated_runtime(module))
    return task


def run_with_scales(task: DeepLearningTask) -> tuple[Any, list[float], list[int]]:
    """The run, with the loss scale and the skipped count after every epoch (one step each here)."""
    scales, skips = [], []

    def record(kind: str, info: object) -> None:
        if kind == "epoch" and task.config.precision == "fp16":
            scales.append(float(task.runner.view("amp.scale")[0]))
            skips.append(int(task.runner.view("nan.skipped")[0]))
    return task.run(progress=False, callbacks=[record]), scales, skips


def test_an_emulated_bf16_mlp_follows_the_cpu_run(module) -> None:  # type: ignore[no-untyped-def]
    """bf16 fc products by GemmEx (NumPy's float32 sums of the widened operands) against the CPU's
    (vdpbf16ps tiles on an AVX-512 BF16 CPU: another order of the same sums; the bias gradient a column
    sum there, an SGEMM here). Not byte-identical, and why: the biases' fp32 gradients differ within the
    float32 sum bound; a weight gradient is rounded to bf16 once, so a last-place difference in its fp32
    sum can flip that rounding, and the weight then moves by lr x one bf16 ulp of its gradient, far less
    than the weight's own bf16 quantum (2^-9 relative). Measured here after 15 steps: the losses bitwise
    equal, 1 of 640 fc1 weights 4.6e-6 apart (relative), fc2's bias 1.3e-7."""
    calls = dict(cuda_emulator.NumpyGemm.CALLS)
    cpu = mlp("bf16", X, Y, 3)
    rc = cpu.run(progress=False)
    gpu = emulated(mlp("bf16", X, Y, 3), module)
    rg = gpu.run(progress=False)
    assert len(rc.step_losses) == len(rg.step_losses) == 15
    assert np.allclose(rc.step_losses, rg.step_losses, rtol=1e-6, atol=0)
    sc, sg = cpu.state_dict(), gpu.state_dict()
    for k in sc:
        rel = np.abs(sc[k] - sg[k]) / np.abs(sc[k])
        if k.endswith("bias"):
            assert np.allclose(sc[k], sg[k], rtol=1e-6, atol=1e-7), (k, rel.max())
        else:  # a flipped rounding of a bf16 gradient moves few weights, each well under their bf16 quantum
            assert (rel > 0).mean() < 0.01 and rel.max() < 2.0 ** -12, (k, (rel > 0).mean(), rel.max())
    assert [h.val_top1 for h in rc.history] == [h.val_top1 for h in rg.history]
    ex = cuda_emulator.NumpyGemm.CALLS.get("gemm_ex", 0) - calls.get("gemm_ex", 0)
    assert ex >= 15 * (3 + 5)  # every fc product of every step went through GemmEx: 3 forward, 5 backward
    assert module.launches["rnb_lowp_bias_act"] and module.launches["rnb_lowp_act_grad"]
    # the device holds bf16 tensors as their bytes; its working copies are lowp.c's rounding of its masters
    a_gpu = gpu.runner.replay.view("train_base", "fc1.weight@a")
    w_gpu = gpu.runner.replay.view("train_base", "fc1.weight")
    assert a_gpu.dtype == np.uint16 and cpu.executor.view("train_base", "fc1.weight@a").dtype == BF16
    assert np.array_equal(a_gpu, lowp.round_to(w_gpu, "bf16"))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_an_emulated_fp16_mlp_skips_the_steps_and_follows_the_scale_of_the_cpu(module) -> None:  # type: ignore[no-untyped-def]
    """Inputs x300 overflow fp16's scaled gradients: GradScaler halves the scale and skips those steps.
    The device's NaN check skips (the compiler sets policy 'skip' under fp16) under the task's default
    nan_policy 'raise', step for step as the CPU's. One batch per epoch, so the scale is read after each
    step. The fp16 products here are the same float32 sums on both sides (widened operands, sgemm); the
    bias gradients are summed in another order (a column sum on the CPU, an SGEMM here). Measured: every
    weight byte-identical, fc1's bias 1.2e-10 apart; asserted within float32 rounding."""
    x, y = X[:64] * 300.0, Y[:64]
    cpu = mlp("fp16", x, y, 14)
    rc, scales_c, skips_c = run_with_scales(cpu)
    gpu = emulated(mlp("fp16", x, y, 14), module)
    rg, scales_g, skips_g = run_with_scales(gpu)
    assert gpu.config.nan_policy == "raise"
    assert scales_g == scales_c and skips_g == skips_c
    assert 0 < skips_c[-1] < 14 and scales_c[-1] < 2.0 ** 16  # the overflow was provoked, and training went on
    assert gpu.skipped_updates == cpu.skipped_updates == skips_c[-1]
    assert module.launches["rnb_amp_unscale"] and module.launches["rnb_amp_update_scale"]
    assert np.allclose(rc.step_losses, rg.step_losses, rtol=1e-6)
    sc, sg = cpu.state_dict(), gpu.state_dict()
    for k in sc:
        assert np.allclose(sc[k], sg[k], rtol=1e-6, atol=1e-7), k
    growth = [t.runner.view("amp.growth")[0] for t in (cpu, gpu)]
    assert growth[0] == growth[1]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("precision,scale", [("bf16", 1.0), ("fp16", 300.0)])
def test_an_emulated_conv_net_in_mixed_precision_follows_the_cpu(module, precision: str, scale: float) -> None:  # type: ignore[no-untyped-def]
    """A conv net: its convolutions are the fp32 GPU kernels between casts (as on the CPU), its fc a GemmEx.
    Measured here: bf16 byte-identical, fp16 (x300 inputs, steps skipped) within 1e-9."""
    rng = np.random.default_rng(5)
    imgs, labels = rng.normal(size=(64, 1, 8, 8)).astype(np.float32) * scale, rng.integers(0, 3, 64)

    def make() -> DeepLearningTask:
        return (DeepLearningTask().model(seq(conv(4, 3, 1, 1), relu(), maxpool(2), flatten(), fc(3)))
                .data(train=(imgs, labels), batch_size=16).optimizer(SGD().lr(0.05).momentum(0.9)).total_epochs(2)
                .seed(1).precision(precision))
    cpu = make()
    rc = cpu.run(progress=False)
    gpu = emulated(make(), module)
    rg = gpu.run(progress=False)
    assert cpu.skipped_updates == gpu.skipped_updates and (cpu.skipped_updates > 0) == (precision == "fp16")
    assert np.allclose(rc.step_losses, rg.step_losses, rtol=1e-6)
    sc, sg = cpu.state_dict(), gpu.state_dict()
    assert all(np.allclose(sc[k], sg[k], rtol=1e-6, atol=1e-7) for k in sc)


def test_device_auto_takes_the_gpu_for_mixed_precision(module, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Where a GPU is there (the probe says cuda; CuPy's runtime replaced by the stand-in), a bf16 task on
    device('auto') runs on it, and device('cuda') plans a bf16 task instead of refusing it."""
    from renaissance_nb.gpu import device as dev, executor
    monkeypatch.setattr(dev, "resolve_device", lambda wanted: "cuda")
    monkeypatch.setattr(executor, "cupy_runtime", lambda: cuda_emulator.emulated_runtime(module))
    task = mlp("bf16", X, Y, 1).device("auto")
    task.compile()
    assert task.device_kind == "cuda"
    assert any("cublasGemmEx (bf16 operands" in n for n in task.runner.notes)
    result = task.run(progress=False)
    assert np.isfinite(result.step_losses).all()
    mlp("fp16", X, Y, 1).device("cuda").plan()

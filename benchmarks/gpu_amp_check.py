"""Mixed precision on the device machine, in one short run (device time is scarce):

    PYTHONPATH=. python benchmarks/gpu_amp_check.py --out benchmarks/results/gpu_amp_h200.txt
    python benchmarks/gpu_amp_check.py --stand-in   # here, without a GPU: the same branch on the CPU stand-in

1) versions; 2) gpu/src/rnb_amp.cu's casts on the device against kernels/lowp.py's bytes: every bf16 and
fp16 pattern widened, and fp32 edges plus random bit patterns rounded (exact equality expected: integer
bit operations); 3) one cublasGemmEx product per format at the MLP's shapes against a float64 reference,
in units of the float32 sum bound k * 2^-24 * sum|a||b|; 4) the seed MLP (784-1024-512-256-10, SGD with
momentum) on device('cuda') against device('cpu') from the same weights: bf16 for 20 steps (the losses'
and weights' largest relative differences), fp16 with inputs x300 for 20 one-batch epochs (the skipped
steps and the loss scale after every step must be the CPU's); 5) one epoch of MNIST-shaped random data at
batch 128 in fp32, bf16 and fp16 on the device, medians of the rounds after the first. The data are
random numbers (the timing depends on shapes only).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import renaissance_nb as rnb  # noqa: E402
import gpu_device_check as dc  # noqa: E402  (say, stage, versions, the stand-in switch)
from renaissance_nb.kernels import lowp  # noqa: E402

say, stage = dc.say, dc.stage


def device_kit() -> tuple[Any, Any, Any]:
    """(array module, compiled kernel module, stream): CuPy's on a GPU, the stand-in's under --stand-in."""
    if dc.STAND_IN:
        import cuda_emulator
        return np, cuda_emulator.EmulatedModule(), cuda_emulator.NULL_STREAM
    import cupy
    from renaissance_nb.gpu.kernels import NVRTC_OPTIONS, kernel_source
    return cupy, cupy.RawModule(code=kernel_source(), options=NVRTC_OPTIONS), cupy.cuda.Stream(non_blocking=True)


def casts() -> None:
    from renaissance_nb.gpu import amp_kernels
    from renaissance_nb.gpu.base import GpuBindEnv
    xp, module, stream = device_kit()
    env = GpuBindEnv(module, None, None)
    rng = np.random.default_rng(0)
    specials = np.array([0, 0x80000000, 1, 0x33000000, 0x33000001, 0x387FF000, 0x38800000, 0x477FEFFF, 0x477FF000,
                         0x7F7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0x3F808000, 0x3F818000], np.uint32)
    x = np.concatenate([specials, rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32)]).view(np.float32)
    patterns = np.arange(1 << 16, dtype=np.uint16)
    for fmt, store in (("bf16", np.uint16), ("fp16", np.float16)):
        dst = xp.zeros(x.size, store)
        amp_kernels.cast_launch(env, xp.asarray(x), dst)(stream)
        wide = xp.zeros(patterns.size, np.float32)
        amp_kernels.cast_launch(env, xp.asarray(patterns.view(store)), wide)(stream)
        stream.synchronize()
        got, back = (np.asarray(a.get() if hasattr(a, "get") else a) for a in (dst, wide))
        want = lowp.round_to(x, fmt).view(np.uint16)
        bad_r = int((got.view(np.uint16) != want).sum())
        bad_w = int((back.view(np.uint32) != lowp.widen(patterns.view(store), fmt).view(np.uint32)).sum())
        say(f"   cast {fmt}: {x.size} fp32 values rounded, {bad_r} bytes differ from lowp.c's; all 65536 patterns "
            f"widened, {bad_w} differ  {'OK' if bad_r == bad_w == 0 else 'MISMATCH'}")


def gemm_ex() -> None:
    from renaissance_nb.gpu.cublas import Gemm
    xp, _, stream = device_kit()
    if dc.STAND_IN:
        import cuda_emulator
        gemm = cuda_emulator.NumpyGemm()
    else:
        from renaissance_nb.gpu.cublas import WORKSPACE_BYTES
        gemm = Gemm(xp.zeros(WORKSPACE_BYTES, np.uint8))
    rng = np.random.default_rng(1)
    m, k, n = 128, 784, 1024
    for fmt, store in (("bf16", np.uint16), ("fp16", np.float16)):
        a = lowp.round_to(rng.normal(size=(m, k)).astype(np.float32), fmt)
        b = lowp.round_to(rng.normal(size=(n, k)).astype(np.float32), fmt)
        da, db, dc_ = xp.asarray(a.view(store)), xp.asarray(b.view(store)), xp.zeros((m, n), np.float32)
        gemm.bind(dc_, da, db.T)(stream)
        stream.synchronize()
        c = np.asarray(dc_.get() if hasattr(dc_, "get") else dc_)
        a64, b64 = lowp.widen(a, fmt).astype(np.float64), lowp.widen(b, fmt).astype(np.float64)
        ref, mag = a64 @ b64.T, np.abs(a64) @ np.abs(b64.T)
        ratio = float(np.max(np.abs(c - ref) / (k * 2.0 ** -24 * mag)))
        say(f"   cublasGemmEx {fmt} ({m}x{k} @ {k}x{n}, fp32 sums): largest error {ratio:.3g} of the float32 sum "
            f"bound  {'OK' if ratio <= 1 else 'OVER'}")
    gemm.close()


def mlp(precision: str, device: str, x: np.ndarray, y: np.ndarray, epochs: int, batch: int = 128) -> Any:
    net = rnb.seq(rnb.fc(1024), rnb.relu(), rnb.fc(512), rnb.relu(), rnb.fc(256), rnb.relu(), rnb.fc(10))
    return (rnb.DeepLearningTask("mlp").model(net).data(train=(x, y), batch_size=batch)
            .optimizer(rnb.SGD().lr(0.01).momentum(0.9)).total_epochs(epochs).seed(0).precision(precision)
            .device(device))


def parity() -> None:
    x, y = dc.mnist_like(128 * 20)
    for prec, inputs, epochs in (("bf16", (x, y), 1), ("fp16", (x[:128] * 300.0, y[:128]), 20)):
        runs = {}
        for device in ("cpu", "cuda"):
            task = mlp(prec, device, *inputs, epochs)
            scales: list[float] = []

            def record(kind: str, info: object, task: Any = task, scales: list = scales) -> None:
                if kind == "epoch" and prec == "fp16":
                    scales.append(float(task.runner.view("amp.scale")[0]))
            result = task.run(progress=False, callbacks=[record])
            runs[device] = (task, result, scales)
        (tc, rc, sc), (tg, rg, sg) = runs["cpu"], runs["cuda"]
        loss = float(np.max(np.abs(np.subtract(rc.step_losses, rg.step_losses)) / np.abs(rc.step_losses)))
        wc, wg = tc.state_dict(), tg.state_dict()
        weight = max(float(np.max(np.abs(wc[k] - wg[k])) / np.max(np.abs(wc[k]))) for k in wc)
        say(f"   {prec}: device {tg.device_kind}, {len(rc.step_losses)} steps recorded; largest difference from the "
            f"CPU: losses {loss:.3g} (relative), weights {weight:.3g} (of each tensor's largest |w|)")
        if prec == "fp16":
            same = sc == sg and tc.skipped_updates == tg.skipped_updates
            say(f"   fp16 x300: skipped {tc.skipped_updates} (cpu) / {tg.skipped_updates} (cuda); scales cpu {sc}")
            say(f"   fp16 scale sequence and skipped steps {'the same' if same else 'DIFFER: cuda ' + str(sg)}")


def speed(n: int, rounds: int) -> None:
    x, y = dc.mnist_like(n)
    device = "cuda"
    times = {}
    for prec in ("fp32", "bf16", "fp16"):
        task = mlp(prec, device, x, y, 100)
        t = time.perf_counter()
        task.compile()
        compile_s = time.perf_counter() - t
        per = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            task.run(epochs=1, progress=False)
            per.append(time.perf_counter() - t0)
        times[prec] = statistics.median(per[1:] or per)
        say(f"   {prec}: compile {compile_s:.2f} s, epoch of {n} at batch 128: {times[prec] * 1e3:.1f} ms "
            f"(rounds: {', '.join(f'{p * 1e3:.1f}' for p in per)}); arena "
            f"{task.memory_inspector.plan().total_bytes / 2 ** 20:.1f} MiB")
    say(f"   bf16 / fp32: {times['bf16'] / times['fp32']:.2f}x; fp16 / fp32: {times['fp16'] / times['fp32']:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="", help="also write the report here")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--stand-in", action="store_true", help="no GPU: this branch on the tests' CPU stand-in")
    a = ap.parse_args()
    if a.stand_in:
        dc.use_stand_in()
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text("")
        dc.OUT_FILE.append(Path(a.out))
    dc.versions()
    if dc.gpu_device.probe()[0] is None:
        say("no GPU here: run with --stand-in for a dry run")
        return
    stage("casts", casts)
    stage("GemmEx", gemm_ex)
    stage("parity with the CPU", parity)
    stage("speed", lambda: speed(2048 if dc.STAND_IN else 60000, 2 if dc.STAND_IN else a.rounds))


if __name__ == "__main__":
    main()

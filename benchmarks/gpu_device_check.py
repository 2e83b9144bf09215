"""The GPU check for the device machine: tests, parity, determinism, and a side-by-side benchmark.

    PYTHONPATH=. python benchmarks/gpu_device_check.py --out benchmarks/results/gpu_h200.txt
    python benchmarks/gpu_device_check.py --smoke   # here, without a GPU: the torch and CPU parts, tiny
    python benchmarks/gpu_device_check.py --stand-in --skip-tests   # the GPU branch on the CPU stand-in

One script, one run (device time is scarce): 1) versions of everything; 2) the GPU test suite
(tests/test_gpu.py: 20 steps against the CPU backend from the same weights, byte-identical
reruns, checkpoints, NaN guard) and the CPU-side GPU tests; 3) the capture-safe GEMM candidates
at the MLP's shapes; 4) one epoch of the original's MNIST MLP (784-1024-512-256-10, AdamW,
label smoothing 0.1) at batch 128 and 512, data already on the device and through a loader, ours with one graph
per atlas entry and one per step, interleaved round by round with PyTorch eager (default and
fused AdamW); then, last (it may take minutes to compile), against
torch.compile(mode="max-autotune"), whose compile time is reported apart; 5) the conv net (three
conv-BN-ReLU stages, max pooling, gap, fc) for one epoch against PyTorch eager on the GPU; and,
before the benchmarks, the memory the device holds (CuPy's pool, cudaMemGetInfo) against the plan. Medians of the
rounds after the first; ratios are ours / theirs. The data are MNIST-shaped random numbers
(the timing depends on shapes only; ../shared does not travel to the device machine).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import renaissance_nb as rnb  # noqa: E402
import renaissance_nb.gpu.device as gpu_device  # noqa: E402

LAYERS = (784, 1024, 512, 256, 10)
OUT_FILE: list[Path] = []  # the report, appended line by line: a run cut short still leaves what it measured
STAND_IN: list[bool] = []  # --stand-in: device("cuda") served by the tests' CPU stand-in for CuPy (a dry run)


def say(line: str = "") -> None:
    print(line, flush=True)
    for f in OUT_FILE:
        with f.open("a") as fh:
            fh.write(line + "\n")


def versions() -> None:
    info, reason = gpu_device.probe()
    say(f"date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    say(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    say(f"GPU: {info if info else 'none: ' + reason}")
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        say(f"nvidia-smi: {smi.stdout.strip() or smi.stderr.strip()}")
    except (OSError, subprocess.TimeoutExpired) as exc:
        say(f"nvidia-smi: {exc}")
    try:
        import torch
        say(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
    except ImportError:
        say("torch: not installed (PyTorch contenders skipped)")
    say(f"numpy {np.__version__}, renaissance_nb {rnb.__version__}")


def stage(name: str, fn: Callable[[], Any]) -> Any:
    """Run one stage; on failure print its traceback and go on (one device run must tell everything)."""
    try:
        return fn()
    except Exception:
        say(f"   FAILED: {name}")
        for line in traceback.format_exc().strip().splitlines()[-12:]:
            say("   | " + line)
        return None


def diagnose() -> None:
    """Each GPU piece alone, in the order the executor needs them, so a failure names its piece."""
    import cupy

    from renaissance_nb.gpu.cublas import WORKSPACE_BYTES, Gemm
    from renaissance_nb.gpu.kernels import NVRTC_OPTIONS, kernel_source
    say("\n== diagnostics")
    t = time.perf_counter()
    mod = cupy.RawModule(code=kernel_source(), options=NVRTC_OPTIONS)
    mod.get_function("rnb_adam")
    say(f"   NVRTC compiled the kernels in {time.perf_counter() - t:.2f} s")
    gemm = Gemm(cupy.empty(WORKSPACE_BYTES, cupy.uint8))
    a = cupy.random.random((128, 784), dtype=cupy.float32)
    w = cupy.random.random((1024, 784), dtype=cupy.float32)
    c = cupy.empty((128, 1024), cupy.float32)
    s = cupy.cuda.Stream(non_blocking=True)
    launch = gemm.bind(c, a, w.T)
    launch(s)
    s.synchronize()
    err = float(cupy.abs(c - a @ w.T).max())
    say(f"   cuBLAS on our handle: max abs diff from cupy.matmul {err:.2e}")
    c.fill(0)
    with s:
        s.begin_capture()
        launch(s)
        g = s.end_capture()
    g.launch(s)
    s.synchronize()
    err = float(cupy.abs(c - a @ w.T).max())
    say(f"   cuBLAS inside a captured graph: max abs diff {err:.2e}; DOT {len(g.debug_dot_str())} chars")
    gemm.close()


def run_tests(smoke: bool) -> None:
    files = ["tests/test_gpu_backend.py"] if smoke else ["tests/test_gpu.py", "tests/test_gpu_backend.py"]
    say(f"\n== tests: pytest {' '.join(files)}")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *files], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    for line in (r.stdout + r.stderr).strip().splitlines()[-15:]:
        say("   " + line)


def mnist_like(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.random((n, 784), dtype=np.float32), rng.integers(0, 10, n).astype(np.int32)


def gemm_candidates(batch: int) -> None:
    """Each MLP GEMM, replayed 200 times: cuBLAS on our handle inside a CUDA graph vs CuPy eager vs torch."""
    import cupy

    from renaissance_nb.gpu.cublas import WORKSPACE_BYTES, Gemm
    say(f"\n== capture-safe GEMM candidates, batch {batch} (us per product, 200 replays)")
    gemm = Gemm(cupy.empty(WORKSPACE_BYTES, cupy.uint8))
    s = cupy.cuda.Stream(non_blocking=True)
    shapes = []
    for a, b in zip(LAYERS[:-1], LAYERS[1:]):
        shapes += [(f"fwd {a}->{b}", (batch, a), (a, b)), (f"dW {b}x{a}", (b, batch), (batch, a))]
    for name, sa, sb in shapes:
        x, w = cupy.random.random(sa, dtype=cupy.float32), cupy.random.random(sb, dtype=cupy.float32)
        out = cupy.empty((sa[0], sb[1]), cupy.float32)
        launch = gemm.bind(out, x, w)
        launch(s)
        with s:
            s.begin_capture()
            for _ in range(200):
                launch(s)
            g = s.end_capture()
        g.launch(s)
        s.synchronize()
        t = time.perf_counter()
        g.launch(s)
        s.synchronize()
        ours = (time.perf_counter() - t) / 200 * 1e6
        ref = cupy.matmul(x, w)
        err = float(cupy.abs(ref - out).max() / cupy.abs(ref).max())
        with s:
            cupy.matmul(x, w, out=out)
            s.synchronize()
            t = time.perf_counter()
            for _ in range(200):
                cupy.matmul(x, w, out=out)
            s.synchronize()
        eager = (time.perf_counter() - t) / 200 * 1e6
        say(f"   {name:16s} cuBLAS-in-graph {ours:7.1f}   cupy.matmul eager {eager:7.1f}   max rel diff {err:.1e}")
    try:
        import nvmath  # noqa: F401
        say("   nvmath-python is installed: not measured here (cuBLAS-in-graph needs no extra dependency)")
    except ImportError:
        say("   nvmath-python: not installed")
    gemm.close()


def ours(device: str, batch: int, x: np.ndarray, y: np.ndarray, data: str = "device", capture: str = "entry",
         clip: float | None = None) -> tuple[Callable[[], float], float]:
    net = rnb.seq(rnb.fc(1024, bias=True), rnb.relu(), rnb.fc(512, bias=True), rnb.relu(), rnb.fc(256, bias=True),
                  rnb.relu(), rnb.fc(10, bias=True))
    task = (rnb.DeepLearningTask("mlp").model(net).data(train=(x, y), batch_size=batch)
            .loss(rnb.CrossEntropyLoss().label_smoothing(0.1)).optimizer(rnb.AdamW().lr(1e-3))
            .total_epochs(100).seed(0).device(device, data=data, capture=capture).clip_grad_norm(clip))
    t = time.perf_counter()
    task.compile()
    compile_s = time.perf_counter() - t

    def epoch() -> float:
        t0 = time.perf_counter()
        task.run(epochs=1, progress=False)
        return time.perf_counter() - t0
    return epoch, compile_s


def torch_contender(kind: str, batch: int, x: np.ndarray, y: np.ndarray, device: str, loader: bool
                    ) -> tuple[Callable[[], float], float]:
    import torch
    dev = torch.device(device)
    torch.manual_seed(0)
    layers: list[Any] = []
    for a, b in zip(LAYERS[:-1], LAYERS[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1]).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=(kind == "fused" and device == "cuda"))
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    fwd = model
    compile_s = 0.0
    if kind == "compile":
        fwd = torch.compile(model, mode="max-autotune")
    n = len(x)
    if loader:
        xs, ys = torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))
        if device == "cuda":
            xs, ys = xs.pin_memory(), ys.pin_memory()
    else:
        xs, ys = torch.from_numpy(x).to(dev), torch.from_numpy(y.astype(np.int64)).to(dev)

    def step(xb: Any, yb: Any) -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(fwd(xb), yb).backward()
        opt.step()

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    if kind == "compile":
        t = time.perf_counter()
        for _ in range(3):  # cudagraph trees record on the warm-up calls
            step(xs[:batch].to(dev, non_blocking=True), ys[:batch].to(dev, non_blocking=True))
        sync()
        compile_s = time.perf_counter() - t
    gen = torch.Generator(device="cpu").manual_seed(0)

    def epoch() -> float:
        perm = torch.randperm(n, generator=gen)
        if not loader:
            perm = perm.to(dev)
        sync()
        t0 = time.perf_counter()
        for s in range(0, n - batch + 1, batch):  # full batches only: torch.compile would recompile a partial one
            idx = perm[s:s + batch]
            xb, yb = xs[idx], ys[idx]
            if loader:
                xb, yb = xb.to(dev, non_blocking=True), yb.to(dev, non_blocking=True)
            step(xb, yb)
        sync()
        return time.perf_counter() - t0
    return epoch, compile_s


def bench(batch: int, device: str, n: int, rounds: int, compiled: bool = False) -> None:
    """One interleaved comparison. compiled=False: ours in every mode against PyTorch eager;
    compiled=True: ours (one graph per step) against torch.compile, run last because
    max-autotune may take minutes to compile and the device time is capped."""
    x, y = mnist_like(n)
    what = "against torch.compile" if compiled else "against PyTorch eager"
    say(f"\n== one epoch of the MLP, batch {batch}, {n} samples ({n // batch} steps), {rounds} interleaved rounds, "
        f"{what}")
    contenders: dict[str, tuple[Callable[[], float], float]] = {}
    modes = [("device", "entry", None)]
    if device == "cuda":  # the last: what clip_grad_norm(1.0) adds to a step (its norm and scaling kernels)
        modes = [("device", "step", None)] if compiled else [("device", "step", None), ("device", "entry", None),
                                                             ("pinned", "step", None), ("device", "step", 1.0)]
    for data, capture, clip in modes:
        name = f"renaissance_nb (data={data}, capture={capture})" if device == "cuda" else "renaissance_nb"
        name += f" clip_grad_norm({clip})" if clip else ""
        got = stage(name, lambda data=data, capture=capture, clip=clip: ours(device, batch, x, y, data, capture, clip))
        if got:
            contenders[name] = got
    try:
        import torch  # noqa: F401
        if STAND_IN:
            raise ImportError
    except ImportError:
        say("   torch not installed or a stand-in dry run: PyTorch contenders skipped")
    else:
        for loader in ((False, True) if not compiled else ()):
            tag = "loader" if loader else "on device"
            for kind, label in (("eager", "torch eager"), ("fused", "torch eager fused AdamW")):
                got = stage(f"{label} ({tag})", lambda k=kind, ld=loader: torch_contender(k, batch, x, y, device, ld))
                if got:
                    contenders[f"{label} ({tag})"] = got
        if compiled:
            got = stage("torch.compile", lambda: torch_contender("compile", batch, x, y, device, False))
            if got:
                contenders["torch.compile max-autotune (on device)"] = got
    if not contenders:
        return
    for name, (_, cs) in contenders.items():
        if cs:
            say(f"   compile/warm-up: {name}: {cs:.2f} s")
    times: dict[str, list[float]] = {k: [] for k in contenders}
    for _ in range(rounds):
        for name, (epoch, _) in list(contenders.items()):
            got = stage(f"epoch of {name}", epoch)
            if got is None:
                contenders.pop(name)
                times.pop(name)
            else:
                times[name].append(got)
    med = {k: statistics.median(v[1:] if len(v) > 1 else v) for k, v in times.items() if v}
    for name, m in med.items():
        say(f"   {name:48s} {m * 1e3:9.1f} ms/epoch  ({m / (n // batch) * 1e6:8.1f} us/step)")
    ours_names = [k for k in med if k.startswith("renaissance_nb")]
    refs = [k for k in med if not k.startswith("renaissance_nb")]
    targets = {"torch eager (on device)": 0.2, "torch.compile max-autotune (on device)": 0.5}
    for o in ours_names:
        for r in refs:
            goal = f"  (target <= {targets[r]})" if r in targets and device == "cuda" else ""
            say(f"   {o} / {r}: {med[o] / med[r]:6.3f}x{goal}")


def conv_bench(device: str, n: int, rounds: int) -> None:
    """The original's conv net (three conv-BN-ReLU stages, max pooling, gap, fc; AdamW, label
    smoothing 0.1), batch 128, on MNIST-shaped images: ours against PyTorch eager, interleaved."""
    from convnet_mnist import convnet
    rng = np.random.default_rng(0)
    x, y = rng.random((n, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, n).astype(np.int32)
    batch = 128
    say(f"\n== conv net, one epoch, batch {batch}, {n} images ({n // batch} steps), {rounds} interleaved rounds")

    def ours_conv() -> tuple[Callable[[], float], float]:
        task = (rnb.DeepLearningTask("conv").model(convnet()).data(train=(x, y), batch_size=batch)
                .loss(rnb.CrossEntropyLoss().label_smoothing(0.1)).optimizer(rnb.AdamW().lr(1e-3))
                .total_epochs(100).seed(0).device(device, capture="step" if device == "cuda" else "entry"))
        t = time.perf_counter()
        task.compile()
        return (lambda: _timed(lambda: task.run(epochs=1, progress=False))), time.perf_counter() - t

    def torch_conv() -> tuple[Callable[[], float], float]:
        import torch
        from torch import nn
        dev = torch.device(device)
        torch.manual_seed(0)

        def cbr(cin: int, cout: int) -> list[Any]:
            return [nn.Conv2d(cin, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]
        model = nn.Sequential(*cbr(1, 32), nn.MaxPool2d(2), *cbr(32, 64), nn.MaxPool2d(2), *cbr(64, 128),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10)).to(dev)
        model = model.to(memory_format=torch.channels_last)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
        xs, ys = torch.from_numpy(x).to(dev), torch.from_numpy(y.astype(np.int64)).to(dev)
        gen = torch.Generator(device="cpu").manual_seed(0)

        def epoch() -> float:
            perm = torch.randperm(n, generator=gen).to(dev)
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for s in range(0, n - batch + 1, batch):
                idx = perm[s:s + batch]
                opt.zero_grad(set_to_none=True)
                loss_fn(model(xs[idx].contiguous(memory_format=torch.channels_last)), ys[idx]).backward()
                opt.step()
            if device == "cuda":
                torch.cuda.synchronize()
            return time.perf_counter() - t0
        return epoch, 0.0

    contenders = {}
    makers = (("renaissance_nb conv net", ours_conv),) + (() if STAND_IN else
                                                        (("torch eager conv net (on device)", torch_conv),))
    for name, make in makers:
        got = stage(name, make)
        if got:
            contenders[name] = got
    times: dict[str, list[float]] = {k: [] for k in contenders}
    for _ in range(rounds):
        for name, (epoch, _) in contenders.items():
            got = stage(f"epoch of {name}", epoch)
            if got is not None:
                times[name].append(got)
    med = {k: statistics.median(v[1:] if len(v) > 1 else v) for k, v in times.items() if v}
    for name, m in med.items():
        say(f"   {name:48s} {m * 1e3:9.1f} ms/epoch  ({m / (n // batch) * 1e6:8.1f} us/step)")
    if len(med) == 2:
        a, b = med.values()
        say(f"   renaissance_nb / torch eager: {a / b:6.3f}x")


def _timed(f: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def stream_report() -> None:
    """The seed MLP's training step as the executor runs it (gpu/deps.py, gpu/streams.py): each entry's
    stream, the event edges, and the waits one epoch issued in entry mode."""
    x, y = mnist_like(2048)
    task = (rnb.DeepLearningTask("streams").model(rnb.seq(rnb.fc(1024), rnb.relu(), rnb.fc(10)))
            .data(train=(x, y), batch_size=128).optimizer(rnb.AdamW()).total_epochs(1).seed(0).device("cuda"))
    task.run(progress=False)
    rx = task.runner.replay
    sg = rx.stream_graph()
    say("\n== streams: " + ", ".join(f"{r['gid']}@{r['stream']}" for r in sg.entries))
    names = [r["gid"] for r in sg.entries]
    for i, j, kind in sg.edges:
        say(f"   {(sg.previous[i]['gid'] + ' (previous step)') if kind == 'across' else names[i]} -> {names[j]}")
    say(f"   one epoch of {len(task.result.step_losses)} steps issued {rx.order.waits} event waits")


def memory_report() -> None:
    """Planned vs measured on the device (#25): CuPy's pool and cudaMemGetInfo beside the plan's arena
    and the data the plan keeps on the device, after compile and through one epoch of the seed MLP
    (inspector/resident.py; samples at the start, every 16 steps and at the epoch's end)."""
    from renaissance_nb.inspector.resident import ResidentMemory
    from renaissance_nb.text import human_bytes
    n = 2048 if STAND_IN else 60000
    x, y = mnist_like(n)
    say(f"\n== planned vs measured device memory: the seed MLP, batch 128, {n} samples on the device")
    net = rnb.seq(rnb.fc(1024), rnb.relu(), rnb.fc(512), rnb.relu(), rnb.fc(256), rnb.relu(), rnb.fc(10))
    task = (rnb.DeepLearningTask("memory").model(net).data(train=(x, y), batch_size=128).optimizer(rnb.AdamW())
            .total_epochs(1).seed(0).device("cuda", data="device"))
    task.compile()
    reading = task.memory_inspector.device_memory()
    if reading is None:
        say("   CuPy sees no device (a stand-in dry run): no reading, as designed")
        return
    say("   after compile: " + reading.summary())
    rss = ResidentMemory(every=16)
    task.run(callbacks=[rss], progress=False)
    rows = rss.rows()
    used = [r["pool_used"] for r in rows]
    say(f"   one epoch, {len(rows)} samples: pool used {human_bytes(min(used))} to {human_bytes(max(used))}, pool "
        f"total at most {human_bytes(max(r['pool_total'] for r in rows))}, device in use at most "
        f"{human_bytes(max(r['device_used'] for r in rows))}; planned arena {human_bytes(reading.arena)} + data "
        f"{human_bytes(reading.data)}")
    say("   " + rss.summary())


def use_stand_in() -> None:
    """Serve device("cuda") with the tests' CPU stand-in for CuPy (tests/cuda_emulator.py, built by
    g++): a dry run of this script's GPU branch, to catch its own mistakes before device time is spent."""
    sys.path.insert(0, str(ROOT / "tests"))
    import cuda_emulator

    import renaissance_nb.gpu.executor as gpu_executor
    module = cuda_emulator.EmulatedModule()
    info = gpu_device.DeviceInfo("CPU stand-in (tests/cuda_emulator.py)", "90", 0.0, "-", 0, 0)
    gpu_device.probe = lambda: (info, "")  # type: ignore[assignment]
    gpu_executor.cupy_runtime = lambda: cuda_emulator.emulated_runtime(module)  # type: ignore[assignment]
    STAND_IN.append(True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="", help="also write the report here")
    ap.add_argument("--smoke", action="store_true", help="no GPU: CPU device, small data, no torch.compile")
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--stand-in", action="store_true",
                    help="no GPU: a dry run of the GPU branch (ours only, small data) on the tests' CPU stand-in")
    a = ap.parse_args()
    if a.stand_in:
        use_stand_in()
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text("")
        OUT_FILE.append(Path(a.out))
    versions()
    gpu = gpu_device.probe()[0] is not None and not a.smoke
    if gpu and not STAND_IN:
        stage("diagnostics", diagnose)
    if not a.skip_tests:
        stage("tests", lambda: run_tests(not gpu))
    real = gpu and not STAND_IN
    if gpu:
        stage("stream edges", stream_report)
        stage("device memory against the plan", memory_report)
    if real:
        for b in (128, 512):
            stage(f"GEMM candidates at batch {b}", lambda b=b: gemm_candidates(b))
    for b in (128, 512):
        bench(b, "cuda" if gpu else "cpu", 60000 if real else 2048, a.rounds if real else 2)
    conv_bench("cuda" if gpu else "cpu", 60000 if real else 512, 3 if real else 2)
    if real:
        for b in (128, 512):
            bench(b, "cuda", 60000, a.rounds, compiled=True)


if __name__ == "__main__":
    main()

"""Side-by-side CPU benchmark: renaissance_nb vs PyTorch on the original's MNIST MLP.

    python benchmarks/mlp_cpu.py                 # batch 128 and 32, 3 interleaved rounds
    python benchmarks/mlp_cpu.py --quick         # fewer samples, for a smoke run
    python benchmarks/mlp_cpu.py --markdown FILE # also write the results table (docs/benchmarks.md)
    python benchmarks/mlp_cpu.py --openblas      # also our replay on NumPy's threaded matmul

Each contender runs in its own process (``--same-process`` puts them in this one), and the
epochs are interleaved A B C D A B C D..., medians compared, so machine noise hits every
contender alike. Contenders: renaissance_nb (replay of the compiled step), with
``--openblas`` the same replay on NumPy's threaded matmul (RNB_OWN_THREADS=0), with
``--other-blas`` the same replay with its bands on the other sgemm (OpenBLAS or oneMKL), with
``--no-program`` the same replay kernel by kernel from Python instead of one native program per
16 steps (RNB_PROGRAM=0),
PyTorch eager with default AdamW (foreach), with fused AdamW, and torch.compile (its compile
time is reported separately). Also printed: compile() time, the fraction of the GEMM roofline
(step FLOPs over the 1024^3 sgemm rate, the faster of NumPy's and our own product's, measured
in our process in bursts between segments of 64 steps of an extra, untimed epoch per round;
the median over segments), and
arena bytes against each
framework's peak resident memory growth, measured in fresh subprocesses.
PyTorch is optional: without it the script says what it skipped.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import renaissance_nb as rnb  # noqa: E402

LAYERS = (784, 1024, 512, 256, 10)


def load_data(n: int) -> tuple[np.ndarray, np.ndarray, str]:
    shared = ROOT.parent / "shared" / "data" / "mnist"
    if shared.exists():
        s = rnb.datasets.mnist(shared)
        return s.train.x[:n], s.train.y[:n], "MNIST (shared/data)"
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, 784), dtype=np.float32), rng.integers(0, 10, n).astype(np.int32), "random 784-d"


def step_flops(batch: int) -> float:
    """Forward + weight-gradient + input-gradient GEMMs (no input gradient for layer 1)."""
    macs = sum(a * b for a, b in zip(LAYERS[:-1], LAYERS[1:]))
    first = LAYERS[0] * LAYERS[1]
    return 2.0 * batch * (3 * macs - first)


def _median_time(f, reps: int = 10) -> float:  # type: ignore[no-untyped-def]
    f()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def sgemm_rate() -> float:
    """The 1024^3 sgemm rate that sets the roofline: NumPy's matmul, or, where our products call
    another BLAS (oneMKL), our own banded product of that size if it is faster."""
    a = np.random.default_rng(0).standard_normal((1024, 1024), dtype=np.float32)
    c = np.empty_like(a)
    best = _median_time(lambda: np.matmul(a, a, out=c))
    blas = sys.modules.get("renaissance_nb.kernels.blas")
    if blas is not None and blas.THREADED and blas.SGEMM.name != "openblas":
        product = blas.gemm(a, a, c)
        with blas.own_cores():
            best = min(best, _median_time(product))
    return 2 * 1024**3 / best


def mlp():  # type: ignore[no-untyped-def]
    return rnb.seq(rnb.fc(1024), rnb.relu(), rnb.fc(512), rnb.relu(), rnb.fc(256), rnb.relu(), rnb.fc(10))


ROOFLINE_EVERY = 64
"""Steps per roofline segment (callbacks come every 16 steps): about 0.4 s at batch 128 here."""
OPENBLAS_KIND = "ours-openblas"
"""Our replay with NumPy's own threaded matmul and single-threaded passes (RNB_OWN_THREADS=0, set
in its process before import): what the one-pool design of kernels/blas.py gains."""
NO_PROGRAM_KIND = "ours-no-program"
"""Our replay kernel by kernel from Python (RNB_PROGRAM=0): what packing the step into one native
program (kernels/program.py) gains."""
OTHER_BLAS_KIND = "ours-other-blas"
"""Our replay with its bands calling the other sgemm (RNB_BLAS=openblas where MKL is the default,
mkl where it is installed but not chosen): what the choice of BLAS gains."""


def our_sgemm() -> tuple[str, str]:
    """(the sgemm our bands call by default here, the other one if it loads, else "")."""
    from renaissance_nb.kernels import blas
    loaded = blas.loaded_sgemms() if blas.THREADED else {}
    other = [k for k in loaded if k != blas.SGEMM.name]
    return (blas.SGEMM.name if blas.THREADED else "np.matmul"), (other[0] if other else "")


def kind_env(kind: str) -> dict[str, str]:
    """The environment a contender's process imports renaissance_nb under."""
    if kind == OPENBLAS_KIND:
        return {"RNB_OWN_THREADS": "0"}
    if kind == OTHER_BLAS_KIND:
        return {"RNB_BLAS": our_sgemm()[1]}
    if kind == NO_PROGRAM_KIND:
        return {"RNB_PROGRAM": "0"}
    return {}


def roofline_epoch(task, flops_per_step: float, every: int = ROOFLINE_EVERY) -> list[tuple[float, float, int]]:  # type: ignore[no-untyped-def]
    """One more epoch of ``task``, cut into segments of ``every`` steps with a burst of our own 1024^3
    product (both threads, as the step's products run) before and after each: per segment,
    (step FLOPs at the mean of its two burst rates / its time per step, that rate, its steps;
    an epoch shorter than ``every`` steps gets one segment of its whole 16-step blocks). A
    segment lasts about 0.4 s, so the rate it is held against is the machine's speed of
    that moment: this VM's sgemm rate moves between 140 and 300 GFLOP/s from one second to
    the next, and one rate per 3 s epoch paired a slow epoch with a fast burst or the reverse.
    A NumPy matmul that beats our banded product (OpenBLAS's threads, say) raises every
    burst by that ratio, measured back to back around the epoch. The bursts evict the
    caches between segments, which can only slow the step; the tail after the last whole
    segment is not counted."""
    from renaissance_nb.kernels import blas
    a = np.random.default_rng(0).standard_normal((1024, 1024), dtype=np.float32)
    c = np.empty_like(a)
    product = blas.gemm(a, a, c)
    with blas.own_cores():
        ours = _median_time(product, 5)
    boost = max(1.0, ours / _median_time(lambda: np.matmul(a, a, out=c), 5))
    time.sleep(0.3)  # OpenBLAS's workers spin for about 0.1 s after NumPy's product: let them stop
    marks: list[tuple[int, float, float, float]] = []  # (steps done, segment end, burst rate, next start)
    done, size = [0], [every]

    def burst() -> float:
        return boost * 2 * 1024**3 / _median_time(product, 3)

    def mark(kind: str, info: dict) -> None:
        if kind == "start":  # an epoch shorter than a segment gets segments of whole 16-step blocks
            size[0] = min(every, max(16, info["steps_per_epoch"] // 16 * 16))
        if kind == "step":
            done[0] += 16  # run() calls back every 16 steps
        if kind == "start" or (kind == "step" and done[0] - marks[-1][0] >= size[0]):
            end = time.perf_counter()
            rate = burst()
            marks.append((done[0], end, rate, time.perf_counter()))
    task.run(epochs=1, progress=False, callbacks=[mark])
    out = []
    for (s0, _, r0, t0), (s1, t1, r1, _) in zip(marks[:-1], marks[1:]):
        rate = (r0 + r1) / 2
        out.append((flops_per_step / rate / ((t1 - t0) / (s1 - s0)), rate, s1 - s0))
    return out


class Ours:
    name = "renaissance_nb"

    def __init__(self, x: np.ndarray, y: np.ndarray, batch: int, name: str | None = None,
                 options: dict | None = None) -> None:
        if name:
            self.name = name
        t = time.perf_counter()
        self.task = (rnb.DeepLearningTask("bench").model(mlp()).data(train=(x, y), batch_size=batch)
                     .loss(rnb.CrossEntropyLoss().label_smoothing(0.1)).optimizer(rnb.AdamW().weight_decay(1e-4))
                     .scheduler(rnb.CosineAnnealingLR().base_lr(1e-3)).total_epochs(1000).seed(0))
        if options:
            self.task.options(**options)
        self.task.compile()
        self.compile_s = time.perf_counter() - t
        self.epoch()  # warm-up: numba kernels, BLAS buffers

    def epoch(self) -> float:
        """One training epoch through the public API (no validation data is given)."""
        t = time.perf_counter()
        self.task.run(epochs=1, progress=False)
        return time.perf_counter() - t

    def roofline_epoch(self, flops_per_step: float) -> list[tuple[float, float, int]]:
        return roofline_epoch(self.task, flops_per_step)


class TorchContender:
    """PyTorch training of ``model``: AdamW (default or fused) or torch.compile with fused AdamW,
    label smoothing, random full batches of the same size as ours; compile time is kept apart."""

    NAMES = {"eager": "PyTorch eager AdamW", "fused": "PyTorch eager AdamW(fused)",
             "compile": "torch.compile AdamW(fused)"}

    def __init__(self, model, x: np.ndarray, y: np.ndarray, batch: int, mode: str,  # type: ignore[no-untyped-def]
                 weight_decay: float = 1e-2, cosine: bool = False) -> None:
        import torch
        from torch import nn
        self.torch, self.name, self.model = torch, self.NAMES[mode], model
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=weight_decay,
                                     fused=(mode != "eager") or None)
        self.sched = torch.optim.lr_scheduler.CosineAnnealingLR(self.opt, T_max=10**6) if cosine else None
        self.loss = nn.CrossEntropyLoss(label_smoothing=0.1)
        self.x, self.y = torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))
        self.batch, self.compile_s, self.forward = batch, 0.0, model
        if mode == "compile":
            self.forward = torch.compile(model)
            t = time.perf_counter()
            self._step(self.x[:batch], self.y[:batch])
            self._step(self.x[:batch], self.y[:batch])
            self.compile_s = time.perf_counter() - t
        self.epoch()

    def _step(self, xb, yb) -> None:  # type: ignore[no-untyped-def]
        self.opt.zero_grad(set_to_none=True)
        self.loss(self.forward(xb), yb).backward()
        self.opt.step()
        if self.sched is not None:
            self.sched.step()

    def epoch(self) -> float:
        torch = self.torch
        t = time.perf_counter()
        perm = torch.randperm(len(self.x))
        for i in range(0, len(self.x) - self.batch + 1, self.batch):  # full batches only: one compiled shape
            idx = perm[i:i + self.batch]
            self._step(self.x[idx], self.y[idx])
        return time.perf_counter() - t


class Torch(TorchContender):
    """The MLP in PyTorch: same layers, AdamW(weight_decay=1e-4), cosine schedule."""

    def __init__(self, x: np.ndarray, y: np.ndarray, batch: int, mode: str) -> None:
        import torch
        from torch import nn
        torch.manual_seed(0)
        layers = []
        for a, b in zip(LAYERS[:-1], LAYERS[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        super().__init__(nn.Sequential(*layers[:-1]), x, y, batch, mode, weight_decay=1e-4, cosine=True)


def peak_rss_child(which: str, batch: int, n: int, module: str = "mlp_cpu") -> dict:
    """Peak resident-memory growth of set-up plus one training epoch, and of a later epoch, in a
    fresh process (the data is loaded before the baseline, so it counts for neither side).
    ``module`` names the benchmark whose ``load(n)`` and ``make_contender`` to use."""
    code = f"""
import sys, json
sys.path.insert(0, {str(ROOT)!r}); sys.path.insert(0, {str(ROOT / 'benchmarks')!r})
import {module} as b
data = b.load({n})
if {which!r} != 'ours':
    import torch
import gc; gc.collect()
def status(key):
    for line in open('/proc/self/status'):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
open('/proc/self/clear_refs', 'w').write('5')  # reset the peak (VmHWM) to the current RSS
base = status('VmRSS')
o = b.make_contender({which!r}, {batch}, {n}, data)
extra = o.task.memory.total_bytes if {which!r} == 'ours' else 0
first = status('VmHWM') - base  # set-up and the warm-up epoch (includes JIT compilers' memory)
open('/proc/self/clear_refs', 'w').write('5')
base2 = status('VmRSS')
o.epoch()
print(json.dumps({{'rss_growth': first, 'steady_growth': status('VmHWM') - base2, 'arena': extra}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        return {"error": out.stderr[-400:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def print_memory(mem: dict, batch: int) -> None:
    """The memory lines of a benchmark report."""
    print(f"\nmemory (batch {batch}, one epoch, fresh process):")
    for k, v in mem.items():
        if "error" in v:
            print(f"  {k}: failed: {v['error']}")
        else:
            print(f"  {k}: peak RSS growth {v['rss_growth'] / 2**20:.1f} MiB through set-up and the first epoch, "
                  f"{v['steady_growth'] / 2**20:.1f} MiB more during a later epoch"
                  + (f" (arena {v['arena'] / 2**20:.1f} MiB)" if v.get("arena") else ""))


def print_times(r: dict) -> None:
    """Each contender's median epoch and step time with ours/theirs, then the compile times."""
    ours = r["median_epoch_s"]["renaissance_nb"]
    for name, t in r["median_epoch_s"].items():
        ratio = "" if name == "renaissance_nb" else f"   ours/this = {ours / t:.2f}x"
        print(f"  {name:<28} {t:7.3f} s/epoch  {1e3 * t / r['steps']:7.2f} ms/step{ratio}")
    print(f"  compile(): {r['compile_s']['renaissance_nb']:.3f} s" + "".join(
        f"; {k}: {v:.1f} s" for k, v in r["compile_s"].items() if k.startswith("torch.compile")))


def print_roofline(r: dict, roof_s: float, rate: float, where: str = "", name: str = "GEMM roofline") -> None:
    """The roofline line of a report: the products' time at the sgemm rate, and the fraction reached."""
    if not where:
        lo, hi = r["roofline_spread"]
        where = (f"median over {r['roofline_segments']} segments of {r['roofline_segment_steps']} steps, each against "
                 f"sgemm bursts just before and after it; quartiles {100 * lo:.0f}-{100 * hi:.0f}%")
    print(f"  {name}: {1e3 * roof_s:.2f} ms/step at {rate / 1e9:.0f} GFLOP/s ({where}) "
          f"-> {100 * r['roofline_fraction']:.0f}% reached")


def print_skipped(r: dict) -> None:
    for s in r["skipped"]:
        print(f"  skipped: {s}")


def load(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The training data of this benchmark: (x, y)."""
    x, y, _ = load_data(n)
    return x, y


def make_contender(kind: str, batch: int, samples: int, data=None):  # type: ignore[no-untyped-def]
    """Build one contender of this benchmark ("ours", "eager", "fused", "compile")."""
    x, y = data if data is not None else load(samples)
    if kind == OPENBLAS_KIND:
        from renaissance_nb.kernels import blas
        assert not blas.THREADED, "set RNB_OWN_THREADS=0 before importing renaissance_nb"
        return Ours(x, y, batch, "ours, OpenBLAS threads")
    if kind == OTHER_BLAS_KIND:
        from renaissance_nb.kernels import blas
        return Ours(x, y, batch, f"ours, {blas.SGEMM.name} bands")
    if kind == NO_PROGRAM_KIND:
        return Ours(x, y, batch, "ours, kernel by kernel")
    return Ours(x, y, batch) if kind == "ours" else Torch(x, y, batch, kind)


def _worker(conn, module: str, kind: str, batch: int, samples: int) -> None:  # type: ignore[no-untyped-def]
    """One contender in its own process: builds it, then runs an epoch each time it is asked."""
    try:
        import importlib
        sys.path.insert(0, str(ROOT / "benchmarks"))
        c = importlib.import_module(module).make_contender(kind, batch, samples)
        conn.send(("ready", c.name, c.compile_s))
    except Exception as exc:  # noqa: BLE001 - reported by the parent as skipped
        conn.send(("error", kind, f"{type(exc).__name__}: {str(exc)[:160]}"))
        return
    while (ask := conn.recv()) != "stop":
        if ask == "epoch":
            conn.send(c.epoch())
        else:  # ("roofline", step FLOPs)
            conn.send(c.roofline_epoch(ask[1]))


class Remote:
    """A contender living in a worker process; interleaving stays, shared process state goes."""

    def __init__(self, kind: str, batch: int, samples: int, module: str = "mlp_cpu") -> None:
        import multiprocessing as mp
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, module, kind, batch, samples), daemon=True)
        env = kind_env(kind)  # the child reads it when it imports renaissance_nb
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            self.proc.start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        status, self.name, extra = self.conn.recv()
        if status != "ready":
            self.close()
            raise RuntimeError(extra)
        self.compile_s = extra

    def epoch(self) -> float:
        self.conn.send("epoch")
        return self.conn.recv()

    def roofline(self, flops_per_step: float) -> list[tuple[float, float, int]]:
        """Our contender's roofline epoch: (fraction, sgemm rate, steps) per segment (roofline_epoch)."""
        self.conn.send(("roofline", flops_per_step))
        return self.conn.recv()

    def close(self) -> None:
        try:
            self.conn.send("stop")
        except (OSError, BrokenPipeError):
            pass
        self.proc.join(timeout=10)


def run_isolated(batch: int, samples: int, rounds: int, have_torch: bool, use_compile: bool,
                 arena_bytes: int, module: str = "mlp_cpu", kinds: list[str] | None = None,
                 flops_per_step: float = 0.0) -> dict:
    """Like run(), each contender in its own process (PyTorch's OpenMP pool and libraries loaded
    beside NumPy/OpenBLAS slowed the replay by up to 25% in one process here). With
    ``flops_per_step``, our process runs one more epoch per round after its timed one, cut
    into segments with sgemm bursts between them (Ours.roofline_epoch), and "roofline_fraction"
    is the median over every segment of every round: this machine's speed moves by up to 2x
    from one second to the next, and a rate measured apart from the steps it is compared with
    carried that into the fraction. The timed epochs run without bursts."""
    if kinds is None:
        kinds = ["ours"] + (["eager", "fused"] + (["compile"] if use_compile else []) if have_torch else [])
    elif not have_torch:
        kinds = [k for k in kinds if k.startswith("ours")]
    contenders, skipped = [], []
    for k in kinds:
        try:
            contenders.append(Remote(k, batch, samples, module))
        except RuntimeError as exc:
            skipped.append(f"{k}: {exc}")
    if not have_torch:
        skipped.append("PyTorch not installed: PyTorch contenders skipped (pip install torch)")
    times: dict[str, list[float]] = {c.name: [] for c in contenders}
    fractions, rates, sizes = [], [], []
    steps = samples // batch
    for _ in range(rounds):
        for c in contenders:
            times[c.name].append(c.epoch())
            if flops_per_step and c.name == "renaissance_nb":
                for fraction, rate, n in c.roofline(flops_per_step):
                    fractions.append(fraction)
                    rates.append(rate)
                    sizes.append(n)
    for c in contenders:
        c.close()
    out = {"batch": batch, "median_epoch_s": {k: statistics.median(v) for k, v in times.items()},
           "steps": steps, "compile_s": {c.name: c.compile_s for c in contenders}, "skipped": skipped,
           "arena_bytes": arena_bytes}
    if fractions:
        out["roofline_fraction"] = statistics.median(fractions)
        out["roofline_spread"] = statistics.quantiles(fractions, n=4)[::2] if len(fractions) > 1 else fractions * 2
        out["roofline_segments"] = len(fractions)
        out["roofline_segment_steps"] = max(sizes)
        out["sgemm_rates"] = rates
    return out


def run(batch: int, x: np.ndarray, y: np.ndarray, rounds: int, have_torch: bool, use_compile: bool) -> dict:
    contenders = [Ours(x, y, batch)]
    skipped = []
    if have_torch:
        contenders += [Torch(x, y, batch, "eager"), Torch(x, y, batch, "fused")]
        if use_compile:
            try:
                contenders.append(Torch(x, y, batch, "compile"))
            except Exception as exc:  # noqa: BLE001 - report and go on
                skipped.append(f"torch.compile failed: {type(exc).__name__}: {str(exc)[:120]}")
    else:
        skipped.append("PyTorch not installed: PyTorch contenders skipped (pip install torch)")
    times: dict[str, list[float]] = {c.name: [] for c in contenders}
    for _ in range(rounds):
        for c in contenders:
            times[c.name].append(c.epoch())
    med = {k: statistics.median(v) for k, v in times.items()}
    steps = len(x) // batch
    return {"batch": batch, "median_epoch_s": med, "steps": steps,
            "compile_s": {c.name: c.compile_s for c in contenders}, "skipped": skipped,
            "arena_bytes": contenders[0].task.memory.total_bytes}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--samples", type=int, default=60000)
    ap.add_argument("--batches", type=int, nargs="+", default=[128, 32])
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--openblas", action="store_true",
                    help="also run our replay on NumPy's threaded matmul (RNB_OWN_THREADS=0) side by side")
    ap.add_argument("--other-blas", action="store_true",
                    help="also run our replay with its bands on the other sgemm (OpenBLAS or oneMKL) side by side")
    ap.add_argument("--no-program", action="store_true",
                    help="also our replay kernel by kernel from Python (RNB_PROGRAM=0), interleaved")
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--same-process", action="store_true",
                    help="run every contender in this process (the default gives each its own process)")
    args = ap.parse_args()
    if args.quick:
        args.samples, args.rounds = 6400, 2
    try:
        import torch
        torch.set_num_threads(os.cpu_count() or 1)
        have_torch, tver = True, torch.__version__
    except ImportError:
        have_torch, tver = False, "not installed"
    x, y, data_name = load_data(args.samples)
    rates = [sgemm_rate()]
    from threadpoolctl import threadpool_info
    blas = ", ".join(f"{i['internal_api']} {i.get('version')} x{i['num_threads']}" for i in threadpool_info())
    ours_blas, other_blas = our_sgemm()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; numpy {np.__version__} "
          f"({blas}); torch {tver}; data {data_name}, {len(x)} samples; our products: {ours_blas}")
    print(f"sgemm 1024^3 (the faster of NumPy's and ours): {rates[0] / 1e9:.0f} GFLOP/s at the start, measured again between "
          "segments of our roofline epochs; "
          "contenders "
          + ("in this process" if args.same_process else "each in its own process") + ", interleaved")
    rows = []
    for batch in args.batches:
        if args.same_process:
            r = run(batch, x, y, args.rounds, have_torch, not args.no_compile)
            r["sgemm_rates"] = rates[:1]  # measured once, at the start
        else:
            kinds = ["ours"] + ([OPENBLAS_KIND] if args.openblas else [])
            kinds += [OTHER_BLAS_KIND] if args.other_blas and other_blas else []
            kinds += [NO_PROGRAM_KIND] if args.no_program else []
            kinds += (["eager", "fused"] + ([] if args.no_compile else ["compile"])) if have_torch else []
            r = run_isolated(batch, len(x), args.rounds, have_torch, not args.no_compile, 0, kinds=kinds,
                             flops_per_step=step_flops(batch))
        where = "sgemm rate measured once, at the start" if args.same_process else ""
        if not args.same_process:
            rates += r.get("sgemm_rates", [])
            if "roofline_fraction" not in r:  # no segment: the epoch is shorter than 16 steps
                r["sgemm_rates"] = rates[:1]
                where = "epochs under 16 steps: sgemm rate measured once, at the start"
        rate = statistics.median(r["sgemm_rates"])
        step_ms = 1e3 * r["median_epoch_s"]["renaissance_nb"] / r["steps"]
        roof = step_flops(batch) / rate
        r.setdefault("roofline_fraction", roof / (step_ms / 1e3))
        print(f"\nbatch {batch}: {r['steps']} steps/epoch, medians of {args.rounds} interleaved rounds")
        print_times(r)
        print_roofline(r, roof, rate, where)
        if args.other_blas and not other_blas:
            r["skipped"].append("--other-blas: only one sgemm loads here (pip install 'renaissance_nb[mkl]' for oneMKL)")
        print_skipped(r)
        rows.append(r)
    mem = {}
    if not args.no_memory:
        mem["ours"] = peak_rss_child("ours", 128, min(len(x), 60000))
        if have_torch:
            mem["torch"] = peak_rss_child("eager", 128, min(len(x), 60000))
        print_memory(mem, 128)
    if args.markdown:
        write_markdown(args.markdown, rows, mem, statistics.median(rates), f"{blas}; our products: {ours_blas}",
                       tver, data_name)
    return 0


def write_markdown(path: Path, rows: list[dict], mem: dict, rate: float, blas: str, tver: str, data: str) -> None:
    lines = [f"Machine: {os.cpu_count()}-core {platform.machine()} CPU, NumPy {np.__version__} ({blas}), "
             f"PyTorch {tver}, data: {data}; sgemm {rate / 1e9:.0f} GFLOP/s. Medians of interleaved epochs.", "",
             "| batch | contender | s/epoch | ms/step | renaissance_nb time / this |", "|---|---|---|---|---|"]
    for r in rows:
        ours = r["median_epoch_s"]["renaissance_nb"]
        for name, t in r["median_epoch_s"].items():
            lines.append(f"| {r['batch']} | {name} | {t:.3f} | {1e3 * t / r['steps']:.2f} | "
                         f"{'—' if name == 'renaissance_nb' else f'{ours / t:.2f}x'} |")
        lines.append(f"| {r['batch']} | GEMM roofline reached | | | {100 * r['roofline_fraction']:.0f}% |")
    for r in rows[:1]:
        lines.append("")
        lines.append(f"compile(): {r['compile_s']['renaissance_nb']:.3f} s" + "".join(
            f"; {k} compile: {v:.1f} s" for k, v in r["compile_s"].items() if k.startswith("torch.compile")))
    if mem:
        lines.append("")
        lines.append("Peak resident memory (batch 128, fresh process): growth through set-up and the first epoch / "
                     "extra during a later epoch: " + "; ".join(
            f"{k} {v['rss_growth'] / 2**20:.1f} / {v['steady_growth'] / 2**20:.1f} MiB" for k, v in mem.items()
            if "error" not in v)
            + (f"; renaissance_nb arena {mem['ours']['arena'] / 2**20:.1f} MiB" if "arena" in mem.get("ours", {}) else ""))
    path.write_text("\n".join(lines) + "\n")
    print(f"\nwrote {path}")


if __name__ == "__main__":
    sys.exit(main())

"""Low-precision GEMMs side by side: our bf16 and fp16 products (kernels/lowp.py) against the float32
product the package runs today (OpenBLAS sgemm bands, kernels/blas.py) and torch's bf16 matmul.

    python benchmarks/lowp_gemm.py                  # 7 interleaved rounds
    python benchmarks/lowp_gemm.py --rounds 3 --out benchmarks/results/lowp_gemm.txt
    python benchmarks/lowp_gemm.py --threads 1      # one core each: steadier on a busy machine

Shapes: every product of one training step of the seed MLP (benchmarks/mlp_cpu.py's 784-1024-512-256-10)
at batch 32 and 128, in the orientation the fc layer uses (forward y = x W^T: NT; dx = dy W: NN;
dW = dy^T x: TN), and a conv-like im2col product (a 3x3 convolution, 32 -> 64 channels on 16x16
maps, batch 32: 8192 x 288 times 288 x 64). Each contender's time is the median of a burst of calls;
bursts run A B C D A B C D... for ``--rounds`` rounds, and the median over rounds is reported, so a
neighbour's load hits every contender alike. torch runs in a worker process of its own, driven in
the same interleaving (its OpenMP pool and ours would spin against each other in one process).
Our products write float32 results (what the fc layer keeps before its bias and activation);
torch's bf16 matmul writes bf16. Operands are pre-rounded, so the float32 product multiplies the
same values. Threads: all cores (or ``--threads``) for every contender (ours: OpenMP, with
OpenBLAS at one thread per band, as a replay runs; torch: torch.set_num_threads).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from machine import machine_line  # noqa: E402

from renaissance_nb.kernels import blas, lowp  # noqa: E402

LAYERS = (784, 1024, 512, 256, 10)
CONV = ("conv 3x3 32->64, 16x16, batch 32 (im2col)", "NN", 32 * 16 * 16, 64, 9 * 32)


def mlp_products(batch: int) -> list[tuple[str, str, int, int, int]]:
    """(name, orientation, m, n, k) of every product of one step: forward, dx (not for layer 1), dW."""
    out = []
    for i, (fin, fout) in enumerate(zip(LAYERS[:-1], LAYERS[1:])):
        out.append((f"fc{i + 1} fwd {fin}->{fout}", "NT", batch, fout, fin))
        if i:
            out.append((f"fc{i + 1} dx", "NN", batch, fin, fout))
        out.append((f"fc{i + 1} dW", "TN", fout, fin, batch))
    return out


def operands(orient: str, m: int, n: int, k: int, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """op(A) (m, k) and op(B) (k, n) in ``fmt`` storage, laid out as the fc layer stores them."""
    rng = np.random.default_rng(0)
    A = lowp.round_to(rng.standard_normal((m, k)).astype(np.float32), fmt)
    B = lowp.round_to(rng.standard_normal((k, n)).astype(np.float32), fmt)
    a = A if orient[0] == "N" else np.ascontiguousarray(A.T).T
    b = B if orient[1] == "N" else np.ascontiguousarray(B.T).T
    return a, b


def contenders(orient: str, m: int, n: int, k: int, threads: int) -> dict[str, Callable[[], Any]]:
    """Our products and the package's float32 product of this shape, as zero-argument kernels."""
    out: dict[str, Callable[[], Any]] = {}
    c = np.empty((m, n), np.float32)
    for fmt, path in (("bf16", "auto"), ("bf16", "sgemm"), ("fp16", "auto")):
        try:
            p = lowp.gemm_path(fmt, path)
        except Exception:  # noqa: BLE001 - a path this build lacks is left out
            continue
        if path != "auto" and p == lowp.gemm_path(fmt):
            continue
        a, b = operands(orient, m, n, k, fmt)
        scratch = np.zeros(lowp.scratch_elems(m, n, k, fmt, "fp32", path), np.float32)
        out[f"ours {fmt} ({p})"] = lowp.gemm(a, b, c, scratch, threads, path=path)
    a, b = operands(orient, m, n, k, "bf16")
    a32, b32 = lowp.widen(a), lowp.widen(b)
    a32 = a32 if orient[0] == "N" else np.ascontiguousarray(a32.T).T
    b32 = b32 if orient[1] == "N" else np.ascontiguousarray(b32.T).T
    out["OpenBLAS sgemm fp32"] = blas.gemm(a32, b32, c, threaded=threads > 1)
    return out


def torch_kernel(orient: str, m: int, n: int, k: int) -> Callable[[], Any]:
    """torch.matmul on bf16 tensors laid out as the fc layer stores them (in the torch worker)."""
    import torch
    a, b = operands(orient, m, n, k, "bf16")
    ta = torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    tb = torch.from_numpy(np.ascontiguousarray(b).view(np.int16)).view(torch.bfloat16)
    ta = ta if orient[0] == "N" else ta.t().contiguous().t()
    tb = tb if orient[1] == "N" else tb.t().contiguous().t()
    tc = torch.empty((m, n), dtype=torch.bfloat16)
    return lambda: torch.matmul(ta, tb, out=tc)


def torch_worker(threads: int) -> None:
    """Time torch's bf16 matmul on request: a line 'orient m n k' in, the burst's median seconds out.
    Why a process of its own: torch's OpenMP pool and ours spin against each other in one process
    (every product there took milliseconds)."""
    import torch
    torch.set_num_threads(threads)
    cache: dict[str, Callable[[], Any]] = {}
    for line in sys.stdin:
        key = line.strip()
        if key not in cache:
            o, m, n, k = key.split()
            cache[key] = torch_kernel(o, int(m), int(n), int(k))
        print(burst(cache[key]), flush=True)


class TorchProcess:
    """The torch worker, or None where torch is not installed."""

    def __init__(self, threads: int) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--torch-worker", "--threads", str(threads)],
                                     stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def time(self, orient: str, m: int, n: int, k: int) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{orient} {m} {n} {k}\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def burst(f: Callable[[], Any], seconds: float = 0.05) -> float:
    """The median time of one call, over a burst of about ``seconds``."""
    f()
    t0 = time.perf_counter()
    f()
    one = max(time.perf_counter() - t0, 1e-6)
    reps = max(3, min(200, int(seconds / one)))
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure(shapes: list[tuple[str, str, int, int, int]], rounds: int, threads: int,
            worker: TorchProcess | None) -> dict:
    kernels = {s: contenders(*s[1:], threads) for s in shapes}
    times: dict[tuple, list[float]] = {}
    with blas.own_cores():
        for _ in range(rounds):
            for s, ks in kernels.items():
                for name, f in ks.items():
                    times.setdefault((s, name), []).append(burst(f))
                if worker is not None:
                    times.setdefault((s, "torch bf16 matmul"), []).append(worker.time(*s[1:]))
    return {key: statistics.median(v) for key, v in times.items()}


def report(title: str, shapes: list[tuple[str, str, int, int, int]], med: dict) -> list[str]:
    names = list(dict.fromkeys(name for (_, name) in med))
    lines = [title, f"  {'product':34s} {'m x n x k':>16s}  " + "  ".join(f"{n:>24s}" for n in names)]
    totals = dict.fromkeys(names, 0.0)
    for s in shapes:
        label, orient, m, n, k = s
        cells = []
        for name in names:
            t = med.get((s, name))
            cells.append(f"{2 * m * n * k / t / 1e9:18.1f} GF/s" if t else f"{'-':>24s}")
            totals[name] += t or float("nan")
        lines.append(f"  {label + ' ' + orient:34s} {f'{m}x{n}x{k}':>16s}  " + "  ".join(cells))
    flops = sum(2 * m * n * k for (_, _, m, n, k) in shapes)
    lines.append(f"  {'all of them, summed time':34s} {'':>16s}  "
                 + "  ".join(f"{totals[n] * 1e3:10.3f} ms {flops / totals[n] / 1e9:5.0f} GF/s" for n in names))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", type=Path, help="also write the report here")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="threads of every contender (default: all cores; 1 is steadier beside busy neighbours)")
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_worker:
        torch_worker(args.threads)
        return
    threads = args.threads
    try:
        import importlib.metadata
        tver = importlib.metadata.version("torch")
        worker: TorchProcess | None = TorchProcess(threads)
    except importlib.metadata.PackageNotFoundError:
        tver, worker = "not installed (its column is left out)", None
    from threadpoolctl import threadpool_info
    libs = ", ".join(f"{i['internal_api']} {i.get('version')}" for i in threadpool_info())
    head = [f"machine: {machine_line()}",
            f"numpy {np.__version__} ({libs}); torch {tver} (in its own process); our sgemm: {blas.SGEMM.name}; "
            f"threads: {threads}",
            f"lowp: {lowp.path()}",
            f"medians of {args.rounds} interleaved rounds of bursts; GFLOP/s = 2 m n k / time; load average at the "
            f"start: {os.getloadavg()[0]:.1f} (other processes share these cores)", ""]
    print("\n".join(head), flush=True)
    lines = list(head)
    for title, shapes in [(f"seed MLP {'-'.join(map(str, LAYERS))}, batch {b}: one step's products", mlp_products(b))
                          for b in (32, 128)] + [("conv-like", [CONV])]:
        block = report(title, shapes, measure(shapes, args.rounds, threads, worker)) + [""]
        print("\n".join(block), flush=True)
        lines += block
    if worker is not None:
        worker.close()
    if args.out:
        args.out.write_text("\n".join(lines))


if __name__ == "__main__":
    main()

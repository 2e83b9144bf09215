"""First run after an install, against PyTorch's: wall clock of fresh processes, interleaved.

    python benchmarks/cold_start.py [--pairs 3]  (rounds) [--epochs 1]

Each round runs ``python -m renaissance_nb train --epochs N`` with empty caches (a new NUMBA_CACHE_DIR
and a new RNB_CACHE_DIR, so the C kernels are compiled too: what a first run after an install, or a
new Binder or CI machine, pays), the equivalent PyTorch eager job (benchmarks/cold_start_torch.py),
and the renaissance_nb command again with an empty numba cache and ``RNB_NATIVE=0`` (the numba
kernels, as on a machine without a C compiler, with the warm-up helper of runtime/warmup.py), in
rotating order; then the renaissance_nb command with the caches warm. ``--mnist DIR`` trains on the
full MNIST there (both jobs). Printed: the machine, CPU, BLAS and threads, every time, the medians
and the ratios. Issue #28 asks cold <= 1.0x PyTorch and warm <= 0.55x.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import machine_line  # benchmarks/machine.py

ROOT = Path(__file__).resolve().parents[1]


def wall(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return time.perf_counter() - t0, out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""


def machine() -> str:
    from renaissance_nb.kernels import blas
    return f"{machine_line()} · ours: {blas.describe()}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--mnist", metavar="DIR", help="the four MNIST IDX files (default: the embedded 5k digits)")
    args = ap.parse_args()
    extra = ["--mnist", args.mnist] if args.mnist else []
    ours = [sys.executable, "-m", "renaissance_nb", "train", "--epochs", str(args.epochs), *extra]
    torch_job = [sys.executable, str(ROOT / "benchmarks" / "cold_start_torch.py"), *extra]
    base = {**os.environ, "PYTHONPATH": str(ROOT)}
    print(machine())
    print(f"data: {args.mnist or 'the embedded MNIST-5k'}, {args.epochs} epoch(s)")
    times: dict[str, list[float]] = {"cold": [], "numba": [], "torch": [], "warm": []}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.pairs):
            cache = {**base, "NUMBA_CACHE_DIR": os.path.join(tmp, f"cache{k}"), "RNB_CACHE_DIR": os.path.join(tmp, f"c{k}")}
            numba_only = {**base, "NUMBA_CACHE_DIR": os.path.join(tmp, f"nb{k}"), "RNB_NATIVE": "0"}
            jobs = [("cold", ours, cache), ("torch", torch_job, base), ("numba", ours, numba_only)]
            for name, cmd, env in jobs[k % 3:] + jobs[:k % 3]:
                s, last = wall(cmd, env)
                times[name].append(s)
                print(f"round {k + 1}: {name:5} {s:6.2f} s   {last}", flush=True)
            s, last = wall(ours, cache)
            times["warm"].append(s)
            print(f"round {k + 1}: warm  {s:6.2f} s   {last}", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        print(f"{k:5} median {med[k]:6.2f} s   spread {min(v):.2f}-{max(v):.2f}")
    print("cold: empty numba and C-kernel caches (the C kernels compiled by cc in the run); numba: an empty numba "
          "cache and RNB_NATIVE=0 (no C kernels: numba compiles, the warm-up helper on a second core)")
    print(f"cold / PyTorch = {med['cold'] / med['torch']:.2f}   numba / PyTorch = {med['numba'] / med['torch']:.2f}   "
          f"warm / PyTorch = {med['warm'] / med['torch']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

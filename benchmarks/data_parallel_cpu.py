"""Data-parallel training on the CPU: 2 MPI ranks x 1 thread against 1 process x 1 and x 2 threads.

    python benchmarks/data_parallel_cpu.py [--epochs 3] [--out benchmarks/results/data_parallel_cpu.json]

The original's MNIST MLP (784-1024-512-256-10) on the embedded MNIST-5k at global batch 128; samples/s
over the epochs after the first (which includes compiling). In the 2-rank run each rank also times the
all-reduce of the gradient slab alone (the DEEP_COMM kernel's work), which gives the per-step
communication time; the all-reduce is blocking, so none of it is hidden behind backward (the
fraction hidden is reported as measured: 0 until a bucketed Iallreduce exists).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

from machine import cpu_model  # benchmarks/machine.py


def worker(epochs: int) -> dict:
    import numpy as np

    from renaissance_nb import AdamW, DeepLearningTask, datasets
    from renaissance_nb.__main__ import original_mlp
    from renaissance_nb.kernels import blas
    from renaissance_nb.memory.region import Region
    from renaissance_nb.mpi import under_mpiexec
    task = (DeepLearningTask("bench").model(original_mlp()).data(datasets.default_mnist(), batch_size=128)
            .optimizer(AdamW()).total_epochs(epochs).seed(1))
    if under_mpiexec():
        task.distributed("mpi")
    task.compile()
    result = task.run(progress="none")
    n = len(task.splits.train)
    secs = sum(h.seconds for h in result.history[1:])
    out = {"samples_per_s": n * (epochs - 1) / secs, "steps_per_epoch": task.steps_per_epoch,
           "blas": blas.describe(), "ranks": task.config.ranks}
    runner = task.runner
    a, b = task.compiled.plan.region_range(Region.G_BN_BIAS, Region.G_DEEP_CONV)
    out["gradient_bytes"] = b - a
    if runner.dp is not None:
        from mpi4py import MPI
        view = runner.arena.bytes[a:b].view(np.float32)
        comm = runner.dp.world.comm
        comm.Barrier()
        t = time.perf_counter()
        for _ in range(50):
            comm.Allreduce(MPI.IN_PLACE, view, op=MPI.SUM)
        out["allreduce_ms"] = 1e3 * (time.perf_counter() - t) / 50
        out["step_ms"] = 1e3 * secs / ((epochs - 1) * task.steps_per_epoch)
        if runner.dp.rank:
            return {}
    return out


def run(cmd: list[str], threads: int) -> dict:
    env = {**os.environ, "NUMBA_NUM_THREADS": str(threads), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/data_parallel_cpu.json")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--model", metavar="JSON", help="print docs/scaling.md's table from a saved report")
    args = ap.parse_args()
    if args.model:
        return
    if args.worker:
        res = worker(args.epochs)
        if res:
            print(json.dumps(res))
        return
    from renaissance_nb.mpi import mpiexec_path
    me = [sys.executable, __file__, "--worker", "--epochs", str(args.epochs)]
    rows = {"1 process x 1 thread": run(me, 1), "1 process x 2 threads": run(me, 2),
            "2 ranks x 1 thread": run([mpiexec_path() or "mpiexec", "-n", "2", *me], 1)}
    two = rows["2 ranks x 1 thread"]
    report = {"machine": platform.node(), "cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
              "epochs": args.epochs, "model": "784-1024-512-256-10 MLP, MNIST-5k (4,000 train), global batch 128",
              "rows": rows, "allreduce_ms_per_step": two["allreduce_ms"], "step_ms_2_ranks": two["step_ms"],
              "allreduce_fraction_of_step": two["allreduce_ms"] / two["step_ms"],
              "hidden_fraction": 0.0}
    for k, v in rows.items():
        print(f"{k:<24} {v['samples_per_s']:9.0f} samples/s   ({v['blas']})")
    print(f"all-reduce of {two['gradient_bytes'] / 2**20:.2f} MiB of gradients: {two['allreduce_ms']:.2f} ms per step "
          f"of {two['step_ms']:.2f} ms ({100 * report['allreduce_fraction_of_step']:.1f}%), hidden: 0% (blocking)")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(scaling_table(report))


if __name__ == "__main__":
    main()


def scaling_table(report: dict) -> str:
    """docs/scaling.md's N-node model from a report: ring all-reduce time and the local batch that hides it.

    Ring all-reduce of S bytes over N ranks sends 2 (N-1)/N x S bytes per rank (reduce-scatter, then
    all-gather), in 2 (N-1) steps of latency each (5 us assumed per step). Backward is two thirds of a
    step's arithmetic (two products per forward one), so with perfect overlap the all-reduce hides when
    local_batch x (2/3) x (seconds per sample on one core) >= its time."""
    s = report["rows"]["2 ranks x 1 thread"]["gradient_bytes"]
    per_sample = 1.0 / report["rows"]["1 process x 1 thread"]["samples_per_s"]
    lines = [f"gradient slab S = {s:,} bytes; one core: {1e6 * per_sample:.0f} us per sample (forward, backward, "
             f"update), backward {1e6 * per_sample * 2 / 3:.0f} us", "",
             "| ranks N | bytes sent per rank per step | 10 Gb/s | 25 Gb/s | 100 Gb/s | local batch hiding it at 10 / 25 / 100 Gb/s |",
             "|---|---|---|---|---|---|"]
    for n in (2, 4, 8, 16, 64):
        sent = 2 * (n - 1) / n * s
        times = [sent * 8 / (g * 1e9) + 2 * (n - 1) * 5e-6 for g in (10, 25, 100)]
        hide = [int(-(-t // (per_sample * 2 / 3))) for t in times]
        lines.append(f"| {n} | {sent / 2**20:.2f} MiB | " + " | ".join(f"{1e3 * t:.2f} ms" for t in times)
                     + f" | {' / '.join(str(h) for h in hide)} |")
    return "\n".join(lines)


if __name__ == "__main__" and "--model" in sys.argv:
    print(scaling_table(json.load(open(sys.argv[sys.argv.index("--model") + 1]))))

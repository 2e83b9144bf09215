"""Data-parallel training on the CPU: 2 MPI ranks x 1 thread against 1 process x 1 and x 2 threads.

    python benchmarks/data_parallel_cpu.py [--epochs 3] [--out benchmarks/results/data_parallel_cpu.json]
                                           [--docs docs/scaling.md]
    python benchmarks/data_parallel_cpu.py --model benchmarks/results/data_parallel_cpu.json [--docs ...]

The original's MNIST MLP (784-1024-512-256-10) on the embedded MNIST-5k at global batch 128; samples/s
over the epochs after the first (which includes compiling). The 2-rank job runs three ways: the
bucketed all-reduce (an Iallreduce per layer started as backward writes it, waited in DEEP_COMM), the
same with MPICH's progress thread (MPIR_CVAR_ASYNC_PROGRESS=1), and the one blocking all-reduce of the
whole gradient slab (distributed(allreduce='slab')). In each, every rank clocks the step's all-reduce
kernels (starts and waits, or the slab's one call): the all-reduce time a step still waits for. The
fraction hidden behind backward is 1 - (that time with buckets) / (that time with the slab). Each rank
also times the slab's Allreduce alone, back to back after a barrier: what the reduction costs with
nobody computing.

With ``--docs`` the measured section and the N-node model of docs/scaling.md (between their
``<!-- data_parallel_cpu: ... -->`` markers) are rewritten from the report, so no figure is retyped.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from typing import Any

from machine import machine_line  # benchmarks/machine.py

MODEL = "784-1024-512-256-10 MLP, MNIST-5k (4,000 train), global batch 128"
TWO = ("2 ranks x 1 thread, buckets", "2 ranks x 1 thread, buckets + MPICH progress thread",
       "2 ranks x 1 thread, one slab")


def clock_comm(task: Any) -> list[float]:
    """Wrap the training step programs' all-reduce kernels with a clock; returns the running total of
    seconds spent in them (the programs are the very lists the trainer replays)."""
    from renaissance_nb.compiler.touches import COMM_OPS
    from renaissance_nb.runtime.replay import batch_variants
    runner, total = task.runner, [0.0]
    comm = {id(k) for b in runner.executor.bound for n, k in zip(b.nodes, b.kernels) if n.op in COMM_OPS}

    def timed(kernel: Any) -> Any:
        def run() -> None:
            t = time.perf_counter()
            kernel()
            total[0] += time.perf_counter() - t
        return run
    variants = batch_variants(len(task.splits.train), task.config.batch_size, "train_base", "train_last")
    for prog in {id(p): p for p in runner.replay.train_schedule(variants).steps}.values():
        prog[:] = [timed(k) if id(k) in comm else k for k in prog]
    return total


def slab_alone_ms(task: Any, repeats: int = 50) -> float:
    """The blocking Allreduce of the whole gradient slab, back to back after a barrier (nobody computing)."""
    import numpy as np
    from mpi4py import MPI

    from renaissance_nb.memory.region import Region
    a, b = task.compiled.plan.region_range(Region.G_BN_BIAS, Region.G_DEEP_CONV)
    view = np.array(task.runner.arena.bytes[a:b].view(np.float32))  # a copy: the weights stay as trained
    comm = task.runner.dp.world.comm
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(repeats):
        comm.Allreduce(MPI.IN_PLACE, view, op=MPI.SUM)
    return 1e3 * (time.perf_counter() - t) / repeats


def worker(epochs: int, allreduce: str) -> dict | None:
    from renaissance_nb import AdamW, DeepLearningTask, datasets
    from renaissance_nb.__main__ import original_mlp
    from renaissance_nb.kernels import blas
    from renaissance_nb.memory.region import Region
    from renaissance_nb.mpi import under_mpiexec
    task = (DeepLearningTask("bench").model(original_mlp()).data(datasets.default_mnist(), batch_size=128)
            .optimizer(AdamW()).total_epochs(epochs).seed(1))
    if under_mpiexec():
        task.distributed("mpi", allreduce=allreduce)
    task.compile()
    comm_s, after_first = clock_comm(task), [0.0]

    def first_epoch(event: str, info: Any) -> None:
        if event == "epoch" and info.epoch == 1:
            after_first[0] = comm_s[0]
    result = task.run(progress="none", callbacks=[first_epoch])
    n, steps = len(task.splits.train), (epochs - 1) * task.steps_per_epoch
    secs = sum(h.seconds for h in result.history[1:])
    a, b = task.compiled.plan.region_range(Region.G_BN_BIAS, Region.G_DEEP_CONV)
    out = {"samples_per_s": n * (epochs - 1) / secs, "steps_per_epoch": task.steps_per_epoch, "blas": blas.describe(),
           "ranks": task.config.ranks, "gradient_bytes": b - a, "step_ms": 1e3 * secs / steps}
    dp = task.runner.dp
    if dp is None:
        return out
    mine = {"comm_ms": 1e3 * (comm_s[0] - after_first[0]) / steps, "slab_alone_ms": slab_alone_ms(task)}
    ranks = dp.world.comm.gather(mine)
    if dp.rank:
        return None
    out.update({k: sum(r[k] for r in ranks) / len(ranks) for k in mine},
               per_rank_comm_ms=[r["comm_ms"] for r in ranks], allreduce=allreduce)
    return out


def run(cmd: list[str], threads: int, env: dict[str, str] | None = None) -> dict:
    env = {**os.environ, "NUMBA_NUM_THREADS": str(threads), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", **(env or {})}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(epochs: int) -> dict:
    from renaissance_nb.mpi import mpiexec_path
    me = [sys.executable, __file__, "--worker", "--epochs", str(epochs)]
    mpi = [mpiexec_path() or "mpiexec", "-n", "2", *me]
    rows = {"1 process x 1 thread": run(me, 1), "1 process x 2 threads": run(me, 2),
            TWO[0]: run([*mpi, "--allreduce", "buckets"], 1),
            TWO[1]: run([*mpi, "--allreduce", "buckets"], 1, {"MPIR_CVAR_ASYNC_PROGRESS": "1"}),
            TWO[2]: run([*mpi, "--allreduce", "slab"], 1)}
    slab = rows[TWO[2]]["comm_ms"]
    return {"machine": machine_line(), "epochs": epochs, "model": MODEL, "rows": rows,
            "hidden_fraction": {k: 1.0 - rows[k]["comm_ms"] / slab for k in TWO[:2]}}


def measured_markdown(report: dict) -> str:
    """docs/scaling.md's measured section, from a report."""
    rows, slab = report["rows"], report["rows"][TWO[2]]
    lines = [f"One run of `python benchmarks/data_parallel_cpu.py --docs docs/scaling.md` on {report['machine']}; "
             f"{report['model']}; {report['epochs']} epochs, figures over epochs 2..{report['epochs']} (the first "
             "compiles). The machine's 2 cores are shared with other jobs, so figures move by tens of percent "
             "between runs.", "",
             "| run | samples/s | ms per step | all-reduce kernels, ms per step (rank 0 / rank 1) | hidden behind backward |",
             "|---|---|---|---|---|"]
    for name, r in rows.items():
        comm = (f"{r['comm_ms']:.2f} ({' / '.join(f'{x:.2f}' for x in r['per_rank_comm_ms'])})"
                if "comm_ms" in r else "")
        hidden = _hidden_text(report["hidden_fraction"].get(name))
        lines.append(f"| {name} | {r['samples_per_s']:,.0f} | {r['step_ms']:.1f} | {comm} | {hidden} |")
    lines += ["", f"The gradient slab is {slab['gradient_bytes'] / 2**20:.2f} MiB; its blocking `Allreduce` alone "
              f"(back to back, nobody computing) takes {slab['slab_alone_ms']:.2f} ms. In the training step the "
              f"slab's all-reduce takes {slab['comm_ms']:.2f} ms: besides the reduction it waits for the other "
              "rank to finish its backward. \"Hidden\" is 1 - (the bucketed run's all-reduce kernels) / (the "
              "slab's): the share of that wait the overlap removed."]
    return "\n".join(lines)


def _hidden_text(fraction: float | None) -> str:
    if fraction is None:
        return ""
    if fraction >= 0:
        return f"{100 * fraction:.0f}%"
    return f"none: {1 - fraction:.1f}x the slab's wait"


def scaling_table(report: dict) -> str:
    """docs/scaling.md's N-node model from a report: ring all-reduce time and the local batch that hides it.

    Ring all-reduce of S bytes over N ranks sends 2 (N-1)/N x S bytes per rank (reduce-scatter, then
    all-gather), in 2 (N-1) steps of latency each (5 us assumed per step). Backward is two thirds of a
    step's arithmetic (two products per forward one), so with perfect overlap the all-reduce hides when
    local_batch x (2/3) x (seconds per sample on one core) >= its time."""
    s = report["rows"][TWO[2]]["gradient_bytes"]
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


def write_docs(path: str, report: dict) -> None:
    """Replace the text between each ``<!-- data_parallel_cpu: NAME -->`` and ``<!-- /data_parallel_cpu -->``."""
    text = open(path, encoding="utf-8").read()
    for name, body in (("measured", measured_markdown(report)), ("model", scaling_table(report))):
        pattern = re.compile(rf"(<!-- data_parallel_cpu: {name} -->\n)(?:(?!<!-- ).)*(<!-- /data_parallel_cpu -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"{path}: no '<!-- data_parallel_cpu: {name} -->' ... '<!-- /data_parallel_cpu -->' block")
        text = pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/data_parallel_cpu.json")
    ap.add_argument("--docs", metavar="MD", help="rewrite the measured section and model of this file")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--allreduce", default="buckets")
    ap.add_argument("--model", metavar="JSON", help="print docs/scaling.md's sections from a saved report")
    args = ap.parse_args()
    if args.worker:
        res = worker(args.epochs, args.allreduce)
        if res is not None:
            print(json.dumps(res))
        return
    if args.model:
        with open(args.model) as f:
            report = json.load(f)
    else:
        report = measure(args.epochs)
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    print(measured_markdown(report), scaling_table(report), sep="\n\n")
    if args.docs:
        write_docs(args.docs, report)


if __name__ == "__main__":
    main()

"""Data-parallel training on the CPU: 2 MPI ranks x 1 thread against 1 process x 1 and x 2 threads.

    python benchmarks/data_parallel_cpu.py [--epochs 3] [--runs 3] [--out benchmarks/results/data_parallel_cpu.json]
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

``--runs N`` measures all five N times, one after the other; the report keeps every run and the machine's
load average before each (this VM's 2 cores are shared), and the tables give the median and the range
over the runs. With ``--docs`` the measured section and the N-node model of docs/scaling.md (between their
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
    """One run of the five configurations: their rows and the fraction of the slab's wait each bucketed one hid."""
    from renaissance_nb.mpi import mpiexec_path
    me = [sys.executable, __file__, "--worker", "--epochs", str(epochs)]
    mpi = [mpiexec_path() or "mpiexec", "-n", "2", *me]
    load = os.getloadavg()[0]
    rows = {"1 process x 1 thread": run(me, 1), "1 process x 2 threads": run(me, 2),
            TWO[0]: run([*mpi, "--allreduce", "buckets"], 1),
            TWO[1]: run([*mpi, "--allreduce", "buckets"], 1, {"MPIR_CVAR_ASYNC_PROGRESS": "1"}),
            TWO[2]: run([*mpi, "--allreduce", "slab"], 1)}
    slab = rows[TWO[2]]["comm_ms"]
    return {"rows": rows, "hidden_fraction": {k: 1.0 - rows[k]["comm_ms"] / slab for k in TWO[:2]}, "load_before": load}


def measure_runs(epochs: int, runs: int) -> dict:
    return {"machine": machine_line(), "epochs": epochs, "model": MODEL, "runs": [measure(epochs) for _ in range(runs)]}


def _runs(report: dict) -> list[dict]:
    """The runs of a report (a report of one run, written before --runs, is that run)."""
    return report.get("runs") or [{"rows": report["rows"], "hidden_fraction": report["hidden_fraction"]}]


def _median(values: list[float]) -> float:
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def _spread(values: list[float], fmt: str) -> str:
    """The median, and the range over the runs when there are several: '5.15 (4.90-5.60)'."""
    med = format(_median(values), fmt)
    return med if len(values) < 2 else f"{med} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def measured_markdown(report: dict) -> str:
    """docs/scaling.md's measured section, from a report: medians and ranges over its runs."""
    runs = _runs(report)
    n, col = len(runs), (lambda name, key: [r["rows"][name][key] for r in runs])
    loads = ", ".join(f"{r['load_before']:.1f}" for r in runs if "load_before" in r)
    lines = [f"{'One run' if n == 1 else f'{n} runs, one after the other,'} of `python benchmarks/data_parallel_cpu.py "
             f"--runs {n} --docs docs/scaling.md` on {report['machine']}; {report['model']}; {report['epochs']} epochs, "
             f"figures over epochs 2..{report['epochs']} (the first compiles). The machine's 2 cores are shared with "
             "other jobs" + (f" (load average before each run: {loads})" if loads else "") + ", so each figure is "
             + ("the median over the runs and, in brackets, their range." if n > 1 else "one sample."), "",
             "| run | samples/s | ms per step | all-reduce kernels, ms per step | hidden behind backward |",
             "|---|---|---|---|---|"]
    for name in runs[0]["rows"]:
        comm = _spread(col(name, "comm_ms"), ".2f") if "comm_ms" in runs[0]["rows"][name] else ""
        hidden = (_hidden_text([r["hidden_fraction"][name] for r in runs])
                  if name in runs[0]["hidden_fraction"] else "")
        lines.append(f"| {name} | {_spread(col(name, 'samples_per_s'), ',.0f')} | {_spread(col(name, 'step_ms'), '.1f')} "
                     f"| {comm} | {hidden} |")
    slab = runs[0]["rows"][TWO[2]]
    lines += ["", f"The gradient slab is {slab['gradient_bytes'] / 2**20:.2f} MiB; its blocking `Allreduce` alone "
              f"(back to back, nobody computing) takes {_spread(col(TWO[2], 'slab_alone_ms'), '.2f')} ms. In the "
              f"training step the slab's all-reduce takes {_spread(col(TWO[2], 'comm_ms'), '.2f')} ms: besides the "
              "reduction it waits for the other rank to finish its backward. \"Hidden\" is 1 - (the bucketed run's "
              "all-reduce kernels) / (the slab's) within each run: the share of that wait the overlap removed."]
    hid = [r["hidden_fraction"][TWO[0]] for r in runs]
    if min(hid) < 0 < max(hid):
        lines[-1] += (f" Over these {n} runs it ranges from {100 * min(hid):.0f}% to {100 * max(hid):.0f}%: in "
                      f"{sum(h < 0 for h in hid)} of them the buckets waited longer than the slab, so on this shared "
                      "machine the overlap's gain is within the noise between runs.")
    return "\n".join(lines)


def _hidden_text(fractions: list[float]) -> str:
    """'14% (9%-20%)' of the runs' fractions; where the median is negative, how many times the slab's wait."""
    med = _median(fractions)
    if med < 0:
        worse = [1 - f for f in fractions]
        return f"none: {_spread(worse, '.1f')}x the slab's wait"
    if len(fractions) < 2:
        return f"{100 * med:.0f}%"
    return f"{100 * med:.0f}% ({100 * min(fractions):.0f}% to {100 * max(fractions):.0f}%)"


def scaling_table(report: dict) -> str:
    """docs/scaling.md's N-node model from a report: ring all-reduce time and the local batch that hides it.

    Ring all-reduce of S bytes over N ranks sends 2 (N-1)/N x S bytes per rank (reduce-scatter, then
    all-gather), in 2 (N-1) steps of latency each (5 us assumed per step). Backward is two thirds of a
    step's arithmetic (two products per forward one), so with perfect overlap the all-reduce hides when
    local_batch x (2/3) x (seconds per sample on one core) >= its time."""
    runs = _runs(report)
    s = runs[0]["rows"][TWO[2]]["gradient_bytes"]
    per_sample = 1.0 / _median([r["rows"]["1 process x 1 thread"]["samples_per_s"] for r in runs])
    lines = [f"gradient slab S = {s:,} bytes; one core (the median run): {1e6 * per_sample:.0f} us per sample (forward, backward, "
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
    ap.add_argument("--runs", type=int, default=3, help="measure every configuration this many times")
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
        report = measure_runs(args.epochs, args.runs)
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    print(measured_markdown(report), scaling_table(report), sep="\n\n")
    if args.docs:
        write_docs(args.docs, report)


if __name__ == "__main__":
    main()

"""Where a CPU training step of the MLP spends its time, and what bounds each part.

    python benchmarks/mlp_cpu_profile.py [--batches 128 32] [--steps 200] [--out FILE]

Prints, per batch size:
* the replayed step's kernels, grouped by (GraphId, op), in ms per step (the sum is checked
  against the wall time of the same steps);
* every matrix product twice in a row inside the step: as the step runs it (operands where
  the step left them) and again at once (operands now in cache). The gap is what memory
  costs the products; the warm figure is what OpenBLAS can do at these shapes;
* the memory system: one thread streaming a range that fits in cache and one that does not,
  and the optimizer pass over the W/G/M/V ranges hot and after evicting them.

``--track ROUNDS`` instead prints, round by round, the 1024^3 rate beside the step's products
in the step and in a tight loop: whether they follow the machine's speed.

Not a timed test: a profile to justify (or refute) an optimisation with.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numba
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from mlp_cpu import Ours, load, sgemm_rate, step_flops  # noqa: E402

from renaissance_nb.kernels import blas, fused  # noqa: E402
from renaissance_nb.runtime.replay import batch_variants  # noqa: E402

GEMM_OPS = ("fc_fwd", "fc_bwd")  # idempotent for this MLP: outputs are overwritten, the ReLU mask is 0/1


def kernel_names(ex) -> dict[int, tuple[str, str]]:  # type: ignore[no-untyped-def]
    """id(bound kernel) -> (GraphId name without its A/B buffer suffix, op)."""
    names = {}
    for bg in ex.bound:
        gid = bg.name.split("/")[1].removesuffix("_A").removesuffix("_B")
        for node, k in zip(bg.nodes, bg.kernels):
            names[id(k)] = (gid, node.op)
    return names


def profile_steps(task, steps: int) -> dict:  # type: ignore[no-untyped-def]
    """Replay ``steps`` training steps, timing every kernel; fc kernels also run a second time, warm."""
    ex = task.executor
    n = len(task.config.data.train)
    sched = ex.train_schedule(batch_variants(n, task.config.batch_size, "train_base", "train_last"))
    names = kernel_names(ex)
    cold: dict[tuple[str, str], float] = defaultdict(float)
    warm: dict[tuple[str, str], float] = defaultdict(float)
    ex.view("train_base", "cursor")[0] = 0
    for k in sched.prologue:
        k()
    progs = sched.steps[:min(steps, sched.batches - 1)]
    with blas.own_cores():  # as task.run(): OpenBLAS at one thread, our bands on numba's threads
        wall = _timed_replay(progs, names, cold, warm)
    per = 1e3 / len(progs)
    return {"steps": len(progs), "cold": {k: v * per for k, v in cold.items()},
            "warm": {k: v * per for k, v in warm.items()}, "wall_ms": wall * per}


def _timed_replay(progs, names, cold, warm) -> float:  # type: ignore[no-untyped-def]
    clock = time.perf_counter
    wall = 0.0
    for prog in progs:
        for k in prog:
            key = names.get(id(k), ("?", "?"))
            t0 = clock()
            k()
            t1 = clock()
            cold[key] += t1 - t0
            wall += t1 - t0
            if key[1] in GEMM_OPS:
                k()
                warm[key] += clock() - t1
    return wall


def stream_rate(nbytes: int, reps: int = 30) -> float:
    """Bytes per second one thread reads from a range of ``nbytes`` (repeatedly: it stays in cache if it fits)."""
    a = np.ones(nbytes // 4, np.float32)
    fused.nonfinite_probe(a)
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fused.nonfinite_probe(a)
        ts.append(time.perf_counter() - t)
    return nbytes / statistics.median(ts)


@fused.jit
def _same_bytes_core(w, g, m, v):  # type: ignore[no-untyped-def]
    for k in range(w.shape[0]):
        gk = g[k]
        mk = m[k] + (gk - m[k]) * np.float32(0.1)
        vk = v[k] * np.float32(0.999) + np.float32(0.001) * gk * gk
        m[k] = mk
        v[k] = vk
        w[k] = w[k] * np.float32(0.9999999) - np.float32(1e-3) * mk


@fused.par
def same_bytes_pass(w, g, m, v):  # type: ignore[no-untyped-def]
    """AdamW's loads and stores (read w, g, m, v; write w, m, v) over the same chunks on the same
    threads (fused.adam_update_par), with its multiply-adds but without its square root and two
    divisions: the pass's memory floor."""
    n = w.shape[0]
    ch = (n + fused.PAR_CHUNKS - 1) // fused.PAR_CHUNKS
    for c in numba.prange(fused.PAR_CHUNKS):
        lo = min(n, c * ch)
        hi = min(n, lo + ch)
        _same_bytes_core(w[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi])


def optimizer_pass(task, reps: int = 20) -> tuple[float, float, float, int]:  # type: ignore[no-untyped-def]
    """(hot ms, cold ms, hot ms of same_bytes_pass, floats per range) of the AdamW pass over the
    task's own W/G/M/V ranges (on copies, so the task is untouched); cold = after streaming 64 MiB
    through the caches."""
    from renaissance_nb.kernels.operands import optimizer_ranges
    w, g, m, v = (a.copy() for a in optimizer_ranges(task.runner.env.range_view))
    lr, step = np.full(4, 1e-3, np.float32), np.zeros(1, np.int64)
    evict = np.ones(16 * 2**20, np.float32)

    update = fused.adam_update_par if blas.THREADED else fused.adam_update  # what the executor binds

    def run() -> float:
        step[0] = 0
        t = time.perf_counter()
        update(w, g, m, v, lr, step, 0.9, 0.999, 1e-8, 1e-4, True, False)
        return time.perf_counter() - t
    def floor() -> float:
        t = time.perf_counter()
        same_bytes_pass(w, g, m, v)
        return time.perf_counter() - t
    with blas.own_cores():  # no idle OpenBLAS worker spinning beside numba's threads
        run()
        floor()
        hot, bare = [], []
        for _ in range(reps):  # interleaved: the machine's speed drifts
            hot.append(run())
            bare.append(floor())
        cold = []
        for _ in range(reps):
            evict += 1.0
            cold.append(run())
    return 1e3 * statistics.median(hot), 1e3 * statistics.median(cold), 1e3 * statistics.median(bare), w.size


def report(batch: int, steps: int, x: np.ndarray, y: np.ndarray) -> list[str]:
    task = Ours(x, y, batch).task
    before = sgemm_rate()
    time.sleep(0.3)  # OpenBLAS's workers stop spinning before the profiled steps
    p = profile_steps(task, steps)
    rate = (before + sgemm_rate()) / 2  # the machine's speed drifts: measured around these very steps
    lines = [f"batch {batch}: {p['steps']} steps profiled, kernels sum to {p['wall_ms']:.2f} ms/step"]
    total = p["wall_ms"]
    for key, ms in sorted(p["cold"].items(), key=lambda kv: -kv[1]):
        if ms >= 0.005:
            lines.append(f"  {key[0] + ':' + key[1]:<36} {ms:7.3f} ms  {100 * ms / total:5.1f}%")
    cold_g = sum(v for k, v in p["cold"].items() if k[1] in GEMM_OPS)
    warm_g = sum(p["warm"].values())
    flops = step_flops(batch)
    lines.append(f"  matrix products: {cold_g:.2f} ms in the step ({flops / cold_g / 1e6:.0f} GFLOP/s), "
                 f"{warm_g:.2f} ms run again at once ({flops / warm_g / 1e6:.0f} GFLOP/s): "
                 f"{cold_g - warm_g:.2f} ms/step is operands coming from memory")
    hot, cold, bare, floats = optimizer_pass(task)
    params = sum(int(np.prod(q.shape)) for q in task.compiled.params)
    in_step = sum(v for k, v in p["cold"].items() if k[1] == "optimizer")
    lines.append(f"  optimizer: {params} parameters in ranges of {floats} floats (with alignment and padded rows), "
                 f"{28 * floats / 2**20:.1f} MiB read and written per step; "
                 f"{in_step:.2f} ms in the step, {hot:.2f} ms with its ranges in cache, {cold:.2f} ms after "
                 f"evicting them; {bare:.2f} ms in cache for its loads and stores alone (no sqrt, no division)")
    rest = total - cold_g - in_step
    lines.append(f"  step = products {cold_g:.2f} + optimizer {in_step:.2f} + the rest {rest:.2f} ms; the products "
                 f"alone at the 1024^3 rate would take {flops / rate * 1e3:.2f} ms (the roofline; sgemm "
                 f"{rate / 1e9:.0f} GFLOP/s, measured just before and after the profiled steps)")
    need = flops / rate * 1e3 / 0.75
    lines.append(f"  75% of the roofline needs a step of at most {need:.2f} ms; the products as they run in the step "
                 f"plus the optimizer's loads and stores alone take {cold_g + bare:.2f} ms, with nothing else")
    return lines


def track(batch: int, rounds: int, x: np.ndarray, y: np.ndarray) -> list[str]:
    """Whether the step's products follow the machine's speed: per round, our 1024^3 product's
    rate (bursts before and after), the step's fc kernels as the step runs them (cold) and run
    again at once (warm) over 30 profiled steps, and each fc kernel in a tight loop of five calls."""
    task = Ours(x, y, batch).task
    names = kernel_names(task.executor)
    sched = task.executor.train_schedule(batch_variants(len(task.config.data.train), batch, "train_base", "train_last"))
    fcs = [k for k in sched.steps[2] if names.get(id(k), ("", ""))[1] in GEMM_OPS]
    a = np.random.default_rng(0).standard_normal((1024, 1024), dtype=np.float32)
    big = blas.gemm(a, a, np.empty_like(a))
    flops = step_flops(batch)

    def burst() -> float:
        big()
        return 2 * 1024**3 / statistics.median(_timed(big) for _ in range(3))

    def tight() -> float:
        total = 0.0
        for k in fcs:
            k()  # its operands into cache
            total += statistics.median(_timed(k) for _ in range(4))
        return flops / total

    lines = [f"batch {batch}: GFLOP/s per round: 1024^3 bursts before/after | fc kernels in the step, cold and "
             "warm | the same kernels in a tight loop | step ms"]
    with blas.own_cores():
        for _ in range(rounds):
            b0 = burst()
            p = profile_steps(task, 30)
            cold = sum(v for k, v in p["cold"].items() if k[1] in GEMM_OPS)
            warm = sum(p["warm"].values())
            lines.append(f"  {b0 / 1e9:4.0f} / {burst() / 1e9:4.0f} | {flops / cold / 1e6:4.0f}  {flops / warm / 1e6:4.0f}"
                         f" | {tight() / 1e9:4.0f} | {p['wall_ms']:.2f}")
            print(lines[-1], flush=True)
    return lines


def _timed(k) -> float:  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    k()
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, nargs="+", default=[128, 32])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--samples", type=int, default=60000)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--track", type=int, default=0, metavar="ROUNDS",
                    help="instead: ROUNDS rounds of bursts, in-step and tight-loop product rates side by side")
    args = ap.parse_args()
    x, y = load(args.samples)
    if args.track:
        lines = [line for batch in args.batches for line in track(batch, args.track, x, y)]
        if args.out:
            args.out.write_text("\n".join(lines) + "\n")
        return 0
    lines = [f"sgemm 1024^3: {sgemm_rate() / 1e9:.0f} GFLOP/s at the start; one thread reads "
             f"{stream_rate(4 * 2**20) / 1e9:.0f} GB/s from a 4 MiB range (cache), "
             f"{stream_rate(64 * 2**20) / 1e9:.0f} GB/s from a 64 MiB range (DRAM); our products: "
             f"{blas.SGEMM.name if blas.THREADED else 'np.matmul'} (RNB_BLAS picks)"]
    print(lines[0], flush=True)
    for batch in args.batches:
        block = report(batch, args.steps, x, y)
        print("\n".join(block), flush=True)
        lines += [""] + block
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What packing a CPU step into one native program saves: the same bound steps of an MLP replayed
kernel by kernel from Python and as native programs (kernels/program.py), 16 steps per call as
task.run() calls them, interleaved epoch by epoch, best epoch of each.

    python benchmarks/program_overhead.py            # three MLP sizes
    python benchmarks/program_overhead.py --rounds 30

The tiny MLP (784-16-8-4-10) shows the dispatch cost itself (its kernels take microseconds); the
seed MLP at batch 32 and 128 what that cost is worth beside real products and passes.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import renaissance_nb as rnb  # noqa: E402
from renaissance_nb.kernels import blas  # noqa: E402
from renaissance_nb.runtime.replay import run_schedules  # noqa: E402

SIZES = ((16, 32), (1024, 32), (1024, 128))
"""(first hidden width, batch): widths w, w/2, w/4 then 10 classes."""


def measure(width: int, batch: int, rounds: int) -> tuple[float, float, int]:
    """(seconds per step kernel by kernel, as native programs, kernels per step)."""
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4096, 784), dtype=np.float32), rng.integers(0, 10, 4096).astype(np.int32)
    mlp = rnb.seq(rnb.fc(width), rnb.relu(), rnb.fc(width // 2), rnb.relu(), rnb.fc(width // 4), rnb.relu(), rnb.fc(10))
    task = (rnb.DeepLearningTask("overhead").model(mlp).data(train=(x, y), batch_size=batch)
            .loss(rnb.CrossEntropyLoss().label_smoothing(0.1)).optimizer(rnb.AdamW().weight_decay(1e-4))
            .scheduler(rnb.CosineAnnealingLR().base_lr(1e-3)).total_epochs(1000).seed(0)).compile()
    sched = run_schedules(task.config, task.runner.executor).base
    if sched.captured is None or sched.captured.whole is None:
        raise SystemExit("the step is not one native program here (RNB_PROGRAM=0, or no C compiler)")
    whole, cursor, n = sched.captured.whole, task.runner.view("cursor"), sched.batches - 1

    def python() -> None:
        cursor[0] = 0
        for prog in sched.steps[:n]:
            for k in prog:
                k()

    def native() -> None:
        cursor[0] = 0
        for a in range(0, n, 16):
            whole.run(a, min(a + 16, n))
    best = {python: float("inf"), native: float("inf")}
    with blas.own_cores():
        python()
        native()
        for _ in range(rounds):
            for f in best:
                t = time.perf_counter()
                f()
                best[f] = min(best[f], (time.perf_counter() - t) / n)
    return best[python], best[native], len(sched.steps[0])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f}; {blas.describe()}")
    for width, batch in SIZES:
        p, q, k = measure(width, batch, args.rounds)
        print(f"784-{width}-{width // 2}-{width // 4}-10, batch {batch}, {k} kernels per step: kernel by kernel "
              f"{p * 1e6:.1f} us/step, native program {q * 1e6:.1f} us/step (best of {args.rounds} interleaved "
              f"epochs): {(p - q) * 1e6:.1f} us saved per step, {100 * (p - q) / p:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())

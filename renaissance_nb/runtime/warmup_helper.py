"""The helper process of runtime/warmup.py: the task's kernels called last to first, into numba's cache.

It reads (config without data, data shapes) from stdin, builds the same plan around zeros of those
shapes, and calls every bound kernel of a run in reverse order, so that numba compiles and caches
them while the task's own process compiles forwards; it stops when that process is gone.
"""
from __future__ import annotations

import os
import pickle
import sys
from typing import Any

import numpy as np

from ..config import TaskConfig


def _zero_data(spec: dict[str, Any]) -> Any:
    """Zeros shaped as the task's data (np.zeros maps untouched pages: only the rows read cost memory)."""
    from ..data.arrays import DataSplits, Dataset

    def one(s: tuple[tuple[int, ...], int, str] | None) -> Dataset | None:
        if s is None:
            return None
        shape, classes, name = s
        return Dataset(np.zeros(shape, np.float32), np.zeros(shape[0], np.int32), classes, name)
    train = one(spec["train"])
    assert train is not None
    return DataSplits(train, one(spec["val"]), spec["name"])


def _kernels(runner: Any) -> list[Any]:
    """Every bound kernel a run of the task calls (training, validation, EMA's), in run order, each once."""
    from .replay import batch_variants
    ex, config = runner.executor, runner.config
    plans = runner.compiled.plans
    scheds = []
    for base, last in (("train_base", "train_last"), ("train_lowres", "train_lowres_last")):
        if base in plans:
            scheds.append(ex.train_schedule([base, base] + ([last] if last in plans else [])))
    s = config.data
    if s.val is not None:
        variants = batch_variants(len(s.val), config.val_batch, "val_base", "val_last")
        scheds.append(ex.eval_schedule(variants))
        if config.ema is not None:
            scheds.append(ex.eval_schedule(variants, ema=True))
    seen: set[int] = set()
    kernels = []
    for sched in scheds:
        for k in [*sched.prologue, *(k for prog in sched.steps for k in prog)]:
            if id(k) not in seen:
                seen.add(id(k))
                kernels.append(k)
    return kernels


def compile_in_reverse(config: TaskConfig) -> int:
    """Build the task's runner and call its kernels last to first, so that numba caches each; returns
    how many ran without error (one that fails on zero data has been compiled by then all the same)."""
    from ..compiler.pipeline import compile_stage, lock_stage, plan_stage
    from ..kernels.blas import own_cores
    from .runner import Runner
    planned = plan_stage(config)
    locked = lock_stage(config, planned)
    runner = Runner(config, compile_stage(config, planned, locked), planned.lr_table)
    parent, ran = os.getppid(), 0
    with own_cores():
        for k in reversed(_kernels(runner)):
            if os.getppid() != parent:  # the task's process is gone: nobody waits for the rest
                return ran
            try:
                k()
                ran += 1
            except Exception:  # noqa: BLE001 - zeros can trip a check; the kernel compiled before it ran
                pass
        runner.shuffle_into("train", 0)  # what a run does first: the epoch's Philox permutation
    return ran


def main() -> None:
    """The helper: read (config, data shapes) from stdin and compile the task's kernels in reverse."""
    try:
        os.nice(10)  # the training process comes first
    except OSError:
        pass
    config, spec = pickle.loads(sys.stdin.buffer.read())
    compile_in_reverse(config.with_(data=_zero_data(spec)))


if __name__ == "__main__":
    main()

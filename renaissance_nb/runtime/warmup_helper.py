"""The helper process of runtime/warmup.py: the task's kernels called last to first, into numba's cache.

It reads (config without data, data shapes) from stdin, builds the same plan around zeros of those
shapes, and calls every bound kernel of a run, the first training step's in reverse order, so that
numba compiles and caches them while the task's own process compiles forwards; it stops when that
process is gone. RNB_WARMUP_LOG names a file where it notes when each kernel was done.
"""
from __future__ import annotations

import os
import pickle
import sys
import time
from typing import Any

import numpy as np

from ..config import TaskConfig
from ..kernels.cacheprobe import mark_cache_warm

_STARTED = time.perf_counter()


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
    """Every bound kernel a run of the task calls, each once, in the order the helper calls them: the
    first training step's last to first (the task's process compiles it first to last, so the two meet
    in its middle), then the rest of a run as it comes (the last batch, other resolutions, batch norm's
    folding, validation of raw and EMA weights), which the task reaches only after its first step."""
    from ..compiler.ids import GraphId
    from .replay import run_schedules
    ex = runner.executor
    scheds = run_schedules(runner.config, ex)
    first = scheds.train(0)
    groups = [[*first.prologue, *first.steps[0]][::-1], *(scheds.train(0), scheds.low),
              ex.kernels("val_base", GraphId.UPDATE_BN_INF_PARAMS),
              *(sched for sched in (scheds.val, scheds.ema) if sched is not None)]
    seen: set[int] = set()
    kernels = []
    for group in groups:
        calls = group if isinstance(group, list) else [*group.prologue, *(k for prog in group.steps for k in prog)]
        for k in calls:
            if id(k) not in seen:
                seen.add(id(k))
                kernels.append(k)
    return kernels


def compile_in_reverse(config: TaskConfig) -> int:
    """Build the task's runner and call its kernels (``_kernels`` order), so that numba caches each; returns
    how many ran without error (one that fails on zero data has been compiled by then all the same)."""
    from ..compiler.pipeline import compile_stage, lock_stage, plan_stage
    from ..kernels.blas import own_cores
    from .runner import Runner
    planned = plan_stage(config)
    locked = lock_stage(config, planned)
    runner = Runner(config, compile_stage(config, planned, locked), planned.lr_table)
    parent, ran = os.getppid(), 0
    log = _progress_log()
    with own_cores():
        for i, k in enumerate(_kernels(runner)):
            if os.getppid() != parent:  # the task's process is gone: nobody waits for the rest
                return ran
            try:
                k()
                ran += 1
            except Exception:  # noqa: BLE001 - zeros can trip a check; the kernel compiled before it ran
                pass
            log(f"kernel {i} done")
        runner.shuffle_into("train", 0)  # what a run does first: the epoch's Philox permutation
    mark_cache_warm()
    return ran


def _progress_log() -> Any:
    """``log(text)``: a line with the seconds since the helper started, to the file named by
    RNB_WARMUP_LOG (how a benchmark sees when the helper got where); a no-op without it."""
    path = os.environ.get("RNB_WARMUP_LOG")
    if not path:
        return lambda text: None

    def log(text: str) -> None:
        with open(path, "a") as f:
            f.write(f"{time.perf_counter() - _STARTED:8.3f} {text}\n")
    return log


def main() -> None:
    """The helper: read (config, data shapes) from stdin and compile the task's kernels into the cache."""
    try:
        os.nice(10)  # the training process comes first
    except OSError:
        pass
    config, spec = pickle.loads(sys.stdin.buffer.read())
    compile_in_reverse(config.with_(data=_zero_data(spec)))


if __name__ == "__main__":
    main()

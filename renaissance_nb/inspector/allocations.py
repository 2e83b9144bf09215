"""What a replayed training step allocates: numba runtime (NRT) allocations and Python's.

Why: "no allocation per step" is a claim of the product, so it is measured, not assumed. A
replayed step is ``for kernel in program: kernel()``; every buffer a kernel writes is an arena
view bound once (runtime/bind.py). What remains is numba's calling convention: a jitted function
called from Python with a NumPy array boxes it into a native array struct whose ``meminfo`` is
a small NRT record (``NRT_meminfo_new_from_pyobject``, one ``NRT_Allocate`` of about 50 bytes,
freed when the call returns). So a step's NRT allocation count equals the number of array
arguments its kernels hand to numba, all freed within the call; ``audit_allocations`` counts
both and the net growth of each, and tracemalloc's (NRT allocates through PyMem_RawMalloc,
which tracemalloc traces, so its net growth covers numba's buffers too).

NRT counts only while numba's statistics are on: ``NUMBA_NRT_STATS=1`` before numba loads, or
``enable_nrt_stats()`` here (the counters then start from that moment).
"""
from __future__ import annotations

import contextlib
import tracemalloc
import types
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np

from ..errors import ConfigError, DeviceError, PhaseError, bad_argument
from ..runtime.replay import EpochSchedule, run_schedules
from ..text import plural

if TYPE_CHECKING:
    from ..runtime.runner import Runner


def enable_nrt_stats() -> bool:
    """Turn numba's allocation counters on (a no-op when NUMBA_NRT_STATS=1 did); whether they count."""
    from numba.core.runtime import _nrt_python
    _nrt_python.memsys_enable_stats()
    return bool(_nrt_python.memsys_stats_enabled())


def nrt_counts() -> tuple[int, int]:
    """(allocations, frees) numba's runtime has counted so far."""
    from numba.core.runtime import rtsys
    s = rtsys.get_allocation_stats()
    return int(s.alloc), int(s.free)


@dataclass(frozen=True)
class StepAllocations:
    """Allocations of ``steps`` replayed training steps after a warm-up replay of the same steps."""

    steps: int
    nrt_allocs: int
    nrt_frees: int
    array_arguments: int
    python_growth: int
    per_kernel: dict[str, int] = field(default_factory=dict)

    @property
    def nrt_net(self) -> int:
        """NRT allocations not freed by the end (0: nothing held)."""
        return self.nrt_allocs - self.nrt_frees

    @property
    def per_step(self) -> float:
        """NRT allocations per replayed step (the epoch's prologue, which loads batch 0, included)."""
        return self.nrt_allocs / self.steps if self.steps else 0.0

    @property
    def only_argument_records(self) -> bool:
        """Every NRT allocation was the record of an array argument (no kernel allocated a buffer)."""
        return self.nrt_allocs == self.array_arguments

    def rows(self) -> list[tuple[str, str]]:
        """(what, measured) pairs, the table a dashboard shows."""
        return [("training steps replayed (after a warm-up)", str(self.steps)),
                ("numba allocations per step", f"{self.per_step:.1f}"),
                ("of which records of array arguments", f"{self.array_arguments} of {self.nrt_allocs}"),
                ("numba allocations still held at the end", str(self.nrt_net)),
                ("Python traced memory growth", f"{self.python_growth} B")]

    def summary(self) -> str:
        what = ("no kernel called numba with an array (the C kernels take addresses)" if self.nrt_allocs == 0 else
                "each the record numba makes for an array argument of a kernel call, freed as the call returns"
                if self.only_argument_records else
                f"{self.array_arguments} of them records of array arguments, the rest buffers a kernel allocated")
        held = "nothing held" if self.nrt_net == 0 else f"{plural(self.nrt_net, 'allocation')} held"
        return (f"{plural(self.steps, 'training step')} replayed after a warm-up: {self.nrt_allocs} numba "
                f"allocations ({self.per_step:.1f} per step), {what}; {self.nrt_frees} freed ({held}); "
                f"Python's traced memory grew by {self.python_growth} B")

    def __repr__(self) -> str:
        return f"<StepAllocations {self.summary()}>"


def _dispatcher_type() -> type:
    from numba.core.dispatcher import Dispatcher
    return Dispatcher


def _numba_cells(fn: Any, seen: set[int]) -> Iterator[Any]:
    """Closure cells (recursively through nested closures) that hold numba dispatchers."""
    if id(fn) in seen:
        return
    seen.add(id(fn))
    dispatcher = _dispatcher_type()
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(value, dispatcher):
            yield cell
        elif isinstance(value, types.FunctionType):
            yield from _numba_cells(value, seen)
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, types.FunctionType):
                    yield from _numba_cells(item, seen)


@contextlib.contextmanager
def counting_array_arguments(kernels: list[Callable[[], None]]) -> Iterator[list[int]]:
    """While open, the numba functions the kernels call from Python count the NumPy arrays they are
    handed (into the yielded one-item list); the kernels are restored afterwards."""
    counter = [0]
    cells: list[Any] = []
    seen: set[int] = set()
    for k in kernels:
        cells += list(_numba_cells(k, seen))
    originals = [c.cell_contents for c in cells]

    def counted(f: Any) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            counter[0] += sum(1 for a in args if isinstance(a, np.ndarray))
            return f(*args)
        return call
    try:
        for c, f in zip(cells, originals):
            c.cell_contents = counted(f)
        yield counter
    finally:
        for c, f in zip(cells, originals):
            c.cell_contents = f


def measurable_runner(runner: "Runner | None", op: str) -> "Runner":
    """The runner of a compiled, single-process CPU task, or a clear error: the measurements replay
    the host executor's kernels, which is what runs only there."""
    if runner is None:
        raise PhaseError(op, "PLANNING or MEMORY_LOCKED (no arena yet)", "COMPILED",
                         "Fix: call task.compile() first, then task.memory_inspector again.")
    if runner.gpu is not None or runner.device_kind != "cpu":
        raise DeviceError(f"{op}: the task runs on {runner.device_kind}; this replays the CPU kernels. Fix: measure a "
                          "task compiled with device('cpu') (on a GPU, see memory_inspector.device_memory()).")
    not_distributed(runner.config, op)
    return runner


def not_distributed(config: Any, op: str) -> None:
    """A distributed task's step cannot be replayed alone (checked from the settings, so before compiling too)."""
    if config.distributed is not None:
        raise ConfigError(f"{op}: a distributed task's step all-reduces with the other ranks, which would not be "
                          "replaying. Fix: measure the same model in one process (without distributed()).")


def check_steps(op: str, steps: Any) -> int:
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise bad_argument(ConfigError, op, "steps", steps, "an int >= 1", "pass steps=20")
    return int(steps)


def training_pass(runner: "Runner") -> tuple[EpochSchedule, Callable[[], None]]:
    """The runner's training epoch as step programs, and a zero-allocation replay of it (cursor reset)."""
    ex = runner.executor
    sched = run_schedules(runner.config, ex).base  # the trainer's own (a measured task is not distributed)
    cursor = ex.view("train_base", "cursor")

    def replay() -> None:
        cursor[0] = 0
        sched.replay()
    return sched, replay


def step_sequence(runner: "Runner", steps: int,
                  packed: bool = False) -> tuple[EpochSchedule, list[tuple[int, list[Callable[[], None]]]]]:
    """``steps`` training steps as the epoch replays them, from batch 0: (step index, program) pairs, with
    (-1, cursor reset + prologue) before batch 0 each time the pass starts again. ``packed``: the programs
    as run() calls them, runs of C kernels packed into native programs (kernels/program.py), where they are."""
    sched, _ = training_pass(runner)
    cap = sched.captured if packed else None
    prologue, programs = (sched.prologue, sched.steps) if cap is None else (cap.prologue, cap.steps)
    cursor = runner.executor.view("train_base", "cursor")

    def rewind() -> None:
        cursor[0] = 0
    start = [rewind, *prologue]
    out: list[tuple[int, list[Callable[[], None]]]] = []
    for n in range(steps):
        i = n % sched.batches
        if i == 0:
            out.append((-1, start))
        out.append((i, programs[i]))
    return sched, out


@contextlib.contextmanager
def arena_restored(runner: "Runner") -> Iterator[None]:
    """The arena's bytes (weights, moments, counters, metrics) as they were before the block: a
    measurement that trains on leaves the task untouched. Prefetched copies land before the restore."""
    runner.drain_transfers()  # a copy still landing from a stopped run would be saved half-written
    saved = runner.arena.bytes.copy()
    try:
        yield
    finally:
        try:
            runner.drain_transfers()
        finally:  # a prefetch error or a Ctrl-C while draining must not leave the replayed bytes behind
            runner.arena.bytes[:] = saved


def audit_allocations(runner: "Runner | None", steps: int = 100, op: str = "audit_allocations") -> StepAllocations:
    """Replay ``steps`` training steps of a compiled CPU task (the same steps once before, to warm up)
    and count what they allocate: NRT allocations and frees, the array arguments handed to numba,
    the growth of Python's traced memory, and NRT allocations per kernel. The steps replay as run()
    replays them (runs of C kernels as native programs, kernels/program.py); the arena is restored."""
    from ..kernels.blas import own_cores
    runner = measurable_runner(runner, op)
    steps = check_steps(op, steps)
    enable_nrt_stats()
    _, seq = step_sequence(runner, steps, packed=True)
    kernels = [k for _, prog in seq for k in prog]

    def run() -> None:
        for k in kernels:
            k()
    with own_cores(), arena_restored(runner):
        run()  # warm-up: compiles, fills caches
        a0, f0 = nrt_counts()
        growth = _traced_growth(run) - _traced_growth(lambda: None)
        a1, f1 = nrt_counts()
        with counting_array_arguments(kernels) as counter:
            run()
        per_kernel = _per_kernel(step_sequence(runner, steps)[1])
    return StepAllocations(steps, a1 - a0, f1 - f0, counter[0], growth, per_kernel)


def _traced_growth(work: Callable[[], None]) -> int:
    """How much Python's traced memory (NRT's buffers included) grew over ``work``; the caller
    subtracts the growth of an empty call, which is the measurement's own integers."""
    started = tracemalloc.is_tracing()
    if not started:
        tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        work()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        if not started:
            tracemalloc.stop()


def _per_kernel(seq: list[tuple[int, list[Callable[[], None]]]]) -> dict[str, int]:
    """NRT allocations per kernel of the steps (by its function's name), replayed in order; the
    prologues run between them uncounted."""
    out: dict[str, int] = {}
    for i, prog in seq:
        if i < 0:
            for k in prog:
                k()
            continue
        for k in prog:
            a0 = nrt_counts()[0]
            k()
            name = getattr(k, "__qualname__", type(k).__name__).replace(".<locals>", "")
            out[name] = out.get(name, 0) + nrt_counts()[0] - a0
    return out

"""How long each kernel of a CPU training step takes, measured on the compiled task's own kernels.

Why: the plan's Chrome trace orders the step's nodes; a profile gives them durations, so the trace
shows where the time goes beside what is live. ``profile_kernels`` replays training steps from
batch 0 with the runner's pre-bound step programs (the list ``task.run()`` replays), once to warm
up, then each step twice in a row: once timed whole and once timing each kernel alone
(``time.perf_counter`` around the call; the whole step as ``run()`` calls it, its C kernels packed
into one native program where they are: kernels/program.py). Interleaving keeps both measurements in the same time
window, so a neighbour process that steals the CPU for a while slows both alike. A kernel's time
is the median over the steps that ran it. Only steps of the
``train_base`` variant are timed (a partial last batch has kernels of other shapes). The arena is
restored afterwards (allocations.arena_restored), so the task trains on as if nothing ran.
"""
from __future__ import annotations

import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ..errors import ConfigError
from ..text import plural
from .allocations import arena_restored, check_steps, measurable_runner, step_sequence

if TYPE_CHECKING:
    from ..runtime.replay import EpochSchedule, Executor
    from ..runtime.runner import Runner

Label = tuple[str, int, str, str]
"""(GraphId name as bound, node index in that graph, op, layer)."""


@dataclass(frozen=True)
class KernelTiming:
    """One kernel of the step: which node it runs, and its median time over the steps that ran it."""

    gid: str
    index: int
    op: str
    layer: str
    seconds: float
    calls: int

    @property
    def key(self) -> tuple[str, int]:
        return self.gid, self.index


@dataclass(frozen=True)
class StepTimings:
    """Median seconds per kernel (in the order the step first ran them) and per whole step."""

    steps: int
    step_seconds: float
    kernels: tuple[KernelTiming, ...]
    replay: str = ""  # how run() replays the step, as timed whole (the compile note of its native capture)

    def get(self, gid: str, index: int) -> KernelTiming | None:
        """The timing of node ``index`` of GraphId ``gid`` (None: not run by a timed step)."""
        for k in self.kernels:
            if k.gid == gid and k.index == index:
                return k
        return None

    def slowest(self, n: int = 10) -> list[KernelTiming]:
        return sorted(self.kernels, key=lambda k: -k.seconds)[:n]

    def rows(self) -> list[dict[str, object]]:
        """One row per kernel: graph, node index, op, layer, median microseconds, calls."""
        return [{"graph": k.gid, "index": k.index, "op": k.op, "layer": k.layer, "us": k.seconds * 1e6,
                 "calls": k.calls} for k in self.kernels]

    def label(self, k: KernelTiming) -> str:
        """'fc_bwd (fc1)', with the graph where the same op of the same layer runs in more than one (the first
        layer's A and B buffers' graphs alternate step by step)."""
        twins = sum(1 for j in self.kernels if (j.op, j.layer) == (k.op, k.layer))
        return f"{k.op} ({k.layer or k.gid}" + (f", {k.gid}" if twins > 1 and k.layer else "") + ")"

    def summary(self) -> str:
        top = ", ".join(f"{self.label(k)} {k.seconds * 1e3:.3f} ms" for k in self.slowest(3))
        return (f"{plural(self.steps, 'training step')} timed: {self.step_seconds * 1e3:.3f} ms per step (median), "
                f"{plural(len(self.kernels), 'kernel')} over the steps' programs (the A and B buffers' alternate); "
                f"slowest: {top}" + (f"; {self.replay}" if self.replay else ""))

    def __repr__(self) -> str:
        return f"<StepTimings {self.summary()}>"


def program_labels(ex: "Executor", sched: "EpochSchedule", i: int) -> list[Label]:
    """The node each kernel of step ``i``'s program runs, by position (the program is its
    (variant, GraphId) pairs' bound kernels end to end: runtime/replay.py)."""
    assert sched.variants is not None
    labels: list[Label] = []
    for variant, gid in ex.train_step_gids(sched.variants, i):
        idx = ex.entry(variant, gid)
        if idx >= 0:
            labels += [(gid.name, j, n.op, n.layer) for j, n in enumerate(ex.bound[idx].nodes)]
    assert len(labels) == len(sched.steps[i]), (i, len(labels), len(sched.steps[i]))
    return labels


def profile_kernels(runner: "Runner | None", steps: int = 20) -> StepTimings:
    """Median seconds of each kernel of a CPU training step and of the whole step, over the
    ``train_base`` steps among ``steps`` replayed from batch 0 (see the module's doc)."""
    from ..kernels.blas import own_cores
    runner = measurable_runner(runner, "memory.profile")
    steps = check_steps("memory.profile", steps)
    sched, seq = step_sequence(runner, steps)
    packed = dict(step_sequence(runner, steps, packed=True)[1])  # the steps as run() calls them, timed whole
    timed = [(i, prog) for i, prog in seq if i >= 0 and sched.variants and sched.variants[i] == "train_base"]
    if not timed:
        raise ConfigError("memory.profile: the training set is one partial batch (variant "
                          "train_last), and only full batches are timed. Fix: a batch_size no larger than "
                          "the training set.")
    labels = {i: program_labels(runner.executor, sched, i) for i, _ in timed}
    clock = time.perf_counter
    cursor = runner.executor.view("train_base", "cursor")
    whole: list[float] = []
    samples: dict[Label, list[float]] = defaultdict(list)
    with own_cores(), arena_restored(runner):
        _replay(seq)  # warm-up: compiles, fills caches
        for i, prog in seq:  # interleaved: a whole step, then the same step kernel by kernel, so a
            if i not in labels:  # busy neighbour process slows both medians alike
                _replay([(i, prog)])
                continue
            at = int(cursor[0])
            t0 = clock()
            for k in packed[i]:
                k()
            whole.append(clock() - t0)
            cursor[0] = at  # the kernel-by-kernel run reads the same batch
            for label, k in zip(labels[i], prog):
                t0 = clock()
                k()
                samples[label].append(clock() - t0)
    kernels = tuple(KernelTiming(g, j, op, layer, statistics.median(s), len(s))
                    for (g, j, op, layer), s in samples.items())
    return StepTimings(len(whole), statistics.median(whole) if whole else 0.0, kernels,
                       runner.executor.capture_note(sched))


def _replay(seq: list[tuple[int, list[Callable[[], None]]]]) -> None:
    for _, prog in seq:
        for k in prog:
            k()

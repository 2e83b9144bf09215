"""The CPU executor: bind every atlas capture once, then replay step programs.

A step program is the flat list of bound kernels of one training step, in the
original's order (zero grad, transfer of the next batch into the other buffer,
first-layer forward, deep forward+backward, first-layer backward, NaN check,
metrics, optimizer). Programs are built once per (buffer, variant, next variant)
and an epoch is a precomputed list of references to them, so the replay loop is
``for kernel in program: kernel()`` with nothing to look up or allocate.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..compiler.atlas import ACCUM_ID, GraphAtlas
from ..compiler.stages import STEP_ORDER_A, CompiledPlan, swap_ab
from ..compiler.ids import GraphId
from ..kernels import native, program
from ..kernels.base import BindBuffer
from ..kernels.cpu import BindEnv
from ..train.epochs import EpochBatches
from .arena import Arena
from .bind import BoundGraph, bind

if TYPE_CHECKING:
    from ..config import TaskConfig

Program = list[Callable[[], None]]


@dataclass
class EpochSchedule:
    """The programs of one pass over a data set, plus the prologue that loads batch 0."""

    prologue: Program
    steps: list[Program]
    batches: int
    variants: list[str] | None = None  # each batch's variant (training passes)
    captured: program.Captured | None = None  # the programs packed as native calls (CPU, kernels/program.py)

    def replay(self) -> None:
        """The whole pass: prologue, then every step's kernels in order."""
        if self.captured is not None:
            self.captured.replay()
            return
        for k in self.prologue:
            k()
        for prog in self.steps:
            for k in prog:
                k()


def batch_variants(n: int, batch: int, base: str, last: str) -> list[str]:
    """Variant of each batch of an epoch: base, and last for a partial final batch (train/epochs.py)."""
    return EpochBatches(n, batch).labels(base, last)


@dataclass
class RunSchedules:
    """The epoch programs of a run: training at each resolution, validation of raw and EMA weights."""

    base: EpochSchedule
    low: EpochSchedule
    boundary: int  # the first epoch at the second resolution
    val: EpochSchedule | None
    ema: EpochSchedule | None

    def train(self, epoch: int) -> EpochSchedule:
        return self.low if epoch >= self.boundary else self.base


def run_schedules(config: "TaskConfig", rx: "StepPrograms") -> RunSchedules:
    """What a run of ``config`` replays through ``rx`` (the trainer's, and the warm-up helper's list)."""
    s, epoch = config.data, config.train_batches  # a rank's shard has the global pass's steps, partial alike
    assert s is not None  # compiled tasks have data
    base = rx.train_schedule(epoch.labels("train_base", "train_last"))
    low, boundary = base, config.total_epochs + 1
    if config.train_resolution is not None:
        boundary = config.train_resolution[2]
        low = rx.train_schedule(epoch.labels("train_lowres", "train_lowres_last"))
    val = ema = None
    if s.val is not None:
        val_vs = config.val_batches.labels("val_base", "val_last")
        val = rx.eval_schedule(val_vs)
        if config.ema is not None:
            ema = rx.eval_schedule(val_vs, ema=True)
    return RunSchedules(base, low, boundary, val, ema)


class StepPrograms:
    """Builds step programs from ``kernels(variant, gid)``; the backends say what a kernel is.

    On the CPU a program is the flat list of bound kernels; on the GPU it is the list of
    captured-graph launches (runtime/../gpu/executor.py). The order is the same.
    """

    def __init__(self, compiled: CompiledPlan) -> None:
        self.compiled = compiled
        self.atlas: GraphAtlas = compiled.atlas
        self._programs: dict[tuple, Program] = {}

    def kernels(self, variant: str, gid: GraphId) -> Program:  # pragma: no cover - abstract
        raise NotImplementedError

    def _program(self, key: tuple, gids: list[tuple[str, GraphId]]) -> Program:
        if key not in self._programs:
            prog: Program = []
            for variant, gid in gids:
                prog.extend(self.kernels(variant, gid))
            self._programs[key] = prog
        return self._programs[key]

    @staticmethod
    def train_step_gids(variants: list[str], i: int) -> list[tuple[str, GraphId]]:
        """The (variant, GraphId) pairs step ``i`` of a training epoch replays, in order: its
        step program is their bound kernels end to end (a pair the atlas has no entry for,
        such as an elided ZERO_GRAD, adds none). The next batch's transfer uses its variant."""
        v = variants[i]
        order = STEP_ORDER_A if i % 2 == 0 else tuple(swap_ab(g) for g in STEP_ORDER_A)
        nxt = variants[i + 1] if i + 1 < len(variants) else None
        gids: list[tuple[str, GraphId]] = []
        for gid in order:
            if gid in (GraphId.TRANSFER_A, GraphId.TRANSFER_B):
                if nxt is not None:
                    gids.append((nxt, gid))
            elif gid is GraphId.ACCUM_METRICS:
                gids.append((v, ACCUM_ID[v]))
            else:
                gids.append((v, gid))
        return gids

    def train_schedule(self, variants: list[str]) -> EpochSchedule:
        """Step programs for a training epoch whose batches have these variants."""
        steps = []
        for i, v in enumerate(variants):
            nxt = variants[i + 1] if i + 1 < len(variants) else None
            steps.append(self._program(("train", i % 2, v, nxt), self.train_step_gids(variants, i)))
        prologue = self._program(("train-pro", variants[0]),
                                 [(variants[0], GraphId.CLEAR_METRICS), (variants[0], GraphId.TRANSFER_A)])
        return EpochSchedule(prologue, steps, len(variants), list(variants))

    def eval_schedule(self, variants: list[str], ema: bool = False) -> EpochSchedule:
        """Programs for one pass of inference over the validation data (INF_EMA with ema=True)."""
        steps = []
        kind = "EMA" if ema else "MAIN"
        for i, v in enumerate(variants):
            cur, other = ("A", "B") if i % 2 == 0 else ("B", "A")
            nxt = variants[i + 1] if i + 1 < len(variants) else None
            gids = [(nxt, GraphId[f"TRANSFER_{other}"])] if nxt else []
            gids += [(v, GraphId[f"INF_{kind}_{cur}"]), (v, ACCUM_ID[v])]
            steps.append(self._program(("val", kind, i % 2, v, nxt), gids))
        prologue = self._program(("val-pro", variants[0]),
                                 [(variants[0], GraphId.CLEAR_METRICS), (variants[0], GraphId.TRANSFER_A)])
        return EpochSchedule(prologue, steps, len(variants))

    def entry(self, variant: str, gid: GraphId) -> int:
        """Phase C: the atlas index of (variant, GraphId) by array lookup; -1 if none."""
        return self.atlas.table[self.atlas.variants.index(variant)][gid]

    # Host <-> device hand-over. The host arena is the canonical copy between runs (checkpoints,
    # state_dict, evaluate read it); a device backend copies it up before a run, pushes the few
    # values the host writes during one (data order, cursors), pulls what it reads (metrics), and
    # copies everything back at epoch ends. On the CPU the host arena is the only arena: no-ops.
    def upload_all(self) -> None:
        """Host arena -> device arena."""

    def download_all(self) -> None:
        """Device arena -> host arena (waits for queued work)."""

    def push(self, *views: np.ndarray) -> None:
        """Host views just written -> the same bytes on the device."""

    def pull(self, *views: np.ndarray) -> None:
        """The device's bytes of these host views -> the host views."""

    def set_perm(self, source: str, perm: np.ndarray) -> None:
        """A new data order for ``source`` (the host's copy is already updated)."""


class Executor(StepPrograms):
    """Owns the bound graphs of a compiled task and runs epochs of them."""

    def __init__(self, compiled: CompiledPlan, arena: Arena, env: BindEnv) -> None:
        super().__init__(compiled)
        self.arena = arena
        self.views = {v: arena.views(p) for v, p in compiled.plans.items()}
        graphs = {"train": compiled.graphs.train, "inference": compiled.graphs.inference}
        self.bound: list[BoundGraph] = []
        self.outside_arena: list[tuple[str, BindBuffer]] = []
        """(bound graph, buffer) for each buffer a kernel allocated at bind time outside the arena."""
        self._packed: dict[int, tuple[Program, Program]] = {}
        self.native_programs = program.enabled()
        """Whether step programs are packed into native calls (RNB_PROGRAM when the task was bound)."""
        self.ops = {n.op for key in self.atlas.captures for n in graphs[key.graph].nodes(key.gid)}
        """The ops this plan binds (kernels/native.py decides by them)."""
        with native.chosen_for(self.ops):  # one thread pool per plan: C kernels for all of it, or numba's
            for key in self.atlas.captures:
                spec = compiled.shapes.specs[key.variant]
                benv = replace(env, batch=spec.batch)
                nodes = graphs[key.graph].nodes(key.gid)
                name = f"{key.graph}/{key.gid.name}/s{key.shape_id}"
                self.bound.append(bind(name, nodes, self.views[key.variant], benv))
                listed = {id(b) for _, b in self.outside_arena}  # benv may share env's list
                self.outside_arena += [(name, b) for b in benv.outside_arena if id(b) not in listed]

    def winograd_layers(self) -> dict[str, tuple[str, ...]]:
        """The conv layers with passes that run by Winograd (kernels/winograd.py), in order:
        layer -> those passes ("forward", "weight gradient", "input gradient")."""
        from ..kernels.winograd import layers_using
        return layers_using((n, k) for g in self.bound for n, k in zip(g.nodes, g.kernels))

    def winograd_tiles(self) -> dict[str, tuple[int, ...]]:
        """The same layers -> the tiles m of the F(m x m, 3x3) they run by (kernels/winograd.py: 4 on maps from
        7x7 where its buffers fit, else 2)."""
        from ..kernels.winograd import tiles_of
        return tiles_of((n, k) for g in self.bound for n, k in zip(g.nodes, g.kernels))

    def winograd_note(self) -> str:
        """winograd_layers as the compile note lists them ("" where none): kernels/winograd.describe."""
        from ..kernels.winograd import describe
        return describe((n, k) for g in self.bound for n, k in zip(g.nodes, g.kernels))

    def train_schedule(self, variants: list[str]) -> EpochSchedule:
        return self._capture(super().train_schedule(variants))

    def eval_schedule(self, variants: list[str], ema: bool = False) -> EpochSchedule:
        return self._capture(super().eval_schedule(variants, ema))

    def _capture(self, sched: EpochSchedule) -> EpochSchedule:
        """The schedule with its programs packed into native calls (kernels/program.py), unless RNB_PROGRAM=0
        or the C library is not loaded; each distinct program is packed once."""
        if not self.native_programs:
            return sched

        def packed(prog: Program) -> Program:
            if id(prog) not in self._packed:
                self._packed[id(prog)] = (prog, program.pack(prog))  # the list is kept: its id stays its own
            return self._packed[id(prog)][1]
        sched.captured = program.Captured(packed(sched.prologue), [packed(p) for p in sched.steps])
        return sched

    def capture_note(self, sched: EpochSchedule) -> str:
        """What the compile notes say of the CPU step's capture (this training schedule's first step)."""
        if not self.native_programs:
            why = "RNB_PROGRAM=0" if native.lib() is not None else native.status().describe()
            return f"CPU step not captured as a native program ({why}): every kernel is a Python call"
        names = {id(k): f"{g.name.split('/')[1]}:{n.op}" for g in self.bound for n, k in zip(g.nodes, g.kernels)}
        step = sched.steps[0]
        python = program.python_ops(step, lambda k: names.get(id(k), "?"))
        if not python:
            calls = sum(len(program.ops_of(k) or ()) for k in step)
            return (f"CPU step captured as one native program of {len(step)} kernels ({calls} C calls); the steps "
                    "up to each 16-step check run in one call (RNB_PROGRAM=0 replays kernel by kernel)")
        if len(python) == len(step):  # a plan bound to numba (an op without a C twin): one Python call each
            return (f"CPU step not captured as a native program ({native.plan_note(self.ops)}): every kernel is "
                    "a Python call")
        runs = sum(isinstance(k, program.NativeRun) for k in sched.captured.steps[0]) if sched.captured else 0
        return (f"CPU step not captured whole: {', '.join(python)} run in Python; the {len(step) - len(python)} "
                f"other kernels run as {runs} native program(s) between them")

    def native_calls(self, variant: str, gid: GraphId, graph: str) -> list[tuple[Any, tuple[str, ...] | None]]:
        """Each node of ``graph``'s (variant, GraphId) with the C calls its kernel makes inside the step's
        native program (program.calls_of; None: a Python kernel); empty where steps are not packed."""
        idx = self.entry(variant, gid)
        if not self.native_programs or idx < 0 or self.bound[idx].name.split("/")[0] != graph:
            return []
        return [(n, program.calls_of(k)) for n, k in zip(self.bound[idx].nodes, self.bound[idx].kernels)]

    def kernels(self, variant: str, gid: GraphId) -> Program:
        """Phase C: the bound kernels of (variant, GraphId) by array lookup; empty if none."""
        idx = self.entry(variant, gid)
        return self.bound[idx].kernels if idx >= 0 else []

    def view(self, variant: str, name: str) -> np.ndarray:
        return self.views[variant][self.compiled.ids[name]]

    def weight_view(self, name: str) -> np.ndarray:
        """A parameter's view by name (the same bytes in every variant)."""
        return self.view("train_base", name)

"""The memory inspector: the peak and what is live there, what-if plans, diffs, the largest batch.

Why: the plan knows every byte before the first step, so the questions other frameworks answer
after a run (which buffers are live at the peak and who made them, what a larger batch would
cost, which batch fits a budget) are answered here by planning alone: ``what_if`` and ``fit``
run stages 1-4 (compiler/pipeline.py plan_stage + lock_stage) on a changed config and never
bind a kernel or allocate an arena.

The timeline is the liveness timeline of memory/liveness.py: every program of a step (training,
then validation) laid end to end, one tick per node. A tensor of a reusable region (feature maps,
gradient slots, temporaries) is live over its intervals; every other tensor (weights, gradients,
optimizer state, inputs, results, scalars) holds state and is live throughout.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from ..compiler.graph import GraphNode
from ..compiler.ids import GraphId
from ..compiler.pipeline import Locked, Planned, lock_stage, plan_stage
from ..compiler.touches import node_access
from ..compiler.stages import labelled_programs
from ..config import PRECISIONS, TaskConfig
from ..errors import ConfigError, PlanError, bad_argument
from ..memory.dtensor import DTensor
from ..memory.plan import MemoryPlan
from ..memory.region import Region
from ..text import human_bytes
from .allocations import StepAllocations, audit_allocations
from .resident import DeviceMemory, device_memory_of
from .sequence import SEQUENCE_WHAT_IF, peak_by_block, peak_by_kind, sequence_changes
from .timings import StepTimings, profile_kernels

if TYPE_CHECKING:
    from ..runtime.runner import Runner
    from ..task import DeepLearningTask

CATEGORIES = ("weights", "gradients", "optimizer state", "activations", "temporaries", "inputs", "results",
              "scalars")
"""What a byte of the arena is for, in the order reports list them."""
_FAMILY_CATEGORY = {"W": "weights", "E": "weights", "B": "weights", "A": "weights", "G": "gradients",
                    "M": "optimizer state", "V": "optimizer state", "N": "optimizer state",
                    "F": "activations", "T": "temporaries", "I": "inputs", "R": "results", "S": "scalars"}
WHAT_IF_KEYS = ("batch_size", "val_batch_size", "resolution", "liveness", "pad_rows", "fuse", "optimizer", "ema",
                "precision", *SEQUENCE_WHAT_IF)


def category_of(region: Region) -> str:
    """The category of a region: weights (W, EMA copies, BN statistics), gradients, optimizer state
    (M, V), activations (feature maps, their gradient slots, dropout masks), temporaries, inputs,
    results, scalars (step counters, cursors, the learning-rate table)."""
    if region is Region.S_MASK:
        return "activations"
    return _FAMILY_CATEGORY[region.family]


@dataclass(frozen=True)
class Tick:
    """One node of the step timeline: its program, GraphId, node and position in the program."""

    time: int
    program: str
    gid: GraphId
    node: GraphNode
    index: int


@dataclass(frozen=True)
class LiveTensor:
    """A tensor as the inspector reports it: where it is, what it is for, who wrote it."""

    name: str
    category: str
    region: str
    offset: int
    nbytes: int
    producer: str
    layer: str
    live: tuple[tuple[int, int], ...]
    dtype: str = "float32"
    """Its storage dtype: mixed precision's 16-bit tensors say "bfloat16" or "float16"."""

    def as_row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class PeakReport:
    """The largest live set of a variant's step: its bytes, when, and every tensor in it."""

    variant: str
    peak_bytes: int
    arena_bytes: int
    time: int
    program: str
    op: str
    layer: str
    tensors: tuple[LiveTensor, ...]

    @property
    def by_category(self) -> dict[str, int]:
        """Live bytes at the peak per category (every category listed, in CATEGORIES order)."""
        out = dict.fromkeys(CATEGORIES, 0)
        for t in self.tensors:
            out[t.category] += t.nbytes
        return out

    @property
    def by_dtype(self) -> dict[str, int]:
        """Live bytes at the peak per storage dtype: what mixed precision keeps in 16 bits at the peak."""
        out: dict[str, int] = {}
        for t in self.tensors:
            out[t.dtype] = out.get(t.dtype, 0) + t.nbytes
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def top(self, n: int = 10) -> list[LiveTensor]:
        """The n largest tensors live at the peak."""
        return sorted(self.tensors, key=lambda t: -t.nbytes)[:n]

    def summary(self) -> str:
        cats = ", ".join(f"{k} {human_bytes(v)}" for k, v in self.by_category.items() if v)
        half = "".join(f"; {k} {human_bytes(v)}" for k, v in self.by_dtype.items() if k in ("bfloat16", "float16"))
        return (f"{self.variant}: peak {human_bytes(self.peak_bytes)} of a {human_bytes(self.arena_bytes)} arena at "
                f"{self.op} ({self.layer or '-'}) in {self.program}, {len(self.tensors)} tensors live: {cats}{half}")

    def __repr__(self) -> str:
        return f"<PeakReport {self.summary()}>"


@dataclass(frozen=True)
class PlanDiff:
    """Two plans side by side: arena and categories, regions that changed, tensors that moved."""

    arena: tuple[int, int]
    categories: dict[str, tuple[int, int]]
    regions: dict[str, tuple[int, int]]
    moved: dict[str, tuple[int, int]]
    resized: dict[str, tuple[int, int]]
    added: tuple[str, ...]
    removed: tuple[str, ...]
    labels: tuple[str, str] = ("this", "other")

    @property
    def grew(self) -> dict[str, tuple[int, int]]:
        return {k: v for k, v in self.regions.items() if v[1] > v[0]}

    @property
    def shrank(self) -> dict[str, tuple[int, int]]:
        return {k: v for k, v in self.regions.items() if v[1] < v[0]}

    def summary(self) -> str:
        a, b = self.arena
        ratio = f" ({b / a:.2f}x)" if a else ""
        return (f"arena {human_bytes(a)} ({self.labels[0]}) -> {human_bytes(b)} ({self.labels[1]}){ratio}; "
                f"{len(self.grew)} regions grew, {len(self.shrank)} shrank, {len(self.moved)} tensors moved, "
                f"{len(self.resized)} resized, {len(self.added)} added, {len(self.removed)} removed")

    def rows(self) -> list[dict[str, Any]]:
        """One row per category: bytes in each plan and the change (what a side-by-side chart draws)."""
        return [{"category": k, self.labels[0]: a, self.labels[1]: b, "change": b - a}
                for k, (a, b) in self.categories.items()]

    def __repr__(self) -> str:
        return f"<PlanDiff {self.summary()}>"


@dataclass
class MemoryInspector:
    """The memory questions of one config's plan. Built from a task (its stage values when it has
    them) or from a config, which it plans itself; either way it only plans."""

    config: TaskConfig
    planned: Planned
    locked: Locked
    label: str = "current"
    runner: "Runner | None" = field(default=None, repr=False)
    """The compiled task's runner (None before compile, and for what_if plans): what is measured."""
    _ticks: list[Tick] | None = field(default=None, repr=False)
    _producers: dict[int, Tick] | None = field(default=None, repr=False)

    @classmethod
    def of(cls, task: "DeepLearningTask") -> "MemoryInspector":
        """The inspector of a task: its own planned and locked values once it has them, else plans
        (without changing the task)."""
        return cls.from_config(task.config, task.planned, task.locked, runner=task.runner)

    @classmethod
    def from_config(cls, config: TaskConfig, planned: Planned | None = None, locked: Locked | None = None,
                    label: str = "current", runner: "Runner | None" = None) -> "MemoryInspector":
        planned = planned or plan_stage(config)
        return cls(config, planned, locked or lock_stage(config, planned), label, runner)

    # ---- measured on the compiled task (inspector/allocations.py, timings.py, resident.py) --------
    def allocations(self, steps: int = 20) -> StepAllocations:
        """What ``steps`` replayed training steps allocate (numba's per-argument records, what numba
        still holds, Python's traced growth); the arena is restored, so the task is as it was."""
        return audit_allocations(self.runner, steps, op="memory.allocations")

    def profile(self, steps: int = 20) -> StepTimings:
        """Median seconds of each kernel of a training step and of the whole step, over ``steps``
        replayed steps (arena restored); ``export.chrome_trace(..., timings=)`` lays them out in time."""
        return profile_kernels(self.runner, steps)

    def device_memory(self, cupy: Any = None) -> DeviceMemory | None:
        """On a GPU task: CuPy's pool and cudaMemGetInfo beside the planned arena and device data;
        None where CuPy sees no device."""
        return device_memory_of(self.runner, self.arena_bytes, cupy)

    # ---- the plan -------------------------------------------------------------------------------
    @property
    def variants(self) -> list[str]:
        return list(self.locked.plans)

    def plan(self, variant: str = "train_base") -> MemoryPlan:
        if not isinstance(variant, str) or variant not in self.locked.plans:
            raise bad_argument(PlanError, "memory.plan", "variant", variant, f"one of {self.variants}",
                               "pass a variant name such as 'train_base'")
        return self.locked.plans[variant]

    @property
    def arena_bytes(self) -> int:
        return self.plan().total_bytes

    def by_category(self, variant: str = "train_base") -> dict[str, int]:
        """Arena bytes per category: the regions' sizes (packed regions count once)."""
        out = dict.fromkeys(CATEGORIES, 0)
        for span in self.plan(variant).regions.values():
            out[category_of(span.region)] += span.size
        return out

    def ticks(self) -> list[Tick]:
        """The step timeline, one tick per node (the liveness timeline's numbering)."""
        if self._ticks is None:
            ticks, t0 = [], 0
            for title, prog in labelled_programs(self.locked.graphs):
                ticks += [Tick(t0 + i, title, gid, n, i) for i, (gid, n) in enumerate(prog)]
                t0 += len(prog) + 1
            self._ticks = ticks
        return self._ticks

    def producers(self) -> dict[int, Tick]:
        """Tensor id -> the first tick that writes it: as an output, in place, or in the whole range a
        region-wide op updates (the optimizer: weights and moments; the EMA) (compiler/touches.py)."""
        if self._producers is None:  # live_at() asks at every tick of a trace
            out: dict[int, Tick] = {}
            plan = self.plan()
            for tick in self.ticks():
                for tid in sorted(node_access(tick.node, plan)[1]):
                    out.setdefault(tid, tick)
            self._producers = out
        return self._producers

    def _live(self, t: DTensor, prod: dict[int, Tick]) -> LiveTensor:
        tick = prod.get(t.id)
        lives = self.locked.lifetimes or {}
        live = tuple(lives.get(t.id, ())) if t.region.reusable and self.locked.lifetimes is not None else ()
        return LiveTensor(t.name, category_of(t.region), t.region.name, int(t.offset or 0), t.storage_bytes,
                          tick.node.op if tick else "-", tick.node.layer if tick else "", live, t.dtype)

    def live_at(self, time: int, variant: str = "train_base") -> list[LiveTensor]:
        """Every tensor live at a tick: the stateful ones, and the reusable ones whose intervals hold it."""
        ticks = self.ticks()
        last = ticks[-1].time if ticks else 0
        if isinstance(time, (bool, np.bool_)) or not isinstance(time, (int, np.integer)) or not 0 <= time <= last:
            raise bad_argument(ConfigError, "memory.live_at", "time", time, f"a tick in [0, {last}] (the step's "
                               "timeline: memory.ticks())", "pass e.g. memory.peak().time")
        prod = self.producers()
        return [self._live(t, prod) for t in self.plan(variant) if _is_live(t, time, self.locked)]

    def live_bytes(self, variant: str = "train_base") -> np.ndarray:
        """Live bytes at every tick (index = tick number; the gaps between programs included)."""
        plan = self.plan(variant)
        ticks = self.ticks()
        end = (ticks[-1].time + 1) if ticks else 1
        delta = np.zeros(end + 1, np.int64)
        for t in plan:
            if not t.region.reusable or self.locked.lifetimes is None:
                delta[0] += t.storage_bytes
                continue
            for a, b in self.locked.lifetimes.get(t.id, ()):
                delta[a] += t.storage_bytes
                delta[b + 1] -= t.storage_bytes
        return np.cumsum(delta)[:end]

    def peak(self, variant: str = "train_base") -> PeakReport:
        """The tick where the most bytes are live in ``variant``'s plan, and every tensor live there
        with its category, region, offset, bytes, producer op and layer."""
        live = self.live_bytes(variant)
        ticks = self.ticks()
        if not ticks:
            raise PlanError("memory.peak: the plan has no nodes. Fix: compile a model first.")
        at = max(ticks, key=lambda k: (int(live[k.time]), -k.time))
        tensors = tuple(self.live_at(at.time, variant))
        return PeakReport(variant, int(live[at.time]), self.plan(variant).total_bytes, at.time, at.program,
                          at.node.op, at.node.layer, tensors)

    def peak_by_kind(self, variant: str = "train_base") -> dict[str, int]:
        """Bytes live at the peak by kind: weights, gradients, moments, activations, attention scores..."""
        return peak_by_kind(self, variant)

    def peak_by_block(self, variant: str = "train_base") -> dict[str, int]:
        """Bytes live at the peak by block (a transformer block, a ResNet block; other layers by name)."""
        return peak_by_block(self, variant)

    # ---- other plans ----------------------------------------------------------------------------
    def what_if(self, **changes: Any) -> "MemoryInspector":
        """The inspector of this config with ``changes`` (batch_size, val_batch_size, resolution=(h, w),
        liveness, pad_rows, fuse, optimizer: an Optimizer or a menu name such as 'sgd' (optim.menu()), ema: a decay or
        None, precision: 'bf16', 'fp16' or 'fp32'; for a language model context (the window length), heads, attention ('materialized' or 'flash'),
        recompute), planned only: no kernels, no arena."""
        config = changed_config(self.config, changes)
        label = ", ".join(f"{k}={_short(v)}" for k, v in changes.items()) or "unchanged"
        return MemoryInspector.from_config(config, label=label)

    def diff(self, other: "MemoryInspector | DeepLearningTask", variant: str = "train_base") -> PlanDiff:
        """This plan against another (an inspector, e.g. from what_if, or a task)."""
        task_like = all(hasattr(other, a) for a in ("config", "planned", "locked", "runner"))  # a DeepLearningTask
        if not isinstance(other, MemoryInspector) and not task_like:
            raise bad_argument(ConfigError, "memory.diff", "other", other, "a MemoryInspector or a DeepLearningTask",
                               "pass e.g. memory.what_if(batch_size=256), or another task")
        if not isinstance(other, MemoryInspector):
            other = MemoryInspector.of(other)
        a, b = self.plan(variant), other.plan(variant)
        ca, cb = self.by_category(variant), other.by_category(variant)
        regions = {r.name: (a.regions[r].size if r in a.regions else 0, b.regions[r].size if r in b.regions else 0)
                   for r in Region if r is not Region.END}
        ta, tb = {t.name: t for t in a}, {t.name: t for t in b}
        both = [n for n in ta if n in tb]
        return PlanDiff(
            (a.total_bytes, b.total_bytes), {k: (ca[k], cb[k]) for k in CATEGORIES},
            {k: v for k, v in regions.items() if v[0] != v[1]},
            {n: (int(ta[n].offset or 0), int(tb[n].offset or 0)) for n in both if ta[n].offset != tb[n].offset},
            {n: (ta[n].storage_bytes, tb[n].storage_bytes) for n in both
             if ta[n].storage_bytes != tb[n].storage_bytes},
            tuple(n for n in tb if n not in ta), tuple(n for n in ta if n not in tb), (self.label, other.label))

    def batch_changes(self, batch: int) -> dict[str, int]:
        """The settings ``fit`` changes for a batch size: batch_size, and val_batch_size with it
        when it follows the training batch (unset or equal), since every variant sizes the arena."""
        follow = self.config.val_batch_size in (None, self.config.batch_size)
        return {"batch_size": batch, **({"val_batch_size": batch} if follow else {})}

    def fit(self, budget_bytes: int, over: str = "batch_size") -> int:
        """The largest batch size (``over="batch_size"``) or, for a language model, context length
        (``over="context"``) whose arena fits in ``budget_bytes``: a search over plans, the rest as now.
        A batch is at most the training set's size; a context at most 2**20 positions."""
        budget = _positive_bytes(budget_bytes)
        assert self.config.data is not None
        if over not in ("batch_size", "context"):
            raise bad_argument(ConfigError, "memory.fit", "over", over, "'batch_size' or 'context'",
                               "pass over='context' to fit a language model's window length")
        hi_limit = len(self.config.data.train) if over == "batch_size" else 1 << 20

        def changes(n: int) -> dict[str, int]:
            return self.batch_changes(n) if over == "batch_size" else {"context": n}

        def fits(n: int) -> bool:
            return self.what_if(**changes(n)).arena_bytes <= budget
        if not fits(1):
            need = self.what_if(**changes(1)).arena_bytes
            what = "batch" if over == "batch_size" else over
            raise PlanError(f"memory.fit({budget_bytes}): even {what} 1 needs an arena of {human_bytes(need)}. "
                            "Fix: a larger budget, or a smaller model.")
        lo, hi = 1, 2
        while hi <= hi_limit and fits(hi):
            lo, hi = hi, hi * 2
        hi = min(hi, hi_limit + 1)
        while hi - lo > 1:  # lo fits, hi does not (or is past the data)
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo

    def by_dtype(self, variant: str = "train_base") -> dict[str, int]:
        """Arena bytes per storage dtype ("float32", "bfloat16", ...): what mixed precision moved to half
        precision. They add up to the arena: a region whose tensors share bytes (F, T) counts its size once,
        split over its dtypes in proportion to their tensors' slots where it holds several."""
        plan, out = self.plan(variant), {}
        for region, span in plan.regions.items():
            slots: dict[str, int] = {}
            for t in plan:
                if t.region is region:
                    slots[t.dtype] = slots.get(t.dtype, 0) + t.slot_bytes
            total = sum(slots.values())
            shares = {dtype: span.size * n // total for dtype, n in slots.items()}
            if shares:  # what the floors leave goes to the region's largest dtype: the split adds up
                big = max(slots, key=lambda d: slots[d])
                shares[big] += span.size - sum(shares.values())
            for dtype, n in shares.items():
                out[dtype] = out.get(dtype, 0) + n
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def summary(self) -> str:
        cats = ", ".join(f"{k} {human_bytes(v)}" for k, v in self.by_category().items() if v)
        half = {k: v for k, v in self.by_dtype().items() if k in ("bfloat16", "float16")}
        low = "".join(f"; {k} {human_bytes(v)}" for k, v in half.items())
        return f"MemoryInspector({self.label}): arena {human_bytes(self.arena_bytes)}: {cats}{low}"

    def __repr__(self) -> str:
        return f"<{self.summary()}>"

    def __iter__(self) -> Iterator[Tick]:
        return iter(self.ticks())


def _is_live(t: DTensor, time: int, locked: Locked) -> bool:
    if not t.region.reusable or locked.lifetimes is None:
        return True
    return any(a <= time <= b for a, b in locked.lifetimes.get(t.id, ()))


def _positive_bytes(value: Any) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer, float)) or not 1 <= value < math.inf:
        raise bad_argument(ConfigError, "memory.fit", "budget_bytes", value, "a number of bytes >= 1",
                           "pass e.g. 64 << 20 for 64 MiB")
    return int(value)


def _short(v: Any) -> str:
    return v if isinstance(v, str) else (type(v).__name__ if hasattr(v, "state") else repr(v))


def changed_config(config: TaskConfig, changes: dict[str, Any]) -> TaskConfig:
    """``config`` with the what-if changes applied and checked (the builder's own checks where it has them)."""
    from ..optim import from_menu  # the optimizer definitions bind kernels: imported when asked
    unknown = [k for k in changes if k not in WHAT_IF_KEYS]
    if unknown:
        raise bad_argument(ConfigError, "memory.what_if", unknown[0], changes[unknown[0]], f"one of {WHAT_IF_KEYS}",
                           "pass e.g. what_if(batch_size=256) or what_if(liveness=False)")
    fields: dict[str, Any] = {}
    for key, value in changes.items():
        if key in ("batch_size", "val_batch_size"):
            if value is None and key == "val_batch_size":
                fields[key] = None
                continue
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise bad_argument(ConfigError, "memory.what_if", key, value, "an int >= 1", f"pass {key}=64")
            fields[key] = int(value)
        elif key in ("liveness", "pad_rows", "fuse"):
            if not isinstance(value, (bool, np.bool_)):
                raise bad_argument(ConfigError, "memory.what_if", key, value, "True or False", f"pass {key}=False")
            fields[key] = bool(value)
        elif key == "optimizer":  # an optimizer, or a choice of the optimizer menu by its name (optim/)
            fields[key] = from_menu(value, "memory.what_if", key)
        elif key == "ema":
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not 0.0 < value < 1.0):
                raise bad_argument(ConfigError, "memory.what_if", key, value, "a decay in (0, 1) or None",
                                   "pass ema=0.999 (or None for no EMA)")
            fields[key] = None if value is None else float(value)
        elif key == "precision":
            if not isinstance(value, str) or value not in PRECISIONS:
                raise bad_argument(ConfigError, "memory.what_if", key, value, f"one of {sorted(PRECISIONS)}",
                                   "pass precision='bf16' (or 'fp16', 'fp32')")
            fields[key] = value
        elif key in SEQUENCE_WHAT_IF:
            fields.update(sequence_changes(config.with_(**fields), key, value))
        else:
            fields["data"] = _resized_data(config, value)
    return config.with_(**fields)


def _resized_data(config: TaskConfig, hw: Any) -> Any:
    """The config's data with images of another height and width, for planning only: zero-stride
    arrays of the new shape (no memory), so plan_stage sees the new sample shape."""
    data = config.data
    assert data is not None
    if (not isinstance(hw, (tuple, list)) or len(hw) != 2
            or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1 for v in hw)):
        raise bad_argument(ConfigError, "memory.what_if", "resolution", hw, "(height, width), ints >= 1",
                           "pass resolution=(32, 32)")
    if len(data.train.sample_shape) != 3:
        raise bad_argument(ConfigError, "memory.what_if", "resolution", hw, "image data (N, C, H, W)",
                           "ask for a resolution only for a model trained on images")

    def resized(ds: Any) -> Any:
        if ds is None:
            return None
        shape = (len(ds), ds.sample_shape[0], int(hw[0]), int(hw[1]))
        return dataclasses.replace(ds, x=np.broadcast_to(np.zeros((), np.float32), shape))
    return dataclasses.replace(data, train=resized(data.train), val=resized(data.val))

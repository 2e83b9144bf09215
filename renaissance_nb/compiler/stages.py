"""The five compiler stages, each a pure function returning an inspectable value, in the order they run.

    1 derive_all_shapes -> 2 compute_max_slot_bytes -> 3 build_computation_graph
      -> 4 create_memory_plans -> 5 share_or_clone

Stage 1 lists every tensor of every variant; stage 2 takes, per tensor position,
the largest size over the variants; stage 3 builds the zero-shape graphs (they need
only tensor ids); stage 4 places the tensors once with the stage-2 sizes, packed by
the liveness of stage 3's step order (so a tensor has the same offset in every
variant), and derives the six variant plans; stage 5 decides which (graph, GraphId,
ShapeId) triples are bound, sharing where shapes agree. compiler/pipeline.py groups
them into the task's plan(), lock_memory() and compile().
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import PlanError, ShapeError
from ..memory.dtensor import padded_bytes, row_pitch
from ..memory.liveness import Lifetimes, lifetimes_from_programs
from ..memory.plan import MemoryPlan
from ..text import human_bytes, plural
from ..memory.region import PARAM_FAMILIES
from ..train.epochs import EpochBatches
from .atlas import GraphAtlas, build_atlas
from .graph import ComputationGraph, GraphNode
from .ids import GraphId
from .emit import StepOptions, emit_inference_graph, emit_training_graph
from .layers import ArchPlan, TensorTable, tensor_table

VARIANTS = ("train_base", "train_last", "train_lowres", "train_lowres_last", "val_base", "val_last")


@dataclass(frozen=True)
class VariantSpec:
    """The input of one variant: batch size and per-sample shape; used=False if it never runs."""

    name: str
    batch: int
    sample_shape: tuple[int, ...]
    used: bool = True

    @property
    def is_train(self) -> bool:
        return self.name.startswith("train")

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.batch, *self.sample_shape)


def variant_specs(train: EpochBatches, val: EpochBatches, sample_shape: tuple[int, ...],
                  lowres_shape: tuple[int, ...] | None = None,
                  train_shape: tuple[int, ...] | None = None) -> dict[str, VariantSpec]:
    """The six variants of a data set: full and last batches, two resolutions, validation.

    ``train`` is one rank's training batches (compiler/pipeline.py ``local_sizes``), ``val`` the
    validation pass's; ``train_shape`` is the first training resolution (default: the data's),
    ``lowres_shape`` the one after the progressive-resizing boundary.
    """
    first = tuple(train_shape) if train_shape is not None else tuple(sample_shape)
    low = tuple(lowres_shape) if lowres_shape is not None else first
    return {
        "train_base": VariantSpec("train_base", train.batch, first),
        "train_last": VariantSpec("train_last", train.last, first),
        "train_lowres": VariantSpec("train_lowres", train.batch, low, lowres_shape is not None),
        "train_lowres_last": VariantSpec("train_lowres_last", train.last, low, lowres_shape is not None),
        "val_base": VariantSpec("val_base", val.batch, tuple(sample_shape), val.n > 0),
        "val_last": VariantSpec("val_last", val.last, tuple(sample_shape), val.n > 0),
    }


# ---- stage 1 ---------------------------------------------------------------------------
@dataclass(frozen=True)
class AllShapes:
    """Stage 1's result: each variant's tensor table."""

    specs: dict[str, VariantSpec]
    tables: dict[str, TensorTable]

    def __repr__(self) -> str:
        lines = ["AllShapes:"]
        for v, s in self.specs.items():
            lines.append(f"  {v:<18} input {s.input_shape}{'' if s.used else '  (unused)'}")
        return "\n".join(lines)


def derive_all_shapes(arch: ArchPlan, specs: dict[str, VariantSpec], num_classes: int,
                      opt_state: tuple[str, ...], total_steps: int, ema: bool = False,
                      clip: bool = False, class_weights: bool = False, tokens: bool = False,
                      recompute: bool = False, lowp: str | None = None, scaling: bool = False,
                      elide: bool = False) -> AllShapes:
    """Stage 1: every variant's tensors (same names, order and regions; shapes differ).

    Parameters must have one shape in every variant: a model whose weights depend
    on the input size (fc right after flatten) cannot change resolution.
    """
    tables = {v: tensor_table(arch, s.batch, s.sample_shape, num_classes, opt_state, total_steps, ema, clip,
                              class_weights, tokens, recompute, lowp, scaling, elide) for v, s in specs.items()}
    ref = tables["train_base"]
    for v, table in tables.items():
        if not specs[v].used:
            continue
        for a, b in zip(ref.specs, table.specs):
            if a.region.family in ("W", "B") and a.shape != b.shape:
                raise ShapeError(f"plan: {a.name} is {a.shape} at input {specs['train_base'].sample_shape} but "
                                 f"{b.shape} at {specs[v].sample_shape} ({v}); its size depends on the input "
                                 "resolution. Fix: use gap() instead of flatten() before the first fc, or train "
                                 "at one resolution.")
    return AllShapes(dict(specs), tables)


# ---- stage 2 ---------------------------------------------------------------------------
def compute_max_slot_bytes(shapes: AllShapes) -> list[int]:
    """Stage 2: per tensor position, the largest byte size over all variants.

    Also checks the invariant that makes this possible: every variant lists the
    same tensors in the same order with the same names, dtypes and regions.
    """
    tables = list(shapes.tables.items())
    ref_name, ref = tables[0]
    sizes = [0] * len(ref.specs)
    for vname, table in tables:
        if len(table.specs) != len(ref.specs):
            raise PlanError(f"compute_max_slot_bytes: variant {vname} has {len(table.specs)} tensors, "
                            f"{ref_name} has {len(ref.specs)}. Fix: layers must allocate the same tensors "
                            "in every variant.")
        for i, (a, b) in enumerate(zip(ref.specs, table.specs)):
            if (a.name, a.dtype, a.region) != (b.name, b.dtype, b.region):
                raise PlanError(f"compute_max_slot_bytes: tensor #{i} is {a.name}/{a.dtype}/{a.region.name} "
                                f"in {ref_name} but {b.name}/{b.dtype}/{b.region.name} in {vname}.")
            sizes[i] = max(sizes[i], int(np.prod(b.shape)) * np.dtype(b.dtype).itemsize)
    return sizes


# ---- stage 3 ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Graphs:
    """Stage 3's result: the training and inference graphs (no shapes inside)."""

    train: ComputationGraph
    inference: ComputationGraph

    def __repr__(self) -> str:
        return f"Graphs(\n  train={self.train!r},\n  inference={self.inference!r})"


def build_computation_graph(arch: ArchPlan, ids: dict[str, int], opts: StepOptions,
                            g_range: tuple[str, str]) -> Graphs:
    """Stage 3: walk the layer descriptors to build training and inference graphs
    (each keeps the tensor names, so that ``as_text()`` reads by name)."""
    graphs = Graphs(emit_training_graph(arch, ids, opts, g_range), emit_inference_graph(arch, ids, opts))
    names = {i: n for n, i in ids.items()}
    graphs.train.names, graphs.inference.names = names, names
    return graphs


STEP_ORDER_A = (GraphId.CAST_MAIN_FP32_TO_FP16, GraphId.ZERO_GRAD, GraphId.TRANSFER_B, GraphId.FIRST_LAYER_FWD_A, GraphId.DEEP_FWD_BWD,
                GraphId.FIRST_LAYER_BWD_A, GraphId.DEEP_COMM, GraphId.CAST_AND_CHECK, GraphId.ACCUM_METRICS,
                GraphId.LARS_NORMS, GraphId.OPTIMIZER, GraphId.EMA_UPDATE)
"""One training step reading buffer A, in the original's order; under mixed precision it starts by
rounding the weights into their working copies (compiler/autocast.py)."""


def swap_ab(gid: GraphId) -> GraphId:
    """The same graph for the other input buffer."""
    name = gid.name
    if name.endswith("_A"):
        return GraphId[name[:-2] + "_B"]
    if name.endswith("_B"):
        return GraphId[name[:-2] + "_A"]
    return gid


def program_orders(graphs: Graphs) -> list[tuple[str, ComputationGraph, tuple[GraphId, ...]]]:
    """Every program a step can run, as (title, graph, GraphId order): a training step per input
    buffer, then a validation pass per buffer, for the raw and (where built) the EMA weights."""
    out = [("train step, buffer A", graphs.train, STEP_ORDER_A),
           ("train step, buffer B", graphs.train, tuple(swap_ab(g) for g in STEP_ORDER_A))]
    for ab in ("A", "B"):
        for kind, what in (("MAIN", "validation"), ("EMA", "validation (EMA)")):
            gid = GraphId[f"INF_{kind}_{ab}"]
            if graphs.inference.nodes(gid):
                cast = GraphId.CAST_EMA_FP32_TO_FP16 if kind == "EMA" else GraphId.CAST_MAIN_FP32_TO_FP16
                out.append((f"{what}, buffer {ab}", graphs.inference,
                            (GraphId.UPDATE_BN_INF_PARAMS, cast, GraphId[f"TRANSFER_{ab}"], gid, GraphId.ACCUM_METRICS)))
    return out


def labelled_programs(graphs: Graphs) -> list[tuple[str, list[tuple[GraphId, GraphNode]]]]:
    """Each program of ``program_orders`` as its (GraphId, node) sequence: what the views draw."""
    return [(title, [(gid, n) for gid in order for n in graph.nodes(gid)]) for title, graph, order in
            program_orders(graphs)]


def step_programs(graphs: Graphs) -> list[list[tuple[tuple[int, ...], tuple[int, ...]]]]:
    """The (inputs, outputs) sequences of one step per program, for liveness."""
    return [[(n.inputs, n.outputs) for _, n in prog] for _, prog in labelled_programs(graphs)]


def graph_lifetimes(graphs: Graphs) -> Lifetimes:
    """Lifetimes of every tensor over the training and inference programs."""
    return lifetimes_from_programs(step_programs(graphs))


# ---- stage 4: placement, packed by stage 3's liveness ---------------------------------------
def padded_pitch(spec: Any, pad_rows: bool = True) -> int | None:
    """The row pitch stage 4 gives a tensor: parameter matrices (and their gradient, moment and
    EMA copies, padded alike so the flat optimizer ranges stay element-aligned) whose rows alias
    in the cache; every other tensor is contiguous (its kernels read it as one block)."""
    if not pad_rows or spec.region.family not in PARAM_FAMILIES:
        return None
    return row_pitch(tuple(spec.shape), np.dtype(spec.dtype).itemsize)


def create_memory_plans(shapes: AllShapes, max_slots: Sequence[int], lifetimes: Lifetimes | None,
                        pad_rows: bool = True, merged: Mapping[str, str] | None = None) -> dict[str, MemoryPlan]:
    """Stage 4: one placement with max slot sizes, then six plans sharing its offsets.
    With ``pad_rows``, a parameter matrix whose rows are a multiple of 4 KiB gets 64 bytes more
    per row (``padded_pitch``); its slot grows by the padding. ``merged``: the outputs fusion removed
    (ArchPlan.merged), which the plans name when one is asked for."""
    ref = shapes.tables["train_base"]
    base = MemoryPlan("base")
    base.merged = dict(merged or {})
    for spec, slot in zip(ref.specs, max_slots):
        pitch = padded_pitch(spec, pad_rows)
        if pitch is not None:
            slot = max(slot, padded_bytes(spec.shape, np.dtype(spec.dtype).itemsize, pitch))
        base.alloc(spec.shape, spec.dtype, spec.region, spec.name, slot_bytes=slot, pitch=pitch)
    base.finalize(lifetimes)
    return {v: base.with_shapes({i: s.shape for i, s in enumerate(t.specs)}, v)
            for v, t in shapes.tables.items()}


# ---- stage 5 ---------------------------------------------------------------------------
def share_or_clone(specs: dict[str, VariantSpec], graphs: Graphs, plans: dict[str, MemoryPlan],
                   zero_grad: bool, nan_check: bool) -> GraphAtlas:
    """Stage 5: the atlas. Shape-only variants share a graph; val variants get no training graph."""
    return build_atlas(specs, graphs, plans, zero_grad=zero_grad, nan_check=nan_check)


# ---- the whole pipeline ------------------------------------------------------------------
@dataclass(frozen=True)
class CompiledPlan:
    """Everything compile produces before binding: inspect any stage's value here. Frozen, as every stage
    value: what binding found (the device, the kernels chosen) are the Runner's notes, not the plan's."""

    arch: ArchPlan
    shapes: AllShapes
    max_slot_bytes: tuple[int, ...]
    lifetimes: Lifetimes
    plans: dict[str, MemoryPlan]
    graphs: Graphs
    atlas: GraphAtlas
    ids: dict[str, int]
    params: list[Any]
    notes: tuple[str, ...] = ()

    @property
    def plan(self) -> MemoryPlan:
        return self.plans["train_base"]

    def summary(self) -> str:
        a = self.atlas
        return (f"Compiled: {plural(len(a.entries), 'atlas entry', 'atlas entries')} over {len(a.variants)} variants"
                f" -> {plural(len(a.captures), 'bound graph')}, arena {human_bytes(self.plan.total_bytes)}")

    def as_text(self) -> str:
        return "\n".join([self.summary(), self.atlas.as_text(), *(f"note: {n}" for n in self.notes)])

    def __repr__(self) -> str:
        """One line: the full dataclass dump runs to kilobytes; each stage has its own repr."""
        a = self.atlas
        return (f"<CompiledPlan: {plural(len(self.arch.layers), 'layer')}, {plural(len(self.plans), 'variant')}, "
                f"arena {human_bytes(self.plan.total_bytes)}, {len(self.graphs.train)}+{len(self.graphs.inference)} "
                f"train+inference nodes, {plural(len(a.entries), 'atlas entry', 'atlas entries')} -> "
                f"{plural(len(a.captures), 'bound graph')}, {plural(len(self.notes), 'note')}>")

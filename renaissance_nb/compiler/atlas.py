"""GraphAtlas: the [variant x GraphId] table of what is bound, and where.

Phase A fills the table; phase B binds each distinct (graph, GraphId, ShapeId)
once; phase C (run time) is an array lookup, ``atlas.table[variant][gid]``,
giving the index of the bound kernel list: no hashing, no search.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..checks import as_int
from ..errors import PlanError, bad_argument
from ..text import plural
from .ids import GraphId, StreamKind, as_graph_id

if TYPE_CHECKING:  # pragma: no cover
    from ..memory.plan import MemoryPlan
    from .stages import Graphs, VariantSpec

TRAIN_IDS = (GraphId.TRANSFER_A, GraphId.TRANSFER_B, GraphId.FIRST_LAYER_FWD_A, GraphId.FIRST_LAYER_FWD_B,
             GraphId.DEEP_FWD_BWD, GraphId.ZERO_GRAD, GraphId.FIRST_LAYER_BWD_A, GraphId.FIRST_LAYER_BWD_B,
             GraphId.DEEP_COMM, GraphId.CAST_AND_CHECK, GraphId.LARS_NORMS, GraphId.OPTIMIZER, GraphId.EMA_UPDATE,
             GraphId.CLEAR_METRICS, GraphId.CAST_MAIN_FP32_TO_FP16)
VAL_IDS = (GraphId.TRANSFER_A, GraphId.TRANSFER_B, GraphId.INF_MAIN_A, GraphId.INF_MAIN_B,
           GraphId.INF_EMA_A, GraphId.INF_EMA_B, GraphId.CLEAR_METRICS, GraphId.UPDATE_BN_INF_PARAMS,
           GraphId.CAST_MAIN_FP32_TO_FP16, GraphId.CAST_EMA_FP32_TO_FP16)
ACCUM_ID = {"train_base": GraphId.ACCUM_METRICS, "train_lowres": GraphId.ACCUM_METRICS,
            "train_last": GraphId.ACCUM_METRICS_TRAIN_LAST, "train_lowres_last": GraphId.ACCUM_METRICS_TRAIN_LAST,
            "val_base": GraphId.ACCUM_METRICS, "val_last": GraphId.ACCUM_METRICS_VAL_LAST}


@dataclass(frozen=True)
class CaptureKey:
    """What is bound once: a graph's bucket at one input shape (ShapeId 0: any shape)."""

    graph: str
    gid: GraphId
    shape_id: int
    variant: str  # the first variant that needed it: its plan gives the shapes


@dataclass(frozen=True)
class AtlasEntry:
    variant: str
    gid: GraphId
    graph: str
    shape_id: int
    stream: StreamKind
    captured_index: int


class GraphAtlas:
    """The [variant x GraphId] table; ``table[v][g]`` is a captured index or -1."""

    def __init__(self, variants: tuple[str, ...]) -> None:
        self.variants = variants
        self.entries: dict[tuple[str, GraphId], AtlasEntry] = {}
        self.captures: list[CaptureKey] = []
        self.shape_ids: dict[int, tuple[int, ...] | None] = {0: None}
        self.collapsed: dict[str, str] = {}
        self.unused: set[str] = set()
        self.table: list[list[int]] = [[-1] * len(GraphId) for _ in variants]

    def lookup(self, variant_index: int, gid: GraphId) -> int:
        """Phase C: the captured index for a variant and GraphId, by array indexing.
        The index is checked: a negative one would quietly answer for another variant."""
        vi = as_int(variant_index)
        if vi is None or not 0 <= vi < len(self.variants):
            raise bad_argument(PlanError, "lookup", "variant_index", variant_index,
                               f"an int in [0, {len(self.variants)}), the position of one of {self.variants}",
                               "use atlas.variants.index(name)")
        return self.table[vi][as_graph_id(gid, "lookup")]

    def entry(self, variant: str, gid: GraphId) -> AtlasEntry | None:
        """The entry of (variant, GraphId); None where that variant does not use the GraphId."""
        if not isinstance(variant, str) or variant not in self.variants:
            raise bad_argument(PlanError, "entry", "variant", variant, f"one of {self.variants}",
                               "pick a variant name from atlas.variants")
        return self.entries.get((variant, as_graph_id(gid, "entry")))

    def graph_ids(self) -> list[GraphId]:
        """GraphIds used by any variant, in enum order."""
        return sorted({g for _, g in self.entries})

    def rows(self) -> list[dict[str, object]]:
        """The table as records (variant, GraphId, ShapeId, stream, captured index)."""
        return [{"variant": e.variant, "graph_id": e.gid.name, "graph": e.graph, "shape_id": e.shape_id,
                 "stream": e.stream.name, "captured": e.captured_index}
                for e in sorted(self.entries.values(), key=lambda e: (self.variants.index(e.variant), e.gid))]

    def as_text(self) -> str:
        gids = self.graph_ids()
        width = max(len(g.name) for g in gids) if gids else 8
        head = " " * width + "  " + "  ".join(f"{v:>17}" for v in self.variants)
        lines = [head]
        for g in gids:
            cells = []
            for v in self.variants:
                e = self.entry(v, g)
                cells.append(f"{'—':>17}" if e is None else f"{f'#{e.captured_index} s{e.shape_id}':>17}")
            lines.append(f"{g.name:<{width}}  " + "  ".join(cells))
        shapes = ", ".join(f"s{k}={'any' if v is None else v}" for k, v in self.shape_ids.items())
        lines.append(f"ShapeIds: {shapes}")
        if self.collapsed:
            lines.append("collapsed: " + ", ".join(f"{a} = {b}" for a, b in self.collapsed.items()))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"<GraphAtlas: {plural(len(self.variants), 'variant')} x {plural(len(self.graph_ids()), 'GraphId')}, "
                f"{plural(len(self.entries), 'entry', 'entries')} -> {len(self.captures)} distinct bound graphs, "
                f"{plural(len(self.shape_ids), 'ShapeId')} (s0: any shape)"
                + (f", collapsed {len(self.collapsed)}" if self.collapsed else "") + ">")


def build_atlas(specs: dict[str, "VariantSpec"], graphs: "Graphs", plans: dict[str, "MemoryPlan"],
                zero_grad: bool, nan_check: bool) -> GraphAtlas:
    """Fill the atlas; distinct (graph, GraphId, ShapeId) triples get one captured index each."""
    atlas = GraphAtlas(tuple(specs))
    shape_index: dict[tuple[int, ...], int] = {}
    capture_index: dict[tuple[str, GraphId, int], int] = {}
    first_of_shape: dict[tuple[str, tuple[int, ...]], str] = {}
    for vi, (vname, spec) in enumerate(specs.items()):
        key = ("train" if spec.is_train else "val", spec.input_shape)
        if not spec.used:
            atlas.unused.add(vname)
        if key in first_of_shape:
            atlas.collapsed[vname] = first_of_shape[key]
        else:
            first_of_shape[key] = vname
        graph = graphs.train if spec.is_train else graphs.inference
        ids = (TRAIN_IDS if spec.is_train else VAL_IDS) + (ACCUM_ID[vname],)
        for gid in ids:
            if not graph.nodes(gid):
                continue
            if gid.shape_invariant:
                sid = 0
            else:
                sid = shape_index.setdefault(spec.input_shape, len(shape_index) + 1)
                atlas.shape_ids[sid] = spec.input_shape
            ck = (graph.name, gid, sid)
            if ck not in capture_index:
                capture_index[ck] = len(atlas.captures)
                atlas.captures.append(CaptureKey(graph.name, gid, sid, vname))
            idx = capture_index[ck]
            atlas.entries[(vname, gid)] = AtlasEntry(vname, gid, graph.name, sid, gid.stream, idx)
            atlas.table[vi][gid] = idx
    return atlas

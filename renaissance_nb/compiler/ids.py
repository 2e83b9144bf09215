"""GraphId (one captured graph each) and StreamKind, as in the original."""
from __future__ import annotations

from enum import IntEnum
from typing import Any

from ..checks import as_int
from ..errors import PlanError, bad_argument


class StreamKind(IntEnum):
    """The five streams per device. On the CPU they are an ordering label only."""

    TRANS = 0
    COMP_1 = 1
    COMP_2 = 2
    COMP_3 = 3
    UPDATE = 4


class GraphId(IntEnum):
    """Buckets of graph nodes; each distinct (graph, GraphId, ShapeId) is bound once."""

    TRANSFER_A = 0
    TRANSFER_B = 1
    FIRST_LAYER_FWD_A = 2
    FIRST_LAYER_FWD_B = 3
    DEEP_FWD_BWD = 4
    ZERO_GRAD = 5
    FIRST_LAYER_BWD_A = 6
    FIRST_LAYER_BWD_B = 7
    FIRST_COMM = 8
    DEEP_COMM = 9
    CAST_AND_CHECK = 10  # the original's NaN check and gradient scaling
    STATS_COMM = 11
    UPDATE_STATS = 12
    OPTIMIZER = 13
    EMA_UPDATE = 14
    INF_MAIN_A = 15
    INF_MAIN_B = 16
    INF_EMA_A = 17
    INF_EMA_B = 18
    CAST_MAIN_FP32_TO_FP16 = 19
    CAST_EMA_FP32_TO_FP16 = 20
    ACCUM_METRICS = 21
    ACCUM_METRICS_TRAIN_LAST = 22
    ACCUM_METRICS_VAL_LAST = 23
    VAL_RESULT_COMM = 24
    CLEAR_METRICS = 25
    UPDATE_BN_INF_PARAMS = 26
    LARS_NORMS = 27

    @property
    def stream(self) -> StreamKind:
        """The stream this graph is captured on."""
        return DEFAULT_STREAM[self]

    @property
    def shape_invariant(self) -> bool:
        """Graphs that touch only weights, moments and scalars: one binding serves all variants."""
        return self in SHAPE_INVARIANT

    @property
    def multi_device_only(self) -> bool:
        """Ids about several devices or AMP: they stay empty on one CPU."""
        return self in MULTI_DEVICE_OR_AMP

    @property
    def reserved_for(self) -> str | None:
        """The feature of the original a reserved GraphId belongs to (no graph here fills it), else None."""
        return RESERVED.get(self)


DEFAULT_STREAM: dict[GraphId, StreamKind] = {
    GraphId.TRANSFER_A: StreamKind.TRANS,
    GraphId.TRANSFER_B: StreamKind.TRANS,
    GraphId.FIRST_LAYER_FWD_A: StreamKind.COMP_1,
    GraphId.FIRST_LAYER_FWD_B: StreamKind.COMP_1,
    GraphId.DEEP_FWD_BWD: StreamKind.COMP_1,
    GraphId.ZERO_GRAD: StreamKind.COMP_2,
    GraphId.FIRST_LAYER_BWD_A: StreamKind.COMP_1,
    GraphId.FIRST_LAYER_BWD_B: StreamKind.COMP_1,
    GraphId.FIRST_COMM: StreamKind.COMP_3,
    GraphId.DEEP_COMM: StreamKind.COMP_3,
    GraphId.CAST_AND_CHECK: StreamKind.UPDATE,
    GraphId.STATS_COMM: StreamKind.COMP_3,
    GraphId.UPDATE_STATS: StreamKind.UPDATE,
    GraphId.OPTIMIZER: StreamKind.UPDATE,
    GraphId.EMA_UPDATE: StreamKind.UPDATE,
    GraphId.INF_MAIN_A: StreamKind.COMP_1,
    GraphId.INF_MAIN_B: StreamKind.COMP_1,
    GraphId.INF_EMA_A: StreamKind.COMP_2,
    GraphId.INF_EMA_B: StreamKind.COMP_2,
    GraphId.CAST_MAIN_FP32_TO_FP16: StreamKind.UPDATE,
    GraphId.CAST_EMA_FP32_TO_FP16: StreamKind.UPDATE,
    GraphId.ACCUM_METRICS: StreamKind.COMP_2,
    GraphId.ACCUM_METRICS_TRAIN_LAST: StreamKind.COMP_2,
    GraphId.ACCUM_METRICS_VAL_LAST: StreamKind.COMP_2,
    GraphId.VAL_RESULT_COMM: StreamKind.COMP_3,
    GraphId.CLEAR_METRICS: StreamKind.COMP_2,
    GraphId.UPDATE_BN_INF_PARAMS: StreamKind.UPDATE,
    GraphId.LARS_NORMS: StreamKind.UPDATE,
}

SHAPE_INVARIANT = frozenset({
    GraphId.ZERO_GRAD, GraphId.CAST_AND_CHECK, GraphId.OPTIMIZER, GraphId.EMA_UPDATE,
    GraphId.CAST_MAIN_FP32_TO_FP16, GraphId.CAST_EMA_FP32_TO_FP16, GraphId.CLEAR_METRICS,
    GraphId.UPDATE_BN_INF_PARAMS, GraphId.LARS_NORMS, GraphId.FIRST_COMM, GraphId.DEEP_COMM,
    GraphId.STATS_COMM, GraphId.VAL_RESULT_COMM,
})

MULTI_DEVICE_OR_AMP = frozenset({
    GraphId.FIRST_COMM, GraphId.DEEP_COMM, GraphId.STATS_COMM, GraphId.VAL_RESULT_COMM,
    GraphId.CAST_MAIN_FP32_TO_FP16, GraphId.CAST_EMA_FP32_TO_FP16,
})


RESERVED: dict[GraphId, str] = {
    GraphId.FIRST_COMM: "data-parallel training: all-reduce of the first layer's gradients",
    GraphId.STATS_COMM: "data-parallel training: all-reduce of batch-norm statistics",
    GraphId.VAL_RESULT_COMM: "data-parallel training: all-reduce of validation metrics",
    GraphId.UPDATE_STATS: "data-parallel training: batch-norm statistics after their all-reduce",
}
"""GraphIds of the original kept in the enum that no graph of this library fills: the emitters never
put a node in them, and the atlas binds nothing for them. DEEP_COMM is filled on a distributed task:
the wait of each layer's all-reduce, started right after that layer's backward (or, with
``distributed(allreduce='slab')``, one in-place all-reduce of the whole gradient region; compiler/emit.py);
LARS_NORMS by a task whose optimizer is LARS (its per-weight norms before the update, optim/lars.py)."""


def as_graph_id(value: Any, where: str, argument: str = "gid") -> GraphId:
    """``value`` as a GraphId: a member, its name ('OPTIMIZER') or its number; else a PlanError.

    Why one check: graphs and the atlas both take a GraphId from the user, and ``GraphId(value)``
    alone answers a typo with a bare ValueError and takes True for GraphId 1.
    """
    if isinstance(value, GraphId):
        return value
    if isinstance(value, str) and value in GraphId.__members__:
        return GraphId[value]
    i = as_int(value)
    if i is not None and any(g == i for g in GraphId):
        return GraphId(i)
    raise bad_argument(PlanError, where, argument, value,
                       f"a GraphId such as GraphId.DEEP_FWD_BWD, its name, or its number 0..{len(GraphId) - 1}",
                       "pass a member of renaissance_nb.GraphId; list them with [g.name for g in GraphId]")

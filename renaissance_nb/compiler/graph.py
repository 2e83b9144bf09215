"""ComputationGraph: nodes of (op, params, input ids, output ids), bucketed by GraphId.

It holds no shapes, dtypes or offsets: those come from the MemoryPlan of the
variant being bound, which is why one graph serves every variant that differs
only in shape.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping

from ..checks import as_int
from ..errors import PlanError, bad_argument
from ..memory.dtensor import DTensor
from .ids import GraphId, as_graph_id


@dataclass(frozen=True)
class GraphNode:
    """One operation: kernel name, parameters, tensor ids read and written."""

    op: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    params: tuple[tuple[str, Any], ...] = ()
    layer: str = ""

    @property
    def p(self) -> dict[str, Any]:
        return dict(self.params)

    def __repr__(self) -> str:
        ps = ", ".join(f"{k}={v}" for k, v in self.params)
        return f"{self.op}({', '.join(map(str, self.inputs))}) -> ({', '.join(map(str, self.outputs))})" + (
            f" [{ps}]" if ps else "")


def _tensor_ids(value: Any, argument: str) -> tuple[int, ...]:
    """A node's tensor ids as Python ints; one bare id counts as a list of one (``node("relu", x.id, y.id)``).

    Why here: a bool or a float would otherwise pass as an id (True is tensor #1) and a DTensor
    or a bare int would fail later with a raw TypeError far from the call that built the node.
    """
    items: Any = (value,) if as_int(value) is not None else value
    try:
        ids = [as_int(v) for v in items] if not isinstance(items, (str, bytes, DTensor)) else [None]
    except TypeError:  # not iterable
        ids = [None]
    if None in ids or any(i < 0 for i in ids):  # type: ignore[operator]
        raise bad_argument(PlanError, "node", argument, value, "a list of tensor ids (ints >= 0) like [x.id, w.id]",
                           "pass the .id of each DTensor that alloc() returned, e.g. [x.id]")
    return tuple(ids)  # type: ignore[arg-type]


def node(op: str, inputs: int | tuple[int, ...] | list[int], outputs: int | tuple[int, ...] | list[int],
         layer: str = "", **params: Any) -> GraphNode:
    """Build a node; params are stored sorted so equal nodes compare equal."""
    if not isinstance(op, str) or not op:
        raise bad_argument(PlanError, "node", "op", op, "a kernel name (str) such as 'relu'",
                           "name the operation as a string")
    return GraphNode(op, _tensor_ids(inputs, "inputs"), _tensor_ids(outputs, "outputs"),
                     tuple(sorted(params.items())), layer)


@dataclass
class ComputationGraph:
    """Buckets of nodes by GraphId. ``name`` tells the training from the inference graph.

    ``names`` (tensor id -> name) only labels ``as_text``; the compiler fills it, a
    hand-built graph may leave it empty.
    """

    name: str = "graph"
    buckets: dict[GraphId, list[GraphNode]] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict, compare=False, repr=False)

    def append(self, gid: GraphId, n: GraphNode) -> None:
        g = as_graph_id(gid, "ComputationGraph.append")
        if not isinstance(n, GraphNode):
            raise bad_argument(PlanError, "ComputationGraph.append", "n", n, "a GraphNode",
                               "build it with renaissance_nb.node(op, inputs, outputs)")
        self.buckets.setdefault(g, []).append(n)

    def nodes(self, gid: GraphId) -> list[GraphNode]:
        return self.buckets.get(as_graph_id(gid, "ComputationGraph.nodes"), [])

    def ids(self) -> list[GraphId]:
        """GraphIds that hold at least one node, in enum order."""
        return sorted(g for g, ns in self.buckets.items() if ns)

    def __iter__(self) -> Iterator[tuple[GraphId, GraphNode]]:
        for gid in self.ids():
            for n in self.buckets[gid]:
                yield gid, n

    def __len__(self) -> int:
        return sum(len(v) for v in self.buckets.values())

    def tensor_ids(self) -> set[int]:
        return {t for _, n in self for t in (*n.inputs, *n.outputs)}

    def as_text(self, names: Mapping[int, str] | Iterable[Any] | None = None) -> str:
        """One line per node, grouped by GraphId, tensors by name: from ``names`` (id -> name, or
        a MemoryPlan's DTensors) if given, else the graph's own ``names``; bare ids where unknown."""
        if names is not None and not isinstance(names, Mapping):
            tensors = list(names) if isinstance(names, Iterable) and not isinstance(names, (str, bytes)) else [names]
            if not all(isinstance(t, DTensor) for t in tensors):
                raise bad_argument(PlanError, "as_text", "names", names,
                                   "a mapping tensor id -> name, a MemoryPlan (its DTensors), or None",
                                   "pass {0: 'x', 1: 'y'} or task.memory; None uses the graph's own names")
            names = {t.id: t.name for t in tensors}
        known = self.names if names is None else names
        lines = []
        fmt = (lambda t: f"{known.get(t, t)}") if known else str
        for gid in self.ids():
            lines.append(f"{gid.name}  [stream {gid.stream.name}]")
            for n in self.buckets[gid]:
                ps = ", ".join(f"{k}={v}" for k, v in n.params)
                lines.append(f"    {n.op}({', '.join(fmt(t) for t in n.inputs)}) -> "
                             f"{', '.join(fmt(t) for t in n.outputs)}" + (f"   [{ps}]" if ps else ""))
        return "\n".join(lines)

    def __repr__(self) -> str:
        per = ", ".join(f"{g.name}:{len(self.buckets[g])}" for g in self.ids())
        return f"<ComputationGraph {self.name!r}: {len(self)} nodes in {len(self.ids())} GraphIds ({per})>"

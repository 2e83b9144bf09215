"""ComputationGraph: nodes of (op, params, input ids, output ids), bucketed by GraphId.

It holds no shapes, dtypes or offsets: those come from the MemoryPlan of the
variant being bound, which is why one graph serves every variant that differs
only in shape.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping

from .ids import GraphId


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


def node(op: str, inputs: tuple[int, ...] | list[int], outputs: tuple[int, ...] | list[int],
         layer: str = "", **params: Any) -> GraphNode:
    """Build a node; params are stored sorted so equal nodes compare equal."""
    return GraphNode(op, tuple(inputs), tuple(outputs), tuple(sorted(params.items())), layer)


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
        self.buckets.setdefault(GraphId(gid), []).append(n)

    def nodes(self, gid: GraphId) -> list[GraphNode]:
        return self.buckets.get(GraphId(gid), [])

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
            names = {t.id: t.name for t in names}
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

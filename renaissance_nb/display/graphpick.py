"""What GraphView's details panel shows for a clicked op or tensor (Netron's side panel).

A tensor: its shape in every variant, dtype, region, offset, slot and bytes, and the ops of the graph that
write and read it (declared operands, in-place inputs and the region ranges an op sweeps: compiler.touches).
An op: its GraphId, stream, layer, every parameter, and the tensors it reads and writes.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..compiler.ids import GraphId
from ..compiler.touches import node_access
from ..text import human_bytes
from .graphlayout import ordered_nodes
from .theme import family_color, shape_text


def _where(g_id: GraphId, n: Any) -> str:
    return f"{n.op} ({n.layer or 'step'}) in {g_id.name}"


def tensor_details(graph: Any, plans: dict[str, Any], tensor: int, order: Sequence[GraphId] | None) -> dict[str, Any]:
    """The details of tensor ``tensor`` (its id in the plans), {"error": ...} if no plan has it."""
    ref = next(iter(plans.values()), None)
    if ref is None or not ref.has(tensor):
        return {"error": f"No tensor #{tensor} in this task's plans."}
    t = ref[tensor]
    writers, readers = [], []
    for g_id, n in ordered_nodes(graph, None, order):
        r, w = node_access(n, ref)
        if tensor in w:
            writers.append(_where(g_id, n))
        if tensor in r:
            readers.append(_where(g_id, n))
    variants = [{"variant": v, "shape": shape_text(p[tensor].shape), "bytes": int(p[tensor].nbytes),
                 "human": human_bytes(int(p[tensor].nbytes))} for v, p in plans.items()]
    return {"kind": "tensor", "id": tensor, "name": t.name, "dtype": str(t.dtype), "region": t.region.name,
            "family": t.region.family, "color": family_color(t.region.family), "offset": int(t.offset),
            "slot_bytes": int(t.slot_bytes), "slot_human": human_bytes(int(t.slot_bytes)), "variants": variants,
            "writers": writers, "readers": readers}


def op_details(graph: Any, gid: GraphId | None, plan: Any, index: int, order: Sequence[GraphId] | None) -> dict[str, Any]:
    """The details of the ``index``-th op of the drawing (graphviz id op<index>, in its run order)."""
    nodes = ordered_nodes(graph, gid, order)
    if not 0 <= index < len(nodes):
        return {"error": f"No op #{index} in this drawing ({len(nodes)} ops)."}
    g_id, n = nodes[index]
    if plan is not None:
        r, w = node_access(n, plan)
        name = lambda ids: [plan[t].name for t in sorted(ids, key=lambda t: plan[t].offset) if plan.has(t)]  # noqa: E731
        reads, writes = name(r), name(w)
    else:
        reads, writes = [f"t{t}" for t in n.inputs], [f"t{t}" for t in n.outputs]
    return {"kind": "op", "index": index, "op": n.op, "layer": n.layer or "step", "graph_id": g_id.name,
            "stream": g_id.stream.name, "params": [[str(k), str(v)] for k, v in n.params],
            "reads": reads, "writes": writes}

"""What each drawn op reads and writes, the region-wide operands included (compiler.touches).

The optimizer, the NaN check, clipping, zero_grad and the EMA declare a flag or a counter and reach
the rest of their operands as byte ranges; a drawing that showed only the declared tensors would say
the optimizer never reads a weight. Here those ranges become named operands the graph view and the
atlas detail draw, each listing the tensors it covers.
"""
from __future__ import annotations

from typing import Any

from ..compiler.touches import ids_in, node_access, region_spans
from ..memory.region import FAMILIES
from ..text import human_bytes, plural
from .theme import family_color


def span_operand(first: str, last: str, plan: Any) -> dict[str, Any] | None:
    """One region range as a drawable operand: key, label, colour and the tensors in it (None if empty)."""
    ids = sorted(ids_in(plan, [(first, last)]), key=lambda t: plan[t].offset)
    if not ids:
        return None
    family = first.split("_", 1)[0]
    size = sum(plan[t].slot_bytes for t in ids)
    what = FAMILIES.get(family, family)
    # the regions this plan has in the range (an MLP's weights: W_FC_BIAS and W_FC_WEIGHT, not the
    # W_BN_BIAS … W_DEEP_CONV a ResNet's optimizer sweeps)
    present = list(dict.fromkeys(plan[t].region.name for t in ids))
    span = ", ".join(present) if len(present) <= 3 else f"{present[0]} … {present[-1]} ({len(present)} regions)"
    return {"key": f"span_{first}_{last}", "family": family, "color": family_color(family),
            "label": f"{family}: {what}", "detail": f"{plural(len(ids), 'tensor')} · {human_bytes(size)}",
            "span": span, "ids": ids, "names": [plan[t].name for t in ids]}


def range_operands(node: Any, plan: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(ranges read, ranges written) by ``node`` beyond its declared tensors, as operands."""
    if plan is None:
        return [], []
    reads, writes = region_spans(node)

    def operands(spans: list[tuple[str, str]]) -> list[dict[str, Any]]:
        out = []
        for first, last in spans:
            try:
                op = span_operand(first, last, plan)
            except Exception:  # a plan without that range (a reserved region): nothing there to draw
                op = None
            if op is not None:
                out.append(op)
        return out

    return operands(reads), operands(writes)


def access_rows(nodes: list[Any], plan: Any) -> list[dict[str, Any]]:
    """Per node: its op, layer, and the names of every tensor it reads and writes (compiler.touches)."""
    rows = []
    for n in nodes:
        if plan is None:
            r, w = set(n.inputs), set(n.outputs)
        else:
            r, w = node_access(n, plan)

        def names(ids: set[int]) -> list[str]:
            known = [t for t in ids if plan is not None and plan.has(t)]
            return [plan[t].name for t in sorted(known, key=lambda t: plan[t].offset)] + \
                [f"t{t}" for t in sorted(set(ids) - set(known))]

        rows.append({"op": n.op, "layer": n.layer or "step", "reads": names(r), "writes": names(w)})
    return rows

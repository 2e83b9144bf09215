"""Which tensors share bytes in the arena, and the bytes the reusable ones span.

Liveness reuse lets temporaries whose lifetimes never meet take the same bytes; the lifetime chart
(views.lifetime_view) and the memory inspector (inspector_data) both list those partners and draw
the reusable span (feature maps and temporaries) apart from the arena's state. One definition here.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..memory.plan import MemoryPlan


def shared_pairs(plan: MemoryPlan) -> list[dict[str, Any]]:
    """The temporaries whose slots overlap (``plan.shared_bytes()``, lower offset first), with the bytes
    they share: possible only because their lifetimes never meet."""
    return [{"a": a.name, "b": b.name, "a_id": a.id, "b_id": b.id, "bytes": n} for a, b, n in plan.shared_bytes()]


def share_partners(shared: Iterable[dict[str, Any]]) -> dict[int, list[str]]:
    """Tensor id -> the names of the tensors sharing bytes with it, from ``shared_pairs``."""
    partners: dict[int, list[str]] = {}
    for p in shared:
        partners.setdefault(p["a_id"], []).append(p["b"])
        partners.setdefault(p["b_id"], []).append(p["a"])
    return partners


def focus_range(tensors: Iterable[dict[str, Any]], arena_bytes: int) -> list[int]:
    """[lo, hi): the bytes the given tensor rows (``offset``, ``slot_bytes``) span; the whole arena when
    there are none (no reusable tensor to draw apart)."""
    rows = list(tensors)
    return [min((t["offset"] for t in rows), default=0),
            max((t["offset"] + t["slot_bytes"] for t in rows), default=arena_bytes)]

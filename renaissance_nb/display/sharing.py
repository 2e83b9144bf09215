"""Which tensors share bytes in the arena, and the bytes the reusable ones span.

Liveness reuse lets temporaries whose lifetimes never meet take the same bytes; the lifetime chart
(views.lifetime_view) and the memory inspector (inspector_data) both list those partners and draw
the reusable span (feature maps and temporaries) apart from the arena's state. One definition here.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..memory.dtensor import DTensor


def shared_pairs(pairs: Sequence[tuple[DTensor, DTensor, int]]) -> list[dict[str, Any]]:
    """``plan.shared_bytes()`` as rows: the temporaries whose slots overlap (lower offset first) and the
    bytes they share, possible only because their lifetimes never meet."""
    return [{"a": a.name, "b": b.name, "a_id": a.id, "b_id": b.id, "bytes": n} for a, b, n in pairs]


def share_partners(pairs: Iterable[tuple[DTensor, DTensor, int]]) -> dict[int, list[str]]:
    """Tensor id -> the names of the tensors sharing bytes with it, from ``plan.shared_bytes()``."""
    partners: dict[int, list[str]] = {}
    for a, b, _ in pairs:
        partners.setdefault(a.id, []).append(b.name)
        partners.setdefault(b.id, []).append(a.name)
    return partners


def focus_range(tensors: Iterable[dict[str, Any]], arena_bytes: int) -> list[int]:
    """[lo, hi): the bytes the given tensor rows (``offset``, ``slot_bytes``) span; the whole arena when
    there are none (no reusable tensor to draw apart)."""
    rows = list(tensors)
    return [min((t["offset"] for t in rows), default=0),
            max((t["offset"] + t["slot_bytes"] for t in rows), default=arena_bytes)]

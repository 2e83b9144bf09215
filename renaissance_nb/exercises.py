"""Checking cells for the notebooks' exercises: a student's answer against the value the cell measured.

    from renaissance_nb.exercises import check
    check("arena at batch 64", my_guess, task64.memory.total_bytes, rel=0.05, hint="which regions scale with the batch?")

Prints one line, "✓ right" or "✗ not yet" with the hint, and returns whether the answer was right, so
an exercise can never pass silently with the answer left at ``None``.
"""
from __future__ import annotations

import math
from typing import Any


def _close(got: Any, want: Any, rel: float, abs_: float) -> bool:
    if isinstance(want, (set, frozenset)):
        return set(got) == set(want) if isinstance(got, (set, frozenset, list, tuple)) else False
    if isinstance(want, (int, float)) and not isinstance(want, bool):
        try:
            g = float(got)
        except (TypeError, ValueError):
            return False
        return math.isfinite(g) and abs(g - float(want)) <= max(abs_, rel * abs(float(want)))
    return bool(got == want)


def check(name: str, got: Any, want: Any, *, rel: float = 0.0, abs: float = 0.0, hint: str = "") -> bool:  # noqa: A002
    """Whether ``got`` matches ``want`` (numbers within ``rel``/``abs``; sets regardless of order)."""
    if got is None or got is Ellipsis:
        print(f"✗ {name}: no answer yet (replace the ... / None with yours). {hint}".rstrip())
        return False
    ok = _close(got, want, rel, abs)
    if ok:
        print(f"✓ {name}: right ({got!r}).")
    else:
        print(f"✗ {name}: not yet: you said {got!r}; the task says {want!r}. {hint}".rstrip())
    return ok

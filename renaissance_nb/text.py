"""Small text helpers shared by messages, reprs and views: sizes, counts."""
from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal


UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
"""Byte units up to EiB (a what-if plan can be absurdly large, and should read so); widgets/dom.js has the same."""


def one_decimal(x: float) -> str:
    """``x`` to one decimal as JavaScript's ``toFixed(1)`` rounds it: an exact tie away from zero (Python's
    format rounds it to even: 12.25 KiB read 12.2 here and 12.3 in the live widgets)."""
    x = float(x)  # NumPy's float32 and float16 are not Decimal's
    if not math.isfinite(x):
        return str(x)
    return str(Decimal(x).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP))


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'; the live widgets' human() (widgets/dom.js) gives the same text for the same bytes."""
    for unit in UNITS:
        if abs(n) < 1024 or unit == UNITS[-1]:
            return f"{n:.0f} {unit}" if unit == "B" else f"{one_decimal(n)} {unit}"
        n /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def bytes_versus(n: int, other: int, than: str) -> str:
    """A size next to another, with their difference: '4.7 MiB, 24.6 KiB less than without reuse'.

    Rounded to one decimal the two sizes often read alike ('4.7 MiB instead of 4.7 MiB');
    the difference is what the comparison is about, so it is what this spells out.
    """
    d = int(other) - int(n)
    if d == 0:
        return f"{human_bytes(n)}, the same as {than}"
    return f"{human_bytes(n)}, {human_bytes(abs(d))} {'less' if d > 0 else 'more'} than {than}"


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 tensor', '2 tensors', '1 entry' (many='entries'): a count and its noun that agree."""
    return f"{n} {word if n == 1 else (many or word + 's')}"

"""Small text helpers shared by messages, reprs and views: sizes, counts."""
from __future__ import annotations


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (up to EiB: a what-if plan can be absurdly large, and should read so)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if abs(n) < 1024 or unit == "EiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} EiB"  # pragma: no cover


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

"""Liveness: when each tensor is in use, and packing tensors whose lifetimes never meet.

The original gives every tensor its own slot. Here feature maps, gradient slots
and temporaries whose lifetimes do not overlap share bytes. A lifetime is a list
of closed intervals on one timeline on which every program of the step (the
training step, then inference) is laid end to end, so tensors that are live in
different programs never conflict with each other, and ones live in the same
program conflict exactly when their intervals meet.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from ..checks import as_int
from ..errors import PlanError, bad_argument
from .dtensor import ALIGNMENT, DTensor, align_up

Interval = tuple[int, int]
Lifetimes = dict[int, list[Interval]]


def lifetimes_from_programs(programs: Sequence[Sequence[tuple[Iterable[int], Iterable[int]]]]) -> Lifetimes:
    """Lifetimes of every tensor id from programs of (inputs, outputs) steps.

    Each program is one run-to-completion sequence of nodes; programs are laid
    end to end on one timeline. A tensor is live from the first node that touches
    it to the last one within each program.
    """
    spans: Lifetimes = {}
    t0 = 0
    for program in programs:
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for i, (ins, outs) in enumerate(program):
            for tid in (*ins, *outs):
                first.setdefault(tid, t0 + i)
                last[tid] = t0 + i
        for tid, a in first.items():
            spans.setdefault(tid, []).append((a, last[tid]))
        t0 += len(program) + 1
    return spans


LIFETIMES_FORM = "a mapping tensor id -> list of (start, end) int pairs with start <= end, like {0: [(0, 3)]}"


def check_lifetimes(lifetimes: Any, n_tensors: int, where: str = "finalize") -> Lifetimes:
    """``lifetimes`` checked whole and copied as {id: [(start, end), ...]} of Python ints.

    Why: ``pack`` trusts its input; a reversed interval reads as never live (its tensor would
    share bytes with live ones) and a malformed one fails half-way through a placement. Checking
    everything first lets ``finalize`` fail before it changes anything.
    """
    if not isinstance(lifetimes, Mapping):
        raise bad_argument(PlanError, where, "lifetimes", lifetimes, LIFETIMES_FORM,
                           "pass a dict such as lifetimes_from_programs() returns, or None for no reuse")
    out: Lifetimes = {}
    for key, intervals in lifetimes.items():
        tid = as_int(key)
        if tid is None or not 0 <= tid < n_tensors:
            raise bad_argument(PlanError, where, "lifetimes key", key,
                               f"the id of an allocated tensor, an int in [0, {n_tensors})",
                               "key lifetimes by DTensor.id, not by name or position")
        if not isinstance(intervals, (list, tuple)) or not all(isinstance(iv, (list, tuple)) for iv in intervals):
            raise bad_argument(PlanError, where, f"lifetimes[{tid}]", intervals,
                               "a list of (start, end) int pairs like [(4, 6)]",
                               "wrap a single interval in a list: [(start, end)]")
        pairs = []
        for iv in intervals:
            ends = [as_int(x) for x in iv]
            if len(ends) != 2 or None in ends:
                raise bad_argument(PlanError, where, f"lifetimes[{tid}] interval", iv, "a (start, end) pair of ints",
                                   "give each interval as (first step, last step), both ints")
            start, end = ends
            if start > end:  # type: ignore[operator]
                raise bad_argument(PlanError, where, f"lifetimes[{tid}] interval", iv,
                                   "start <= end (closed intervals on the step timeline)",
                                   f"write it as ({end}, {start}) if the ends were swapped")
            pairs.append((start, end))
        out[tid] = pairs  # type: ignore[assignment]
    return out


def intervals_meet(a: Sequence[Interval], b: Sequence[Interval]) -> bool:
    """Whether two lifetimes overlap at any time."""
    return any(x0 <= y1 and y0 <= x1 for x0, x1 in a for y0, y1 in b)


def pack(tensors: Sequence[DTensor], lifetimes: Lifetimes) -> tuple[dict[int, int], int]:
    """Greedy-by-size packing: offsets (relative, aligned) and the bytes needed.

    Largest tensors are placed first at the lowest offset that does not overlap
    any already placed tensor whose lifetime meets theirs. A tensor without a
    known lifetime is treated as live for ever (it gets bytes of its own).
    """
    forever = [(-(2**62), 2**62)]
    order = sorted(tensors, key=lambda t: (-t.slot_bytes, t.id))
    placed: list[tuple[int, int, list[Interval]]] = []
    offsets: dict[int, int] = {}
    size = 0
    for t in order:
        life = lifetimes.get(t.id, forever)
        busy = sorted((o, e) for o, e, lt in placed if intervals_meet(life, lt))
        off = 0
        for o, e in busy:
            if off + t.slot_bytes <= o:
                break
            off = max(off, align_up(e, ALIGNMENT))
        offsets[t.id] = off
        placed.append((off, off + t.slot_bytes, life))
        size = max(size, off + t.slot_bytes)
    return offsets, align_up(size, ALIGNMENT)


def live_overlaps(tensors: Sequence[DTensor], lifetimes: Lifetimes) -> list[tuple[str, str]]:
    """Pairs of tensors that share bytes while both are live (must be empty)."""
    bad = []
    placed = [t for t in tensors if t.offset is not None and t.slot_bytes > 0]
    forever = [(-(2**62), 2**62)]
    for i, a in enumerate(placed):
        for b in placed[i + 1 :]:
            if a.offset < b.end and b.offset < a.end:
                if intervals_meet(lifetimes.get(a.id, forever), lifetimes.get(b.id, forever)):
                    bad.append((a.name, b.name))
    return bad

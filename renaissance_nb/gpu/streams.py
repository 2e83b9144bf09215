"""The event edges of entry mode, kept at run time, and one cuBLAS workspace per stream.

Each atlas entry runs on its GraphId's stream (compiler/ids.py DEFAULT_STREAM). Before an entry
is launched, its stream waits for the last launch of every entry on another stream whose bytes
conflict with its own (gpu/deps.py: a read-write, write-read or write-write overlap), and only
for those; an event is recorded after each launch. That covers the edges inside a step, across
consecutive steps, and around entries run on their own (batch-norm folding, inference). The
host hand-over (uploads, downloads, a new data order) is a pseudo-entry on the primary stream
that conflicts with everything: it waits for every stream, and every stream waits for it once.

Waits already implied are skipped: the order keeps a vector clock per stream (which launch of
each other stream it is known to follow), so a stream waits at most once per other stream.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from .deps import Access

ALL = -1
"""The index of the host hand-over: conflicts with every entry."""


def _join(a: dict[Any, int], b: dict[Any, int]) -> dict[Any, int]:
    out = dict(a)
    for k, v in b.items():
        if out.get(k, 0) < v:
            out[k] = v
    return out


class StreamOrder:
    """Which events each stream waits for before an entry, from the entries' byte conflicts.

    ``drop`` (test-only) names one edge (GraphId name before, GraphId name after) to leave out, so a
    test can see the CPU stand-in's race detector catch the missing event.
    """

    def __init__(self, accesses: Sequence[Access], names: Sequence[str], new_event: Callable[[], Any],
                 drop: tuple[str, str] | None = None) -> None:
        n = len(accesses)
        self.conflict = [[accesses[i].conflicts(accesses[j]) for j in range(n)] for i in range(n)]
        self.covers = [[accesses[i].covers(accesses[j]) for j in range(n)] for i in range(n)]
        self.names, self.drop = list(names), drop
        self.events = {i: new_event() for i in [*range(n), ALL]}
        self.event_clock: dict[int, dict[Any, int]] = {}
        self.launch_seq: dict[int, int] = {}
        self.pending: dict[Any, list[int]] = {}   # stream -> entries launched on it, none covering an earlier
        self.clock: dict[Any, dict[Any, int]] = {}  # stream -> stream -> the launch it is known to follow
        self.waits = 0  # event waits issued (what a test reads to see the edges are few)

    def _needs(self, before: int, after: int) -> bool:
        if before == ALL or after == ALL:
            return True
        if self.drop is not None and (self.names[before], self.names[after]) == self.drop:
            return False
        return self.conflict[before][after]

    def before(self, idx: int, stream: Any) -> None:
        """Make ``stream`` wait for every conflicting launch on another stream it does not yet follow."""
        mine = self.clock.setdefault(stream, {})
        for other, launched in self.pending.items():
            if other is stream:
                continue
            for j in reversed(launched):  # the latest first: waiting for it covers the earlier ones
                if self.launch_seq[j] <= mine.get(other, 0):
                    break
                if self._needs(j, idx):
                    stream.wait_event(self.events[j])
                    mine = _join(mine, self.event_clock[j])
                    self.waits += 1
                    break
        self.clock[stream] = mine

    def after(self, idx: int, stream: Any) -> None:
        """Record the event of this launch; it replaces the earlier launches it covers on this stream."""
        mine = self.clock.setdefault(stream, {})
        mine[stream] = mine.get(stream, 0) + 1
        self.events[idx].record(stream)
        self.event_clock[idx] = dict(mine)
        self.launch_seq[idx] = mine[stream]
        launched = self.pending.setdefault(stream, [])
        keep = [j for j in launched if not (idx == ALL or (j != ALL and self.covers[idx][j]))]
        self.pending[stream] = keep + [idx]

    def event(self, idx: int) -> Any:
        """The event recorded after the last launch of entry ``idx``."""
        return self.events[idx]


class StreamGemms:
    """One cuBLAS handle with its own workspace per stream that runs GEMMs: a workspace serves one
    GEMM at a time, and entries on different streams may now multiply at once."""

    def __init__(self, make_gemm: Callable[[Any], Any], zeros: Callable[[int], Any], streams: Sequence[Any],
                 workspace_bytes: int) -> None:
        self.by_stream = {s.ptr: make_gemm(zeros(workspace_bytes)) for s in streams}

    def bind(self, c: Any, a: Any, b: Any) -> Callable[[Any], None]:
        launches = {ptr: g.bind(c, a, b) for ptr, g in self.by_stream.items()}

        def launch(stream: Any) -> None:
            launches[stream.ptr](stream)
        return launch

    def close(self) -> None:
        for g in self.by_stream.values():
            g.close()

"""Which atlas entries must wait for which: each entry's read and write byte ranges of the arena,
and the dependency edges between the entries of a step (and the step before it).

Why: a device runs each GraphId on its own stream (compiler/ids.py DEFAULT_STREAM). Two entries may
run at once only if neither writes bytes the other reads or writes; every other pair needs an event
edge. The ranges come from the zero-shape graph (a node's tensor ids, placed by the variant's
MemoryPlan) and, for the region-wide ops, from the op's meaning (kernels/operands.py
optimizer_ranges, ema_ranges; the 'first'/'last' params of zero_range, nan_check, clip_grad_norm).
Pure functions of the compiled plan: no device, no CuPy; the GPU executor, its CPU stand-in and the
graph view read the same values.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from ..compiler.ids import GraphId
from ..compiler.touches import in_place_inputs, region_spans
from ..memory.region import Region

Range = tuple[int, int]
Edge = tuple[int, int]

def merge(ranges: Iterable[Range]) -> tuple[Range, ...]:
    """Sorted, non-empty, non-overlapping ranges covering the same bytes."""
    out: list[list[int]] = []
    for a, b in sorted(r for r in ranges if r[1] > r[0]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return tuple((a, b) for a, b in out)


def overlap(xs: Sequence[Range], ys: Sequence[Range]) -> bool:
    """Whether two merged range lists share a byte (a merge walk)."""
    i = j = 0
    while i < len(xs) and j < len(ys):
        (a, b), (c, d) = xs[i], ys[j]
        if a < d and c < b:
            return True
        if b <= d:
            i += 1
        else:
            j += 1
    return False


def inside(xs: Sequence[Range], ys: Sequence[Range]) -> bool:
    """Whether every byte of xs is in ys (both merged)."""
    return all(any(c <= a and b <= d for c, d in ys) for a, b in xs)


@dataclass(frozen=True)
class Access:
    """The arena bytes an entry reads and writes (merged ranges; a written byte may also be read)."""

    reads: tuple[Range, ...] = ()
    writes: tuple[Range, ...] = ()

    def conflicts(self, other: "Access") -> bool:
        """RAW, WAR or WAW either way: the two must not run at once (the relation is symmetric)."""
        return (overlap(self.writes, other.writes) or overlap(self.writes, other.reads)
                or overlap(self.reads, other.writes))

    def covers(self, other: "Access") -> bool:
        """Whatever conflicts with ``other`` conflicts with this too."""
        return inside(other.writes, self.writes) and inside(other.reads, merge(self.reads + self.writes))

    @property
    def nbytes(self) -> tuple[int, int]:
        return sum(b - a for a, b in self.reads), sum(b - a for a, b in self.writes)


def _region(plan: Any, first: str, last: str) -> Range:
    return plan.region_range(Region[first], Region[last])


def region_ranges(node: Any, plan: Any) -> tuple[list[Range], list[Range]]:
    """(reads, writes) of the whole region ranges a region-wide op works on (compiler/touches.py)."""
    r_spans, w_spans = region_spans(node)
    return [_region(plan, a, b) for a, b in r_spans], [_region(plan, a, b) for a, b in w_spans]


def _tensor_range(plan: Any, tid: int) -> Range:
    t = plan[tid]
    return t.offset, t.offset + t.storage_bytes


def node_access(node: Any, plan: Any) -> Access:
    """The bytes one graph node reads and writes under ``plan`` (its variant's MemoryPlan)."""
    reads, writes = region_ranges(node, plan)
    in_place = set(in_place_inputs(node))
    for tid in node.inputs:
        (writes if tid in in_place else reads).append(_tensor_range(plan, tid))
    writes += [_tensor_range(plan, tid) for tid in node.outputs]
    return Access(merge(reads), merge(writes))


def union(accesses: Iterable[Access]) -> Access:
    rs: list[Range] = []
    ws: list[Range] = []
    for a in accesses:
        rs += a.reads
        ws += a.writes
    return Access(merge(rs), merge(ws))


def capture_accesses(compiled: Any) -> list[Access]:
    """The Access of every distinct bound graph, in atlas capture order (compiled.atlas.captures)."""
    graphs = {"train": compiled.graphs.train, "inference": compiled.graphs.inference}
    out = []
    for key in compiled.atlas.captures:
        plan = compiled.plans[key.variant]
        out.append(union(node_access(n, plan) for n in graphs[key.graph].nodes(key.gid)))
    return out


def reduce_edges(n: int, edges: Iterable[Edge]) -> list[Edge]:
    """The transitive reduction of a DAG whose edges (i, j) all have i < j (nodes 0..n-1)."""
    preds: list[list[int]] = [[] for _ in range(n)]
    for i, j in set(edges):
        preds[j].append(i)
    reach: list[int] = [0] * n  # bit k: node k reaches this node
    kept = []
    for j in range(n):
        for i in sorted(preds[j], reverse=True):  # the nearest first: a farther one it reaches is implied
            if not reach[j] >> i & 1:
                kept.append((i, j))
                reach[j] |= reach[i] | (1 << i)
    return sorted(kept)


@dataclass(frozen=True)
class StepEdges:
    """The waits of one step program: ``within`` (i, j): entry j waits for entry i of the same step;
    ``across`` (i, j): entry j waits for entry i of the previous step. Transitively reduced over
    both steps together."""

    within: tuple[Edge, ...]
    across: tuple[Edge, ...]


def program_edges(accesses: Sequence[Access], previous: Sequence[Access] = ()) -> StepEdges:
    """The dependency edges of a step whose entries (in program order) have these accesses, the
    previous step's entries (in its order) before them: every conflicting pair, then reduced."""
    seq = list(previous) + list(accesses)
    m = len(previous)
    pairs = [(i, j) for j in range(len(seq)) for i in range(j) if seq[i].conflicts(seq[j])]
    kept = reduce_edges(len(seq), pairs)
    within = tuple((i - m, j - m) for i, j in kept if i >= m)
    across = tuple((i, j - m) for i, j in kept if i < m <= j)
    return StepEdges(within, across)


@dataclass(frozen=True)
class StepGraph:
    """A step program as the device runs it: entries (variant, GraphId name, stream name, bytes read,
    bytes written), the streams used, and the edges (i, j, "within" | "across"), entry indices into
    ``entries`` (an "across" edge's i indexes the previous step's ``previous``)."""

    entries: tuple[dict[str, Any], ...]
    previous: tuple[dict[str, Any], ...]
    streams: tuple[str, ...]
    edges: tuple[tuple[int, int, str], ...]


def step_graph(compiled: Any, gids: Sequence[tuple[str, GraphId]],
               previous: Sequence[tuple[str, GraphId]] = ()) -> StepGraph:
    """The StepGraph of a step program given as (variant, GraphId) pairs (StepPrograms.train_step_gids),
    after ``previous``; pairs the atlas has no entry for are left out, as the programs leave them out."""
    accesses = capture_accesses(compiled)
    atlas = compiled.atlas

    def rows(pairs: Sequence[tuple[str, GraphId]]) -> tuple[list[dict[str, Any]], list[Access]]:
        out, acc = [], []
        for v, g in pairs:
            idx = atlas.table[atlas.variants.index(v)][g]
            if idx < 0:
                continue
            r, w = accesses[idx].nbytes
            out.append({"variant": v, "gid": g.name, "stream": g.stream.name, "capture": idx,
                        "read_bytes": r, "write_bytes": w})
            acc.append(accesses[idx])
        return out, acc
    now, acc_now = rows(gids)
    before, acc_before = rows(previous)
    e = program_edges(acc_now, acc_before)
    edges = tuple((i, j, "within") for i, j in e.within) + tuple((i, j, "across") for i, j in e.across)
    streams = tuple(sorted({r["stream"] for r in now}))
    return StepGraph(tuple(now), tuple(before), streams, edges)

"""Where each box of a graph drawing goes, before graphviz sees it: frames, layer runs, tensor drawings.

A training step drawn with one box per tensor is wide: every weight feeds the forward pass, the backward
pass and the optimizer, so its box pulls all of them into a few long ranks (the seed MLP's whole step was
2,839 px wide, the ResNet block net's 17,018). Here the step is laid out the way it runs instead:

- one frame per GraphId, stacked top to bottom in run order; inside, each run of one layer's consecutive
  ops in a dashed frame of its own (it folds into one box), the runs stacked in order too;
- a tensor drawn where it is used: the op right after the one that wrote it reads that drawing; every
  other read, and every write, draws it again beside the op (a saved activation appears again next to
  the backward op that reads it instead of an edge across the page; in-place updates never loop back);
- what one op alone reads or writes (its weights, the gradients and statistics nobody reads here) in one
  box listing them (GROUP_AT), and no row wider than ROW_MAX boxes.

Every drawing of a tensor carries its name and id, so the view's search box lights them all.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from ..compiler.ids import GraphId
from .access import range_operands

REUSE_WITHIN = 1
"""An op reads the drawing of a tensor written at most this many ops before it in the same frame; any
other read draws the tensor again beside the op (long edges are what made the step wide)."""


GROUP_AT = 3
"""An op with this many tensors drawn for it alone on one side (weights and saved values it reads,
gradients and statistics it writes that nothing here reads) gets them as one box listing each, instead
of a row of boxes: a batch norm writes seven tensors, and seven boxes side by side are 1,000 px."""


ROW_MAX = 4
"""The most boxes side by side above or below one op (see Layout.wrapped_rows)."""


def safe(name: str) -> str:
    """A name as graphviz and the DOM accept it in an id."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


@dataclass
class Run:
    """Consecutive ops of one layer inside one frame: a dashed frame, or one box when folded."""

    layer: str
    frame: int
    ops: list[int]
    id: str            # layer_<name>, layer_<name>-<n> for the layer's later runs (the view maps both back)
    folded: bool


@dataclass
class Drawing:
    """One box of a tensor or of a region range an op sweeps; a tensor may have several."""

    id: str
    tensor: int | None          # a tensor id, or None for a range operand
    operand: dict[str, Any] | None
    frame: int
    run: int | None             # the layer run whose frame holds it (None: the GraphId's frame)
    ends: set[str] = field(default_factory=set)  # the op boxes it is drawn for
    group: list[int] = field(default_factory=list)  # the tensors of a group box (GROUP_AT), else empty


@dataclass
class Layout:
    """What graphdraw turns into DOT: frames, runs, op boxes, tensor drawings and edges, all in run order."""

    frames: list[tuple[GraphId | None, list[int]]]   # (GraphId or None for a one-GraphId view, op indices)
    ops: list[tuple[GraphId, Any]]
    op_box: list[str]                                 # op index -> the box drawing it (its own, or its run's)
    op_run: list[int]
    runs: list[Run]
    drawings: dict[str, Drawing]
    edges: list[tuple[str, str, str]]                 # (from, to, "" or the range operand's colour)

    def visible(self, d: Drawing) -> bool:
        """A drawing only a folded run touches goes with it (the run's box keeps the others)."""
        folded = {r.id for r in self.runs if r.folded}
        return not d.ends or not d.ends <= folded

    def shown(self, box: str) -> bool:
        """Whether a box is drawn: every op box is; a drawing unless a folded run hides it."""
        d = self.drawings.get(box)
        return d is None or self.visible(d)

    def members(self, frame: int, run: int | None = None) -> set[str]:
        """The boxes drawn inside a frame, or inside one of its layer runs (a folded run: its box)."""
        if run is not None:
            if self.runs[run].folded:
                return {self.runs[run].id}
            return {f"op{k}" for k in self.runs[run].ops} | {
                d.id for d in self.drawings.values() if d.run == run and self.visible(d)}
        inside = {self.op_box[k] for k in self.frames[frame][1]}
        return inside | {d.id for d in self.drawings.values() if d.frame == frame and self.visible(d)}

    def stacking(self) -> list[tuple[str, str]]:
        """Invisible edges that stack the layer runs (and so the frames) top to bottom in run order: from
        every box of a run with nothing drawn after it there to every box of the next run with nothing
        drawn before it (graphviz otherwise sets runs whose ranks overlap side by side)."""
        parts = [self.members(run.frame, r) for r, run in enumerate(self.runs)]
        out: list[tuple[str, str]] = []
        for above, below in zip(parts, parts[1:]):
            ends = {a for a, b, _ in self.edges if a in above and b in above}
            starts = {b for a, b, _ in self.edges if a in below and b in below}
            out += [(a, b) for a in sorted(above - ends) for b in sorted(below - starts)]
        return out

    def wrapped_rows(self) -> list[tuple[str, str]]:
        """Invisible edges that break a row of more than ROW_MAX boxes drawn for one op into several
        (the optimizer reads four region ranges and three tensors): each part a rank further from the op."""
        out: list[tuple[str, str]] = []
        for box in dict.fromkeys(self.op_box):
            for side in (0, 1):
                row = [a for a, b, _ in self.edges if b == box and a in self.drawings] if side == 0 else \
                    [b for a, b, _ in self.edges if a == box and b in self.drawings]
                row = [d for d in row if self.visible(self.drawings[d])]  # a folded run hides some
                parts = [row[i:i + ROW_MAX] for i in range(0, len(row), ROW_MAX)]
                for near, far in zip(parts, parts[1:]):
                    out += [(f, n) if side == 0 else (n, f) for f in far for n in near]
        return out


def ordered_nodes(graph: Any, gid: GraphId | None, order: Sequence[GraphId] | None = None) -> list[tuple[GraphId, Any]]:
    """One GraphId's nodes, or every node with the GraphIds in ``order`` (run order) first, the rest after."""
    if gid is not None:
        return [(GraphId(gid), n) for n in graph.nodes(gid)]
    ids = list(graph.ids())
    rank = {g: i for i, g in enumerate(dict.fromkeys(order or ()))}
    ids.sort(key=lambda g: (rank.get(g, len(rank)), g))
    return [(g, n) for g in ids for n in graph.nodes(g)]


def _frames_and_runs(nodes: list[tuple[GraphId, Any]], whole: bool,
                     folded: set[str]) -> tuple[list[tuple[GraphId | None, list[int]]], list[Run], list[int]]:
    frames: list[tuple[GraphId | None, list[int]]] = []
    runs: list[Run] = []
    op_run: list[int] = []
    seen: dict[str, int] = {}
    for k, (g, n) in enumerate(nodes):
        if not frames or (whole and frames[-1][0] != g):
            frames.append((g if whole else None, []))
        frames[-1][1].append(k)
        layer = n.layer or "step"
        if not runs or runs[-1].layer != layer or runs[-1].frame != len(frames) - 1:
            count = seen.get(layer, 0)
            seen[layer] = count + 1
            rid = f"layer_{safe(layer)}" + (f"-{count}" if count else "")
            runs.append(Run(layer, len(frames) - 1, [], rid, layer in folded))
        runs[-1].ops.append(k)
        op_run.append(len(runs) - 1)
    return frames, runs, op_run


def step_layout(graph: Any, gid: GraphId | None = None, plan: Any = None, collapsed: Iterable[str] = (),
                order: Sequence[GraphId] | None = None) -> Layout:
    """The layout of one GraphId (``gid``) or of the whole graph, frames in ``order`` (see the module)."""
    nodes = ordered_nodes(graph, gid, order)
    frames, runs, op_run = _frames_and_runs(nodes, gid is None, set(collapsed))
    frame_of = [0] * len(nodes)
    for f, (_, ks) in enumerate(frames):
        for k in ks:
            frame_of[k] = f
    op_box = [runs[op_run[k]].id if runs[op_run[k]].folded else f"op{k}" for k in range(len(nodes))]
    lay = Layout(frames, nodes, op_box, op_run, runs, {}, [])
    latest: dict[Any, tuple[str, int]] = {}   # (frame, tensor or range key) -> (drawing id, op index drawn at)
    count: dict[Any, int] = {}
    edges: set[tuple[str, str]] = set()

    def draw(key: Any, k: int, tensor: int | None, operand: dict[str, Any] | None) -> str:
        base = f"tensor_{tensor}" if operand is None else operand["key"]
        n = count.get(key, 0)
        count[key] = n + 1
        run = op_run[k] if not runs[op_run[k]].folded else None
        d = Drawing(base + (f"-{n}" if n else ""), tensor, operand, frame_of[k], run)
        lay.drawings[d.id] = d
        latest[(frame_of[k], key)] = (d.id, k)
        return d.id

    def link(a: str, b: str, colour: str = "") -> None:
        if a != b and (a, b) not in edges:
            edges.add((a, b))
            lay.edges.append((a, b, colour))

    for k, (_, n) in enumerate(nodes):
        box = op_box[k]
        reads, writes = range_operands(n, plan) if plan is not None else ([], [])
        for key, tensor, operand in [*((t, t, None) for t in n.inputs), *((o["key"], None, o) for o in reads)]:
            last = latest.get((frame_of[k], key))
            if last is not None and (box, last[0]) in edges:
                continue  # written earlier by the same folded box: inside it
            # an op reads what the op just before it wrote (and a folded box what it drew itself); a tensor
            # drawn as another op's input, or longer ago, is drawn again here
            near = last is not None and (op_box[last[1]] == box or (
                k - last[1] <= REUSE_WITHIN and (op_box[last[1]], last[0]) in edges))
            d = last[0] if near else draw(key, k, tensor, operand)
            lay.drawings[d].ends.add(box)
            link(d, box, operand["color"] if operand else "")
        written: set[Any] = set()
        for key, tensor, operand in [*((t, t, None) for t in n.outputs), *((o["key"], None, o) for o in writes)]:
            if key in written:
                continue
            written.add(key)
            last = latest.get((frame_of[k], key))
            again = last is not None and (box, last[0]) in edges  # a folded box writing it twice: one drawing
            d = last[0] if again else draw(key, k, tensor, operand)
            lay.drawings[d].ends.add(box)
            link(box, d, operand["color"] if operand else "")
    for box in dict.fromkeys(op_box):
        _group(lay, box)
    _to_readers(lay)
    return lay


def _to_readers(lay: Layout) -> None:
    """An output read by the next layer run is drawn inside that run's frame, among the op's other inputs:
    graphviz keeps a frame's boxes together, so an edge entering from outside would pin the tensor to
    one end of the row and push the op off centre."""
    run_of = {f"op{k}": lay.op_run[k] for k in range(len(lay.ops))}
    run_of.update({r.id: i for i, r in enumerate(lay.runs) if r.folded})
    written = {b for a, b, _ in lay.edges if a in run_of}
    for a, b, _ in lay.edges:
        d = lay.drawings.get(a)
        if d is None or a not in written or b not in run_of or lay.runs[run_of[b]].folded:
            continue
        if d.run is not None and run_of[b] != d.run:
            d.run = run_of[b]


def _group(lay: Layout, box: str) -> None:
    """Fold the tensors drawn for ``box`` alone, on each side, into one group box (GROUP_AT)."""
    out_of = {a for a, _, _ in lay.edges}
    into = {b for _, b, _ in lay.edges}
    for side in ("reads", "writes"):
        if side == "reads":
            alone = [a for a, b, _ in lay.edges if b == box and a in lay.drawings and a not in into]
        else:
            alone = [b for a, b, _ in lay.edges if a == box and b in lay.drawings and b not in out_of]
        alone = [d for d in alone if lay.drawings[d].operand is None and lay.drawings[d].ends == {box}]
        if len(alone) < GROUP_AT:
            continue
        first = lay.drawings[alone[0]]
        gid = f"{side}_{safe(box)}"
        tensors = [t for d in alone if (t := lay.drawings[d].tensor) is not None]
        lay.drawings[gid] = Drawing(gid, None, None, first.frame, first.run, {box}, tensors)
        for d in alone:
            del lay.drawings[d]
        gone = set(alone)
        edges = [e for e in lay.edges if e[0] not in gone and e[1] not in gone]
        at = next(i for i, e in enumerate(lay.edges) if e[0] in gone or e[1] in gone)
        edges.insert(min(at, len(edges)), (gid, box, "") if side == "reads" else (box, gid, ""))
        lay.edges[:] = edges

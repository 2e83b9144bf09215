"""Drawing a ComputationGraph: graphviz when the `dot` program exists, an HTML table otherwise.

Ops are boxes coloured by the stream of their GraphId; tensors are rounded boxes edged in their
region family's colour, labelled with name, id and the shape in the chosen variant's MemoryPlan.
The whole graph is drawn as it runs: one frame per GraphId, stacked in run order; each run of one
layer's ops is a dashed frame that folds into one box (graphlayout places every box; see there why
a tensor can be drawn more than once).
"""
from __future__ import annotations

import re
import shutil
from typing import Any, Iterable, Sequence

from ..compiler.ids import GraphId
from ..memory.plan import MemoryPlan
from ..text import plural
from .access import range_operands
from .graphlayout import ordered_nodes, safe, step_layout
from .theme import esc, family_color, ink_on, shape_text, stream_color

MAX_OPS_EXPANDED = 80
"""Above this many ops a drawing starts with every layer collapsed."""


def dot_available() -> bool:
    """Whether Graphviz's `dot` program is on PATH (the Python package alone cannot lay out)."""
    return shutil.which("dot") is not None


def _nodes(graph: Any, gid: GraphId | None, order: Sequence[GraphId] | None = None) -> list[tuple[GraphId, Any]]:
    return ordered_nodes(graph, gid, order)


def layers_of(graph: Any, gid: GraphId | None = None) -> list[str]:
    """Layer names in order of first appearance ('' shown as 'step')."""
    seen: list[str] = []
    for _, n in _nodes(graph, gid):
        name = n.layer or "step"
        if name not in seen:
            seen.append(name)
    return seen


def default_collapsed(graph: Any, gid: GraphId | None = None) -> list[str]:
    nodes = _nodes(graph, gid)
    return layers_of(graph, gid) if len(nodes) > MAX_OPS_EXPANDED else []


def _tensor_label(tid: int, plan: MemoryPlan | None) -> tuple[str, str, str]:
    """(name, shape text, colour) of a tensor id; plain id when no plan is known."""
    if plan is not None and plan.has(tid):
        t = plan[tid]
        return t.name, f"{shape_text(t.shape)} {t.dtype}", family_color(t.region.family)
    return f"t{tid}", "", "#8a8f98"


_safe = safe


def _params_text(n: Any) -> str:
    ps = [f"{k}={v}" for k, v in n.params if k not in ("first", "last")]
    text = ", ".join(ps)
    return text if len(text) <= 42 else text[:40] + "…"


def graph_source(graph: Any, gid: GraphId | None = None, plan: MemoryPlan | None = None,
                 collapsed: Iterable[str] = (), order: Sequence[GraphId] | None = None):  # type: ignore[no-untyped-def]
    """A graphviz.Digraph of one GraphId's nodes, or of the whole graph (gid None) with one frame per GraphId
    stacked in ``order`` (run order); see graphlayout for where each box goes."""
    import graphviz

    lay = step_layout(graph, gid, plan, collapsed, order)
    g = graphviz.Digraph(name=_safe(getattr(graph, "name", "graph")), format="svg")
    # newrank: ranks over the whole graph, not frame by frame (frame-wise ranking inverted edges between
    # interleaved layers and packed the step into a few wide ranks)
    g.attr(rankdir="TB", newrank="true", bgcolor="transparent", nodesep="0.18", ranksep="0.26", pad="0.1",
           fontname="Helvetica", fontsize="11", fontcolor="#667085")
    g.attr("node", fontname="Helvetica", fontsize="10", margin="0.07,0.03", height="0.3")
    g.attr("edge", color="#98a2b3", arrowsize="0.6", penwidth="1.0")
    for f, (frame_gid, ks) in enumerate(lay.frames):
        if frame_gid is None:
            _draw_frame(g, lay, f, plan)
            continue
        colour = stream_color(frame_gid.stream.name)
        with g.subgraph(name=f"cluster_gid_{frame_gid.name}") as sub:
            sub.attr(label=f"{frame_gid.name} · {frame_gid.stream.name}", labeljust="l", style="rounded",
                     color=colour, penwidth="1.2", fontcolor=colour, fontsize="11", id=f"gid_{frame_gid.name}",
                     tooltip=f"{frame_gid.name}: {plural(len(ks), 'op')} on stream {frame_gid.stream.name}")
            _draw_frame(sub, lay, f, plan)
    for a, b, colour in lay.edges:
        if lay.shown(a) and lay.shown(b):
            g.edge(a, b, **({"style": "dashed", "color": colour} if colour else {}))
    for a, b in lay.stacking():  # constraints only (weight 0): they order, they do not pull
        g.edge(a, b, style="invis", weight="0")
    for a, b in lay.wrapped_rows():
        g.edge(a, b, style="invis", weight="0")
    return g


def _draw_frame(g: Any, lay: Any, f: int, plan: MemoryPlan | None) -> None:
    """One frame's layer runs (a dashed frame each, or a folded box) and the tensor drawings it holds."""
    for r, run in enumerate(lay.runs):
        if run.frame != f:
            continue
        if run.folded:
            colour = stream_color(lay.ops[run.ops[0]][0].stream.name)
            g.node(run.id, label=f"{run.layer} ▸ {plural(len(run.ops), 'op')}", shape="box3d", style="filled",
                   fillcolor=colour, fontcolor=ink_on(colour), color=colour, id=run.id,
                   tooltip=f"{run.layer}: {plural(len(run.ops), 'op')} folded (click to expand)")
            continue
        with g.subgraph(name=f"cluster_{_safe(run.id)}") as sub:
            sub.attr(label=run.layer, labeljust="c", style="rounded,dashed", color="#c0c6d0", fontcolor="#475467",
                     fontsize="10", penwidth="1", id=run.id, tooltip=f"{run.layer} (click to fold)")
            for k in run.ops:
                _draw_op(sub, k, *lay.ops[k])
            for d in lay.drawings.values():
                if d.run == r and lay.visible(d):
                    _draw_tensor(sub, d, plan)
    for d in lay.drawings.values():
        if d.frame == f and d.run is None and lay.visible(d):
            _draw_tensor(g, d, plan)


def _draw_op(g: Any, k: int, g_id: GraphId, n: Any) -> None:
    colour = stream_color(g_id.stream.name)
    ps = _params_text(n)
    sub_label = f"<br/><font point-size='8'>{esc(ps)}</font>" if ps else ""
    full = ", ".join(f"{k}={v}" for k, v in n.params)  # a click in the view shows it untruncated
    g.node(f"op{k}", label=f"<<b>{esc(n.op)}</b>{sub_label}>", shape="box", style="rounded,filled",
           fillcolor=colour, fontcolor=ink_on(colour), color=colour, id=f"op{k}",
           tooltip=f"{n.op} ({n.layer or 'step'}) on stream {g_id.stream.name} in {g_id.name}"
           + (f" · {full}" if full else ""))


def _draw_tensor(g: Any, d: Any, plan: MemoryPlan | None) -> None:
    """A tensor (rounded box edged in its region family's colour) or a swept range (dashed, its tensors
    in the tooltip, so the drawing shows every operand the kernel touches)."""
    if d.operand is not None:
        o = d.operand
        g.node(d.id, label=f"<<b>{esc(o['label'])}</b><br/><font point-size='8' color='#475467'>"
                           f"{esc(o['detail'])}</font>>",
               shape="box", style="rounded,dashed,filled", fillcolor="white", color=o["color"],
               penwidth="1.8", id=d.id, tooltip=f"{o['span']}: " + ", ".join(o["names"]))
        return
    if d.group:
        _draw_group(g, d, plan)
        return
    name, shape, colour = _tensor_label(d.tensor, plan)
    label = f"<<b>{esc(name)}</b> <font color='#667085'>#{d.tensor}</font>" + (
        f"<br/><font point-size='8' color='#475467'>{esc(shape)}</font>>" if shape else ">")
    g.node(d.id, label=label, shape="box", style="rounded,filled", fillcolor="white", color=colour,
           penwidth="1.6", id=d.id, tooltip=f"{name} #{d.tensor} {shape}")


def _draw_group(g: Any, d: Any, plan: MemoryPlan | None) -> None:
    """Tensors one op alone reads or writes (graphlayout.GROUP_AT), one cell each, three to a column."""
    cells = []
    for t in d.group:
        name, shape, colour = _tensor_label(t, plan)
        cells.append(f"<td border='1' color='{colour}' style='rounded' cellpadding='3'><b>{esc(name)}</b> "
                     f"<font color='#667085'>#{t}</font>" + (f"<br/><font point-size='8' color='#475467'>"
                                                            f"{esc(shape)}</font>" if shape else "") + "</td>")
    rows = -(-len(cells) // 3) and min(3, len(cells))
    cols = -(-len(cells) // rows)
    body = "".join("<tr>" + "".join(cells[c * rows + r] for c in range(cols) if c * rows + r < len(cells)) + "</tr>"
                   for r in range(rows))
    what = "reads" if d.id.startswith("reads_") else "writes"
    names = ", ".join(_tensor_label(t, plan)[0] for t in d.group)
    g.node(d.id, label=f"<<table border='0' cellspacing='3' cellborder='1'>{body}</table>>", shape="plain",
           id=d.id, tooltip=f"{plural(len(d.group), 'tensor')} only this op {what} here: {names}")


def graph_svg(graph: Any, gid: GraphId | None = None, plan: MemoryPlan | None = None,
              collapsed: Iterable[str] = (), order: Sequence[GraphId] | None = None) -> str | None:
    """The drawing as inline SVG, or None when `dot` is missing or fails."""
    if not dot_available():
        return None
    try:
        svg = graph_source(graph, gid, plan, collapsed, order).pipe(format="svg", encoding="utf-8")
    except Exception:  # graphviz.ExecutableNotFound, CalledProcessError: fall back, never a traceback
        return None
    start = svg.find("<svg")
    svg = svg[start:] if start >= 0 else svg
    # let the page scale it: keep the viewBox, drop the fixed point sizes
    return re.sub(r'<svg width="([\d.]+)pt" height="([\d.]+)pt"',
                  lambda m: f'<svg class="rnb-graph-svg" width="{float(m.group(1)) * 1.25:.0f}px" '
                            f'height="{float(m.group(2)) * 1.25:.0f}px"', svg, count=1)


READABLE = 0.75
"""The smallest scale a drawing is fitted to, here and in widgets/graph.js: its 10 pt labels (12.5 px at
natural size) stay at 9 px or more; a wider drawing scrolls sideways."""


def static_svg(svg: str) -> str:
    """A drawing for a static copy, fitted like the live view: to the width, never below READABLE."""
    return re.sub(r'<svg class="rnb-graph-svg" width="(\d+)px"',
                  lambda m: f'<svg class="rnb-graph-svg" style="max-width:100%;height:auto;'
                            f'min-width:{int(m.group(1)) * READABLE:.0f}px" width="{m.group(1)}px"', svg, count=1)


def dot_svg(dot: str) -> str | None:
    """Any DOT text as inline SVG (None without `dot`)."""
    if not dot_available():
        return None
    try:
        import graphviz
        svg = graphviz.Source(dot).pipe(format="svg", encoding="utf-8")
    except Exception:  # a malformed or unrenderable graph: show nothing rather than a traceback
        return None
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg


def cuda_graph_view(task: Any, graph_name: str, gid: GraphId | None, variant: str) -> tuple[str, str]:
    """(SVG or escaped DOT, caption) of the CUDA graph captured for (variant, gid), if the task runs on a GPU.

    The GPU executor keeps every captured graph; cudaGraphDebugDotPrint (CuPy's debug_dot_str)
    shows its kernel, memcpy and memset nodes, next to the ComputationGraph they came from.
    """
    runner = getattr(getattr(task, "runner", None), "gpu", None)
    if gid is None or not hasattr(runner, "debug_dot"):
        return "", ""
    try:
        idx = runner.entry(variant, gid)
    except (ValueError, KeyError):
        return "", ""
    if idx < 0 or runner.atlas.captures[idx].graph != graph_name:
        return "", ""
    dot = runner.debug_dot(idx)
    if not dot:
        return "", ""
    caption = (f"captured CUDA graph of {graph_name}/{gid.name} ({variant}): "
               f"{plural(dot.count('->'), 'dependency', 'dependencies')}")
    svg = dot_svg(dot)
    return (svg or f"<pre class='rnb-dot'>{esc(dot)}</pre>"), caption


def native_program_view(task: Any, graph_name: str, gid: GraphId | None, variant: str) -> tuple[str, str]:
    """(HTML table, caption) of the C calls a CPU task's step makes for (variant, gid): the CPU's counterpart
    of the captured CUDA graph (kernels/program.py packs them into one native call per step)."""
    ex = getattr(task, "executor", None)
    if gid is None or getattr(getattr(task, "runner", None), "gpu", None) is not None or not hasattr(ex, "native_calls"):
        return "", ""
    try:
        calls = ex.native_calls(variant, gid, graph_name)
    except (ValueError, KeyError):  # a variant or GraphId the atlas does not hold: nothing to show
        return "", ""
    if not calls:
        return "", ""
    rows = "".join(
        f"<tr><td>{i}</td><td>{esc(n.layer or 'step')} · {esc(n.op)}</td><td>"
        + (" → ".join(f"<code>{esc(c)}</code>" for c in c_calls) if c_calls is not None
           else "<em>Python (splits the program)</em>") + "</td></tr>"
        for i, (n, c_calls) in enumerate(calls))
    count = sum(len(c) for _, c in calls if c is not None)
    python = sum(c is None for _, c in calls)
    how = (f"{plural(python, 'kernel')} in Python between native runs" if python
           else "packed into the step's native program (RNB_PROGRAM=0 calls the kernels one by one)")
    caption = (f"native program of {graph_name}/{gid.name} ({variant}): {plural(count, 'C call')} from "
               f"{plural(len(calls), 'kernel')}, {how}")
    table = (f"<table class='rnb-table rnb-program'><tr><th>#</th><th>node</th><th>C calls, in order</th></tr>"
             f"{rows}</table>")
    return table, caption


def graph_table(graph: Any, gid: GraphId | None = None, plan: MemoryPlan | None = None,
                collapsed: Iterable[str] = (), gid_column: bool = True,
                order: Sequence[GraphId] | None = None) -> str:
    """The same nodes as an HTML table, grouped by layer, in run order (the fallback without `dot`)."""
    collapsed = set(collapsed)
    rows = []
    nodes = _nodes(graph, gid, order)
    runs: list[int] = []  # length of each run of consecutive nodes of one layer
    for k, (_, n) in enumerate(nodes):
        if k and (n.layer or "step") == (nodes[k - 1][1].layer or "step"):
            runs[-1] += 1
        else:
            runs.append(1)
    run = -1
    for k, (g_id, n) in enumerate(nodes):
        layer = n.layer or "step"
        if k == 0 or layer != (nodes[k - 1][1].layer or "step"):
            run += 1
            ops = plural(runs[run], "op")
            state = " (folded)" if layer in collapsed else ""
            rows.append(f"<tr class='rnb-layer-row'><th colspan='{5 if gid_column else 4}' data-layer='{esc(layer)}'>{esc(layer)}"
                        f"<span class='rnb-muted'> · {ops}{state}</span></th></tr>")
        if layer in collapsed:
            continue

        ranges = range_operands(n, plan)

        def fmt(ids: tuple[int, ...], spans: list[dict[str, Any]]) -> str:
            parts = []
            for t in ids:
                name, shape, colour = _tensor_label(t, plan)
                parts.append(f"<span class='rnb-tensor' style='border-color:{colour}' title='{esc(shape)}'>"
                             f"{esc(name)}<span class='rnb-muted'> #{t}</span></span>")
            for o in spans:
                parts.append(f"<span class='rnb-tensor rnb-range' style='border-color:{o['color']}' "
                             f"title='{esc(', '.join(o['names']))}'>{esc(o['span'])}"
                             f"<span class='rnb-muted'> {esc(o['detail'])}</span></span>")
            return " ".join(parts)

        colour = stream_color(g_id.stream.name)
        gid_cell = f"<td class='rnb-mono'>{esc(g_id.name)}</td>" if gid_column else ""
        rows.append(f"<tr><td><span class='rnb-pill' style='background:{colour}'>{esc(g_id.stream.name)}</span></td>"
                    f"{gid_cell}<td class='rnb-mono'><b>{esc(n.op)}</b>"
                    f"<div class='rnb-muted'>{esc(_params_text(n))}</div></td><td>{fmt(n.inputs, ranges[0])}</td>"
                    f"<td>{fmt(n.outputs, ranges[1])}</td></tr>")
    head = f"<tr><th>stream</th>{'<th>GraphId</th>' if gid_column else ''}<th>op</th><th>reads</th><th>writes</th></tr>"
    return f"<table class='rnb-table rnb-graph-table'>{head}{''.join(rows)}</table>"


def run_order(source: Any, graph: Any) -> list[GraphId]:
    """The GraphIds of ``graph`` in the order a task's steps run them (compiler.stages.program_orders: a
    step reading buffer A, then B's own GraphIds, then the validation passes); [] for a hand-built task."""
    graphs = getattr(source, "graphs", None)
    if graphs is None or not hasattr(graphs, "train"):
        return []
    from ..compiler.stages import program_orders

    out: list[GraphId] = []
    for _, g, order in program_orders(graphs):
        if g is graph:
            out += [x for x in order if x not in out]
    return out


def render_graph(graph: Any, gid: GraphId | None = None, plan: MemoryPlan | None = None,
                 collapsed: Iterable[str] = (), gid_column: bool = True,
                 order: Sequence[GraphId] | None = None) -> dict[str, Any]:
    """{'svg': str|None, 'table': html, 'note': str}: what a view of this graph shows; the whole graph
    (gid None) with its GraphIds in ``order`` (``run_order``), the others after them."""
    collapsed = list(collapsed)
    svg = graph_svg(graph, gid, plan, collapsed, order)
    note = "" if svg is not None else (
        "Graphviz's `dot` program was not found, so the graph is listed as a table. "
        "Install it (apt-get install graphviz, conda install graphviz, or brew install graphviz) for the drawing."
        if not dot_available() else "Graphviz could not lay this graph out; it is listed as a table.")
    table = graph_table(graph, gid, plan, collapsed, gid_column, order) if svg is None else ""
    return {"svg": svg, "table": table, "note": note}

"""Drawing a ComputationGraph: graphviz when the `dot` program exists, an HTML table otherwise.

Ops are boxes coloured by the stream of their GraphId; tensors are rounded boxes
edged in their region family's colour, labelled with name, id and the shape in
the chosen variant's MemoryPlan. Each layer (GraphNode.layer) is a cluster that
can be collapsed into one box, so large models stay readable.
"""
from __future__ import annotations

import re
import shutil
from typing import Any, Iterable

from ..compiler.ids import GraphId
from ..memory.plan import MemoryPlan
from ..text import plural
from .access import range_operands
from .theme import esc, family_color, shape_text, stream_color

MAX_OPS_EXPANDED = 80
"""Above this many ops a drawing starts with every layer collapsed."""


def dot_available() -> bool:
    """Whether Graphviz's `dot` program is on PATH (the Python package alone cannot lay out)."""
    return shutil.which("dot") is not None


def _nodes(graph: Any, gid: GraphId | None) -> list[tuple[GraphId, Any]]:
    if gid is None:
        return list(graph)
    return [(GraphId(gid), n) for n in graph.nodes(gid)]


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


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def _params_text(n: Any) -> str:
    ps = [f"{k}={v}" for k, v in n.params if k not in ("first", "last")]
    text = ", ".join(ps)
    return text if len(text) <= 42 else text[:40] + "…"


def graph_source(graph: Any, gid: GraphId | None = None, plan: MemoryPlan | None = None,
                 collapsed: Iterable[str] = ()):  # type: ignore[no-untyped-def]
    """A graphviz.Digraph of one GraphId's nodes (all GraphIds when gid is None)."""
    import graphviz

    collapsed = set(collapsed)
    nodes = _nodes(graph, gid)
    g = graphviz.Digraph(name=_safe(getattr(graph, "name", "graph")), format="svg")
    g.attr(rankdir="TB", bgcolor="transparent", nodesep="0.22", ranksep="0.32", pad="0.15",
           fontname="Helvetica", fontsize="11", fontcolor="#667085")
    g.attr("node", fontname="Helvetica", fontsize="10", margin="0.08,0.04", height="0.3")
    g.attr("edge", color="#98a2b3", arrowsize="0.6", penwidth="1.0")
    by_layer: dict[str, list[tuple[int, GraphId, Any]]] = {}
    for k, (g_id, n) in enumerate(nodes):
        by_layer.setdefault(n.layer or "step", []).append((k, g_id, n))
    # a tensor used only inside one collapsed layer disappears with it
    touched: dict[int, set[str]] = {}
    for _, n in nodes:
        for t in (*n.inputs, *n.outputs):
            touched.setdefault(t, set()).add(n.layer or "step")
    hidden = {t for t, ls in touched.items() if len(ls) == 1 and next(iter(ls)) in collapsed}
    op_id: dict[int, str] = {}
    for layer, members in by_layer.items():
        if layer in collapsed:
            nid = f"layer_{_safe(layer)}"
            streams = sorted({gg.stream.name for _, gg, _ in members})
            colour = stream_color(streams[0])
            g.node(nid, label=f"{layer} ▸ {plural(len(members), 'op')}", shape="box3d", style="filled",
                   fillcolor=colour, fontcolor="white", color=colour, id=nid,
                   tooltip=f"{layer}: {plural(len(members), 'op')} collapsed (click to expand)")
            for k, _, _ in members:
                op_id[k] = nid
            continue
        with g.subgraph(name=f"cluster_{_safe(layer)}") as sub:
            sub.attr(label=layer, style="rounded,dashed", color="#c0c6d0", fontcolor="#475467",
                     fontsize="11", id=f"layer_{_safe(layer)}", tooltip=f"{layer} (click to collapse)")
            for k, g_id, n in members:
                nid = f"op{k}"
                op_id[k] = nid
                colour = stream_color(g_id.stream.name)
                ps = _params_text(n)
                sub_label = f"<br/><font point-size='8'>{esc(ps)}</font>" if ps else ""
                gid_label = f"<br/><font point-size='7'>{esc(g_id.name)}</font>" if gid is None else ""
                g_label = f"<<b>{esc(n.op)}</b>{sub_label}{gid_label}>"
                full = ", ".join(f"{k}={v}" for k, v in n.params)  # a click in the view shows it untruncated
                sub.node(nid, label=g_label, shape="box", style="rounded,filled", fillcolor=colour,
                         fontcolor="white", color=colour, id=nid,
                         tooltip=f"{n.op} on stream {g_id.stream.name}" + (f" ({g_id.name})" if gid is None else "")
                         + (f" · {full}" if full else ""))
    drawn: set[int] = set()
    edges: set[tuple[str, str]] = set()

    def tensor(t: int) -> str:
        tid = f"tensor_{t}"
        if t not in drawn:
            name, shape, colour = _tensor_label(t, plan)
            label = f"<<b>{esc(name)}</b> <font color='#667085'>#{t}</font>" + (
                f"<br/><font point-size='8' color='#475467'>{esc(shape)}</font>>" if shape else ">")
            g.node(tid, label=label, shape="box", style="rounded,filled", fillcolor="white", color=colour,
                   penwidth="1.6", id=tid, tooltip=f"{name} #{t} {shape}")
            drawn.add(t)
        return tid

    for k, (_, n) in enumerate(nodes):
        for t in n.inputs:
            if t not in hidden:
                e = (tensor(t), op_id[k])
                if e not in edges:
                    edges.add(e)
                    g.edge(*e)
        for t in n.outputs:
            if t not in hidden:
                e = (op_id[k], tensor(t))
                if e not in edges:
                    edges.add(e)
                    g.edge(*e)
        _draw_ranges(g, n, plan, op_id[k], edges)
    return g


def _draw_ranges(g: Any, n: Any, plan: MemoryPlan | None, op: str, edges: set[tuple[str, str]]) -> None:
    """The region ranges an op sweeps (optimizer over W/G/M/V, NaN check over G, EMA over E): one dashed
    box per range, its tensors in the tooltip, so the drawing shows every operand the kernel touches."""
    reads, writes = range_operands(n, plan)
    for operand, is_write in [*((o, False) for o in reads), *((o, True) for o in writes)]:
        nid = operand["key"]
        g.node(nid, label=f"<<b>{esc(operand['label'])}</b><br/><font point-size='8' color='#475467'>"
                          f"{esc(operand['span'])}<br/>{esc(operand['detail'])}</font>>",
               shape="box", style="rounded,dashed,filled", fillcolor="white", color=operand["color"],
               penwidth="1.8", id=nid, tooltip=", ".join(operand["names"]))
        e = (op, nid) if is_write else (nid, op)
        if e not in edges:
            edges.add(e)
            g.edge(*e, style="dashed", color=operand["color"])


def graph_svg(graph: Any, gid: GraphId | None = None, plan: MemoryPlan | None = None,
              collapsed: Iterable[str] = ()) -> str | None:
    """The drawing as inline SVG, or None when `dot` is missing or fails."""
    if not dot_available():
        return None
    try:
        svg = graph_source(graph, gid, plan, collapsed).pipe(format="svg", encoding="utf-8")
    except Exception:  # graphviz.ExecutableNotFound, CalledProcessError: fall back, never a traceback
        return None
    start = svg.find("<svg")
    svg = svg[start:] if start >= 0 else svg
    # let the page scale it: keep the viewBox, drop the fixed point sizes
    return re.sub(r'<svg width="([\d.]+)pt" height="([\d.]+)pt"',
                  lambda m: f'<svg class="rnb-graph-svg" width="{float(m.group(1)) * 1.25:.0f}px" '
                            f'height="{float(m.group(2)) * 1.25:.0f}px"', svg, count=1)


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


def graph_table(graph: Any, gid: GraphId | None = None, plan: MemoryPlan | None = None,
                collapsed: Iterable[str] = (), gid_column: bool = True) -> str:
    """The same nodes as an HTML table, grouped by layer (the fallback without `dot`)."""
    collapsed = set(collapsed)
    rows = []
    nodes = _nodes(graph, gid)
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


def render_graph(graph: Any, gid: GraphId | None = None, plan: MemoryPlan | None = None,
                 collapsed: Iterable[str] = (), gid_column: bool = True) -> dict[str, Any]:
    """{'svg': str|None, 'table': html, 'note': str}: what a view of this graph shows."""
    collapsed = list(collapsed)
    svg = graph_svg(graph, gid, plan, collapsed)
    note = "" if svg is not None else (
        "Graphviz's `dot` program was not found, so the graph is listed as a table. "
        "Install it (apt-get install graphviz, conda install graphviz, or brew install graphviz) for the drawing."
        if not dot_available() else "Graphviz could not lay this graph out; it is listed as a table.")
    table = graph_table(graph, gid, plan, collapsed, gid_column) if svg is None else ""
    return {"svg": svg, "table": table, "note": note}

"""GraphView: a ComputationGraph per GraphId, drawn by graphviz, each layer collapsible."""
from __future__ import annotations

from typing import Any

import traitlets

from ..compiler.ids import GraphId
from . import views
from ._assets import esm
from ._base import ViewWidget
from .graphdraw import (cuda_graph_view, default_collapsed, dot_available, layers_of, native_program_view,
                        render_graph, run_order, static_svg)
from .graphpick import op_details, tensor_details
from .theme import esc


class GraphView(ViewWidget):
    """Pick a graph (train / inference) and a GraphId ('' = all); click a layer to fold it."""

    _esm = esm("graph.js")
    graph = traitlets.Unicode("").tag(sync=True)
    gid = traitlets.Unicode("").tag(sync=True)
    variant = traitlets.Unicode("").tag(sync=True)
    collapsed = traitlets.List(traitlets.Unicode()).tag(sync=True)
    layers = traitlets.List(traitlets.Unicode()).tag(sync=True)
    svg = traitlets.Unicode("").tag(sync=True)
    table = traitlets.Unicode("").tag(sync=True)
    note = traitlets.Unicode("").tag(sync=True)
    dot = traitlets.Bool(False).tag(sync=True)
    captured = traitlets.Unicode("").tag(sync=True)  # what the step runs for the graph picked: the CUDA
    captured_caption = traitlets.Unicode("").tag(sync=True)  # graph (SVG) on a GPU, the C calls on a CPU
    picked = traitlets.Dict().tag(sync=True)   # the op or tensor clicked: {"op": index} or {"tensor": id}
    details = traitlets.Dict().tag(sync=True)  # what the details panel shows for it (graphpick.py)

    def __init__(self, source: Any, graph: str = "", gid: str | None = None, **kwargs: Any) -> None:
        """``gid``: a GraphId's name, '' for all of them; None (the default) opens a training
        graph at DEEP_FWD_BWD, the step's core, and any other graph whole."""
        self._drawing = False
        super().__init__(source, **kwargs)
        self._drawing = True
        self._pick(graph, gid)
        self._drawing = False
        self._ready = True
        self.draw(reset_layers=True)

    def _pick(self, graph: str, gid: str | None) -> None:
        """Open ``graph`` (else the first one) at ``gid`` (None: the default of __init__'s docstring)."""
        graphs = self.view.get("graphs", [])
        names = [g["name"] for g in graphs]
        if names:
            self.graph = graph if graph in names else names[0]
            if gid is None and views.is_deep(self.source) and self.graph == "train":
                gid = GraphId.DEEP_FWD_BWD.name
            if self.view.get("hand"):  # a hand-built graph has one bucket: its stream, no GraphId
                gid = graphs[names.index(self.graph)]["gids"][0]
            self.gid = gid or ""

    def refresh(self) -> None:
        """Read the task again and redraw it: after a reset() and lock_memory() with other settings the
        drawing shows the new graphs and shapes; a view made before the graphs existed opens them now.
        The collapsed layers are kept while the graph's layers stay the same."""
        super().refresh()
        if not getattr(self, "_ready", False):  # __init__ draws once it has picked a graph
            return
        names = [g["name"] for g in self.view.get("graphs", [])]
        if names and self.graph not in names:
            self._drawing = True
            try:
                self._pick(self.graph, None)
            finally:
                self._drawing = False
        g = views.graphs_of(self.source).get(self.graph)
        gid = GraphId[self.gid] if self.gid in GraphId.__members__ else None
        self.draw(reset_layers=g is None or layers_of(g, gid) != list(self.layers))

    def make_view(self) -> dict[str, Any]:
        graphs = views.graphs_of(self.source)
        plans = views.plans_of(self.source)
        return {"ready": bool(graphs), "hand": bool(graphs) and not hasattr(getattr(self.source, "graphs", None), "train")
                and not hasattr(self.source, "buckets"),
                "graphs": [{"name": n, "gids": [g.name for g in cg.ids()],
                            "streams": {g.name: g.stream.name for g in cg.ids()}, "nodes": len(cg)}
                           for n, cg in graphs.items()],
                "variants": list(plans)}

    def static_html(self) -> str:
        body = static_svg(self.svg) if self.svg else self.table or "<div class='rnb-note'>No graphs yet.</div>"
        note = f"<div class='rnb-note'>{esc(self.note)}</div>" if self.note else ""
        captured = (f"<div class='rnb-captured'><div class='rnb-sub'>{esc(self.captured_caption)}</div>"
                    f"{self.captured}</div>" if self.captured else "")
        return (f"<div class='rnb-graph-static'><div class='rnb-sub'>{esc(self.title())}</div>{note}{body}"
                f"{captured}</div>")

    def one_line(self) -> str:
        if not self.view.get("ready"):
            return "no graphs yet"
        return self.title() + (f", shapes of {self.variant}" if self.variant and not self.view.get("hand") else "")

    def title(self) -> str:
        if self.view.get("hand"):
            return f"graph {self.graph!r}"
        return f"{self.graph} graph · " + (self.gid or "all GraphIds")

    def draw(self, reset_layers: bool = False) -> None:
        """Render the current selection (graphviz SVG, or the table when `dot` is missing)."""
        if self._drawing:
            return
        self._drawing = True
        try:
            graphs = views.graphs_of(self.source)
            g = graphs.get(self.graph)
            if g is None:
                self.svg, self.table, self.note = "", "", ""
                return
            if self.gid and self.gid not in GraphId.__members__:  # a stale or malformed pick: show everything
                self.gid = ""
            gid = GraphId[self.gid] if self.gid else None
            plans = views.plans_of(self.source)
            if self.variant not in plans:
                self.variant = next(iter(plans), "")
            if reset_layers:
                self.layers = layers_of(g, gid)
                self.collapsed = default_collapsed(g, gid)
            out = render_graph(g, gid, plans.get(self.variant), self.collapsed, gid_column=not self.view.get("hand"),
                               order=run_order(self.source, g))
            self.svg, self.table, self.note, self.dot = out["svg"] or "", out["table"], out["note"], dot_available()
            view = cuda_graph_view(self.source, self.graph, gid, self.variant)
            if not view[0]:  # a CPU task: the C calls of the step's native program
                view = native_program_view(self.source, self.graph, gid, self.variant)
            with self.hold_sync():  # one message: the front end never draws one graph's calls under another's caption
                self.captured, self.captured_caption = view
        finally:
            self._drawing = False
        self.update_copies()  # the static copy shows this drawing, not the one before it

    @traitlets.observe("graph", "gid")
    def _on_pick(self, change: Any) -> None:
        if change["name"] == "graph" and not self._drawing:
            gids = next((g["gids"] for g in self.view.get("graphs", []) if g["name"] == change["new"]), [])
            keep = gids[0] if self.view.get("hand") and gids else ("" if self.gid not in gids else self.gid)
            if keep != self.gid:
                self._drawing = True
                try:
                    self.gid = keep
                finally:
                    self._drawing = False
        self.draw(reset_layers=True)

    @traitlets.observe("variant", "collapsed")
    def _on_layout(self, change: Any) -> None:
        self.draw()

    @traitlets.observe("picked")
    def _on_picked(self, _change: Any) -> None:
        self.details = self.pick_details(self.picked)

    def pick_details(self, picked: dict[str, Any]) -> dict[str, Any]:
        """The details of ``{"op": index}`` (the drawing's op<index>) or ``{"tensor": id}``; {} for none."""
        g = views.graphs_of(self.source).get(self.graph)
        if g is None or not picked:
            return {}
        plans = views.plans_of(self.source)
        order = run_order(self.source, g)
        try:
            if "tensor" in picked:
                return tensor_details(g, plans, int(picked["tensor"]), order)
            gid = GraphId[self.gid] if self.gid in GraphId.__members__ else None
            return op_details(g, gid, plans.get(self.variant), int(picked["op"]), order)
        except (KeyError, TypeError, ValueError) as exc:  # a malformed pick from the page: said, not raised
            return {"error": f"Cannot show {picked!r}: {exc}"}

"""AtlasView: variants x GraphIds, coloured by the variants that share a bound graph; a click opens it."""
from __future__ import annotations

from typing import Any

import traitlets

from ..compiler.ids import GraphId
from ..text import plural
from . import static, views
from ._assets import esm
from ._base import ViewWidget
from .access import access_rows
from .graphdraw import default_collapsed, render_graph


class AtlasView(ViewWidget):
    """The GraphAtlas of a compiled task. ``selected`` is the clicked cell; ``detail`` shows its graph."""

    _esm = esm("atlas.js")
    selected = traitlets.Dict().tag(sync=True)
    detail = traitlets.Dict().tag(sync=True)

    def make_view(self) -> dict[str, Any]:
        return views.atlas_view(self.source)

    def static_html(self) -> str:
        return static.atlas_html(self.view)

    def one_line(self) -> str:
        v = self.view
        if not v.get("ready"):
            return ("no atlas yet: compile() fills it" if views.is_deep(self.source) else
                    "none: a hand-built task binds its graphs by name")
        return (f"{plural(v['entries'], 'entry', 'entries')} over {plural(len(v['variants']), 'variant')} -> "
                f"{plural(v['captures'], 'distinct bound graph')}")

    def select_cell(self, variant: str, gid: str) -> dict[str, Any]:
        """Select a cell (what a click does) and return the detail it shows."""
        self.selected = {"variant": variant, "gid": gid}
        return self.detail

    @traitlets.observe("selected")
    def _on_select(self, change: Any) -> None:
        sel = change["new"] if isinstance(change["new"], dict) else {}
        variant, gid = sel.get("variant", ""), sel.get("gid", "")
        if not isinstance(variant, str) or not isinstance(gid, str):  # a malformed click: no cell
            self.detail = {}
            return
        cell = self.view.get("cells", {}).get(variant, {}).get(gid)
        if cell is None:
            self.detail = {}
            return
        graphs = views.graphs_of(self.source)
        plans = views.plans_of(self.source)
        graph = graphs.get(cell["graph"])
        gid = GraphId[cell["gid"]]
        plan = plans.get(sel["variant"])
        nodes = graph.nodes(gid) if graph is not None else []
        out = render_graph(graph, gid, plan, default_collapsed(graph, gid)) if graph is not None else \
            {"svg": None, "table": "", "note": "graph not found"}
        sharing = sorted(f"{v}" for v, row in self.view["cells"].items() for g, c in row.items()
                         if c["captured"] == cell["captured"] and (v, g) != (sel["variant"], sel["gid"]))
        self.detail = {"variant": sel["variant"], "gid": cell["gid"], "graph": cell["graph"],
                       "captured": cell["captured"], "shape_id": cell["shape_id"], "stream": cell["stream"],
                       "shape": self.view["shape_ids"].get(str(cell["shape_id"]), ""), "n_nodes": len(nodes),
                       "shared_with": sharing, "svg": out["svg"] or "", "table": out["table"], "note": out["note"],
                       "color": cell["color"], "ink": cell["ink"], "access": access_rows(nodes, plan)}

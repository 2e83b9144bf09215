"""BluePrintView and VariantsView: the declared model, its executable layers, the six variants.

Both are views like the others (ViewWidget): Python renders their HTML, the front end (widgets/
htmlview.js) shows it and polls the task while shown, so a view made before plan() shows the layers
and the variants' shapes once plan() has run, a model changed before plan() shows the new model, and
reset() takes them away again; the static copy kept in the notebook follows too.
"""
from __future__ import annotations

from typing import Any

from ..text import plural
from . import static, views
from ._assets import esm
from ._base import ViewWidget


class _HTMLView(ViewWidget):
    """A view whose whole drawing is HTML rendered here (``render``), the same live and static."""

    _esm = esm("htmlview.js")
    export_name = "view"  # the name of the files its export buttons give

    def render(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def make_view(self) -> dict[str, Any]:
        return {"html": self.render(), "name": self.export_name}

    def static_html(self) -> str:
        return self.render()


class BluePrintView(_HTMLView):
    """The BluePrint tree, the ArchPlan's layers (fusions, shapes, parameters) and the settings."""

    export_name = "blueprint"

    def render(self) -> str:
        return f"<div class='rnb-blueprint-view'>{static.blueprint_html(views.blueprint_view(self.source))}</div>"

    def one_line(self) -> str:
        v = views.blueprint_view(self.source)
        if getattr(self.source, "blueprint", None) is None:
            return "no model declared" + (" (a TaskBase is built by hand)" if not views.is_deep(self.source) else "")
        if not v["planned"]:
            return "model declared; plan() turns it into executable layers"
        return f"{plural(len(v['layers']), 'executable layer')}, {v['total_params']:,} parameters"


class VariantsView(_HTMLView):
    """The six variants: batch, input shape, ShapeId, shared captures and the shapes that differ."""

    export_name = "variants"

    def render(self) -> str:
        return f"<div class='rnb-variants-view'>{static.variants_html(views.variants_view(self.source))}</div>"

    def one_line(self) -> str:
        v = views.variants_view(self.source)
        if not v["ready"]:
            return "the six variants are derived by plan()"
        used = sum(r["used"] for r in v["rows"])
        same = {True: ", same offsets in all", False: ", offsets differ", None: ""}[v["offsets_identical"]]
        return f"{plural(len(v['rows']), 'variant')}, {used} used{same}"

"""BluePrintView and VariantsView: the declared model, its executable layers, the six variants."""
from __future__ import annotations

from typing import Any

import ipywidgets as w

from ..text import plural
from . import static, views
from ._base import OneLine, live_bundle, show_with_copy


class _HTMLView(OneLine, w.HTML):
    """A plain HTML widget holding a task; refresh() re-reads it."""

    def __init__(self, task: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.source = task
        self._shown: list[Any] = []  # display handles of the static copies
        self.add_class("rnb-html-view")
        self.add_class("rnb-live")
        self.refresh()

    def render(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def refresh(self) -> None:
        self.value = static.wrap(self.render())
        for handle in self._shown:
            handle.update(self.copy_bundle(), raw=True)

    def _repr_html_(self) -> str:
        return static.wrap(self.render())

    def copy_bundle(self) -> dict[str, Any]:
        return {"text/plain": repr(self), "text/html": static.static_copy(self._repr_html_(), type(self).__name__)}

    def _ipython_display_(self) -> None:
        self._shown.append(show_with_copy(self.copy_bundle(), live_bundle(self)))


class BluePrintView(_HTMLView):
    """The BluePrint tree, the ArchPlan's layers (fusions, shapes, parameters) and the settings."""

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

    def render(self) -> str:
        return f"<div class='rnb-variants-view'>{static.variants_html(views.variants_view(self.source))}</div>"

    def one_line(self) -> str:
        v = views.variants_view(self.source)
        if not v["ready"]:
            return "the six variants are derived by plan()"
        used = sum(r["used"] for r in v["rows"])
        same = {True: ", same offsets in all", False: ", offsets differ", None: ""}[v["offsets_identical"]]
        return f"{plural(len(v['rows']), 'variant')}, {used} used{same}"

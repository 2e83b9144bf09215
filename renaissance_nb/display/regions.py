"""RegionMap: the arena by region and tensor; switch variants and watch the offsets stay put."""
from __future__ import annotations

from typing import Any

import traitlets

from ..text import plural
from . import static, views
from ._assets import esm
from ._base import ViewWidget


class RegionMap(ViewWidget):
    """Regions laid out by offset and size, coloured by family; hover a tensor, click a region.

    ``source``: a DeepLearningTask (all six variants), a TaskBase, a MemoryPlan or a dict of plans.
    """

    _esm = esm("regions.js")
    variant = traitlets.Unicode("").tag(sync=True)
    selected_region = traitlets.Unicode("").tag(sync=True)

    def make_view(self) -> dict[str, Any]:
        v = views.region_view(self.source)
        if v["variants"] and self.variant not in v["variants"]:
            self.variant = v["variants"][0]
        return v

    @traitlets.observe("variant")
    def _on_variant(self, change: Any) -> None:
        names = self.view.get("variants", []) if isinstance(getattr(self, "view", None), dict) else []
        if names and change["new"] not in names:  # a stale or malformed pick: the first variant
            self.variant = names[0]

    def static_html(self) -> str:
        return static.regions_html(self.view, self.variant or None)

    def one_line(self) -> str:
        v = self.view
        if not v.get("ready"):
            return "no memory plan yet"
        return (f"arena {v['arena_human']}, {plural(v['n_tensors'], 'tensor')} in {plural(len(v['regions']), 'region')}"
                f", variant {self.variant}")

    def tensors_in(self, region: str) -> list[dict[str, Any]]:
        """The DTensors of a region as the detail panel lists them (in the current variant)."""
        ids = next((r["tensor_ids"] for r in self.view.get("regions", []) if r["region"] == region), [])
        by_id = {t["id"]: t for t in self.view.get("tensors", [])}
        return [by_id[i] for i in ids]

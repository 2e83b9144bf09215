"""LifetimeView: step order x offset, one box per tensor interval (like XLA's memory viewer)."""
from __future__ import annotations

from typing import Any

import traitlets

from ..text import plural
from . import static, views
from ._assets import esm
from ._base import ViewWidget


class LifetimeView(ViewWidget):
    """When each tensor is live and where it sits; boxes stacked on the same bytes share memory.

    ``scope``: 'reusable' shows the F and T regions (the ones liveness may pack), 'arena' everything.
    """

    _esm = esm("lifetimes.js")
    scope = traitlets.Unicode("reusable").tag(sync=True)

    def make_view(self) -> dict[str, Any]:
        return views.lifetime_view(self.source)

    def static_html(self) -> str:
        return static.lifetimes_html(self.view)

    def one_line(self) -> str:
        v = self.view
        if not v.get("ready") or not v["tensors"]:
            return "no lifetimes yet: they are read from the graphs"
        share = (f"{plural(len(v['shared']), 'pair')} sharing bytes" if v["reuse"]
                 else "liveness reuse off, no bytes shared")
        return f"{v['variant']}: {plural(len(v['tensors']), 'tensor')} over {plural(len(v['steps']), 'step')}, {share}"

"""LifetimeView: step order x offset, one box per tensor interval (like XLA's memory viewer)."""
from __future__ import annotations

from typing import Any

import traitlets

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

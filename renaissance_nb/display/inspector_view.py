"""MemoryInspectorView: the step scrubber, the peak per variant, what-if plans and the tensor inspector.

One widget over ``task.memory_inspector``. The front end (widgets/inspector.js) sends what the user
picks as traitlets (``tick``, ``variant``, ``what_if``, ``fit_budget``, ``selected``); Python answers
in ``whatif_result``, ``fit_result`` and ``tensor`` with what the engine computes (planning only for
the what-ifs; values read from the arena for a tensor). The same traitlets drive it from code::

    w = MemoryInspectorView(task)
    w.tick = 12; w.what_if = {"liveness": False}; w.fit_budget = 64 << 20; w.selected = "fc1.weight"
"""
from __future__ import annotations

import time
from typing import Any

import traitlets

from ..text import human_bytes
from . import inspector_data as data
from . import inspector_static
from ._assets import esm
from ._base import ViewWidget


class MemoryInspectorView(ViewWidget):
    """The memory plan of a task, one node of its step at a time, and what other settings would cost.

    ``tick``: the node the scrubber is at (its time on the liveness timeline, MemoryInspector.ticks());
    ``variant``: the variant whose sizes and peak are shown; ``what_if``: settings to plan instead
    (batch_size, resolution [h, w], liveness, pad_rows, fuse, optimizer 'sgd'/'sgd_momentum'/'adam'/
    'adamw', ema True/False); ``fit_budget``: bytes for "the largest batch that fits" (0: not asked);
    ``selected``: the tensor the inspector shows.
    """

    _esm = esm("inspector.js")
    tick = traitlets.Int(-1).tag(sync=True)
    variant = traitlets.Unicode("train_base").tag(sync=True)
    what_if = traitlets.Dict().tag(sync=True)
    whatif_result = traitlets.Dict().tag(sync=True)
    fit_budget = traitlets.Int(0).tag(sync=True)
    fit_result = traitlets.Dict().tag(sync=True)
    selected = traitlets.Unicode("").tag(sync=True)
    tensor = traitlets.Dict().tag(sync=True)

    COPY_EVERY = 1.0
    """Seconds between two static-copy updates for picks made in the browser (a scrub sends one per key)."""

    def __init__(self, task: Any, **kwargs: Any) -> None:
        self._insp: Any = None
        self._index: data.TensorIndex | None = None
        self._plans: dict[str, Any] = {}  # what-if inspectors planned for this view (data.planned)
        self._ready = False  # the answers wait for the first view (traitlets given as kwargs arrive first)
        self._from_browser = False
        self._copied, self._copy_due = 0.0, False
        super().__init__(task, **kwargs)

    # ---- the view and the answers ----------------------------------------------------------------------
    def make_view(self) -> dict[str, Any]:
        self._insp, why = data.inspector_of(self.source)
        self._plans = {}
        self._index = None if self._insp is None else data.TensorIndex(self._insp)
        view = ({"ready": False, "reason": why} if self._insp is None
                else data.inspector_view_of(self._insp, str(getattr(self.source, "phase", "")), self._index))
        self._ready = False  # the traitlets below are set against the new view, quietly
        try:
            self._settle(view)
        finally:
            self._ready = True
        return view

    def _settle(self, view: dict[str, Any]) -> None:
        """Fit the picks to a new view (a tick or variant it lacks), and answer them again."""
        if not view.get("ready"):
            self.whatif_result, self.fit_result, self.tensor = {}, {}, {}
            return
        if self.variant not in view["variants"]:
            self.variant = view["variants"][0]
        self.tick = self._snap(self.tick, view)
        self.whatif_result = self._whatif() if self.what_if else {}
        self.fit_result = self._fit() if self.fit_budget else {}
        self.tensor = self._tensor(view) if self.selected else {}

    @staticmethod
    def _snap(tick: int, view: dict[str, Any]) -> int:
        """A tick of the view: ``tick`` itself, the nearest one (a gap between programs), or, for -1,
        the peak of train_base."""
        times = [k["t"] for k in view["ticks"]]
        if not times:
            return -1
        if tick < 0:
            return int(view["peaks"][view["variants"][0]]["time"])
        return min(times, key=lambda t: (abs(t - tick), t))

    def _whatif(self) -> dict[str, Any]:
        return data.whatif_view(self._insp, dict(self.what_if), self.variant, self._plans)

    def _fit_inspector(self) -> tuple[Any, str]:
        """The plan the fit searches from: the what-if settings while some are asked, else the current."""
        changes = data.changes_from(self._insp, dict(self.what_if)) if self.what_if else {}
        if not changes or self.whatif_result.get("error"):
            return self._insp, "with the current settings"
        return data.planned(self._insp, changes, self._plans), f"with {self.whatif_result.get('label', '')}"

    def _fit(self) -> dict[str, Any]:
        insp, label = self._fit_inspector()
        return data.fit_view(insp, self.fit_budget, label)

    def _tensor(self, view: dict[str, Any] | None = None) -> dict[str, Any]:
        return data.tensor_view(self.source, self._insp, view if view is not None else self.view, self.selected,
                                self._index)

    @traitlets.observe("what_if")
    def _on_what_if(self, _change: Any) -> None:
        if self._ready and self._insp is not None:
            self.whatif_result = self._whatif() if self.what_if else {}
            if self.fit_budget:
                self.fit_result = self._fit()
            self._copy()

    @traitlets.observe("fit_budget")
    def _on_fit(self, _change: Any) -> None:
        if self._ready and self._insp is not None:
            self.fit_result = self._fit() if self.fit_budget else {}
            self._copy()

    @traitlets.observe("selected")
    def _on_selected(self, _change: Any) -> None:
        if self._ready and self._insp is not None:
            self.tensor = self._tensor() if self.selected else {}
            self._copy()

    @traitlets.observe("tick", "variant")
    def _on_pick(self, change: Any) -> None:
        if not (self._ready and self.view.get("ready")):
            return
        if change["name"] == "tick" and self._snap(self.tick, self.view) != self.tick:
            self.tick = self._snap(self.tick, self.view)  # observed again with the snapped tick
            return
        if change["name"] == "variant" and self.variant not in self.view["variants"]:
            self.variant = self.view["variants"][0]
            return
        if change["name"] == "variant" and self.what_if:
            self.whatif_result = self._whatif()  # its peak and diff are the variant's
        self._copy()

    # ---- the static copy, kept true without rebuilding it for every key of a scrub -------------------------
    def set_state(self, sync_data: dict[str, Any]) -> None:
        """The picks the browser sends (ipywidgets calls this for them): marked, so that their static
        copy waits (``_copy``); a pick made in code updates it at once."""
        self._from_browser = True
        try:
            super().set_state(sync_data)
        finally:
            self._from_browser = False

    def _copy(self) -> None:
        """Put the picks into the static copies: at once when made in code, or when the last update is
        COPY_EVERY seconds old; else at the next poll (1.5 s while shown), so the last pick is written."""
        now = time.monotonic()
        if self._from_browser and now - self._copied < self.COPY_EVERY:
            self._copy_due = True
            return
        self.update_copies()

    def update_copies(self) -> None:
        self._copied, self._copy_due = time.monotonic(), False
        super().update_copies()

    def polled(self) -> None:
        """At each poll (after a task that moved on was re-read, whose refresh() wrote the copy): the
        picks made since the last copy are written now."""
        if self._copy_due:
            self.update_copies()

    # ---- text and the static copy ------------------------------------------------------------------------
    def at_tick(self) -> dict[str, Any]:
        """The scrubber's node as the view lists it (op, layer, GraphId, reads, writes), {} if none."""
        return next((k for k in self.view.get("ticks", ()) if k["t"] == self.tick), {})

    def live_bytes(self) -> int:
        """Bytes live at the scrubber's tick in the chosen variant (MemoryInspector.live_bytes)."""
        curve = self.view.get("curves", {}).get(self.variant, [])
        return int(curve[self.tick]) if 0 <= self.tick < len(curve) else 0

    def state(self) -> dict[str, Any]:
        """What the user picked and what was answered: the static copy draws it with the view."""
        return {"tick": self.tick, "variant": self.variant, "whatif": self.whatif_result, "fit": self.fit_result,
                "tensor": self.tensor, "selected": self.selected}

    def static_html(self) -> str:
        return inspector_static.inspector_html(self.view, self.state())

    def one_line(self) -> str:
        v = self.view
        if not v.get("ready"):
            return v.get("reason", "no plan yet")
        p = v["peaks"][self.variant]
        k = self.at_tick()
        return (f"{self.variant}: peak {p['human']} of a {v['arena_human']} arena at {p['op']} ({p['layer'] or '-'}); "
                f"tick {self.tick}: {k.get('op', '-')} ({k.get('layer') or '-'}), {human_bytes(self.live_bytes())} live")

"""The dashboard: a header and one tab per section of sections.py (Phases, BluePrint, Variants, Memory,
Inspector, Graph, Atlas, Training; the static page folds the same ones).

What ``task`` as the last line of a cell, or ``task.inspect()``, shows. Its views follow the task
(each polls it while shown, see ViewWidget._on_poll); a change re-reads the task into every tab,
keeping the tab the user chose.
"""
from __future__ import annotations

import traceback
from typing import Any, Callable

import ipywidgets as w

from . import static, views
from ._base import OneLine, ViewWidget, live_bundle, show_with_copy
from .allocations_panel import AllocationsPanel
from .atlas import AtlasView
from .blueprint import BluePrintView, VariantsView
from .graphview import GraphView
from .inspector_view import MemoryInspectorView
from .lifetimes import LifetimeView
from .monitor import TrainingMonitor
from .phase import PhaseView
from .regions import RegionMap
from .sections import INSPECTOR_WAITS, sections_of


class Dashboard(OneLine, w.VBox):
    """Every view of one task, kept in step with it."""

    def __init__(self, task: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.task = task
        self.add_class("rnb-dashboard")
        self.add_class("rnb-live")
        self.header = w.HTML(layout=w.Layout(flex="1 1 auto"))
        self.header.add_class("rnb-dashboard-header")
        self.phases = PhaseView(task)
        self.phases.on_change(lambda _: self.refresh())
        self.monitor = TrainingMonitor(task, controls=views.is_deep(task))
        self.monitor.on_change(lambda _: self.refresh())
        self.tabs = w.Tab()
        self.tabs.add_class("rnb-tabs")
        self._titles: list[str] = []
        self._made: tuple = ()  # which views the tabs hold: rebuilt only when this changes
        self._shown: list[Any] = []  # display handles of the static copies
        self.children = [self.header, self.tabs]
        self.refresh()

    def _build(self) -> list[tuple[str, w.Widget]]:
        """One tab per section the task has (sections.py: the static page lists the same)."""
        makers = self.makers()
        return [(s.title, makers[s.title]()) for s in sections_of(self.task)]

    def makers(self) -> dict[str, Callable[[], w.Widget]]:
        """Each section's live view by title, made when its tab is built."""
        t = self.task
        deep = views.is_deep(t)
        plans = views.plans_of(t)
        return {
            "Phases": lambda: self.phases,
            "BluePrint": lambda: BluePrintView(t),
            "Variants": lambda: VariantsView(t),
            "Memory": lambda: self._memory(bool(plans), deep),
            "Inspector": lambda: MemoryInspectorView(t) if plans else _note(INSPECTOR_WAITS),
            "Graph": lambda: (GraphView(t) if views.graphs_of(t) else
                              _note("Graphs are built by " + ("lock_memory()." if deep else "add_graph()."))),
            "Atlas": lambda: (AtlasView(t) if views.atlas_of(t) is not None else
                              _note("The GraphAtlas is filled by compile()." if deep else "Hand-built tasks bind "
                                    "their graphs by name; the atlas belongs to DeepLearningTask.")),
            "Training": lambda: self.monitor,
        }

    def _memory(self, plans: bool, deep: bool) -> w.Widget:
        """The arena by region, the lifetimes, and on a compiled CPU task the allocation count."""
        t = self.task
        if not plans:
            return _note("The memory plan is fixed by " + ("lock_memory()." if deep else "finalize_memory()."))
        compiled_cpu = deep and views.atlas_of(t) is not None and getattr(t, "device_kind", "cpu") == "cpu"
        return w.VBox([RegionMap(t), LifetimeView(t), *([AllocationsPanel(t)] if compiled_cpu else [])])

    def _made_now(self) -> tuple:
        """What the tabs can show now: a view appears when its stage value does (and goes on reset())."""
        t = self.task
        return (views.is_deep(t), bool(views.plans_of(t)), bool(views.graphs_of(t)), views.atlas_of(t) is not None)

    def refresh(self) -> None:
        """Re-read the task into the header and every tab, keeping the tab the user chose (by title)."""
        self.header.value = static.wrap(static.header_html(self.task))
        made = self._made_now()
        if made == self._made:  # the same views: each re-reads the task in place
            for view in self._views(self.tabs):  # the phase view and the monitor refreshed before calling
                if not isinstance(view, ViewWidget) or view.stale():
                    view.refresh()
        else:
            self._rebuild(made)
        if self._shown:
            bundle = self.copy_bundle()  # every view drawn again as HTML: once, for every copy shown
            for handle in self._shown:
                handle.update(bundle, raw=True)

    def _rebuild(self, made: tuple) -> None:
        chosen = self._titles[self.tabs.selected_index] if self.tabs.selected_index is not None and \
            self.tabs.selected_index < len(self._titles) else None
        self.phases.refresh()
        self.monitor.refresh()
        old = [c for c in self.tabs.children if c not in (self.phases, self.monitor)]
        items = self._safe(self._build)
        self._titles = [title for title, _ in items]
        self._made = made
        with self.tabs.hold_sync():
            self.tabs.children = [c for _, c in items]
            self.tabs.titles = tuple(self._titles)
            self.tabs.selected_index = self._titles.index(chosen) if chosen in self._titles else 0
        self.tabs.send_state("selected_index")  # the front end resets it when the children change
        for c in old:
            self._close_tree(c)

    @staticmethod
    def _views(widget: w.Widget) -> list[Any]:
        """Every view under a widget (the Memory tab holds two): what has a source and refresh()."""
        if hasattr(widget, "source") and hasattr(widget, "refresh"):
            return [widget]
        return [v for c in getattr(widget, "children", ()) for v in Dashboard._views(c)]

    def copy_bundle(self) -> dict[str, Any]:
        """The static copy's output: every view of the task as HTML (foldable sections)."""
        return {"text/plain": repr(self), "text/html": static.static_copy(self._repr_html_(), "Dashboard")}

    def _ipython_display_(self) -> None:
        self._shown.append(show_with_copy(self.copy_bundle(), live_bundle(self)))

    def _safe(self, build: Any) -> list[tuple[str, w.Widget]]:
        try:
            return build()
        except Exception as exc:  # a broken view shows its error, not a traceback
            return [("Phases", self.phases), ("Error", _error(exc))]

    def close(self) -> None:
        """Close every widget this dashboard made (ipywidgets closes only the one it is called on), so
        nothing in ipywidgets' registry keeps the task alive."""
        made = [*getattr(self, "children", ()), getattr(self, "phases", None), getattr(self, "monitor", None),
                getattr(self, "layout", None)]  # getattr: also called from __del__ of one that failed to build
        for c in made:
            if c is not None:
                self._close_tree(c)
        super().close()

    @staticmethod
    def _close_tree(widget: w.Widget) -> None:
        """Close a widget, its children, and its layout and style (ipywidgets leaves those open). No
        module names are used: close() also runs from __del__ at interpreter exit, when they may be gone."""
        for c in getattr(widget, "children", ()):
            Dashboard._close_tree(c)
        for part in ("layout", "style"):
            sub = getattr(widget, part, None)
            if hasattr(sub, "close"):
                sub.close()
        if hasattr(widget, "close"):
            widget.close()

    def select(self, title: str) -> None:
        """Open a tab by its title."""
        self.tabs.selected_index = self._titles.index(title)

    def _repr_html_(self) -> str:
        return static.dashboard_html(self.task)

    def one_line(self) -> str:
        text = repr(self.task)
        return text[1:-1] if text.startswith("<") and text.endswith(">") else text


def _note(text: str) -> w.HTML:
    return w.HTML(static.wrap(f"<div class='rnb-note'>{text}</div>"))


def _error(exc: BaseException) -> w.HTML:
    return w.HTML(static.wrap(f"<div class='rnb-error'><b>{type(exc).__name__}</b>{static.esc(str(exc))}</div>"))


def show(task: Any) -> None:
    """What a notebook shows for a task: the static dashboard, then the live one (``show_with_copy``)."""
    from . import static_bundle

    try:
        board = Dashboard(task)
    except Exception:
        from IPython.display import display

        display(static_bundle(task), raw=True)
        return
    board._ipython_display_()


def bundle(task: Any) -> dict[str, Any]:
    """The mimebundle of a displayed task: widget view + static HTML + text; never raises. Each display
    is a dashboard of its own, built from the task as it is then, so a notebook that displays a task
    at each phase keeps each phase on screen until that dashboard's buttons or refresh re-read the
    task. ipywidgets keeps every displayed widget, and through it the task, until the kernel
    restarts; ``d = task.inspect()`` gives a dashboard that ``d.close()`` releases."""
    from . import static_bundle

    out = static_bundle(task)
    try:
        data = Dashboard(task)._repr_mimebundle_()
    except Exception:
        out["text/html"] += f"<!-- dashboard widget failed: {static.esc(traceback.format_exc(limit=2))} -->"
        return out
    if isinstance(data, tuple):
        data = data[0]
    if isinstance(data, dict) and "application/vnd.jupyter.widget-view+json" in data:
        out["application/vnd.jupyter.widget-view+json"] = data["application/vnd.jupyter.widget-view+json"]
    return out

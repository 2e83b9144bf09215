"""The Jupyter face of renaissance_nb: widgets and static views of a task's artifacts.

    dashboard(task)           tabs: Phases, BluePrint, Variants, Memory, Graph, Atlas, Training
    PhaseView(task)           the phase machine, its history, buttons for plan/lock_memory/compile
    RegionMap(task)           the arena by region and tensor, in any of the six variants
    LifetimeView(task)        step order x offset: which tensors share bytes after liveness reuse
    GraphView(task)           a ComputationGraph per GraphId, drawn with graphviz, collapsible per layer
    AtlasView(task)           variants x GraphIds, coloured by the variants sharing a bound graph; click to open it
    TrainingMonitor(task)     live curves; pass it to task.run(callbacks=[monitor])
    MemoryInspectorView(task) step scrubber, live at the peak, what-if plans, largest batch, tensor values

The engine never imports this package except lazily from DeepLearningTask's
display hooks; every view reads artifacts and recomputes nothing.
"""
from __future__ import annotations

from typing import Any

from .static import dashboard_html

try:  # load the widgets now, so that the function below, not the module, is `display.dashboard`
    from . import dashboard as _board
    from .atlas import AtlasView
    from .blueprint import BluePrintView, VariantsView
    from .dashboard import Dashboard
    from .graphview import GraphView
    from .inspector_view import MemoryInspectorView
    from .lifetimes import LifetimeView
    from .monitor import TrainingMonitor
    from .phase import PhaseView
    from .regions import RegionMap
except ImportError as _exc:  # ipywidgets or anywidget missing: static HTML only
    _board = None
    _missing = str(_exc)

_WIDGETS = ("PhaseView", "RegionMap", "LifetimeView", "GraphView", "AtlasView", "TrainingMonitor", "BluePrintView",
            "VariantsView", "Dashboard", "MemoryInspectorView")


def dashboard(task: Any):  # type: ignore[no-untyped-def]
    """The tabbed dashboard widget of a task (needs ipywidgets and anywidget)."""
    if _board is None:
        raise ImportError(f"the dashboard needs the notebook extra (pip install 'renaissance_nb[notebook]'): {_missing}")
    return _board.Dashboard(task)


def dashboard_bundle(task: Any) -> dict[str, Any]:
    """What displaying a task shows: the live dashboard plus a static HTML fallback.

    Never raises: without ipywidgets, or if a widget fails, the static HTML is shown.
    """
    if _board is None:  # no ipywidgets/anywidget: the static view still shows
        return static_bundle(task)
    return _board.bundle(task)


def show(task: Any) -> None:
    """Display a task in a notebook: its static dashboard, then the live one; never raises."""
    from IPython.display import display

    if _board is None:  # no ipywidgets/anywidget: the static view still shows
        display(static_bundle(task), raw=True)
        return
    _board.show(task)


def static_bundle(task: Any) -> dict[str, Any]:
    """text/plain and the static dashboard HTML; never raises."""
    text = repr(task)
    try:
        return {"text/plain": text, "text/html": dashboard_html(task)}
    except Exception as exc:
        import html

        return {"text/plain": text, "text/html": f"<pre>{html.escape(text)}\n(view failed: {html.escape(str(exc))})</pre>"}


def __getattr__(name: str) -> Any:
    if name in _WIDGETS:
        raise ImportError(f"{name} needs the notebook extra (pip install 'renaissance_nb[notebook]'): {_missing}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["dashboard", "dashboard_bundle", "show", "static_bundle", "dashboard_html", *_WIDGETS]

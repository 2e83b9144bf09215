"""A real browser: every view readable in JupyterLab Dark and Light, measured, not looked at.

One trained task and all its views in a notebook; JupyterLab switched to its Dark theme (then its Light
one, in a second notebook); for each view every
visible text is measured against what is drawn under it from computed styles (tests/contrast.js): at least
4.5:1 (WCAG AA), and, outside the graph drawings (which have their own zoom), at least 12 px. Screenshots of
each view in each theme (50_dark_*.png, 50_light_*.png) and the measures (contrast.json) go to SHOTS.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from browser_lab import SHOTS, open_notebook, run_cell, shot, skip_without_browser

pytestmark = skip_without_browser()

CONTRAST = (Path(__file__).parent / "contrast.js").read_text()
MIN_RATIO, MIN_PX = 4.5, 12.0

SETUP = """
import numpy as np
from IPython.display import display
from renaissance_nb import DeepLearningTask, datasets, fc, relu, seq
from renaissance_nb.display import (AtlasView, BluePrintView, GraphView, LifetimeView, MemoryInspectorView, PhaseView,
                                    RegionMap, TrainingMonitor, VariantsView)
rng = np.random.default_rng(0)
x, y = rng.standard_normal((512, 32)).astype(np.float32), np.arange(512) % 4
task = (DeepLearningTask("dark").model(seq(fc(64), relu(), fc(32), relu(), fc(4)))
        .data(datasets.from_arrays((x, y), (x[:64], y[:64])), batch_size=64).total_epochs(2).seed(0))
task.run(progress=False)
for make in (PhaseView, BluePrintView, VariantsView, RegionMap, LifetimeView, GraphView, AtlasView, TrainingMonitor,
             MemoryInspectorView):
    display(make(task))
task.inspect()
"""
VIEWS = {"phase": ".rnb-phase-view", "blueprint": ".rnb-html-view >> nth=0", "variants": ".rnb-html-view >> nth=1",
         "regions": ".rnb-region-map", "lifetimes": ".rnb-lifetimes", "graph": ".rnb-graph", "atlas": ".rnb-atlas",
         "monitor": ".rnb-monitor", "inspector": ".rnb-inspector"}


@pytest.fixture(scope="module", params=["JupyterLab Dark", "JupyterLab Light"])
def dark(request, lab, browser_context):  # type: ignore[no-untyped-def]
    """The notebook in JupyterLab's Dark theme, then in its Light one (the page's theme switched)."""
    pg = open_notebook(browser_context, lab, f"theme_{request.param.split()[-1].lower()}.ipynb", [SETUP])
    try:
        run_cell(pg, 0)
        pg.locator(".rnb-inspector.rnb-live .rnb-insp-opname").first.wait_for(timeout=60_000)
        pg.locator(".rnb-dashboard.rnb-live").wait_for(timeout=60_000)
        pg.locator(".rnb-atlas.rnb-live td.rnb-cell").first.click()  # the atlas with a graph open
        pg.locator(".rnb-atlas.rnb-live .rnb-atlas-detail .rnb-graph-canvas").first.wait_for(timeout=30_000)
        pg.evaluate(f"window.jupyterapp.commands.execute('apputils:change-theme', {{theme: '{request.param}'}})")
        light = "true" if request.param.endswith("Light") else "false"
        pg.wait_for_function(f"document.body.dataset.jpThemeLight === '{light}'", timeout=30_000)
        pg.wait_for_timeout(1500)
        pg.theme = "dark" if light == "false" else "light"  # type: ignore[attr-defined]
        yield pg
    finally:
        pg.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Light'})")
        pg.close()


@pytest.mark.parametrize("name", list(VIEWS))
def test_every_text_is_readable_in_jupyterlab_dark(dark, name: str) -> None:  # type: ignore[no-untyped-def]
    sel, _, nth = VIEWS[name].partition(" >> nth=")
    view = dark.locator(f".rnb-live{sel}:not(.rnb-dashboard *)").nth(int(nth or 0))
    _check(view, f"{dark.theme}_{name}")


@pytest.mark.parametrize("tab", ["Phases", "Memory", "Inspector", "Atlas", "Training"])
def test_the_dashboard_is_readable_in_jupyterlab_dark(dark, tab: str) -> None:  # type: ignore[no-untyped-def]
    """The dashboard's header, tab bar and the tab shown (Memory: the region map, lifetimes and the
    allocation count)."""
    board = dark.locator(".rnb-dashboard.rnb-live")
    board.locator(".lm-TabBar-tab", has_text=tab).click()
    dark.wait_for_timeout(600)
    _check(board, f"{dark.theme}_dashboard_{tab.lower()}")


def _check(view, name: str) -> None:  # type: ignore[no-untyped-def]
    view.scroll_into_view_if_needed()
    measured = view.evaluate(CONTRAST)
    shot(view, f"50_{name}.png")
    report = SHOTS / "contrast.json"
    data = json.loads(report.read_text()) if report.exists() else {}
    data[name] = {"texts": len(measured), "min_ratio": min((m["ratio"] for m in measured), default=None),
                  "min_px": min((m["px"] for m in measured), default=None)}
    report.write_text(json.dumps(data, indent=1))
    assert len(measured) >= 5, measured
    low = [m for m in measured if m["ratio"] < MIN_RATIO]
    assert not low, [(m["text"], m["ratio"], m["fg"], m["bg"]) for m in low[:12]]
    small = [m for m in measured if m["px"] < MIN_PX - 0.05 and not m["graph"]]  # a graph drawing has its zoom
    assert not small, [(m["text"], m["px"]) for m in small[:12]]

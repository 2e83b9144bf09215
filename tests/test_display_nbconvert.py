"""A notebook converted to HTML offline keeps its pictures: ``jupyter nbconvert --execute --to html``.

nbclient saves the widget state while executing, and nbconvert's HTML then draws each widget with
a script from a CDN; offline that draws nothing. Every view is therefore shown as two outputs (its
static copy, then the live widget: display/_base.py, show_with_copy), and here the HTML must hold a
static copy, with the real numbers of the run, before every view's widget output.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbconvert = pytest.importorskip("nbconvert")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[1]


def test_executed_html_holds_a_static_copy_of_every_view(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nbconvert import HTMLExporter
    from nbconvert.preprocessors import ExecutePreprocessor

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    nb = nbformat.read(ROOT / "notebooks" / "01_tour.ipynb", as_version=4)
    ExecutePreprocessor(timeout=300, kernel_name="python3").preprocess(nb, {"metadata": {"path": str(tmp_path)}})
    assert "widgets" in nb.metadata, "nbclient saved the widget state (the case that used to empty every output)"
    html, _ = HTMLExporter().from_notebook_node(nb)
    html = re.sub(r"<style[^>]*>.*?</style>", "", html, flags=re.S)
    outputs = html.split("<div class=\"jp-OutputArea-child")[1:]
    widget_at = [i for i, o in enumerate(outputs) if "application/vnd.jupyter.widget-view+json\">" in o]
    view_of = [re.search(r"rnb-static-copy[\"'] data-view=[\"'](\w+)", o) for o in outputs]
    copies = [m.group(1) for m in view_of if m]
    assert {"Dashboard", "PhaseView", "BluePrintView", "VariantsView", "RegionMap", "LifetimeView", "GraphView",
            "AtlasView", "TrainingMonitor"} <= set(copies), copies
    # tqdm's bar (progress.py, tqdm.auto) is no view of ours: the run's epoch lines follow it as text
    bare = [i for i in widget_at if not view_of[i - 1] and not (i + 1 < len(outputs) and "epoch" in outputs[i + 1])]
    assert not bare, f"widget outputs without a static copy before them: {[outputs[i][:300] for i in bare]}"
    # the copies are true: the monitor's copy shows the trained epochs, the last dashboard COMPILED
    monitor = next(o for o, m in zip(outputs, view_of) if m and m.group(1) == "TrainingMonitor")
    assert "Not trained yet" not in monitor and re.search(r"92\.\d\d%|9\d\.\d\d%|8\d\.\d\d%", monitor)
    assert "phase COMPILED" in [o for o, m in zip(outputs, view_of) if m and m.group(1) == "Dashboard"][-1]

"""A real browser: every view's export buttons give files that parse and hold the kernel's numbers.

One trained task and all its views; each PNG, SVG, CSV and JSON button is clicked and its download read
back: a PNG image (signature, size, more than one colour), an SVG document (XML, with the picture's text),
a CSV table and a JSON document whose rows and totals are the plan's, the atlas's, the inspector's and the
training history's as the kernel computes them. The files go to SHOTS/exports/.
"""
from __future__ import annotations

import csv
import io
import json
import struct
import xml.etree.ElementTree as ET

import pytest

from browser_lab import SHOTS, open_notebook, run_cell, skip_without_browser

pytestmark = skip_without_browser()

SETUP = """
import json
import numpy as np
from IPython.display import display
from renaissance_nb import DeepLearningTask, datasets, fc, relu, seq
from renaissance_nb.display import (AtlasView, BluePrintView, GraphView, LifetimeView, MemoryInspectorView, PhaseView,
                                    RegionMap, TrainingMonitor)
rng = np.random.default_rng(0)
x, y = rng.standard_normal((512, 32)).astype(np.float32), np.arange(512) % 4
task = (DeepLearningTask("export").model(seq(fc(64), relu(), fc(32), relu(), fc(4)))
        .data(datasets.from_arrays((x, y), (x[:64], y[:64])), batch_size=64).total_epochs(2).seed(0))
task.run(progress=False)
peak = task.memory_inspector.peak("train_base")
plan = task.plans["train_base"]
print("FACTS " + json.dumps({
    "arena": task.memory.total_bytes, "tensors": len(plan), "entries": len(task.compiled.atlas.entries),
    "epochs": [r.epoch for r in task.result.history], "losses": [r.train_loss for r in task.result.history],
    "peak": peak.peak_bytes, "peak_tensors": sorted(t.name for t in peak.tensors),
    "names": sorted(t.name for t in plan), "steps": len(task.memory_inspector.ticks())}))
for make in (PhaseView, BluePrintView, RegionMap, LifetimeView, GraphView, AtlasView, TrainingMonitor, MemoryInspectorView):
    display(make(task))
"""
VIEWS = {"phases": ".rnb-phase-view", "blueprint": ".rnb-html-view", "region_map": ".rnb-region-map",
         "lifetimes": ".rnb-lifetimes", "graph": ".rnb-graph", "atlas": ".rnb-atlas", "training": ".rnb-monitor",
         "memory_inspector": ".rnb-inspector"}


@pytest.fixture(scope="module")
def page(lab, browser_context):  # type: ignore[no-untyped-def]
    pg = open_notebook(browser_context, lab, "export.ipynb", [SETUP])
    try:
        out = run_cell(pg, 0)
        pg.facts = json.loads(next(line[6:] for line in out.splitlines() if line.startswith("FACTS ")))  # type: ignore[attr-defined]
        pg.locator(".rnb-inspector.rnb-live .rnb-insp-opname").wait_for(timeout=60_000)
        pg.locator(".rnb-graph.rnb-live .rnb-graph-canvas svg").wait_for(timeout=60_000)
        yield pg
    finally:
        pg.close()


def _download(pg, name: str, kind: str) -> bytes:  # type: ignore[no-untyped-def]
    view = pg.locator(f".rnb-live{VIEWS[name]}").first
    button = view.locator(f".rnb-export button[data-export='{kind}']")
    button.scroll_into_view_if_needed()
    with pg.expect_download(timeout=30_000) as dl:
        button.click()
    d = dl.value
    assert d.suggested_filename == f"{name}.{kind}"
    folder = SHOTS / "exports"
    folder.mkdir(parents=True, exist_ok=True)
    d.save_as(str(folder / d.suggested_filename))
    return (folder / d.suggested_filename).read_bytes()


@pytest.mark.parametrize("name", list(VIEWS))
def test_pictures_export_as_png_and_svg(page, name: str) -> None:  # type: ignore[no-untyped-def]
    png = _download(page, name, "png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    w, h = struct.unpack(">II", png[16:24])
    assert w >= 200 and h >= 40, (w, h)
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    assert len(img.getcolors(maxcolors=1 << 20) or [0] * 3) > 2, "a blank picture"
    svg = ET.fromstring(_download(page, name, "svg"))
    assert svg.tag.endswith("svg")
    text = " ".join(t for t in svg.itertext() if t.strip())
    assert len(text) > 10, text
    if name == "region_map":
        assert "W_FC_WEIGHT" in text or "fc1.weight" in text, text[:400]


def test_region_map_data(page) -> None:  # type: ignore[no-untyped-def]
    f = page.facts
    rows = list(csv.DictReader(io.StringIO(_download(page, "region_map", "csv").decode())))
    assert sorted(r["name"] for r in rows) == f["names"]
    assert max(int(r["offset"]) + int(r["slot_bytes"]) for r in rows) <= f["arena"]
    data = json.loads(_download(page, "region_map", "json"))
    assert data["arena_bytes"] == f["arena"] and len(data["tensors"]) == f["tensors"]
    assert sum(r["bytes"] for r in data["regions"]) <= f["arena"]


def test_lifetimes_data(page) -> None:  # type: ignore[no-untyped-def]
    rows = list(csv.DictReader(io.StringIO(_download(page, "lifetimes", "csv").decode())))
    assert rows and all(0 <= int(r["first_step"]) <= int(r["last_step"]) for r in rows)
    assert {r["name"] for r in rows} <= set(page.facts["names"])
    data = json.loads(_download(page, "lifetimes", "json"))
    assert data["arena_bytes"] == page.facts["arena"]
    assert sum(len(t["intervals"]) for t in data["tensors"]) == len(rows)


def test_atlas_data(page) -> None:  # type: ignore[no-untyped-def]
    rows = list(csv.DictReader(io.StringIO(_download(page, "atlas", "csv").decode())))
    assert len(rows) == page.facts["entries"]
    data = json.loads(_download(page, "atlas", "json"))
    assert data["entries"] == page.facts["entries"] and len(data["cells"]) == len(rows)


def test_inspector_data(page) -> None:  # type: ignore[no-untyped-def]
    rows = list(csv.DictReader(io.StringIO(_download(page, "memory_inspector", "csv").decode())))
    assert sorted(r["tensor"] for r in rows) == page.facts["peak_tensors"]
    data = json.loads(_download(page, "memory_inspector", "json"))
    assert data["peak"]["bytes"] == page.facts["peak"] == max(data["live_bytes"])
    assert len(data["ticks"]) == page.facts["steps"]


def test_training_history_data(page) -> None:  # type: ignore[no-untyped-def]
    rows = list(csv.DictReader(io.StringIO(_download(page, "training", "csv").decode())))
    assert [int(r["epoch"]) for r in rows] == page.facts["epochs"]
    assert [float(r["train_loss"]) for r in rows] == pytest.approx(page.facts["losses"], rel=1e-6)
    data = json.loads(_download(page, "training", "json"))
    assert [r["epoch"] for r in data["records"]] == page.facts["epochs"]
    phases = json.loads(_download(page, "phases", "json"))
    assert phases["current"] == "COMPILED"


def test_axes_in_human_units_and_families_that_agree(page) -> None:  # type: ignore[no-untyped-def]
    """The lifetimes' offsets read in bytes units (never "offset from 4,567,296"); the live-bytes curve has a
    y axis up to the peak and the peak labelled; a family counts the same bytes in the region map and the
    lifetimes."""
    life = page.locator(".rnb-lifetimes.rnb-live")
    labels = life.locator("svg text.rnb-svg-ax").evaluate_all("ts => ts.map(t => t.textContent)")
    assert not [t for t in labels if "offset from" in t] and "offset in the arena" in labels
    assert sum(t.endswith(("KiB", "MiB", " B")) for t in labels) >= 5, labels
    insp = page.locator(".rnb-inspector.rnb-live")
    ys = [int(x) for x in insp.locator(".rnb-insp-yaxis").evaluate_all("ts => ts.map(t => t.dataset.bytes)")]
    assert ys[0] == 0 and ys[-1] == page.facts["peak"], ys
    assert "peak" in insp.locator(".rnb-insp-peak-label").evaluate("t => t.textContent")
    rmap = page.locator(".rnb-region-map.rnb-live")
    in_map = dict(rmap.locator(".rnb-legend [data-family]").evaluate_all(
        "es => es.map(e => [e.dataset.family, e.textContent.split('·').pop().trim()])"))
    drawn = life.locator(".rnb-legend [data-family]").evaluate_all(
        "es => es.map(e => [e.dataset.family, e.childNodes[2].textContent.split('·').pop().trim()])")
    assert drawn and all(in_map[f] == b for f, b in drawn), (drawn, in_map)

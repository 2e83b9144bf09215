"""A real browser: the widgets' keys stay in the widgets, in Notebook 7 and JupyterLab.

Notebook 7: the memory inspector's scrubber focused, the arrow keys move it one node each and the notebook
neither scrolls nor changes its active cell. JupyterLab: Enter in the what-if batch box applies it (the
plan made again for that batch, as MemoryInspector.what_if computes it in the kernel), and "?" lists a
view's keys. Screenshots 60_nb7_scrubber.png and 61_keys_help.png go to SHOTS.
"""
from __future__ import annotations

import json

from browser_lab import open_notebook, run_cell, shot, skip_without_browser

pytestmark = skip_without_browser()

SETUP = """
import json
import numpy as np
from renaissance_nb import DeepLearningTask, datasets, fc, relu, seq
from renaissance_nb.display import MemoryInspectorView
rng = np.random.default_rng(0)
x, y = rng.standard_normal((512, 32)).astype(np.float32), np.arange(512) % 4
task = (DeepLearningTask("keys").model(seq(fc(64), relu(), fc(4)))
        .data(datasets.from_arrays((x, y), (x[:64], y[:64])), batch_size=64).seed(0).lock_memory())
insp = task.memory_inspector
print("FACTS " + json.dumps({"ticks": [k.time for k in insp.ticks()], "arena_96": insp.what_if(batch_size=96).arena_bytes}))
w = MemoryInspectorView(task)
w
"""
CELLS = [SETUP, "print('a cell below')", "print('and another')"]


def _facts(out: str) -> dict:
    return json.loads(next(line[6:] for line in out.splitlines() if line.startswith("FACTS ")))


def _tick(view) -> int:  # type: ignore[no-untyped-def]
    return int(view.locator(".rnb-insp-op .rnb-pill[data-tick]").get_attribute("data-tick"))


def test_arrow_keys_on_the_scrubber_stay_in_notebook_7(lab, browser_context) -> None:  # type: ignore[no-untyped-def]
    pg = open_notebook(browser_context, lab, "keys_nb7.ipynb", CELLS, front="notebook")
    try:
        facts = _facts(run_cell(pg, 0))
        view = pg.locator(".rnb-inspector.rnb-live").first
        view.locator(".rnb-insp-opname").wait_for(timeout=60_000)
        slider = view.locator("input.rnb-insp-slider")
        slider.focus()
        before = pg.evaluate("() => [window.jupyterapp.shell.currentWidget.content.activeCellIndex,"
                             " document.scrollingElement.scrollTop,"
                             " window.jupyterapp.shell.currentWidget.content.node.scrollTop]")
        start = _tick(view)
        for key in ("ArrowRight", "ArrowRight", "ArrowLeft", "ArrowRight"):
            pg.keyboard.press(key)
            pg.wait_for_timeout(150)
        i = facts["ticks"].index(start)
        assert _tick(view) == facts["ticks"][i + 2], (start, _tick(view))
        pg.keyboard.press("ArrowDown")  # a notebook key in command mode: the cell below
        pg.wait_for_timeout(300)
        after = pg.evaluate("() => [window.jupyterapp.shell.currentWidget.content.activeCellIndex,"
                            " document.scrollingElement.scrollTop,"
                            " window.jupyterapp.shell.currentWidget.content.node.scrollTop]")
        assert after == before, (before, after)
        shot(view, "60_nb7_scrubber.png")
    finally:
        pg.close()


def test_enter_applies_the_what_if_batch_and_question_mark_lists_the_keys(lab, browser_context) -> None:  # type: ignore[no-untyped-def]
    pg = open_notebook(browser_context, lab, "keys_lab.ipynb", CELLS)
    try:
        facts = _facts(run_cell(pg, 0))
        view = pg.locator(".rnb-inspector.rnb-live").first
        view.locator(".rnb-insp-opname").wait_for(timeout=60_000)
        box = view.locator("input.rnb-insp-batch")
        box.fill("96")
        box.press("Enter")
        arena = view.locator(".rnb-insp-side-whatif .rnb-insp-arena-bytes")
        arena.wait_for(timeout=30_000)
        assert int(arena.get_attribute("data-bytes")) == facts["arena_96"]
        assert pg.evaluate("window.jupyterapp.shell.currentWidget.content.mode") == "command"  # Enter stayed here
        view.locator(".rnb-title").first.click()
        pg.keyboard.press("?")
        keys = view.locator(".rnb-keys")
        keys.wait_for(timeout=5_000)
        assert "← →" in keys.inner_text() and "Enter" in keys.inner_text()
        shot(view, "61_keys_help.png")
        pg.keyboard.press("Escape")
        assert view.locator(".rnb-keys").count() == 0
    finally:
        pg.close()

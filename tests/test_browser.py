"""A real browser: JupyterLab + headless Chromium run notebook 1 and look at the widgets.

Starts JupyterLab on 127.0.0.1 (no token) over a copy of notebooks/01_tour.ipynb, runs all
cells through JupyterLab's own command, checks that the dashboard, region map, graph view
and training curves are in the page, clicks a region and an atlas cell, and saves
screenshots to artifacts/screenshots/.

Skips when Chromium or Playwright is missing, unless RNB_REQUIRE_BROWSER is set (CI):
then a missing browser fails. scripts/install_browser.sh installs everything.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHOTS = Path(os.environ.get("RNB_SCREENSHOTS", ROOT / "artifacts" / "screenshots"))
CHROMIUM = os.environ.get("RNB_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def _missing() -> str | None:
    if not Path(CHROMIUM).exists():
        return f"Chromium not found at {CHROMIUM}"
    for mod in ("playwright", "jupyterlab"):
        try:
            __import__(mod)
        except ImportError:
            return f"the Python package {mod} is not installed"
    return None


_why = _missing()
if _why is not None:
    if os.environ.get("RNB_REQUIRE_BROWSER"):
        pytest.fail(f"RNB_REQUIRE_BROWSER is set but {_why}; run scripts/install_browser.sh", pytrace=False)
    pytestmark = pytest.mark.skip(reason=f"{_why} (run scripts/install_browser.sh; set RNB_REQUIRE_BROWSER=1 "
                                         "to make this a failure)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):  # type: ignore[no-untyped-def]
    """A JupyterLab server over a temporary copy of the notebooks (the repo's files stay untouched)."""
    work = tmp_path_factory.mktemp("lab")
    shutil.copy(ROOT / "notebooks" / "01_tour.ipynb", work / "01_tour.ipynb")
    for d in ("config", "data", "runtime", "workspaces", "settings"):
        (work / f".{d}").mkdir()
    notes = work / ".settings" / "@jupyterlab" / "apputils-extension"
    notes.mkdir(parents=True)  # no "official Jupyter news?" toast over the screenshots
    (notes / "notification.jupyterlab-settings").write_text('{"fetchNews": "false", "checkForUpdates": false}')
    port = _free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(JUPYTER_CONFIG_DIR=str(work / ".config"), JUPYTER_RUNTIME_DIR=str(work / ".runtime"),
               JUPYTERLAB_WORKSPACES_DIR=str(work / ".workspaces"), JUPYTERLAB_SETTINGS_DIR=str(work / ".settings"))
    log = open(work / "lab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
         "--ServerApp.token=", "--ServerApp.password=", "--ServerApp.disable_check_xsrf=True",
         f"--ServerApp.root_dir={work}", "--expose-app-in-browser", "--LabApp.news_url=None",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])],
        cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                log.flush()
                raise RuntimeError("JupyterLab did not start:\n" + (work / "lab.log").read_text()[-3000:])
            time.sleep(0.5)
        yield url
    finally:
        if proc.poll() is None:  # the server and the kernels it started (one process group, ours)
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        log.close()


@pytest.fixture(scope="module")
def browser_context(lab):  # type: ignore[no-untyped-def]
    """Headless Chromium, one context for every tab of this module."""
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield browser.new_context(viewport={"width": 1280, "height": 2000}, device_scale_factor=1)
        browser.close()


@pytest.fixture(scope="module")
def page(lab, browser_context):  # type: ignore[no-untyped-def]
    pg = browser_context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(f"{lab}/lab/tree/01_tour.ipynb", wait_until="domcontentloaded", timeout=90_000)
    pg.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
    pg.wait_for_function("window.jupyterapp && window.jupyterapp.shell.currentWidget"
                         " && window.jupyterapp.shell.currentWidget.sessionContext"
                         " && window.jupyterapp.shell.currentWidget.sessionContext.session"
                         " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"
                         " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status === 'idle'",
                         timeout=120_000)
    # JupyterLab's own "Run All Cells"; its promise settles when the last cell has run (or one failed)
    pg.page_ran_all = pg.evaluate(  # type: ignore[attr-defined]
        "window.jupyterapp.commands.execute('notebook:run-all-cells')")
    pg.wait_for_function("window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status === 'idle'",
                         timeout=60_000)
    pg.wait_for_timeout(1500)  # let the last widget views render
    pg.page_errors = errors  # type: ignore[attr-defined]
    yield pg
    pg.close()


def _standalone(page, cls: str):  # type: ignore[no-untyped-def]
    """The first widget of a class displayed on its own (not inside a dashboard)."""
    return page.locator(f".{cls}:not(.rnb-dashboard .{cls})").first


def _shot(locator, name: str) -> None:  # type: ignore[no-untyped-def]
    locator.scroll_into_view_if_needed()
    locator.screenshot(path=str(SHOTS / name))


def test_all_cells_ran_without_errors(page) -> None:  # type: ignore[no-untyped-def]
    counts = page.evaluate("""() => {
        const cells = window.jupyterapp.shell.currentWidget.content.model.cells, out = [];
        for (let i = 0; i < cells.length; i++) if (cells.get(i).type === 'code') out.push(cells.get(i).executionCount);
        return out; }""")
    assert page.page_ran_all is not False and None not in counts, f"not every cell ran: {counts}"
    errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").all_inner_texts()
    tracebacks = [e for e in errors if "Traceback" in e or "Error" in e.split("\n")[0]]
    assert not tracebacks, tracebacks
    assert page.locator(".jp-RenderedText .ansi-red-fg").count() == 0


def test_dashboard_rendered(page) -> None:  # type: ignore[no-untyped-def]
    dash = page.locator(".rnb-dashboard").last
    dash.wait_for(state="visible", timeout=30_000)
    tabs = dash.locator(".lm-TabBar-tabLabel").all_inner_texts()
    assert tabs == ["Phases", "BluePrint", "Variants", "Memory", "Graph", "Atlas", "Training"]
    assert dash.locator(".rnb-phase-view[data-phase='COMPILED']").count() == 1
    _shot(dash, "01_dashboard_phases.png")
    # a button is enabled only where its call can succeed: in COMPILED only reset()
    for action in ("plan", "lock_memory", "compile"):
        assert dash.locator(f".rnb-phase-view button[data-action='{action}']").is_disabled(), action
    assert dash.locator(".rnb-phase-view button[data-action='reset']").is_enabled()
    dash.locator(".lm-TabBar-tab", has_text="Memory").click()
    dash.locator(".rnb-region-map [data-tensor]").first.wait_for(state="visible", timeout=30_000)
    _shot(dash, "02_dashboard_memory.png")
    dash.locator(".lm-TabBar-tab", has_text="Training").click()
    dash.locator(".rnb-monitor").wait_for(state="visible", timeout=30_000)
    _shot(dash, "03_dashboard_training.png")
    page.wait_for_timeout(3500)  # two polls of every view: the chosen tab stays chosen
    assert dash.locator(".lm-TabBar-tab.lm-mod-current").inner_text() == "Training"


def test_phase_view_follows_its_task(page) -> None:  # type: ignore[no-untyped-def]
    """The PhaseView displayed in PLANNING shows COMPILED once compile() ran in a later cell, no refresh."""
    view = _standalone(page, "rnb-phase-view")
    page.wait_for_function("() => [...document.querySelectorAll('.rnb-phase-view')]"
                           ".every(v => v.dataset.phase === 'COMPILED')", timeout=15_000)
    assert view.locator("button[data-action='plan']").is_disabled()


def test_reset_asks_first(page) -> None:  # type: ignore[no-untyped-def]
    view = _standalone(page, "rnb-phase-view")
    view.locator("button[data-action='reset']").click()
    box = view.locator(".rnb-confirm[data-confirm='reset']")
    box.wait_for(timeout=5_000)
    assert "trained weights" in box.inner_text() and "3 epochs" in box.inner_text()
    _shot(view, "04b_reset_confirm.png")
    box.locator("button[data-confirm-no]").click()
    page.wait_for_timeout(2000)
    assert view.get_attribute("data-phase") == "COMPILED"


def test_phase_view_rendered(page) -> None:  # type: ignore[no-untyped-def]
    view = _standalone(page, "rnb-phase-view")
    assert view.locator("svg g[data-phase]").count() == 3
    assert view.locator("button[data-action='lock_memory']").count() == 1
    _shot(view, "04_phase_view.png")


def test_region_map_click_shows_dtensors(page) -> None:  # type: ignore[no-untyped-def]
    rmap = _standalone(page, "rnb-region-map")
    assert rmap.locator("[data-tensor]").count() >= 10
    assert rmap.locator(".rnb-offsets-ok").count() == 1
    rmap.locator(".rnb-region-track[data-region='W_FC_WEIGHT']").click()
    detail = rmap.locator(".rnb-region-detail[data-region='W_FC_WEIGHT']")
    detail.wait_for(timeout=10_000)
    names = detail.locator("tr[data-tensor]").evaluate_all("rows => rows.map(r => r.dataset.tensor)")
    assert names == ["fc1.weight", "fc2.weight", "fc3.weight"], names
    rmap.locator(".rnb-variant-switch button[data-variant='train_last']").click()
    page.wait_for_timeout(300)
    assert rmap.locator(".rnb-variant-switch button.rnb-on").inner_text() == "train_last"
    box = rmap.locator(".rnb-tensor-box[data-tensor='fc1.out']")
    box.hover()
    tip = page.locator(".rnb-tip:visible")
    assert "fc1.out" in tip.inner_text() and "(32, 256)" in tip.inner_text()
    _shot(rmap, "05_region_map.png")


def test_lifetimes_rendered(page) -> None:  # type: ignore[no-untyped-def]
    view = _standalone(page, "rnb-lifetimes")
    assert view.locator("rect.rnb-life-box").count() > 5
    _shot(view, "06_lifetimes.png")


def test_graph_view_rendered(page) -> None:  # type: ignore[no-untyped-def]
    view = _standalone(page, "rnb-graph")
    canvas = view.locator(".rnb-graph-canvas")
    mode = canvas.get_attribute("data-mode")
    if mode == "svg":
        assert canvas.locator("svg g.node").count() > 3
    else:
        assert canvas.locator("table tr").count() > 3
        assert view.locator(".rnb-graph-note").count() == 1
    _shot(view, "07_graph.png")
    # fold a layer: Python redraws, the view swaps the drawing in
    view.locator("button.rnb-chip[data-layer='fc2']").click()
    view.locator("button.rnb-chip.rnb-off[data-layer='fc2']").wait_for(timeout=15_000)
    if mode == "svg":
        canvas.locator("g.node#layer_fc2").wait_for(timeout=15_000)
    view.locator("button.rnb-chip[data-layer='fc2']").click()  # and unfold it again
    view.locator("button.rnb-chip:not(.rnb-off)[data-layer='fc2']").wait_for(timeout=15_000)
    if mode == "svg":
        _navigate_whole_step(page, view, canvas)


def _navigate_whole_step(page, view, canvas) -> None:  # type: ignore[no-untyped-def]
    """All GraphIds of the step: fitted to the width, zoomed, searched, an op's parameters shown whole."""
    view.locator("select[data-role='gid']").select_option("")
    page.wait_for_function("() => [...document.querySelectorAll('.rnb-graph:not(.rnb-dashboard .rnb-graph) "
                           ".rnb-graph-canvas svg g.node')].some(g => g.id.startsWith('span_'))", timeout=30_000)
    view.locator("button[data-action='fit']").click()
    width = canvas.evaluate("c => [c.clientWidth, c.querySelector('svg').getBoundingClientRect().width]")
    assert width[1] <= width[0], width
    fitted = float(canvas.get_attribute("data-zoom"))
    view.locator("button[data-action='zoom-in']").click()
    assert float(canvas.get_attribute("data-zoom")) > fitted
    view.locator("button[data-action='fit']").click()
    view.locator("input.rnb-graph-search").fill("fc1.weight")
    assert canvas.locator("g.node.rnb-hit").count() >= 1 and canvas.locator("g.node.rnb-near").count() >= 2
    assert canvas.locator("g.edge.rnb-near").count() >= 2
    _shot(view, "07b_graph_search.png")
    view.locator("input.rnb-graph-search").fill("")
    assert canvas.locator("g.node.rnb-hit").count() == 0
    canvas.locator("g.node[id^='op']", has_text="optimizer").first.click()
    assert "=" in view.locator(".rnb-graph-info").inner_text()
    _shot(view, "07c_graph_whole_step.png")


def test_atlas_click_opens_graph(page) -> None:  # type: ignore[no-untyped-def]
    atlas = _standalone(page, "rnb-atlas")
    cell = atlas.locator("td.rnb-cell[data-variant='train_last'][data-gid='DEEP_FWD_BWD']")
    cell.click()
    detail = atlas.locator(".rnb-atlas-detail .rnb-graph-canvas")
    detail.wait_for(timeout=15_000)
    assert detail.locator("svg, table").count() >= 1
    assert "DEEP_FWD_BWD" in atlas.locator(".rnb-atlas-detail").inner_text()
    _shot(atlas, "08_atlas.png")


def test_training_curves_rendered(page) -> None:  # type: ignore[no-untyped-def]
    mon = page.locator(".rnb-monitor[data-epochs='3']:not(.rnb-dashboard .rnb-monitor)").first
    mon.wait_for(timeout=30_000)
    d = mon.locator("path[data-series='train']").first.get_attribute("d")
    assert d and d.count("L") >= 2, d
    assert mon.locator(".rnb-pill[data-status='done']").count() == 1
    _shot(mon, "09_monitor.png")


def test_full_page_screenshot(page) -> None:  # type: ignore[no-untyped-def]
    page.screenshot(path=str(SHOTS / "00_notebook.png"))
    assert not getattr(page, "page_errors", []), page.page_errors


def test_saved_notebook_keeps_its_pictures(page) -> None:  # type: ignore[no-untyped-def]
    """Save, restart the kernel, reopen: every view shows its static copy, never "model not found"."""
    live = page.locator(".jp-OutputArea-child .rnb-live").count()  # before: the live views drawn
    page.evaluate("window.jupyterapp.commands.execute('docmanager:save')")
    page.wait_for_timeout(1500)
    page.evaluate("window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.restart()")
    page.wait_for_timeout(1500)
    page.reload(wait_until="domcontentloaded")
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
    page.wait_for_function("window.jupyterapp && window.jupyterapp.shell.currentWidget"
                           " && window.jupyterapp.shell.currentWidget.sessionContext.session"
                           " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel", timeout=90_000)
    page.wait_for_timeout(4000)  # the widget manager has tried to restore every model by now
    body = page.locator(".jp-NotebookPanel").inner_text()
    assert "model not found" not in body and "Error displaying widget" not in body
    copies = page.locator(".rnb-static-copy:visible")
    views = copies.evaluate_all("cs => cs.map(c => c.dataset.view)")
    assert views.count("Dashboard") == 2 and {"PhaseView", "RegionMap", "LifetimeView", "GraphView", "AtlasView",
                                              "TrainingMonitor", "BluePrintView", "VariantsView"} <= set(views), views
    assert all(h > 40 for h in copies.evaluate_all("cs => cs.map(c => c.getBoundingClientRect().height)"))
    visible_errors = page.locator(".jp-OutputArea-output.jupyter-widgets:visible").all_inner_texts()
    assert not [t for t in visible_errors if t.strip()], visible_errors
    assert live >= 10
    page.screenshot(path=str(SHOTS / "10_reopened_notebook.png"), full_page=True)


_STOP_CELLS = [
    "import numpy as np\n"
    "from renaissance_nb import DeepLearningTask, datasets, fc, relu, seq\n"
    "from renaissance_nb.display import TrainingMonitor\n"
    "def make():\n"
    "    return (DeepLearningTask('stop').model(seq(fc(1024), relu(), fc(1024), relu(), fc(10)))\n"
    "            .data(datasets.default_mnist(), batch_size=16).total_epochs(10).seed(3))\n"
    "task = make().compile()\n"
    "monitor = TrainingMonitor(task)\n"
    "monitor",
    "task.run(callbacks=[monitor], progress=False)",
    "rs = task.run_state\n"
    "print('STOPPED', task.result.interrupted, rs.resume_at, rs.torn_at, task.steps_per_epoch,\n"
    "      int(task.read('step')[0]))",
    "task.run(progress=False)\n"
    "other = make(); other.run(progress=False)\n"
    "a, b = task.state_dict(), other.state_dict()\n"
    "print('SAME', len(b), all(np.array_equal(a[k], b[k]) for k in b), task.result.interrupted)",
]


def _open_notebook(context, lab: str, name: str, cells: list[str]):  # type: ignore[no-untyped-def]
    """A notebook written through the server's contents API, opened in a new tab of the same browser."""
    import json

    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                           "language": "python"}},
          "cells": [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "source": src, "outputs": [],
                     "execution_count": None} for i, src in enumerate(cells)]}
    req = urllib.request.Request(f"{lab}/api/contents/{name}", method="PUT", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"type": "notebook", "format": "json", "content": nb}).encode())
    urllib.request.urlopen(req, timeout=10).close()
    pg = context.new_page()
    pg.goto(f"{lab}/lab/tree/{name}", wait_until="domcontentloaded", timeout=90_000)
    pg.wait_for_function(f"window.jupyterapp && window.jupyterapp.shell.currentWidget && "
                         f"window.jupyterapp.shell.currentWidget.title.label === '{name}' && "
                         f"{_KERNEL} && {_KERNEL}.status === 'idle'", timeout=120_000)
    return pg


_KERNEL = "window.jupyterapp.shell.currentWidget.sessionContext.session?.kernel"


def _run_cell(pg, index: int, wait: bool = True) -> str:  # type: ignore[no-untyped-def]
    """Run cell ``index`` with JupyterLab's command; when ``wait``, its text output once the kernel is idle."""
    pg.evaluate(f"() => {{ const nb = window.jupyterapp.shell.currentWidget.content; nb.activeCellIndex = {index};"
                " window.jupyterapp.commands.execute('notebook:run-cell'); }")
    if not wait:
        return ""
    pg.wait_for_function(f"() => {{ const c = window.jupyterapp.shell.currentWidget.content.model.cells.get({index});"
                         f" return c.executionCount != null && {_KERNEL}.status === 'idle'; }}", timeout=240_000)
    return pg.locator(".jp-Cell").nth(index).locator(".jp-OutputArea").inner_text()


def test_stop_button_stops_at_a_step_boundary_and_resumes(browser_context, lab) -> None:  # type: ignore[no-untyped-def]
    """The monitor's stop button during a real run: the kernel is interrupted, the trainer stops at a step
    boundary as Ctrl-C does, run() resumes there and ends with the uninterrupted run's weights, bit for bit."""
    pg = _open_notebook(browser_context, lab, "stop.ipynb", _STOP_CELLS)
    try:
        _run_cell(pg, 0)
        mon = pg.locator(".rnb-monitor").first
        mon.wait_for(timeout=30_000)
        _run_cell(pg, 1, wait=False)
        stop = mon.locator("button[data-action='stop']")
        stop.wait_for(state="visible", timeout=60_000)
        pg.wait_for_timeout(1500)  # some steps in
        _shot(mon, "11_monitor_stop.png")
        stop.click()
        pg.wait_for_function(f"{_KERNEL}.status === 'idle'", timeout=240_000)
        mon.locator(".rnb-pill[data-status='interrupted']").wait_for(timeout=15_000)
        assert mon.locator("[data-stop-note]").count() == 0
        words = _run_cell(pg, 2).split()
        assert words[:2] == ["STOPPED", "True"], words
        epoch, step = int(words[2].strip("(,")), int(words[3].strip(")"))
        assert words[4:6] == ["None", "250"], words  # not torn; 4,000 digits / 16
        assert 0 < step <= 250 and epoch < 10 and int(words[6]) == epoch * 250 + step, words
        assert _run_cell(pg, 3).split() == ["SAME", "6", "True", "False"]
    finally:
        pg.close()

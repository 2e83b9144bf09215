"""A real browser: JupyterLab + headless Chromium run notebook 1 and look at the widgets.

Runs all cells of a copy of notebooks/01_tour.ipynb through JupyterLab's own command, checks that the
dashboard, region map, graph view and training curves are in the page, clicks a region and an atlas
cell, saves and reopens the notebook, stops a run with the monitor's button, and saves screenshots
to artifacts/screenshots/. The server and browser come from tests/browser_lab.py.
"""
from __future__ import annotations

import pytest

from browser_lab import KERNEL, SHOTS, open_notebook, run_cell, shot, skip_without_browser
from browser_lab import standalone

pytestmark = skip_without_browser()


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
    assert tabs == ["Phases", "BluePrint", "Variants", "Memory", "Inspector", "Graph", "Atlas", "Training"]
    assert dash.locator(".rnb-phase-view[data-phase='COMPILED']").count() == 1
    shot(dash, "01_dashboard_phases.png")
    # a button is enabled only where its call can succeed: in COMPILED only reset()
    for action in ("plan", "lock_memory", "compile"):
        assert dash.locator(f".rnb-phase-view button[data-action='{action}']").is_disabled(), action
    assert dash.locator(".rnb-phase-view button[data-action='reset']").is_enabled()
    dash.locator(".lm-TabBar-tab", has_text="Memory").click()
    dash.locator(".rnb-region-map [data-tensor]").first.wait_for(state="visible", timeout=30_000)
    shot(dash, "02_dashboard_memory.png")
    dash.locator(".lm-TabBar-tab", has_text="Training").click()
    dash.locator(".rnb-monitor").wait_for(state="visible", timeout=30_000)
    shot(dash, "03_dashboard_training.png")
    page.wait_for_timeout(3500)  # two polls of every view: the chosen tab stays chosen
    assert dash.locator(".lm-TabBar-tab.lm-mod-current").inner_text() == "Training"


def test_phase_view_follows_its_task(page) -> None:  # type: ignore[no-untyped-def]
    """The PhaseView displayed in PLANNING shows COMPILED once compile() ran in a later cell, no refresh."""
    view = standalone(page, "rnb-phase-view")
    page.wait_for_function("() => [...document.querySelectorAll('.rnb-phase-view')]"
                           ".every(v => v.dataset.phase === 'COMPILED')", timeout=15_000)
    assert view.locator("button[data-action='plan']").is_disabled()


def test_reset_asks_first(page) -> None:  # type: ignore[no-untyped-def]
    view = standalone(page, "rnb-phase-view")
    view.locator("button[data-action='reset']").click()
    box = view.locator(".rnb-confirm[data-confirm='reset']")
    box.wait_for(timeout=5_000)
    assert "trained weights" in box.inner_text() and "3 epochs" in box.inner_text()
    shot(view, "04b_reset_confirm.png")
    box.locator("button[data-confirm-no]").click()
    page.wait_for_timeout(2000)
    assert view.get_attribute("data-phase") == "COMPILED"


def test_phase_view_rendered(page) -> None:  # type: ignore[no-untyped-def]
    view = standalone(page, "rnb-phase-view")
    assert view.locator("svg g[data-phase]").count() == 3
    assert view.locator("button[data-action='lock_memory']").count() == 1
    shot(view, "04_phase_view.png")


def test_region_map_click_shows_dtensors(page) -> None:  # type: ignore[no-untyped-def]
    rmap = standalone(page, "rnb-region-map")
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
    shot(rmap, "05_region_map.png")


def test_lifetimes_rendered(page) -> None:  # type: ignore[no-untyped-def]
    view = standalone(page, "rnb-lifetimes")
    assert view.locator("rect.rnb-life-box").count() > 5
    shot(view, "06_lifetimes.png")


def test_graph_view_rendered(page) -> None:  # type: ignore[no-untyped-def]
    view = standalone(page, "rnb-graph")
    canvas = view.locator(".rnb-graph-canvas")
    mode = canvas.get_attribute("data-mode")
    if mode == "svg":
        assert canvas.locator("svg g.node").count() > 3
    else:
        assert canvas.locator("table tr").count() > 3
        assert view.locator(".rnb-graph-note").count() == 1
    shot(view, "07_graph.png")
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
    shot(view, "07b_graph_search.png")
    view.locator("input.rnb-graph-search").fill("")
    assert canvas.locator("g.node.rnb-hit").count() == 0
    canvas.locator("g.node[id^='op']", has_text="optimizer").first.click()
    assert "=" in view.locator(".rnb-graph-info").inner_text()
    shot(view, "07c_graph_whole_step.png")


def test_atlas_click_opens_graph(page) -> None:  # type: ignore[no-untyped-def]
    atlas = standalone(page, "rnb-atlas")
    cell = atlas.locator("td.rnb-cell[data-variant='train_last'][data-gid='DEEP_FWD_BWD']")
    cell.click()
    detail = atlas.locator(".rnb-atlas-detail .rnb-graph-canvas")
    detail.wait_for(timeout=15_000)
    assert detail.locator("svg, table").count() >= 1
    assert "DEEP_FWD_BWD" in atlas.locator(".rnb-atlas-detail").inner_text()
    shot(atlas, "08_atlas.png")


def test_training_curves_rendered(page) -> None:  # type: ignore[no-untyped-def]
    mon = page.locator(".rnb-monitor[data-epochs='3']:not(.rnb-dashboard .rnb-monitor)").first
    mon.wait_for(timeout=30_000)
    d = mon.locator("path[data-series='train']").first.get_attribute("d")
    assert d and d.count("L") >= 2, d
    assert mon.locator(".rnb-pill[data-status='done']").count() == 1
    shot(mon, "09_monitor.png")


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


_STOP_CELLS = [  # the steps run as native programs; pace() holds each 16-step check 0.1 s, so the run lasts
    # at least 16 s whatever the machine, and the click lands inside it (a loaded CI runner took seconds to click)
    "import time\n"
    "import numpy as np\n"
    "from renaissance_nb import DeepLearningTask, datasets, fc, relu, seq\n"
    "from renaissance_nb.display import TrainingMonitor\n"
    "def make():\n"
    "    return (DeepLearningTask('stop').model(seq(fc(1024), relu(), fc(1024), relu(), fc(10)))\n"
    "            .data(datasets.default_mnist(), batch_size=16).total_epochs(10).seed(3))\n"
    "def pace(event, info):\n"
    "    if event == 'step':\n"
    "        time.sleep(0.1)\n"
    "task = make().compile()\n"
    "monitor = TrainingMonitor(task)\n"
    "monitor",
    "task.run(callbacks=[monitor, pace], progress=False)",
    "rs = task.run_state\n"
    "print('STOPPED', task.result.interrupted, rs.resume_at, rs.torn_at, task.steps_per_epoch,\n"
    "      int(task.read('step')[0]))",
    "task.run(progress=False)\n"
    "other = make(); other.run(progress=False)\n"
    "a, b = task.state_dict(), other.state_dict()\n"
    "print('SAME', len(b), all(np.array_equal(a[k], b[k]) for k in b), task.result.interrupted)",
]


def test_stop_button_stops_at_a_step_boundary_and_resumes(browser_context, lab) -> None:  # type: ignore[no-untyped-def]
    """The monitor's stop button during a real run: the kernel is interrupted, the trainer stops at a step
    boundary as Ctrl-C does, run() resumes there and ends with the uninterrupted run's weights, bit for bit."""
    pg = open_notebook(browser_context, lab, "stop.ipynb", _STOP_CELLS)
    try:
        run_cell(pg, 0)
        mon = pg.locator(".rnb-monitor").first
        mon.wait_for(timeout=30_000)
        run_cell(pg, 1, wait=False)
        stop = mon.locator("button[data-action='stop']")
        stop.wait_for(state="visible", timeout=60_000)
        pg.wait_for_timeout(1500)  # some steps in
        # a first epoch under way: the step within it, the rate and the time left; axes fitted to epoch 1
        import re
        pg.wait_for_function("() => document.querySelector('.rnb-monitor .rnb-progress-text').textContent.endsWith('left')",
                             timeout=30_000)  # two reports make a rate
        progress = mon.locator(".rnb-progress-text").inner_text()
        m = re.fullmatch(r"epoch (\d+)/10 · step \d+/250 · [\d.]+ steps/s · (\d+ min )?\d+ s left", progress)
        assert m, progress
        assert 1 <= int(mon.get_attribute("data-xmax")) <= int(m.group(1)) < 10  # the axes end at the epoch under way
        shot(mon, "11_monitor_stop.png")
        stop.click()
        pg.wait_for_function(f"{KERNEL}.status === 'idle'", timeout=240_000)
        words = run_cell(pg, 2).split()  # first: should the pill fail, the message says where the run ended
        try:
            mon.locator(".rnb-pill[data-status='interrupted']").wait_for(timeout=15_000)
        except Exception as exc:
            pill = mon.locator(".rnb-pill").get_attribute("data-status")
            raise AssertionError(f"pill {pill!r} after a stop clicked at {progress!r}; the task: {words}") from exc
        assert mon.locator("[data-stop-note]").count() == 0
        assert words[:2] == ["STOPPED", "True"], words
        epoch, step = int(words[2].strip("(,")), int(words[3].strip(")"))
        assert words[4:6] == ["None", "250"], words  # not torn; 4,000 digits / 16
        assert 0 < step <= 250 and epoch < 10 and int(words[6]) == epoch * 250 + step, words
        assert run_cell(pg, 3).split() == ["SAME", "6", "True", "False"]
    finally:
        pg.close()

"""The display layer: views read artifacts, widgets never raise, static HTML always renders.

No kernel or browser needed: widgets are created without a front end (ipywidgets allows it),
and what a front end would send is simulated by calling the same handlers.
"""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")

from renaissance_nb import (DeepLearningTask, PhaseError, Region, StreamKind, TaskBase, datasets, fc,  # noqa: E402
                            node, relu, seq)
import renaissance_nb as rnb  # noqa: E402
from renaissance_nb import display  # noqa: E402
from renaissance_nb.display import (AtlasView, GraphView, LifetimeView, PhaseView, RegionMap,  # noqa: E402
                                    TrainingMonitor, dashboard, dashboard_bundle, graphdraw, static, views)
from renaissance_nb.display._assets import asset  # noqa: E402
from renaissance_nb.compiler.ids import GraphId  # noqa: E402
from renaissance_nb.kernels import program as native_program  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def small_task(epochs: int = 1, batch: int = 128) -> DeepLearningTask:
    return (DeepLearningTask("t").model(seq(fc(32), relu(), fc(10)))
            .data(datasets.default_mnist(), batch_size=batch).total_epochs(epochs))


@pytest.fixture(scope="module")
def compiled() -> DeepLearningTask:
    return small_task().compile()


@pytest.fixture(scope="module")
def trained() -> DeepLearningTask:
    t = small_task(epochs=2)
    t.run(progress=False)
    return t


def hand_task(finalize: bool = True, graph: bool = True, compile_: bool = False) -> TaskBase:
    t = TaskBase("hand")
    x = t.alloc((4, 3), "float32", Region.I_A_DATA, name="x")
    w = t.alloc((3, 2), "float32", Region.W_FC_WEIGHT, name="w")
    y = t.alloc((4, 2), "float32", Region.F_FEATURE_FP32, name="y")
    if finalize:
        t.finalize_memory()
        if graph:
            t.add_graph("forward", [node("matmul", [x.id, w.id], [y.id], layer="fc")], StreamKind.COMP_1)
            if compile_:
                t.compile()
    return t


class _Checker(HTMLParser):
    """Fails on nothing; collects tags so a test can see the HTML parsed into real elements."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []

    def handle_starttag(self, tag, attrs):  # type: ignore[no-untyped-def]
        self.tags.append(tag)


def parse(html: str) -> list[str]:
    p = _Checker()
    p.feed(html)
    p.close()
    return p.tags


# ---- the engine never imports the display layer ---------------------------------------------------------
def test_engine_runs_without_importing_display() -> None:
    code = ("import sys; from renaissance_nb import *; "
            "t = DeepLearningTask().model(seq(fc(16), relu(), fc(10))).data(datasets.default_mnist()).total_epochs(1); "
            "t.run(progress=False); repr(t); t.summary(); "
            "bad = [m for m in sys.modules if m.startswith('renaissance_nb.display') or m in ('ipywidgets', 'anywidget')]; "
            "print(bad); assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stdout + r.stderr


def test_only_the_two_lazy_imports_reach_display() -> None:
    hits = []
    for path in (ROOT / "renaissance_nb").rglob("*.py"):
        if "display" in path.relative_to(ROOT / "renaissance_nb").parts:
            continue
        tree = ast.parse(path.read_text())
        for n in ast.walk(tree):
            ours = isinstance(n, ast.ImportFrom) and (n.level > 0 or (n.module or "").startswith("renaissance_nb"))
            if ours and n.module and "display" in n.module.split("."):  # not IPython.display (progress.py's bar)
                hits.append((path.name, n.module, tuple(a.name for a in n.names), n.col_offset > 0))
            elif isinstance(n, ast.Import) and any(a.name.startswith("renaissance_nb.display") for a in n.names):
                hits.append((path.name, "import", tuple(a.name for a in n.names), n.col_offset > 0))
    assert all(lazy for *_, lazy in hits), f"module-level imports of the display layer: {hits}"
    assert {names for _, _, names, _ in hits} <= {("dashboard",), ("dashboard_bundle",), ("show",)}, hits


# ---- views ----------------------------------------------------------------------------------------------
def test_region_view_reads_the_plans(compiled: DeepLearningTask) -> None:
    v = views.region_view(compiled)
    plan = compiled.plans["train_base"]
    assert v["ready"] and v["variants"] == list(compiled.plans)
    assert v["arena_bytes"] == plan.total_bytes and v["offsets_identical"] is True
    assert len(v["tensors"]) == len(plan)
    for t in v["tensors"]:
        assert t["offset"] == plan[t["id"]].offset
        assert t["shapes"]["train_last"] == list(compiled.plans["train_last"][t["id"]].shape)
        assert t["color"] == display.theme.FAMILY_COLORS[t["family"]]
    by_region = {r["region"]: r for r in v["regions"]}
    assert by_region["W_FC_WEIGHT"]["tensor_ids"] == list(plan.regions[Region.W_FC_WEIGHT].tensor_ids)
    assert all(r["size"] > 0 for r in v["regions"])
    # the last batch has 4000 % 128 = 32 rows: shapes change, offsets do not
    fc1 = next(t for t in v["tensors"] if t["name"] == "fc1.out")
    assert fc1["shapes"]["train_base"] == [128, 32] and fc1["shapes"]["train_last"] == [32, 32]
    assert fc1["nbytes"]["train_last"] < fc1["slot_bytes"]


def test_region_view_before_any_plan() -> None:
    assert views.region_view(small_task())["ready"] is False
    assert views.region_view(hand_task(finalize=False))["ready"] is False
    v = views.region_view(hand_task())
    assert v["ready"] and [t["name"] for t in v["tensors"]] == ["x", "w", "y"]


def test_lifetime_view_labels_the_timeline(compiled: DeepLearningTask) -> None:
    v = views.lifetime_view(compiled)
    plan = compiled.plans["train_base"]
    assert v["ready"] and v["programs"] and v["programs"][0]["name"].startswith("train step")
    for t in v["tensors"]:  # feature maps and temporaries as the plan packed them; state kept all step long
        want = plan.lifetimes[t["id"]] if t["reusable"] else [(0, len(v["steps"]) - 1)]
        assert [tuple(iv) for iv in t["intervals"]] == [tuple(iv) for iv in want], t["name"]
    ops = {s["op"] for s in v["steps"]}
    assert {"fc_fwd", "fc_bwd", "softmax_xent", "optimizer"} <= ops
    assert all(s["t"] == i for i, s in enumerate(v["steps"]))
    # every pair reported as sharing bytes really overlaps in bytes and never in time
    for p in v["shared"]:
        a, b = plan[p["a_id"]], plan[p["b_id"]]
        assert a.offset < b.end and b.offset < a.end
        assert not any(x0 <= y1 and y0 <= x1 for x0, x1 in plan.lifetimes.get(a.id, [])
                       for y0, y1 in plan.lifetimes.get(b.id, []))


def test_liveness_off_shares_nothing() -> None:
    t = small_task().options(liveness=False).lock_memory()
    v = views.lifetime_view(t)
    assert v["shared"] == [] and v["reuse"] is False


def test_atlas_view_groups_shared_captures(compiled: DeepLearningTask) -> None:
    atlas = compiled.compiled.atlas
    v = views.atlas_view(compiled)
    assert v["captures"] == len(atlas.captures) and v["entries"] == len(atlas.entries)
    colours: dict[int, set[str]] = {}
    counts: dict[int, int] = {}
    for row in v["cells"].values():
        for c in row.values():
            colours.setdefault(c["captured"], set()).add(c["color"])
            counts[c["captured"]] = counts.get(c["captured"], 0) + 1
            assert c["captured"] == atlas.entry(c["variant"], __import__("renaissance_nb").GraphId[c["gid"]]).captured_index
    assert all(len(s) == 1 for s in colours.values()), "one colour per bound graph"
    # coloured by what a cell shares: the same colour <=> the same variants share the cell's bound graph;
    # in one row, cells of one colour share one bound graph; a graph used by one cell only is grey
    sharers: dict[int, set[str]] = {}
    for v_name, row in v["cells"].items():
        for c in row.values():
            sharers.setdefault(c["captured"], set()).add(v_name)
    by_colour: dict[str, set[frozenset[str]]] = {}
    for cap, names in sharers.items():
        by_colour.setdefault(next(iter(colours[cap])), set()).add(frozenset(names) if len(names) > 1 else frozenset())
    assert all(len(p) == 1 for p in by_colour.values()) and len(by_colour) <= 11, by_colour
    for gid in v["graph_ids"]:
        row = [c for r in v["cells"].values() for g, c in r.items() if g == gid and c["shared_by"] > 1]
        assert len({c["captured"] for c in row}) == len({c["color"] for c in row}), gid
    assert len(v["patterns"]) == len(by_colour) - 1 >= 3
    for row in v["cells"].values():
        for c in row.values():
            assert c["shared_by"] == counts[c["captured"]]
    assert v["cells"]["train_base"]["OPTIMIZER"]["shared_by"] >= 2


def test_variants_and_blueprint_views(compiled: DeepLearningTask) -> None:
    vv = views.variants_view(compiled)
    assert [r["variant"] for r in vv["rows"]] == list(compiled.shapes.specs)
    last = next(r for r in vv["rows"] if r["variant"] == "train_last")
    assert last["batch"] == 32 and "fc1.out" in last["differs_from_base"] and vv["offsets_identical"]
    bv = views.blueprint_view(compiled)
    assert [l["name"] for l in bv["layers"]] == [l.name for l in compiled.arch.layers]
    assert bv["total_params"] == 784 * 32 + 32 + 32 * 10 + 10
    assert views.blueprint_view(small_task())["layers"] == []


def test_phase_view_actions() -> None:
    t = small_task()
    v = views.phase_view(t)
    assert v["current"] == "PLANNING" and [p["state"] for p in v["phases"]] == ["current", "todo", "todo"]
    acts = {a["name"]: a for a in v["actions"]}
    # compile() runs the stages not done yet, as DeepLearningTask.compile() does; plan() is the next one
    assert acts["plan"]["next"] and acts["compile"]["enabled"] and not acts["compile"]["next"]
    assert v["phases"][0]["allows"] == ["change any setting", "plan()", "lock_memory()", "compile()"]
    t.plan()
    v = views.phase_view(t)  # every setter refuses after plan(): the box says so
    assert v["phases"][0]["allows"][0] == "settings fixed by plan(): reset() to change them"
    t.lock_memory()
    v = views.phase_view(t)
    assert [p["state"] for p in v["phases"]] == ["done", "current", "todo"]
    assert [h["operation"] for h in v["history"]] == ["plan", "lock_memory"]
    assert {a["name"]: a for a in v["actions"]}["compile"]["next"]
    hv = views.phase_view(hand_task(finalize=False))
    assert [a["name"] for a in hv["actions"]] == ["finalize_memory", "compile"]


# ---- static HTML ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("stage", ["new", "planned", "locked", "compiled", "trained"])
def test_static_dashboard_at_every_stage(stage: str, trained: DeepLearningTask) -> None:
    t = trained if stage == "trained" else small_task()
    if stage == "planned":
        t.plan()
    elif stage in ("locked", "compiled"):
        t.lock_memory()
        if stage == "compiled":
            t.compile()
    html = static.dashboard_html(t)
    tags = parse(html)
    assert "details" in tags and "svg" in tags
    assert "view failed" not in html
    for title in ("Phases", "BluePrint", "Variants", "Memory", "Inspector", "Graph", "Atlas", "Training"):
        assert f"<summary>{title}</summary>" in html
    if stage in ("locked", "compiled", "trained"):
        assert "data-tensor=" in html and "<title>fc1.out (#" in html  # hover text without JavaScript
    if stage == "trained":
        assert "train loss" in html


def _summaries(html: str) -> tuple[str, ...]:
    return tuple(re.findall(r"<details(?: open)?><summary>([^<]+)</summary>", html))


def test_the_static_page_has_the_live_dashboards_sections() -> None:
    """One list (display/sections.py) makes both: the same titles in the same order at every stage, for
    both kinds of task, and each side has a maker for every section of the list."""
    from renaissance_nb.display.sections import SECTIONS

    titles = tuple(s.title for s in SECTIONS)
    assert tuple(static.SECTION_HTML) == titles
    t, hand = small_task(), hand_task(compile_=True)
    for task, step in ((t, None), (t, "lock_memory"), (t, "compile"), (hand, None)):
        if step:
            getattr(task, step)()
        board = dashboard(task)
        assert tuple(board.makers()) == titles
        assert _summaries(static.dashboard_html(task)) == board.tabs.titles, step
        board.close()
    assert board.tabs.titles == ("Phases", "Memory", "Graph", "Atlas")


def test_the_static_inspector_section_is_the_live_tabs_static_copy() -> None:
    """Before lock_memory() both say the same; after, the section is what the Inspector tab's own static
    copy shows at its starting picks (the peak of train_base)."""
    from renaissance_nb.display.inspector_view import MemoryInspectorView
    from renaissance_nb.display.sections import INSPECTOR_WAITS

    t = small_task()
    assert INSPECTOR_WAITS in static.inspector_section_html(t)
    board = dashboard(t)
    assert INSPECTOR_WAITS in board.tabs.children[board.tabs.titles.index("Inspector")].value
    board.close()
    t.lock_memory()
    live = MemoryInspectorView(t)
    html = static.inspector_section_html(t)
    assert html == live.static_html() and "Step scrubber" in html and "Live at the peak · train_base" in html
    assert f"tick {live.tick} " in html
    page = static.dashboard_html(t)
    assert html in page and "Inspector view failed" not in page


def test_static_dashboard_of_a_hand_built_task() -> None:
    for t in (hand_task(finalize=False), hand_task(graph=False), hand_task(compile_=True)):
        html = static.dashboard_html(t)
        parse(html)
        assert "view failed" not in html


def test_a_failing_view_does_not_break_the_page(monkeypatch: pytest.MonkeyPatch, compiled: DeepLearningTask) -> None:
    def boom(_task):  # type: ignore[no-untyped-def]
        raise RuntimeError("simulated")

    monkeypatch.setattr(views, "atlas_view", boom)
    html = static.dashboard_html(compiled)
    assert "Atlas view failed" in html and "simulated" in html and "<summary>Memory</summary>" in html


# ---- graph drawing ----------------------------------------------------------------------------------------
def test_graph_drawing_with_dot(compiled: DeepLearningTask) -> None:
    if not graphdraw.dot_available():
        pytest.skip("Graphviz's dot is not installed here")
    from renaissance_nb import GraphId

    g = compiled.graphs.train
    out = graphdraw.render_graph(g, GraphId.DEEP_FWD_BWD, compiled.plans["train_last"])
    assert out["svg"].startswith("<svg") and out["note"] == "" and "(32, 10)" in out["svg"]
    folded = graphdraw.render_graph(g, None, compiled.plans["train_base"], collapsed=["fc2", "loss"])
    # the whole step runs fc2 twice (forward, then backward after the loss): one folded box per run
    assert 'id="layer_fc2"' in folded["svg"] and 'id="layer_fc2&#45;1"' in folded["svg"]  # &#45;: graphviz's '-'
    assert folded["svg"].count("fc2 ▸ 1 op") == 2 and "fc2 &#160;▸" not in folded["svg"]


def test_graph_fallback_without_dot(monkeypatch: pytest.MonkeyPatch, compiled: DeepLearningTask) -> None:
    monkeypatch.setattr(graphdraw.shutil, "which", lambda _name: None)
    assert not graphdraw.dot_available()
    out = graphdraw.render_graph(compiled.graphs.train, None, compiled.plans["train_base"])
    assert out["svg"] is None and "dot" in out["note"] and "<table" in out["table"]
    assert "fc_fwd" in out["table"] and "fc1.out" in out["table"]
    gv = GraphView(compiled)
    assert gv.svg == "" and gv.table and gv.note and gv.dot is False
    assert "rnb-note" in gv._repr_html_()
    assert "Graphviz" in static.graph_html(compiled)


class _CapturedGraphs:
    """What the GPU executor offers the graph view (atlas, entry(), one DOT per capture), over the CPU's atlas."""

    def __init__(self, executor) -> None:  # type: ignore[no-untyped-def]
        self.atlas, self.entry = executor.atlas, executor.entry

    def debug_dot(self, idx: int) -> str:
        return f'digraph "cuda {idx}" {{ a [label="rnb_bias_act"]; b [label="cublasSgemm"]; b -> a; }}'


def test_graph_view_shows_the_captured_cuda_graph(monkeypatch: pytest.MonkeyPatch,
                                                  compiled: DeepLearningTask) -> None:
    assert "cublasSgemm" not in GraphView(compiled).captured, "a CPU task has no CUDA graphs"
    monkeypatch.setattr(compiled.runner, "replay", _CapturedGraphs(compiled.executor))
    gv = GraphView(compiled)
    assert gv.gid == "DEEP_FWD_BWD" and "DEEP_FWD_BWD" in gv.captured_caption and "1 dependency" in gv.captured_caption
    assert "cublasSgemm" in gv.captured and "rnb-captured" in gv._repr_html_()
    gv.graph = "inference"  # INF graphs live in the val variants: none captured for train_base
    assert gv.captured == "" or "inference" in gv.captured_caption


@pytest.mark.skipif(not native_program.enabled(), reason="no C library: no native program to show")
def test_graph_view_shows_a_cpu_graphs_c_calls_in_order(compiled: DeepLearningTask) -> None:
    """The CPU's counterpart of the CUDA graph: each node of the GraphId picked and the C calls its kernel
    makes inside the step's native program, as the executor bound them."""
    gv = GraphView(compiled)
    ex = compiled.executor
    calls = ex.native_calls(gv.variant, GraphId.DEEP_FWD_BWD, "train")
    assert calls and all(c for _, c in calls)
    total = sum(len(c) for _, c in calls)
    assert gv.captured_caption.startswith(f"native program of train/DEEP_FWD_BWD ({gv.variant}): {total} C calls "
                                          f"from {len(calls)} kernels, packed into the step's native program")
    assert gv.captured.count("<tr>") == len(calls) + 1 and "rnb_gemm_bands" in gv.captured
    assert "rnb-captured" in gv._repr_html_()
    gv.gid = "OPTIMIZER"
    assert "rnb_adam" in gv.captured and "1 kernel" in gv.captured_caption
    gv.gid = ""  # every GraphId at once: no one program to show
    assert gv.captured == ""


def test_graph_view_switches_and_folds(compiled: DeepLearningTask) -> None:
    gv = GraphView(compiled)
    assert gv.graph == "train" and gv.gid == "DEEP_FWD_BWD" and gv.layers
    before = gv.svg or gv.table
    gv.gid = ""
    assert set(gv.layers) >= {"data", "fc1", "fc2", "loss", "optimizer"}
    gv.collapsed = ["fc1"]
    assert (gv.svg or gv.table) != before
    gv.graph = "inference"
    assert gv.gid == "" and "optimizer" not in gv.layers
    hv = GraphView(hand_task())
    assert hv.graph == "forward" and "matmul" in (hv.svg or hv.table)


# ---- widgets ------------------------------------------------------------------------------------------------
def test_phase_view_buttons_call_the_api_and_show_errors() -> None:
    t = small_task()
    pv = PhaseView(t)
    seen = []
    pv.on_change(lambda w: seen.append(w.view["current"]))
    pv._on_msg(pv, {"action": "lock_memory"}, [])  # what the front end sends on a click
    assert t.phase.value == "MEMORY_LOCKED" and pv.error == {} and pv.view["current"] == "MEMORY_LOCKED"
    pv._on_msg(pv, {"action": "lock_memory"}, [])
    assert pv.error["type"] == "PhaseError" and "needs phase PLANNING" in pv.error["message"]
    assert t.phase.value == "MEMORY_LOCKED"
    pv.act("compile")
    assert t.phase.value == "COMPILED" and pv.error == {} and seen == ["MEMORY_LOCKED", "MEMORY_LOCKED", "COMPILED"]
    pv.act("not_an_operation")
    assert pv.error["type"] == "ValueError"
    empty = PhaseView(TaskBase("empty"))
    empty.act("finalize_memory")
    assert empty.error["type"] == "PlanError" and empty.view["current"] == "PLANNING"
    saved = empty.copy_bundle()["text/html"]  # the saved notebook's copy shows it too (phase.js draws it live)
    assert "PlanError from finalize_memory()" in saved and "finalize_memory() failed: PlanError" in repr(empty)


def test_region_map_and_lifetimes(compiled: DeepLearningTask) -> None:
    rm = RegionMap(compiled)
    assert rm.variant == "train_base"
    names = [t["name"] for t in rm.tensors_in("W_FC_WEIGHT")]
    assert names == ["fc1.weight", "fc2.weight"]
    rm.variant = "val_last"
    assert "val_last" in rm._repr_html_()
    assert RegionMap(compiled.plans["train_last"]).view["variants"] == ["train_last"]
    lv = LifetimeView(compiled)
    assert lv.view["tensors"] and "rnb-lifetime-svg" in lv._repr_html_()


def test_atlas_click_opens_the_graph(compiled: DeepLearningTask) -> None:
    av = AtlasView(compiled)
    d = av.select_cell("train_last", "DEEP_FWD_BWD")
    assert d["gid"] == "DEEP_FWD_BWD" and d["shape"] == "(32, 784)" and d["n_nodes"] > 0
    assert d["svg"] or d["table"]
    assert "train_lowres_last" in d["shared_with"]
    d = av.select_cell("train_base", "OPTIMIZER")
    assert d["shape_id"] == 0 and len(d["shared_with"]) >= 1
    av.selected = {"variant": "val_base", "gid": "DEEP_FWD_BWD"}  # an empty cell
    assert av.detail == {}


def test_training_monitor_is_a_run_callback() -> None:
    t = small_task(epochs=2)
    mon = TrainingMonitor(t)
    assert mon.records == [] and mon.lr and mon.total_epochs == 2 and mon.status == "idle"
    updates = []
    mon.observe(lambda ch: updates.append(len(ch["new"])), names="records")
    t.run(callbacks=[mon], progress=False)
    assert updates == [1, 2], "one update per epoch, while the run goes on"
    assert [r["epoch"] for r in mon.records] == [1, 2] and mon.status == "done"
    assert len(mon.step_losses) == t.total_steps
    assert mon.step_losses == pytest.approx([float(x) for x in t.result.step_losses])
    assert "train loss" in mon._repr_html_()
    mon("something-else", None)  # unknown events are ignored


def test_the_saved_monitor_says_what_the_live_one_says() -> None:
    """An interrupted run: the live pill's status, the static copy and the text line agree (the copy and the
    line left it out; interrupted in epoch 1 the line said 'not trained yet'); the step-time bars leave out a
    run's first step as monitor.js does, and say so."""
    from renaissance_nb import StopTraining
    from renaissance_nb.display import static, views

    def stop_in(epoch: int):  # type: ignore[no-untyped-def]
        def cb(kind: str, info) -> None:  # type: ignore[no-untyped-def]
            if kind == "step" and info["epoch"] == epoch:
                raise StopTraining("pause")
        return cb
    for epoch, line in ((2, "epoch 1/3 (interrupted), train loss"), (1, "interrupted before its first epoch ended")):
        t = small_task(epochs=3, batch=64)
        t.run(progress=False, callbacks=[stop_in(epoch)])
        mon = TrainingMonitor(t)
        assert mon.status == "interrupted" and repr(mon).startswith(f"<TrainingMonitor: {line}")
        assert "data-status='interrupted'" in mon.copy_bundle()["text/html"]
    recs = [{"epoch": 1, "steps": 10, "seconds": 2.9, "first_step_seconds": 2.0},
            {"epoch": 2, "steps": 20, "seconds": 1.0, "first_step_seconds": 0.0}]
    assert static.step_times(recs) == pytest.approx([100.0, 100.0])  # (2.9 - 2.0) s over 9 steps; 1.0 s over 10
    assert static.first_steps_note(recs) == ("first step of a run (kernels compiled or loaded), not in the bars: "
                                             "epoch 1 2.00 s")
    assert views.run_status({"records": recs, "interrupted": False, "total_epochs": 2}) == "done"


def test_monitor_run_shows_errors() -> None:
    t = small_task(epochs=1)
    mon = TrainingMonitor(t, controls=True)
    mon._on_msg(mon, {"action": "run", "epochs": 1}, [])
    assert mon.status == "done" and len(mon.records) == 1
    t2 = DeepLearningTask("no data").model(seq(fc(10)))
    bad = TrainingMonitor(t2)
    bad.run()
    assert bad.status == "error" and bad.error["type"] == "ConfigError"


def test_dashboard_tabs_follow_the_task() -> None:
    t = small_task()
    d = dashboard(t)
    assert d.tabs.titles == ("Phases", "BluePrint", "Variants", "Memory", "Inspector", "Graph", "Atlas", "Training")
    assert "rnb-dashboard" in d._dom_classes
    memory = d.tabs.children[3]
    assert "lock_memory()" in memory.value
    d.phases.act("lock_memory")
    assert isinstance(d.tabs.children[3].children[0], RegionMap)
    assert isinstance(d.tabs.children[5], GraphView)
    d.phases.act("compile")
    assert isinstance(d.tabs.children[6], AtlasView)
    d.select("Training")
    d.monitor.run(1, progress=False)
    assert d.tabs.selected_index == 7 and "1 epoch ·" in d.header.value
    hd = dashboard(hand_task(compile_=True))
    assert hd.tabs.titles == ("Phases", "Memory", "Graph", "Atlas")


def test_bundle_has_widget_html_and_text(compiled: DeepLearningTask) -> None:
    b = compiled._repr_mimebundle_()
    assert set(b) == {"text/plain", "text/html", WIDGET_MIME}
    assert b[WIDGET_MIME]["model_id"]
    assert b["text/plain"].startswith("<DeepLearningTask")
    assert dashboard_bundle(compiled).keys() == b.keys()


def test_bundle_without_widgets_is_static(monkeypatch: pytest.MonkeyPatch, compiled: DeepLearningTask) -> None:
    monkeypatch.setattr(display, "_board", None)
    monkeypatch.setattr(display, "_missing", "No module named 'anywidget'", raising=False)
    b = display.dashboard_bundle(compiled)
    assert set(b) == {"text/plain", "text/html"}
    with pytest.raises(ImportError, match="notebook extra"):
        display.dashboard(compiled)


def test_bundle_survives_a_broken_widget(monkeypatch: pytest.MonkeyPatch, compiled: DeepLearningTask) -> None:
    def boom(*_a, **_k):  # type: ignore[no-untyped-def]
        raise RuntimeError("simulated widget failure")

    monkeypatch.setattr(display._board.Dashboard, "__init__", boom)
    b = compiled._repr_mimebundle_()
    assert WIDGET_MIME not in b and "rnb-dashboard-static" in b["text/html"]


def test_static_fallbacks_of_every_widget(trained: DeepLearningTask) -> None:
    for w in (PhaseView(trained), RegionMap(trained), LifetimeView(trained), GraphView(trained),
              AtlasView(trained), TrainingMonitor(trained)):
        bundle = w._repr_mimebundle_()
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        assert WIDGET_MIME in data
        html = w._repr_html_()
        assert html.startswith("<div class='rnb rnb-static") and "<style>" in html
        parse(html)


# ---- front-end files and packaging ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["phase.js", "regions.js", "lifetimes.js", "graph.js", "atlas.js", "monitor.js",
                                  "htmlview.js"])
def test_es_modules_export_a_render(name: str) -> None:
    from renaissance_nb.display._assets import esm
    src = esm(name)  # what anywidget loads: the shared DOM helpers, then the module
    assert "export default { render }" in src
    assert "model.on(" in src and "model.off(" in src, "views unsubscribe when removed"
    node_bin = __import__("shutil").which("node")
    if node_bin:
        r = subprocess.run([node_bin, "--check", "--input-type=module"], input=src, text=True, capture_output=True)
        assert r.returncode == 0, r.stderr


def test_css_is_scoped() -> None:
    css = asset("renaissance.css")
    selectors = re.findall(r"(?m)^([^{}@/*\n][^{}\n]*)\{", css)
    assert selectors
    for sel in selectors:
        for part in sel.split(","):  # the output swap reaches outside .rnb, only next to a static copy;
            # a theme's mark (JupyterLab's data-jp-theme-light, VS Code's body class) only picks .rnb's colours
            themed = re.match(r'(\[data-jp-theme-light="(true|false)"\]|body\.vscode-[a-z-]+) \.rnb\b', part.strip())
            assert part.strip().startswith(".rnb") or ":has(.rnb-static-copy)" in part or themed, \
                f"unscoped selector: {part.strip()}"


def test_wheel_ships_the_widgets() -> None:
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert conf["package-dir"]["renaissance_nb._widgets"] == "widgets"
    assert set(conf["package-data"]["renaissance_nb._widgets"]) >= {"*.js", "*.css"}
    listed = set(conf["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "renaissance_nb").rglob("__init__.py")}
    assert on_disk <= listed, f"packages missing from pyproject's list: {sorted(on_disk - listed)}"
    for name in ("dom.js", "phase.js", "regions.js", "lifetimes.js", "graph.js", "atlas.js", "monitor.js",
                 "htmlview.js", "renaissance.css"):
        assert (ROOT / "widgets" / name).is_file()


def test_notebook_extra_lists_what_the_display_needs() -> None:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["notebook"]
    names = {re.split(r"[<>=\[ ]", e)[0].lower() for e in extra}
    assert {"ipywidgets", "anywidget", "matplotlib", "graphviz", "ipykernel"} <= names


def test_views_are_json(trained: DeepLearningTask) -> None:
    for v in (views.phase_view(trained), views.region_view(trained), views.lifetime_view(trained),
              views.atlas_view(trained), views.variants_view(trained), views.blueprint_view(trained),
              views.training_view(trained)):
        json.dumps(v)


def test_phase_error_is_not_swallowed_by_the_api() -> None:
    """The widget shows errors; the API still raises them."""
    t = small_task().lock_memory()
    with pytest.raises(PhaseError):
        t.lock_memory()


def test_per_step_curves_keep_a_fixed_resolution_on_long_runs() -> None:
    """A run planned for 6,400 steps sends one loss point per 4 steps (block means, at each block's
    last step) and one lr point per 4 steps; a million-step run sent a million floats per update."""
    x = np.random.default_rng(0).standard_normal((64, 5)).astype(np.float32)
    t = (DeepLearningTask("long").model(seq(fc(8), relu(), fc(2))).data(train=(x, np.arange(64) % 2), batch_size=1)
         .scheduler(rnb.StepLR().step_size(10)).total_epochs(100))
    mon = TrainingMonitor(t)
    assert views.curve_every(t.total_steps) == 4 and len(mon.lr) == 1600 <= views.CURVE_POINTS
    assert mon.lr == pytest.approx([float(v) for v in t.lr_table()[3::4]])  # each block's last step
    t.run(2, callbacks=[mon], progress=False)
    logged = t.result.step_losses.astype(np.float64)
    assert len(logged) == 128 and mon.loss_steps == 128 and mon.loss_every == 4
    assert mon.step_losses == pytest.approx(list(logged.reshape(32, 4).mean(1)))
    v = views.training_view(t)
    assert v["step_losses"] == mon.step_losses and v["lr"] == mon.lr


def test_step_curve_blocks_gaps_and_the_short_last_block() -> None:
    assert views.curve_every(2000) == 1 and views.curve_every(2001) == 2 and views.curve_every(2**26) == 2**16
    assert views.step_curve(np.array([1.0, 3.0, 5.0, 7.0, 9.0]), 2) == [2.0, 6.0, 9.0]
    assert views.step_curve(np.array([1.0, np.nan, 5.0, 7.0]), 2) == [None, 6.0]  # a diverged block is a gap
    assert views.step_curve(np.array([1.0, 2.0, 3.0, 4.0, 5.0]), 2, mean=False) == [2.0, 4.0, 5.0]
    assert views.step_curve(np.array([np.inf, 1.0], np.float32), 1) == [None, 1.0]


def test_lifetimes_show_every_region_and_every_access_of_the_plan(trained: DeepLearningTask) -> None:
    """Every region of the plan is drawn, the persistent ones alive over the whole step, and every read
    and write of every node (the optimizer's W/G/M/V, the NaN check's G, declared operands) appears."""
    from renaissance_nb.compiler.stages import labelled_programs
    from renaissance_nb.compiler.touches import node_access

    v = views.lifetime_view(trained)
    plan = views.plans_of(trained)[v["variant"]]
    drawn = {t["id"]: t for t in v["tensors"]}
    assert {t["region"] for t in v["tensors"]} == {r.name for r, span in plan.regions.items() if span.size}
    for family in "WGMV":
        assert any(t["region"].startswith(family + "_") and t["persistent"] for t in v["tensors"]), family
    last = max(b for t in v["tensors"] for _, b in t["intervals"])
    t0 = 0
    opt_seen = False
    for _, nodes in labelled_programs(trained.graphs):
        for i, (_, n) in enumerate(nodes):
            r, w = node_access(n, plan)
            assert set(n.inputs) <= r and set(n.outputs) <= w
            for tid in r:
                assert t0 + i in drawn[tid]["reads"], (n.op, plan[tid].name)
            for tid in w:
                assert t0 + i in drawn[tid]["writes"], (n.op, plan[tid].name)
            if n.op == "optimizer":
                opt_seen = True
                names = {plan[tid].name for tid in r}
                assert {"fc1.weight", "fc1.weight@grad"} <= names and any(x.startswith("fc1.weight@") and
                                                                          x != "fc1.weight@grad" for x in names)
                assert "fc1.weight" in {plan[tid].name for tid in w}
        t0 += len(nodes) + 1
    assert opt_seen
    w = next(t for t in v["tensors"] if t["name"] == "fc1.weight")
    assert w["intervals"] == [[0, last]], "a weight lives through the whole step, optimizer included"


def test_atlas_detail_shows_every_access_of_the_plan(compiled: DeepLearningTask) -> None:
    """The atlas detail of OPTIMIZER (and of every cell) lists every tensor each op reads and writes, the
    ranges the optimizer and NaN check sweep included, and draws those ranges as operands."""
    from renaissance_nb.compiler.touches import node_access

    av = AtlasView(compiled)
    plans, graphs = views.plans_of(compiled), views.graphs_of(compiled)
    for variant, row in av.view["cells"].items():
        for gid, cell in row.items():
            d = av.select_cell(variant, gid)
            nodes = graphs[cell["graph"]].nodes(rnb.GraphId[gid])
            assert [a["op"] for a in d["access"]] == [n.op for n in nodes]
            for a, n in zip(d["access"], nodes):
                r, w = node_access(n, plans[variant])
                assert set(n.inputs) <= r and set(n.outputs) <= w
                assert sorted(a["reads"]) == sorted(plans[variant][t].name for t in r), (gid, n.op)
                assert sorted(a["writes"]) == sorted(plans[variant][t].name for t in w), (gid, n.op)
    d = av.select_cell("train_base", "OPTIMIZER")
    opt = next(a for a in d["access"] if a["op"] == "optimizer")
    assert {"fc1.weight", "fc1.weight@grad", "fc2.bias"} <= set(opt["reads"]) and "fc1.weight" in opt["writes"]
    params = lambda names: [x for x in names if x.startswith("fc")]  # noqa: E731
    assert len(params(opt["reads"])) == 16 and len(params(opt["writes"])) == 12  # 4 params: W, G, M, V / W, M, V
    if d["svg"]:
        for family in "WGMV":
            assert f'id="span_{family}_BN_BIAS_{family}_DEEP_CONV"' in d["svg"], family


def test_svg_ids_are_unique_per_drawing_and_captions_fit() -> None:
    """Two phase diagrams in one page (one in a hidden tab) each point at their own arrowhead marker;
    every line of the captions under the phases fits its column."""
    task = small_task()
    task.plan()  # PLANNING's longest caption: "settings fixed by plan(): reset() to change them"
    v = views.phase_view(task)
    a, b = static.phase_svg(v), static.phase_svg(v)
    ids = [re.search(r"<marker id='([^']+)'", x).group(1) for x in (a, b)]  # type: ignore[union-attr]
    assert ids[0] != ids[1] and f"url(#{ids[0]})" in a and f"url(#{ids[1]})" in b and f"url(#{ids[0]})" not in b
    lines = re.findall(r"<text x='(\d+)' y='\d+' text-anchor='middle' font-size='12'[^>]*>([^<]*)</text>", a)
    assert any("reset()" in t for _, t in lines)
    for x, text in lines:  # about 6.6 px per character at 12 px: inside the drawing and its column
        assert len(text) <= 25 and int(x) - 3.3 * len(text) >= 0, text


# ---- the whole step, laid out as it runs (display/graphlayout.py) -------------------------------------------
def _seed_mlp() -> DeepLearningTask:
    return DeepLearningTask("mlp").model(seq(fc(1024), relu(), fc(1024), relu(), fc(10))).data(
        datasets.default_mnist(), batch_size=128).lock_memory()


def _resnet_blocks() -> DeepLearningTask:
    """The block net of notebooks/08_image_models.ipynb (EMA on: its update sweeps five ranges)."""
    from renaissance_nb import RESNET_3_3, RESNET_3_3_DS, block, cbr, gap, maxpool

    net = seq(cbr(8, 3, 1, 1), maxpool(2), block(8, RESNET_3_3), block(16, RESNET_3_3_DS), gap(), fc(10))
    return DeepLearningTask("resnet").model(net).data(datasets.default_mnist(layout="image"), batch_size=96) \
        .train_resolution(20, 28, boundary_epoch=2).ema(0.99).total_epochs(4).lock_memory()


@pytest.mark.parametrize("make", [_seed_mlp, _resnet_blocks])
def test_whole_step_is_drawn_in_run_order_and_fits_a_page(make) -> None:  # type: ignore[no-untyped-def]
    """All GraphIds: one frame per GraphId in the order a step runs them, every op once, and a drawing
    narrow enough for a notebook (the seed MLP's was 2,839 px wide drawn as one graph, the ResNet's 17,018)."""
    if not graphdraw.dot_available():
        pytest.skip("Graphviz's dot is not installed here")
    task = make()
    g = task.graphs.train
    from renaissance_nb.compiler.stages import STEP_ORDER_A

    order = graphdraw.run_order(task, g)
    step_a = [x for x in STEP_ORDER_A if g.nodes(x)]  # a step reading buffer A comes first, in its order
    assert [x for x in order if g.nodes(x)][:len(step_a)] == step_a
    svg = graphdraw.render_graph(g, None, task.plans["train_base"], order=order)["svg"]
    width = int(re.search(r'width="(\d+)px"', svg).group(1))  # type: ignore[union-attr]
    assert width <= 1200, f"{width} px: the whole step no longer fits a page at a readable scale"
    frames = re.findall(r'<g id="gid_(\w+)" class="cluster">', svg)
    drawn = [x for x in order if g.nodes(x)]
    assert frames == [x.name for x in drawn] + [x.name for x in g.ids() if x not in drawn]
    assert len(set(re.findall(r'<g id="(op\d+)" class="node">', svg))) == len(g)
    fitted = graphdraw.static_svg(svg)
    assert f"min-width:{width * graphdraw.READABLE:.0f}px" in fitted and "max-width:100%" in fitted


def test_layout_draws_every_operand_and_flows_one_way(compiled: DeepLearningTask) -> None:
    """Every tensor an op reads or writes is drawn and linked to it (in a group box or its own), every
    range operand too; the edges, with the invisible ones that stack frames, run top to bottom (no cycle)."""
    from graphlib import TopologicalSorter

    from renaissance_nb.display.access import range_operands
    from renaissance_nb.display.graphlayout import step_layout

    g, plan = compiled.graphs.train, compiled.plans["train_base"]
    for collapsed in ([], ["fc2"]):
        lay = step_layout(g, None, plan, collapsed, graphdraw.run_order(compiled, g))
        preds: dict[str, set[str]] = {}
        for a, b in [*((a, b) for a, b, _ in lay.edges), *lay.stacking(), *lay.wrapped_rows()]:
            preds.setdefault(b, set()).add(a)
        list(TopologicalSorter(preds).static_order())  # raises CycleError on a loop
        for k, (_, n) in enumerate(lay.ops):
            box = lay.op_box[k]
            linked = [lay.drawings[a if b == box else b] for a, b, _ in lay.edges if box in (a, b)]
            tensors = {t for d in linked for t in (d.group or [d.tensor])}
            spans = {d.operand["key"] for d in linked if d.operand}
            reads, writes = range_operands(n, plan)
            if box.startswith("op"):
                assert set(n.inputs) | set(n.outputs) <= tensors, (n.op, k)
                assert {o["key"] for o in reads + writes} == spans, (n.op, k)
        assert all(lay.visible(d) == (not d.ends <= {r.id for r in lay.runs if r.folded})
                   for d in lay.drawings.values())
        drawn = {f"op{k}" for k in range(len(lay.ops))} | {r.id for r in lay.runs if r.folded} | {
            d.id for d in lay.drawings.values() if lay.visible(d)}
        invisible = [*lay.stacking(), *lay.wrapped_rows()]
        assert {x for e in invisible for x in e} <= drawn, "an invisible edge would make graphviz draw a stray node"
    folded = graphdraw.render_graph(g, None, plan, graphdraw.layers_of(g), order=graphdraw.run_order(compiled, g))
    assert not re.search(r'<g id="node\d+" class="node">', folded["svg"]), "every box drawn has its own id"

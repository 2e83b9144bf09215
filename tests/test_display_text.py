"""What the views and reprs *say*: text/plain, comparisons of sizes, plurals, placed handles.

Each test pins a reviewer's finding to concrete content, so that a view that shows the
wrong graph, an empty chart or a misleading number fails here, not in a screenshot.
"""
from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")

from renaissance_nb import (DeepLearningTask, GraphId, PhaseError, Region, StreamKind, TaskBase,  # noqa: E402
                            datasets, fc, node, relu, seq)
from renaissance_nb.display import (AtlasView, BluePrintView, GraphView, LifetimeView, PhaseView,  # noqa: E402
                                    RegionMap, TrainingMonitor, VariantsView, dashboard, static, views)
from renaissance_nb.compiler.stages import graph_lifetimes  # noqa: E402
from renaissance_nb.text import bytes_versus, human_bytes, plural  # noqa: E402

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def small_task(epochs: int = 1, **options: object) -> DeepLearningTask:
    t = (DeepLearningTask("t").model(seq(fc(32), relu(), fc(10)))
         .data(datasets.default_mnist(), batch_size=128).total_epochs(epochs))
    return t.options(**options) if options else t


@pytest.fixture(scope="module")
def compiled() -> DeepLearningTask:
    return small_task().compile()


def hand_task() -> tuple[TaskBase, object]:
    t = TaskBase("hand")
    x = t.alloc((4, 3), "float32", Region.I_A_DATA, name="x")
    w = t.alloc((3, 2), "float32", Region.W_FC_WEIGHT, name="w")
    y = t.alloc((4, 2), "float32", Region.F_FEATURE_FP32, name="y")
    t.finalize_memory()
    t.add_graph("forward", [node("matmul", [x.id, w.id], [y.id], layer="fc")], StreamKind.COMP_1)
    return t, x


# ---- 1: GraphView(gid='') is every GraphId ------------------------------------------------------------
def test_graph_view_empty_gid_means_all_graph_ids(compiled: DeepLearningTask) -> None:
    assert GraphView(compiled).gid == "DEEP_FWD_BWD", "the default opens the step's core"
    gv = GraphView(compiled, gid="")
    assert gv.gid == "" and gv.title() == "train graph · all GraphIds"
    drawn = gv.svg or gv.table
    assert "optimizer" in drawn and "transfer" in drawn, "OPTIMIZER and TRANSFER nodes are drawn too"
    assert {"data", "fc1", "optimizer"} <= set(gv.layers)
    assert GraphView(compiled, gid="OPTIMIZER").gid == "OPTIMIZER"


# ---- 2: lifetimes with liveness reuse off ----------------------------------------------------------------
def test_lifetimes_without_liveness_reuse_draw_every_box_unshared() -> None:
    off = small_task(liveness=False).lock_memory()
    on = small_task().lock_memory()
    assert off.plans["train_base"].lifetimes == {}, "the plan packed nothing, so it kept no lifetimes"
    v = views.lifetime_view(off)
    life = graph_lifetimes(off.graphs)
    plan = off.plans["train_base"]
    assert v["ready"] and v["lifetimes_from"] == "graphs" and v["shared"] == []
    assert {t["id"] for t in v["tensors"]} == {t.id for t in plan if t.id in life or not t.region.reusable}
    for t in v["tensors"]:
        want = life[t["id"]] if t["reusable"] else [(0, len(v["steps"]) - 1)]
        assert [tuple(iv) for iv in t["intervals"]] == [tuple(iv) for iv in want] and t["shares"] == []
    assert [t["intervals"] for t in v["tensors"]] == [t["intervals"] for t in views.lifetime_view(on)["tensors"]]
    svg = static.lifetimes_svg(v)
    boxes = re.findall(r"<rect class='rnb-life-box' data-tensor='([^']+)' data-shared='(\d)'", svg)
    reusable = [t for t in v["tensors"] if t["reusable"]]
    assert reusable and len(boxes) == sum(len(t["intervals"]) for t in reusable), "one box per live interval"
    assert {name for name, _ in boxes} == {t["name"] for t in reusable}, "every F/T tensor has its box"
    assert all(flag == "0" for _, flag in boxes) and "own bytes, not shared" in svg
    html = LifetimeView(off)._repr_html_()
    assert "Liveness reuse is off" in html and "no box shares its bytes" in html


def test_lifetimes_of_a_hand_built_task_come_from_its_graphs() -> None:
    t, _ = hand_task()
    v = views.lifetime_view(t)
    assert [x["name"] for x in v["tensors"]] == ["x", "w", "y"]
    assert v["programs"] == [{"name": "graph 'forward'", "start": 0, "end": 0}] and v["steps"][0]["op"] == "matmul"


# ---- 3: sizes compared by their difference -----------------------------------------------------------------
def test_bytes_versus_spells_out_the_difference() -> None:
    mib = 1 << 20
    assert bytes_versus(int(4.7 * mib), int(4.7 * mib) + 25190, "without reuse") == \
        "4.7 MiB, 24.6 KiB less than without reuse"
    assert bytes_versus(13 * mib + 2560, 13 * mib, "contiguous") == "13.0 MiB, 2.5 KiB more than contiguous"
    assert bytes_versus(1024, 1024, "before") == "1.0 KiB, the same as before"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(16 << 40) == "16.0 TiB" and human_bytes(2 ** 65) == "32.0 EiB"  # not '34359738368.0 GiB'


def test_plan_and_views_compare_sizes_by_their_difference() -> None:
    t = (DeepLearningTask("deep").model(seq(fc(64), relu(), fc(64), relu(), fc(64), relu(), fc(10)))
         .data(datasets.default_mnist(), batch_size=100).total_epochs(1).lock_memory())
    p = t.plans["train_base"]
    saved = p.bytes_without_reuse - p.total_bytes
    assert saved > 0
    first = p.summary().splitlines()[0]
    assert first.endswith(f"arena {human_bytes(p.total_bytes)}, {human_bytes(saved)} less than without liveness reuse")
    assert "instead of" not in first
    for text in (views.region_view(t)["reuse_text"], views.lifetime_view(t)["summary"],
                 static.lifetimes_html(views.lifetime_view(t)), static.regions_html(views.region_view(t))):
        assert f"{human_bytes(saved)} less than without reuse" in text and "instead of" not in text


# ---- 4: a handle from alloc() after finalize -------------------------------------------------------------------
def test_alloc_handle_resolves_its_placement() -> None:
    t = TaskBase("h")
    x = t.alloc((4, 3), "float32", Region.I_A_DATA, name="x")
    y = t.alloc((4, 3), "float32", Region.F_FEATURE_FP32, name="y")
    assert "unplaced" in repr(y) and y.placed is y
    with pytest.raises(ValueError, match="no offset yet"):
        _ = y.end
    t.finalize_memory()
    placed = t.memory[y.id]
    assert y.offset is None, "a DTensor is immutable: the handle keeps offset None"
    assert y.placed == placed and y.placed.offset == placed.offset == 256 and y.end == placed.end
    assert "unplaced" not in repr(y) and f"placed at offset={placed.offset} (see .placed)" in repr(y)
    assert repr(placed) == repr(placed.placed) and f"offset={placed.offset}," in repr(placed)
    assert replace(x, plan=None) == x and hash(replace(x, plan=None)) == hash(x), "the plan takes no part in equality"


# ---- 7: static fallbacks and text/plain ---------------------------------------------------------------------------
def test_monitor_fallback_reads_the_history_at_display_time() -> None:
    t = small_task(epochs=1)
    mon = TrainingMonitor(t)
    assert "Not trained yet" in mon._repr_html_() and repr(mon) == "<TrainingMonitor: not trained yet, 1 epoch planned>"
    t.run(progress=False)  # not through the monitor: the fallback still follows the task
    html = mon._repr_html_()
    assert "Not trained yet" not in html and "train loss" in html and "<svg" in html
    assert re.fullmatch(r"<TrainingMonitor: epoch 1/1, train loss \d\.\d{4}, val top-1 \d+\.\d\d%>", repr(mon))


def test_monitor_replaces_its_static_copy_when_a_run_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    import IPython.display

    class Handle:
        def __init__(self, data: dict) -> None:
            self.shown = [data]

        def update(self, data: dict, raw: bool = False) -> None:
            assert raw
            self.shown.append(data)

    handles: list[Handle] = []
    live: list[dict] = []

    def fake_display(data: dict, raw: bool = False, display_id: object = None) -> Handle | None:
        assert raw
        if display_id is None:  # the live widget: an output of its own, after the static copy
            live.append(data)
            return None
        assert display_id is True
        handles.append(Handle(data))
        return handles[-1]

    monkeypatch.setattr(IPython.display, "display", fake_display)
    t = small_task(epochs=1)
    mon = TrainingMonitor(t)
    mon._ipython_display_()
    (h,) = handles
    (view,) = live
    assert WIDGET_MIME in view and "text/html" not in view, "the live output holds the widget, not a second copy"
    assert WIDGET_MIME not in h.shown[0] and "Not trained yet" in h.shown[0]["text/html"]
    assert "rnb-static-copy" in h.shown[0]["text/html"]
    t.run(callbacks=[mon], progress=False)
    assert len(h.shown) == 2, "one update, when the run ends (not per epoch)"
    assert "train loss" in h.shown[1]["text/html"]
    assert "Not trained yet" not in h.shown[1]["text/html"] and "epoch 1/1" in h.shown[1]["text/plain"]


def _plain(widget: object) -> str:
    bundle = widget._repr_mimebundle_()  # type: ignore[attr-defined]
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    return data["text/plain"]


@pytest.mark.parametrize("stage", ["new", "locked", "compiled", "hand", "one tensor"])
def test_every_view_has_a_one_line_text_plain(stage: str) -> None:
    if stage == "hand":
        t = hand_task()[0]
    elif stage == "one tensor":
        t = TaskBase("one")
        t.alloc((2,), "float32", Region.I_A_DATA)
        t.finalize_memory()
    else:
        t = small_task()
        if stage == "locked":
            t.lock_memory()
        elif stage == "compiled":
            t.compile()
    made = [PhaseView(t), RegionMap(t), LifetimeView(t), GraphView(t), AtlasView(t), TrainingMonitor(t),
            BluePrintView(t), VariantsView(t), dashboard(t)]
    for w in made:
        text = _plain(w)
        name = type(w).__name__
        assert text.startswith(f"<{name}: ") and text.endswith(">"), text
        assert "\n" not in text and "<style" not in text and "<div" not in text and " object at 0x" not in text
        assert len(text) <= 110, f"ipywidgets cuts text/plain at 110 characters: {text}"
        assert not re.search(r"\b1 (tensors|variants|kernels|entries|layers|calls|regions|epochs|graphs|steps)\b",
                             text), text
        assert repr(w) == text
    if stage == "compiled":
        texts = {type(w).__name__: _plain(w) for w in made}
        assert "phase COMPILED" in texts["PhaseView"] and "phase COMPILED" in texts["Dashboard"]
        assert "56 entries over 6 variants -> 30 distinct bound graphs" in texts["AtlasView"]
        assert "2 executable layers" in texts["BluePrintView"] and "same offsets" in texts["VariantsView"]
        assert texts["GraphView"].startswith("<GraphView: train graph · DEEP_FWD_BWD")


def test_plural() -> None:
    assert [plural(n, "tensor") for n in (0, 1, 2)] == ["0 tensors", "1 tensor", "2 tensors"]
    assert plural(1, "entry", "entries") == "1 entry" and plural(3, "entry", "entries") == "3 entries"


def test_static_views_of_a_hand_task_speak_in_the_singular() -> None:
    t, _ = hand_task()
    t.compile()
    html = static.dashboard_html(t)
    assert "in all 1 variants" not in html and "1 tensors" not in html
    assert "change any setting" not in str(views.phase_view(t)["phases"]), "TaskBase has no settings"
    assert views.phase_view(t)["phases"][0]["allows"] == ["alloc()", "finalize_memory()"]
    assert repr(t.bound_graphs["forward"]) == "<BoundGraph forward: 1 kernel>"


def test_a_hint_that_is_the_fix_is_said_once() -> None:
    t, _ = hand_task()
    with pytest.raises(PhaseError) as err:
        t.run("forward")
    assert str(err.value).count("compile()") == 2 and str(err.value).count("Fix:") == 1
    d = small_task()
    with pytest.raises(PhaseError) as err:
        d.predict(datasets.default_mnist().val.x)
    assert str(err.value).endswith("needs phase COMPILED, but the task is in phase PLANNING. "
                                   "Fix: call task.compile() first.")


# ---- 8: reprs that agree with what they summarise -------------------------------------------------------------------
def test_atlas_repr_counts_the_shape_ids_as_text_lists(compiled: DeepLearningTask) -> None:
    atlas = compiled.compiled.atlas
    listed = re.findall(r"\bs\d+=", atlas.as_text().splitlines()[-2 if atlas.collapsed else -1])
    assert f"{len(listed)} ShapeIds (s0: any shape)" in repr(atlas)


def test_compiled_plan_repr_is_one_short_line(compiled: DeepLearningTask) -> None:
    text = repr(compiled.compiled)
    assert text.startswith("<CompiledPlan: 2 layers, 6 variants, arena ") and "\n" not in text and len(text) < 200
    assert "30 bound graphs" in text


def test_graph_as_text_names_tensors(compiled: DeepLearningTask) -> None:
    text = compiled.graphs.train.as_text()
    assert "fc_fwd(I_A.data, fc1.weight, fc1.bias) -> fc1.out" in text
    assert not re.search(r"\bfc_fwd\(\d", text), "no bare tensor ids when the compiler knows the names"
    assert compiled.graphs.train.as_text({}) != text, "an explicit mapping wins (here: none, so ids)"
    t, _ = hand_task()
    g = views.graphs_of(t)["forward"]
    assert "matmul(0, 1) -> 2" in g.as_text() and "matmul(x, w) -> y" in g.as_text(t.memory)
    assert GraphId.DEEP_FWD_BWD.name in compiled.graphs.train.as_text()


# ---- what a view shows follows the task (found by an audit of the displayed figures) -------------------
def test_parameter_counts_leave_out_batch_norm_running_statistics() -> None:
    from renaissance_nb import bn, conv, flatten
    x = np.random.default_rng(0).standard_normal((64, 3, 8, 8)).astype(np.float32)
    t = DeepLearningTask("p").model(seq(conv(8, 3, 1, 1), bn(), relu(), flatten(), fc(10))).data(
        train=(x, np.arange(64) % 10), batch_size=32)
    t.plan()
    bv = views.blueprint_view(t)
    # torch's sum(p.numel() for p in model.parameters()): conv w+b, bn gamma+beta, fc w+b; the 16
    # running statistics are buffers
    assert bv["total_params"] == (8 * 3 * 9 + 8) + (8 + 8) + (8 * 8 * 8 * 10 + 10) == 5370
    assert {layer["name"]: layer["params"] for layer in bv["layers"]}["bn1"] == 16
    assert "5,370 parameters" in repr(BluePrintView(t))


def test_graph_view_refresh_redraws_after_a_reset_with_other_settings() -> None:
    t = small_task()
    t.data(t.splits, batch_size=96)  # a batch of its own so the shapes below are unambiguous
    t.lock_memory()
    gv = GraphView(t)
    assert "(96, 32) float32" in (gv.svg or gv.table)
    t.reset()
    t.data(datasets.default_mnist(), batch_size=50)
    gv.refresh()
    assert gv.view["ready"] is False and not gv.svg and not gv.table  # no graphs in PLANNING: nothing stale
    t.lock_memory()
    gv.refresh()
    text = gv.svg or gv.table
    assert "(50, 32) float32" in text and "(96, 32)" not in text
    fresh = GraphView(small_task().lock_memory())  # a view made before lock_memory() opens the graphs later
    empty = GraphView(small_task())
    empty.source = fresh.source
    empty.refresh()
    assert empty.graph == "train" and empty.gid == "DEEP_FWD_BWD" and (empty.svg or empty.table)


def test_a_phase_button_error_clears_once_the_setting_is_fixed_in_code() -> None:
    from renaissance_nb import CosineAnnealingLR
    t = small_task(epochs=2).scheduler(CosineAnnealingLR().warmup(5))
    from renaissance_nb.display import Dashboard
    d = Dashboard(t)
    d.phases.act("plan")
    assert d.phases.error.get("type") == "ConfigError" and "warmup" in d.phases.error["message"]
    d.refresh()
    assert d.phases.error.get("type") == "ConfigError", "nothing changed: the error stays"
    t.total_epochs(10)
    d.refresh()
    assert not d.phases.error.get("type")
    d.close()


def test_task_repr_counts_epochs_in_words() -> None:
    t = small_task(epochs=2)
    t.run(1, progress=False)
    assert repr(t).endswith(", 1 epoch trained>")
    t.run(1, progress=False)
    assert repr(t).endswith(", 2 epochs trained>")


def test_region_rows_are_drawn_to_one_scale(compiled) -> None:  # type: ignore[no-untyped-def]
    """A 1 KiB bias region must not look as full as a 100 KiB weight region: each row's length is its
    region's size against the largest (issue #23, item 7)."""
    import re

    from renaissance_nb.display.static import region_rows_svg
    view = views.region_view(compiled)
    svg = region_rows_svg(view)
    widths = {name: float(w) for name, w in re.findall(
        r"<g data-region='(\w+)'><text[^>]*>\w+</text><rect x='\d+' y='[\d.]+' width='([\d.]+)'", svg)}
    sizes = {r["region"]: r["size"] for r in view["regions"]}
    big, small = max(sizes, key=sizes.get), min(sizes, key=sizes.get)
    assert widths[big] > 20 * widths[small] or widths[small] == 6.0
    assert abs(widths["W_FC_BIAS"] / widths["W_FC_WEIGHT"] - max(sizes["W_FC_BIAS"] / sizes["W_FC_WEIGHT"],
                                                                  6 / widths["W_FC_WEIGHT"])) < 1e-3


def test_the_widgets_print_bytes_as_the_text_does() -> None:
    """widgets/dom.js human() and text.human_bytes give the same text for the same bytes: exact ties such as
    12544 B (12.25 KiB) read 12.2 KiB in the text (round half to even) and 12.3 KiB in the live widgets, and
    the widgets stopped at GiB ('1960.0 GiB' beside a '1.9 TiB' arena)."""
    import json
    import re
    import shutil
    import subprocess

    from renaissance_nb.display._assets import asset
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node to run the widgets' JavaScript")
    src = asset("dom.js")
    helper = re.search(r"const BYTE_UNITS.*?\n}\n", src, re.S)
    assert helper is not None, "dom.js: BYTE_UNITS and human() side by side"
    values = [k * 256 for k in range(1, 4097)] + [1023, 1536, 12544, 1280, 2 ** 65, 1.9 * 2 ** 40, 0]
    out = subprocess.run([node, "-e", helper.group(0) + f"console.log(JSON.stringify({json.dumps(values)}.map(human)))"],
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [human_bytes(v) for v in values]
    assert human_bytes(12544) == "12.3 KiB" and human_bytes(2 ** 65) == "32.0 EiB"
    assert human_bytes(np.float32(2048)) == human_bytes(np.float16(2048)) == "2.0 KiB"  # not Decimal's TypeError
    assert human_bytes(float("inf")) == "inf EiB"

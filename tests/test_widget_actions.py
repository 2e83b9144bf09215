"""What the widgets do with the messages their buttons send, out of order and malformed ones
included, and with a diverged run. Found by an audit of the widget handlers: NaN losses broke
the monitor's drawing, statuses and errors went stale after reset(), a run started from a
callback interleaved two training loops over one arena.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")

from renaissance_nb import AdamW, DeepLearningTask, PhaseError, datasets, fc, relu, seq  # noqa: E402
from renaissance_nb.display import AtlasView, GraphView, TrainingMonitor, dashboard, static, views  # noqa: E402

rng = np.random.default_rng(0)
X = rng.standard_normal((300, 20)).astype(np.float32)
Y = (np.arange(300) % 3).astype(np.int32)


def mlp(epochs: int = 1, batch: int = 64) -> DeepLearningTask:
    return (DeepLearningTask("w").model(seq(fc(16), relu(), fc(3)))
            .data(datasets.from_arrays((X, Y), (X[:60], Y[:60])), batch_size=batch).total_epochs(epochs).seed(1))


def send(widget, **content) -> None:  # type: ignore[no-untyped-def]
    widget._on_msg(widget, content, [])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_diverged_run_reaches_the_monitor_as_json_nulls() -> None:
    t = mlp().optimizer(AdamW().lr(1e30)).options(nan_check=False)
    t.splits.train.x[...] *= 1e20
    mon = TrainingMonitor(t, controls=True)
    send(mon, action="run", epochs=1)
    assert mon.status == "done" and not mon.error
    assert mon.records[0]["train_loss"] is None and None in mon.step_losses
    json.dumps({"records": mon.records, "step_losses": mon.step_losses}, allow_nan=False)  # strict JSON
    assert "train loss not finite" in repr(mon)
    assert "not finite" in static.training_html(views.training_view(t))


def test_the_monitor_reads_its_status_from_the_task_after_reset_and_resume() -> None:
    t = mlp(epochs=2)
    d = dashboard(t)
    send(d.monitor, action="run", epochs=1)
    assert d.monitor.status == "paused" and len(d.monitor.records) == 1  # one epoch of two: more to run
    send(d.monitor, action="run")
    assert d.monitor.status == "done"
    send(d.phases, action="reset")
    assert t.phase.name == "PLANNING" and d.monitor.status == "idle" and d.monitor.records == []
    t.device("cuda")
    send(d.monitor, action="run")
    assert d.monitor.status in ("error", "done")  # no GPU here: an error; a GPU machine trains
    if d.monitor.status == "error":
        t.device("cpu")
        t.run(progress=False)  # in code: the widget shows it at its next refresh
        d.refresh()
        assert d.monitor.status == "done" and not d.monitor.error


def test_a_phase_error_goes_once_the_task_moves_on() -> None:
    t = mlp()
    d = dashboard(t)
    send(d.phases, action="compile")
    send(d.phases, action="lock_memory")  # already passed
    assert d.phases.error["type"] == "PhaseError"
    send(d.monitor, action="run")
    d.refresh()
    assert d.phases.error == {} and t.result.history


def test_run_or_reset_from_a_callback_is_refused_while_training() -> None:
    ref = mlp(epochs=3, batch=8)
    ref.run(progress=False)
    t = mlp(epochs=3, batch=8)  # 38 steps an epoch: step callbacks come every 16
    seen = []

    def meddle(kind: str, info: object) -> None:
        if kind == "step" and not seen:
            for call in (lambda: t.run(epochs=1, progress=False), t.reset):
                with pytest.raises(PhaseError, match=r"while run\(\) is training"):
                    call()
            seen.append(True)

    t.run(progress=False, callbacks=[meddle])
    assert seen and [r.steps for r in t.result.history] == [r.steps for r in ref.result.history]
    assert all(ref.state_dict()[k].tobytes() == v.tobytes() for k, v in t.state_dict().items())


def test_run_on_a_trained_task_says_so_in_the_widget() -> None:
    t = mlp()
    mon = TrainingMonitor(t, controls=True)
    send(mon, action="run")
    send(mon, action="run")
    assert mon.status == "done" and mon.error["type"] == "UserWarning" and "nothing to run" in mon.error["message"]
    assert len(t.result.history) == 1


@pytest.mark.parametrize("epochs", ["abc", [1], True, 1.5])
def test_a_malformed_run_message_runs_nothing(epochs: object) -> None:
    t = mlp()
    mon = TrainingMonitor(t, controls=True)
    send(mon, action="run", epochs=epochs)
    assert mon.error["type"] == "ValueError" and "nothing was run" in mon.error["message"]
    assert not t.result.history


def test_graph_and_atlas_views_survive_bad_picks() -> None:
    t = mlp().compile()
    gv = GraphView(t)
    gv.set_state({"gid": "DEEP_FWD_BWDX"})
    assert gv.gid == "" and gv.svg + gv.table  # falls back to every GraphId, and draws
    gv.set_state({"variant": "val_base"})  # later changes still work
    av = AtlasView(t)
    av.set_state({"selected": {"variant": ["x"], "gid": "A"}})
    assert av.detail == {}
    av.select_cell("train_base", "OPTIMIZER")
    assert av.detail["gid"] == "OPTIMIZER"


def test_region_map_and_blueprint_view_say_true_things_for_odd_sources() -> None:
    from renaissance_nb import Region, TaskBase
    from renaissance_nb.display import BluePrintView, RegionMap

    t = mlp().compile()
    r = RegionMap(t)
    r.set_state({"variant": "nope"})
    assert r.variant == "train_base" and "variant train_base" in repr(r)
    hand = TaskBase("h")
    hand.alloc((2, 2), "float32", Region.T_TEMP_FP32)
    hand.finalize_memory()
    assert "no model declared (a TaskBase is built by hand)" in repr(BluePrintView(hand))


# ---- widget lifetimes ---------------------------------------------------------------------------------
def open_widgets() -> int:
    import ipywidgets

    return len(ipywidgets.widgets.widget._instances)


def test_each_display_shows_the_task_as_it_was_then() -> None:
    t = mlp()
    first = t._repr_mimebundle_()
    t.compile()
    second = t._repr_mimebundle_()
    mime = "application/vnd.jupyter.widget-view+json"
    assert first[mime]["model_id"] != second[mime]["model_id"]
    assert "PLANNING" in first["text/plain"] and "COMPILED" in second["text/plain"]


def test_closing_a_dashboard_closes_every_widget_it_made() -> None:
    """ipywidgets closes only the widget close() is called on: a closed dashboard used to leave 31
    widgets open, and the task alive through them; each refresh left its layouts and styles."""
    import gc
    import weakref

    t = mlp()
    t.compile()
    before = open_widgets()
    d = dashboard(t)
    d.refresh()
    d.refresh()
    assert open_widgets() > before
    d.close()
    assert open_widgets() == before
    ref = weakref.ref(t)
    del t, d
    gc.collect()
    assert ref() is None  # nothing left open holds the task


def test_the_monitor_follows_plateau_reductions_and_an_early_stop() -> None:
    """As a run callback: the lr curve shows the rates ReduceLROnPlateau puts in force as epochs end,
    and the status after the run is the task's (it stayed 'running' after a stop)."""
    from renaissance_nb import EarlyStopping, ReduceLROnPlateau, SGD
    d = datasets.default_mnist()
    t = (DeepLearningTask("m").model(seq(fc(16), relu(), fc(10))).data(d.train, batch_size=500)
         .optimizer(SGD().lr(0.1)).scheduler(ReduceLROnPlateau(monitor="train_loss", mode="max", patience=0))
         .total_epochs(6).seed(0))
    monitor = TrainingMonitor(t)
    seen: list[float] = []
    res = t.run(progress=False, callbacks=[EarlyStopping("train_loss", mode="max", patience=3), monitor,
                                           lambda kind, info: seen.append(info.epoch) if kind == "epoch" else None])
    assert res.stopped and len(res.history) == 4 and seen == [1, 2, 3, 4]  # every callback saw the last epoch
    assert sorted({np.float32(v) for v in monitor.lr}) == list(np.float32([1e-4, 1e-3, 1e-2, 0.1]))
    assert monitor.status == "paused"


def test_dashboard_keeps_the_chosen_tab_and_follows_the_task() -> None:
    from renaissance_nb.display import Dashboard

    t = mlp(epochs=1)
    d = Dashboard(t)
    try:
        assert d._titles[:3] == ["Phases", "BluePrint", "Variants"]
        d.select("Memory")
        t.compile()  # in code, not from the widget: the phase view's poll notices, the dashboard follows
        d.phases._on_poll(d.phases, {"poll": 1}, [])
        assert d.tabs.titles[d.tabs.selected_index] == "Memory"
        assert d.phases.view["current"] == "COMPILED"
        names = {a["name"]: a["enabled"] for a in d.phases.view["actions"]}
        assert names == {"plan": False, "lock_memory": False, "compile": False, "reset": True}
        d.select("Training")
        d.monitor.run(1)  # a run from the widget ends: the tab stays
        assert d.tabs.titles[d.tabs.selected_index] == "Training"
        reset = next(a for a in d.phases.view["actions"] if a["name"] == "reset")
        assert "trained weights" in reset["confirm"] and "1 epoch" in reset["confirm"]
    finally:
        d.close()


def test_monitor_tells_the_first_steps_compile_time_apart() -> None:
    """The epoch records the monitor receives say how long a run's first step took (it compiles or loads the
    kernels): part of its epoch's seconds, zero in the epochs after it and again in a resumed run's first."""
    task = mlp(epochs=3)
    mon = TrainingMonitor(task)
    task.run(2, callbacks=[mon], progress=False)
    task.run(callbacks=[mon], progress=False)
    recs = mon.records
    assert [r["epoch"] for r in recs] == [1, 2, 3]
    assert 0 < recs[0]["first_step_seconds"] < recs[0]["seconds"] and recs[1]["first_step_seconds"] == 0.0
    assert 0 < recs[2]["first_step_seconds"] < recs[2]["seconds"]  # run() again: its first step is timed apart
    assert json.loads(json.dumps(recs)) == recs


def test_the_epoch_line_tells_a_slow_first_step_apart() -> None:
    """The CLI's and the progress bar's epoch line says how long the kernels took to compile or load
    (#28: the compile time shown apart from training); a fast first step adds nothing."""
    from renaissance_nb.result import FIRST_STEP_SHOWN_S, EpochRecord
    rec = EpochRecord(1, 0.5, 0.9, 1.0, None, None, None, 1e-3, 12.4, 32, first_step_seconds=9.8)
    assert rec.line().endswith("12.40s  (first step 9.8s: kernels compiled or loaded)")
    quick = EpochRecord(1, 0.5, 0.9, 1.0, None, None, None, 1e-3, 0.4, 32, first_step_seconds=FIRST_STEP_SHOWN_S / 2)
    assert quick.line().endswith("0.40s")


class _Handle:
    """What IPython's display() returns for a static copy: the bundles put into it are kept here."""

    def __init__(self) -> None:
        self.bundles: list[dict] = []

    def update(self, bundle: dict, raw: bool = False) -> None:
        self.bundles.append(bundle)


def poll(widget) -> None:  # type: ignore[no-untyped-def]
    widget._on_poll(widget, {"poll": 1}, [])  # what the front end sends every 1.5 s while the view is shown


def test_blueprint_and_variants_views_follow_their_task() -> None:
    """Shown alone, both views poll like the others: the VariantsView made in PLANNING shows the six
    variants' shapes once plan() has run, the BluePrintView a model changed before plan() and then the
    executable layers; reset() takes them back; the static copies in the notebook follow."""
    from renaissance_nb.display import BluePrintView, VariantsView

    t = mlp()
    bp, var = BluePrintView(t), VariantsView(t)
    copies = {id(w): _Handle() for w in (bp, var)}
    for w in (bp, var):
        w._shown.append(copies[id(w)])
    assert "derived by plan()" in var.view["html"] and "fc(16, bias=True)" in bp.view["html"]
    before = bp.view
    poll(bp)
    assert bp.view is before and not copies[id(bp)].bundles, "nothing changed: nothing re-read"
    t.model(seq(fc(12), relu(), fc(3)))
    poll(bp)
    assert "fc(12, bias=True)" in bp.view["html"] and "fc(16" not in bp.view["html"]
    assert "fc(12, bias=True)" in copies[id(bp)].bundles[-1]["text/html"]
    t.plan()
    for w in (bp, var):
        poll(w)
    assert "executable layers" in repr(bp)
    assert "train_base" in var.view["html"] and "(64, 20)" in var.view["html"] and "6 variants" in repr(var)
    assert "(64, 20)" in copies[id(var)].bundles[-1]["text/html"] and "same offsets" not in var.view["html"]
    t.compile()  # the plans and the atlas: offsets compared, ShapeIds given
    poll(var)
    assert "same offsets in every variant" in var.view["html"] and ">s1<" in var.view["html"]
    t.reset()
    for w in (bp, var):
        poll(w)
    assert "derived by plan()" in var.view["html"] and "plan() turns" in repr(bp)

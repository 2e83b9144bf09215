"""MemoryInspectorView's data (display/inspector_data.py) against the engine it reads, and the tensor
statistics (inspector/tensorstats.py) against NumPy on the arena's values and against weights captured
before and after one real training step."""
from __future__ import annotations

import json

import numpy as np
import pytest

from renaissance_nb import (SGD, Adam, AdamW, DeepLearningTask, NumericalError, PhaseError, PlanError, datasets, fc,
                            flatten, relu, seq)
from renaissance_nb.blueprint import bn, conv, maxpool
from renaissance_nb.train.schedulers import ExponentialLR, LinearLR
from renaissance_nb.compiler.touches import node_access
from renaissance_nb.inspector.tensorstats import is_parameter, tensor_stats, value_stats

pytest.importorskip("anywidget")
from renaissance_nb.display import MemoryInspectorView, inspector_static  # noqa: E402
from renaissance_nb.display import inspector_data as data  # noqa: E402

rng = np.random.default_rng(0)
X = rng.standard_normal((300, 20)).astype(np.float32)
Y = (np.arange(300) % 3).astype(np.int32)
IMG = rng.standard_normal((96, 3, 16, 16)).astype(np.float32), (np.arange(96) % 4).astype(np.int32)


def mlp(batch: int = 64, **opts) -> DeepLearningTask:  # type: ignore[no-untyped-def]
    return (DeepLearningTask("insp").model(seq(fc(16), relu(), fc(3)))
            .data(datasets.from_arrays((X, Y), (X[:60], Y[:60])), batch_size=batch).total_epochs(1).seed(1)
            .options(**opts))


def convnet() -> DeepLearningTask:
    """Image data, batch norm, an EMA and gradient clipping: every region-wide op of the step."""
    model = seq(conv(8, 3, 1, 1, bias=True), relu(), maxpool(2), conv(16, 3, 1, 1), bn(), relu(), flatten(), fc(4))
    return (DeepLearningTask("conv").model(model).data(datasets.from_arrays(IMG, (IMG[0][:32], IMG[1][:32])),
                                                       batch_size=24).ema(0.99).clip_grad_norm(1.0).seed(0))


@pytest.fixture(scope="module")
def planned():  # type: ignore[no-untyped-def]
    out = {}
    for name, task in (("mlp", mlp().lock_memory()), ("conv", convnet().lock_memory())):
        out[name] = (task.memory_inspector, data.inspector_view(task))
    return out


@pytest.mark.parametrize("which", ["mlp", "conv"])
def test_the_live_set_the_widget_draws_is_the_engines_at_every_tick(planned, which) -> None:
    insp, view = planned[which]
    assert view["ready"] and [k["t"] for k in view["ticks"]] == [k.time for k in insp.ticks()]
    by_id = {t["id"]: t for t in view["tensors"]}
    for vi, variant in enumerate(view["variants"]):
        curve = insp.live_bytes(variant)
        assert view["curves"][variant] == [int(x) for x in curve]
        for k in view["ticks"]:
            ids = data.live_ids(view, k["t"])
            assert {by_id[i]["name"] for i in ids} == {t.name for t in insp.live_at(k["t"], variant)}
            assert sum(by_id[i]["storage"][vi] for i in ids) == curve[k["t"]]


def test_region_wide_ops_read_and_write_their_whole_ranges(planned) -> None:
    insp, view = planned["conv"]
    plan = insp.plan()
    names = {t.id: t.name for t in plan}
    fam = {t.id: t.region.family for t in plan}
    for k, tick in zip(view["ticks"], insp.ticks()):
        reads, writes = node_access(tick.node, plan)
        assert (k["reads"], k["writes"]) == (sorted(reads), sorted(writes))
    ops = {k["op"]: k for k in view["ticks"]}
    assert set(ops) >= {"optimizer", "nan_check", "clip_grad_norm", "ema_update"}
    params = [t.id for t in plan if is_parameter(plan, t.name)]  # W_EQ_* (BN folded for inference) lie outside
    assert params and all(i in ops["optimizer"]["reads"] and i in ops["optimizer"]["writes"] for i in params)
    grads = {i for i in fam if fam[i] == "G" and plan[names[i]].slot_bytes}
    assert grads <= set(ops["optimizer"]["reads"]) and not grads & set(ops["optimizer"]["writes"])
    assert grads <= set(ops["nan_check"]["reads"]) and grads <= set(ops["clip_grad_norm"]["writes"])
    ema = {i for i in fam if fam[i] == "E" and names[i].split("@")[0] in {names[p] for p in params}}
    assert ema and ema <= set(ops["ema_update"]["writes"]) and set(params) <= set(ops["ema_update"]["reads"])
    assert ops["optimizer"]["ranges_written"] == ["W_BN_BIAS…W_DEEP_CONV", "M_BN_BIAS…M_DEEP_CONV",
                                                  "V_BN_BIAS…V_DEEP_CONV"]


@pytest.mark.parametrize("which", ["mlp", "conv"])
def test_the_peak_of_every_variant_is_the_engines(planned, which) -> None:
    insp, view = planned[which]
    by_id = {t["id"]: t for t in view["tensors"]}
    for variant in view["variants"]:
        rep, p = insp.peak(variant), view["peaks"][variant]
        assert (p["bytes"], p["time"], p["op"], p["layer"]) == (rep.peak_bytes, rep.time, rep.op, rep.layer)
        assert {c["category"]: c["bytes"] for c in p["by_category"]} == rep.by_category
        assert sum(c["bytes"] for c in p["by_category"]) == p["bytes"]
        assert [(by_id[i]["name"], n) for i, n in p["tensors"]] == [(t.name, t.nbytes) for t in rep.top(10_000)]
        assert [by_id[i]["producer"] for i, _ in p["tensors"]] == [t.producer for t in rep.top(10_000)]


@pytest.mark.parametrize("asked, changes", [
    ({"liveness": False}, {"liveness": False}), ({"pad_rows": False}, {"pad_rows": False}),
    ({"fuse": False}, {"fuse": False}), ({"optimizer": "sgd"}, {"optimizer": "sgd"}), ({"ema": True}, {"ema": 0.999}),
    ({"batch_size": 128, "optimizer": "adam"}, {"batch_size": 128, "val_batch_size": 128, "optimizer": "adam"})])
def test_a_what_if_is_the_engines_plan_and_diff(planned, asked, changes) -> None:
    insp, _ = planned["mlp"]
    r = data.whatif_view(insp, asked)
    other = insp.what_if(**changes)
    d = insp.diff(other)
    assert r["arena"] == [insp.arena_bytes, other.arena_bytes] and r["summary"] == d.summary()
    assert r["peak"] == [insp.peak().peak_bytes, other.peak().peak_bytes]
    assert {c["category"]: (c["a"], c["b"]) for c in r["categories"]} == d.categories
    assert {g["region"]: (g["a"], g["b"]) for g in r["grew"]} == d.grew
    assert {g["region"]: (g["a"], g["b"]) for g in r["shrank"]} == d.shrank
    assert {m["name"]: (m["a"], m["b"]) for m in r["moved"]} == d.moved and r["n_moved"] == len(d.moved)
    json.dumps(r, allow_nan=False)


def test_a_what_if_of_the_current_values_plans_nothing_and_bad_values_say_why(planned) -> None:
    insp, view = planned["mlp"]
    assert data.whatif_view(insp, dict(view["settings"]))["empty"]
    assert "batch_size" in data.whatif_view(insp, {"batch_size": 0})["error"]
    assert "optimizer" in data.whatif_view(insp, {"optimizer": "lion"})["error"]
    assert "resolution" in data.whatif_view(insp, {"resolution": [8, 8]})["error"]  # not an image model


def test_resolution_and_the_largest_batch(planned) -> None:
    insp, view = planned["conv"]
    assert view["settings"]["image"] and view["settings"]["resolution"] == [16, 16]
    r = data.whatif_view(insp, {"resolution": [8, 8]})
    assert r["arena"][1] == insp.what_if(resolution=(8, 8)).arena_bytes < insp.arena_bytes
    for budget in (insp.arena_bytes, 3 * insp.arena_bytes):
        f = data.fit_view(insp, budget)
        assert f["batch"] == insp.fit(budget)
        assert f["arena"] <= budget and (f["next_arena"] is None or f["next_arena"] > budget)
    assert "even batch 1" in data.fit_view(insp, 1024)["error"]


def test_value_stats_count_nan_and_inf_apart() -> None:
    x = np.array([1.0, np.nan, -2.0, np.inf, 3.5, -np.inf, 0.25], np.float32)
    s = value_stats(x, bins=5)
    good = x[np.isfinite(x)].astype(np.float64)
    assert (s.size, s.finite, s.nan, s.inf) == (7, 4, 1, 2)
    assert (s.min, s.max, s.mean, s.std) == (good.min(), good.max(), good.mean(), good.std())
    assert list(s.counts) == list(np.histogram(good, bins=5)[0]) and sum(s.counts) == s.finite
    assert value_stats(np.full(3, np.nan)).counts == () and value_stats(np.full(3, np.nan)).min is None


def test_float64_values_too_close_or_too_far_apart_for_numpys_bins_still_get_a_histogram() -> None:
    """numpy.histogram refuses 30 bins over values a few ulps apart and over a range that overflows
    float64 ("Too many bins for data range"); the plan holds float64 tensors (metrics.sum, partial sums)."""
    ulps = np.array([1.0, np.nextafter(1.0, 2.0), np.nextafter(np.nextafter(1.0, 2.0), 2.0)])
    with pytest.raises(ValueError, match="Too many bins"):
        np.histogram(ulps, bins=30)
    s = value_stats(ulps)
    assert s.counts == (3,) and s.edges == (1.0, ulps[2]) and (s.min, s.max) == (1.0, ulps[2])
    wide = np.array([-1.7e308, 0.0, 1.7e308, 1.0, 1.0])
    with pytest.raises(ValueError, match="Too many bins"), np.errstate(over="ignore", invalid="ignore"):
        np.histogram(wide, bins=30)
    s = value_stats(wide, bins=4)
    assert s.counts == (1, 0, 3, 1) and s.edges == pytest.approx((-1.7e308, -0.85e308, 0.0, 0.85e308, 1.7e308))
    assert s.mean == pytest.approx(0.4) and s.std == pytest.approx(np.std(wide / 1.7e308) * 1.7e308)
    task = mlp().compile()  # through the public call: a float64 tensor of the arena written so
    task.write("metrics.sum", ulps[[0, 1, 2, 2]])
    assert tensor_stats(task, "metrics.sum").values.counts == (4,)
    task.write("metrics.sum", wide[:4])
    got = tensor_stats(task, "metrics.sum").values
    assert sum(got.counts) == 4 and len(got.edges) == 31 and all(np.isfinite(got.edges))
    w = MemoryInspectorView(task, selected="metrics.sum")
    assert list(w.tensor["stats"]["counts"]) == list(got.counts) and json.dumps(w.tensor, allow_nan=False)


def test_tensor_stats_are_numpys_on_the_arenas_values() -> None:
    task = mlp()
    with pytest.raises(PhaseError):
        tensor_stats(task, "fc1.weight")
    task.run(progress=False)
    for name in ("fc1.weight", "fc1.out", "fc2.bias@grad", "labels", "step"):
        x = task.read(name).astype(np.float64)
        s = tensor_stats(task, name)
        assert s.shape == x.shape and s.values.size == x.size == sum(s.values.counts)
        assert (s.values.min, s.values.max) == (x.min(), x.max())
        assert s.values.mean == pytest.approx(x.mean(), rel=1e-12, abs=1e-15)
        assert s.values.std == pytest.approx(x.std(), rel=1e-12, abs=1e-15)
        assert list(s.values.counts) == list(np.histogram(x, bins=30)[0])
        assert (s.update is None) == (name != "fc1.weight")
    g = tensor_stats(task, "fc1.weight").update
    assert g.step == task.total_steps and g.grad_norm == pytest.approx(np.linalg.norm(task.read("fc1.weight@grad")))
    with pytest.raises(PlanError, match="fc9.weight"):
        tensor_stats(task, "fc9.weight")


UPDATE_CASES = {  # optimizer, schedule (per epoch: one step each), clip max_norm, the lr of step 3
    "adamw": (AdamW().lr(1e-2), None, None, 1e-2),
    "adam_l2": (Adam().lr(1e-2).weight_decay(0.1), None, None, 1e-2),
    "adam_maximize": (Adam().lr(1e-2).maximize(), None, None, 1e-2),
    "sgd": (SGD().lr(0.1), None, None, 0.1),
    "sgd_maximize": (SGD().lr(0.1).maximize(), None, None, 0.1),
    "sgd_momentum": (SGD().lr(0.1).momentum(0.9), None, None, 0.1),
    "sgd_dampening": (SGD().lr(0.1).momentum(0.9).dampening(0.5), None, None, 0.1),
    "sgd_wd": (SGD().lr(0.1).weight_decay(0.05), None, None, 0.1),
    "sgd_nesterov": (SGD().lr(0.1).momentum(0.9).nesterov(), None, None, 0.1),
    "sgd_nesterov_wd_maximize": (SGD().lr(0.1).momentum(0.9).nesterov().weight_decay(0.05).maximize(), None, None, 0.1),
    "adamw_linear_lr": (AdamW().lr(1e-2), LinearLR().start_factor(1.0).end_factor(0.1).total_iters(4), None,
                        1e-2 * (1 - 0.9 * 2 / 4)),
    "sgd_wd_exponential_lr": (SGD().lr(0.1).weight_decay(0.05), ExponentialLR().gamma(0.5), None, 0.1 * 0.5 ** 2),
    "sgd_clipped": (SGD().lr(0.1), None, 1e-3, 0.1),
    "adam_clipped_exponential_lr": (Adam().lr(1e-2), ExponentialLR().gamma(0.5), 0.05, 1e-2 * 0.5 ** 2),
}


@pytest.mark.parametrize("case", list(UPDATE_CASES))
def test_the_update_ratio_is_the_change_one_real_step_made(case) -> None:  # type: ignore[no-untyped-def]
    """One sample batch per epoch: run(2) then run(1) is exactly one more step, the third; W is read before and
    after it. A schedule changes the rate every epoch, so an lr_table read one step off gives another lr."""
    opt, sched, clip, lr = UPDATE_CASES[case]
    task = (DeepLearningTask("one").model(seq(fc(16), relu(), fc(3))).data(train=(X[:32], Y[:32]), batch_size=32)
            .optimizer(opt).scheduler(sched).clip_grad_norm(clip).total_epochs(4).seed(1))
    task.compile()
    first = tensor_stats(task, "fc1.weight").update
    assert first.step == 0 and first.ratio is None
    task.run(2, progress=False)
    before = task.read("fc1.weight").astype(np.float64)
    task.run(1, progress=False)
    after = task.read("fc1.weight").astype(np.float64)
    u = tensor_stats(task, "fc1.weight").update
    assert u.step == 3 and u.lr == pytest.approx(lr, rel=1e-6)
    assert u.update_norm == pytest.approx(np.linalg.norm(after - before), rel=1e-6)
    assert u.ratio == pytest.approx(np.linalg.norm(after - before) / np.linalg.norm(after), rel=1e-6)
    assert u.changed == int((after != before).sum())
    assert u.grad_norm == pytest.approx(np.linalg.norm(task.read("fc1.weight@grad").astype(np.float64)), rel=1e-12)
    if clip is None:
        assert u.clip_norm is None and u.clip_factor is None
    else:  # G as the update used it, scaled by the clip; clip.norm holds the whole gradient's norm before
        norm, factor = task.read("clip.norm")
        assert (u.clip_norm, u.clip_factor) == (float(norm), float(factor)) and factor < 1 and norm > clip
        grads = [t.name for t in task.memory if t.name.endswith("@grad") and is_parameter(task.memory, t.name[:-5])]
        assert np.sqrt(sum(np.sum(np.square(task.read(g).astype(np.float64))) for g in grads)) == pytest.approx(
            clip, rel=1e-5)
        html = MemoryInspectorView(task, selected="fc1.weight").static_html()
        assert (f"gradient norm {u.grad_norm:.4g} after clipping (×{u.clip_factor:.4g}; "
                f"{u.grad_norm / u.clip_factor:.4g} before, all gradients {u.clip_norm:.4g} before)") in html


@pytest.mark.parametrize("opt", [SGD().lr(1e-9), Adam().lr(1e-10)], ids=["sgd", "adam"])
def test_updates_below_float32_resolution_report_the_change_the_step_made(opt) -> None:  # type: ignore[no-untyped-def]
    """Most of these updates are below half a float32 step of their weight: they change nothing, and |dW|
    is the change the arena holds (a few weights moved by one ulp), not the update the formula asked for."""
    task = (DeepLearningTask("tiny").model(seq(fc(16), relu(), fc(3))).data(train=(X[:16], Y[:16]), batch_size=16)
            .optimizer(opt).total_epochs(3).seed(1)).compile()
    task.run(1, progress=False)
    before = task.read("fc1.weight")
    task.run(1, progress=False)
    after = task.read("fc1.weight")
    u = tensor_stats(task, "fc1.weight").update
    real = np.linalg.norm(after.astype(np.float64) - before)
    assert 0 < u.changed == int((after != before).sum()) < u.size // 10 and u.size == after.size
    assert u.update_norm == pytest.approx(real, rel=1e-12) and u.intended_norm > 3 * real
    assert f"{u.changed:,} of {u.size:,} weights changed" in u.how


def test_after_a_skipped_step_the_last_update_is_unknown() -> None:
    """fc2.bias set to ±3.4e38: the loss overflows to Inf while every gradient stays finite, so the NaN check
    skips the step (nan_policy='skip') and G holds a gradient no update used; once the bias is put back, the
    next step's update is derived again and matches the weights read around it."""
    task = (DeepLearningTask("skip").model(seq(fc(16), relu(), fc(3))).data(train=(X[:32], Y[:32]), batch_size=32)
            .optimizer(SGD().lr(0.1)).options(nan_policy="skip").total_epochs(4).seed(3)).compile()
    task.run(1, progress=False)
    bias, w = task.read("fc2.bias"), task.read("fc1.weight")
    task.write("fc2.bias", np.array([3.4e38, -3.4e38, -3.4e38], np.float32))
    with np.errstate(invalid="ignore"):  # the check's own inf - inf
        task.run(1, progress=False)
    assert (task.skipped_updates, int(task.read("step")[0])) == (1, 1) and np.array_equal(task.read("fc1.weight"), w)
    assert np.isfinite(task.read("fc1.weight@grad")).all()  # this parameter's G alone does not tell
    u = tensor_stats(task, "fc1.weight").update
    assert u.update_norm is None and u.ratio is None and u.how.startswith("unknown: the last step was skipped")
    task.write("fc2.bias", bias)
    task.run(1, progress=False)
    u = tensor_stats(task, "fc1.weight").update
    assert u.step == 2 and u.update_norm == pytest.approx(np.linalg.norm(task.read("fc1.weight") - w.astype(np.float64)))
    stopped = (DeepLearningTask("stop").model(seq(fc(16), relu(), fc(3))).data(train=(X[:32], Y[:32]), batch_size=32)
               .optimizer(SGD().lr(0.1)).total_epochs(2).seed(3)).compile()
    stopped.run(1, progress=False)
    w2 = stopped.read("fc2.weight")
    w2[0, 0] = np.inf  # logits Inf, every gradient NaN: the check stops the step (nan_policy='raise')
    stopped.write("fc2.weight", w2)
    with pytest.raises(NumericalError), np.errstate(invalid="ignore"):
        stopped.run(1, progress=False)
    assert tensor_stats(stopped, "fc1.weight").update.how.startswith("unknown: the last step was stopped")


def test_the_widget_answers_its_picks_and_follows_its_task() -> None:
    task = mlp()
    w = MemoryInspectorView(task, selected="fc1.weight", what_if={"liveness": False})
    insp = task.memory_inspector
    assert w.tick == insp.peak().time and w.variant == "train_base"
    assert w.whatif_result["arena"][1] == insp.what_if(liveness=False).arena_bytes
    assert w.tensor["name"] == "fc1.weight" and w.tensor["stats"] is None and "compile()" in w.tensor["note"]
    times = {k.time for k in insp.ticks()}
    gap = min(t for t in range(max(times)) if t not in times)  # between two programs: the nearest node
    w.tick = gap
    assert w.tick == gap - 1 and w.at_tick()["op"] == insp.ticks()[gap - 1].node.op
    w.variant = "nonsense"
    assert w.variant == "train_base"
    w.fit_budget = 2 * insp.arena_bytes
    assert w.fit_result["batch"] == insp.what_if(liveness=False).fit(2 * insp.arena_bytes)
    w.what_if = {}
    assert w.whatif_result == {} and w.fit_result["batch"] == insp.fit(2 * insp.arena_bytes)
    task.run(progress=False)
    assert w.stale()
    w.refresh()
    assert w.tensor["stats"]["min"] == float(task.read("fc1.weight").min())
    assert w.tensor["stats"]["update"]["step"] == task.total_steps
    html = w.static_html()
    assert "fc1.weight" in html and "update ratio" in html and f"tick {w.tick}" in html
    assert "peak" in repr(w) and json.dumps(w.view, allow_nan=False)
    w.selected = "nope"
    assert "nope" in w.tensor["error"]


def test_a_task_without_data_says_why() -> None:
    w = MemoryInspectorView(DeepLearningTask("empty").model(seq(fc(4))))
    assert not w.view["ready"] and "No plan to inspect yet" in w.view["reason"]
    assert w.view["reason"] in inspector_static.inspector_html(w.view, w.state())


@pytest.mark.parametrize("opts", [{"nan_check": False}, {"nan_policy": "skip"}], ids=["diverged", "skipped"])
def test_a_diverged_or_skipped_step_is_drawn_with_dashes(opts) -> None:  # type: ignore[no-untyped-def]
    """Inputs of 1e18 and a learning rate of 1e20: the gradient (and, unchecked, the weights) hold NaN/Inf,
    which the view sends as None; the static copy prints a dash for them instead of raising."""
    task = (DeepLearningTask("nan").model(seq(fc(16), relu(), fc(3))).data(train=(X[:64] * 1e18, Y[:64]), batch_size=16)
            .optimizer(SGD().lr(1e20)).total_epochs(1).seed(1).options(**opts))
    task.run(progress=False)
    w = MemoryInspectorView(task, selected="fc1.weight")
    u = w.tensor["stats"]["update"]
    assert None in (u["grad_norm"], u["weight_norm"]) and u["update_norm"] is None and u["ratio"] is None
    assert ("NaN/Inf: training diverged" in u["how"]) if "nan_check" in opts else u["how"].startswith("unknown: the last")
    html = w.static_html()
    assert "gradient norm —" in html or "|W| —" in html
    assert "update ratio |dW|/|W| —" in html and json.dumps(w.tensor, allow_nan=False)


@pytest.mark.parametrize("which", ["mlp", "conv"])
def test_a_tensors_readers_writers_and_byte_partners_are_the_plans(planned, which) -> None:
    """tensor_view's lists, looked up once per view (views.accesses, sharing.share_partners), against the
    ticks' own lists and MemoryPlan.shared_bytes for every tensor."""
    insp, view = planned[which]
    index = data.TensorIndex(insp)
    pairs = insp.plan().shared_bytes()
    for row in view["tensors"]:
        tv = data.tensor_view(None, insp, view, row["name"], index)
        assert tv["reads_at"] == [k["t"] for k in view["ticks"] if row["id"] in k["reads"]]
        assert tv["writes_at"] == [k["t"] for k in view["ticks"] if row["id"] in k["writes"]]
        assert tv["shares"] == sorted({(b if a.name == row["name"] else a).name for a, b, _ in pairs
                                       if row["name"] in (a.name, b.name)})
    lo, hi = view["focus_range"]
    reusable = [t for t in insp.plan() if t.region.reusable]
    assert (lo, hi) == (min(t.offset for t in reusable), max(t.offset + t.slot_bytes for t in reusable))


def test_a_stats_error_and_the_reusable_slot_note_are_both_kept(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    task = mlp().compile()

    def refuse(_task, name):  # type: ignore[no-untyped-def]
        raise PlanError(f"tensor_stats: cannot read {name}")

    monkeypatch.setattr(data, "tensor_stats", refuse)
    w = MemoryInspectorView(task, selected="fc1.out")
    assert "cannot read fc1.out" in w.tensor["note"] and "A reusable slot" in w.tensor["note"]


def test_the_what_if_is_shown_for_the_widgets_variant() -> None:
    task = mlp(batch=50)  # 300 samples: a last batch of its own, a variant of other sizes
    w = MemoryInspectorView(task, what_if={"liveness": False})
    insp, other = task.memory_inspector, task.memory_inspector.what_if(liveness=False)
    assert w.whatif_result["variant"] == "train_base"
    assert w.whatif_result["peak"] == [insp.peak().peak_bytes, other.peak().peak_bytes]
    small = next(v for v in insp.variants if insp.peak(v).peak_bytes != insp.peak().peak_bytes)
    w.variant = small
    assert w.whatif_result["variant"] == small
    assert w.whatif_result["peak"] == [insp.peak(small).peak_bytes, other.peak(small).peak_bytes]
    assert w.whatif_result["summary"] == insp.diff(other, small).summary()
    assert f"<b>peak ({small})</b>" in w.static_html()


class _Handle:
    """What IPython's display() returns for a static copy: the bundles put into it are kept here."""

    def __init__(self) -> None:
        self.bundles: list[dict] = []

    def update(self, bundle: dict, raw: bool = False) -> None:
        self.bundles.append(bundle)


def test_a_scrub_in_the_browser_updates_the_static_copy_once_and_the_last_tick_at_the_next_poll() -> None:
    task = mlp()
    w = MemoryInspectorView(task)
    w.COPY_EVERY = 60.0  # one copy a minute at most, whatever this machine's speed
    copies = _Handle()
    w._shown.append(copies)
    times = [k["t"] for k in w.view["ticks"]]
    for t in times[:10]:  # ten arrow keys: ten picks from the browser
        w.set_state({"tick": t})
    assert w.tick == times[9] and not copies.bundles
    w._on_poll(w, {"poll": 1}, [])  # what the front end sends every 1.5 s while the view is shown
    assert len(copies.bundles) == 1 and f"tick {times[9]} " in copies.bundles[-1]["text/html"]
    w._on_poll(w, {"poll": 1}, [])
    assert len(copies.bundles) == 1  # nothing new: nothing written
    w.tick = times[3]  # a pick made in code: written at once
    assert len(copies.bundles) == 2 and f"tick {times[3]} " in copies.bundles[-1]["text/html"]
    w.set_state({"selected": "fc1.weight"})
    assert len(copies.bundles) == 2
    w.COPY_EVERY = 0.0
    w.set_state({"selected": "fc2.weight"})  # the last copy old enough: written at once
    assert len(copies.bundles) == 3 and "Tensor · fc2.weight" in copies.bundles[-1]["text/html"]

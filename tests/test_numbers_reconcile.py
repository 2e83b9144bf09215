"""The views' numbers agree with one another and with the plan (issue 36): the region map and the lifetimes
count a family's bytes the same way and say where the tensors' slots add up to more; the optimizer's range
operands name only the regions the model has; the monitor tells the step within an epoch, the rate and
the time left."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")

from renaissance_nb import DeepLearningTask, datasets, fc, relu, seq  # noqa: E402
from renaissance_nb.display import TrainingMonitor, views  # noqa: E402
from renaissance_nb.display.access import range_operands  # noqa: E402

rng = np.random.default_rng(0)
X = rng.standard_normal((512, 24)).astype(np.float32)
Y = (np.arange(512) % 4).astype(np.int32)


def task(epochs: int = 3) -> DeepLearningTask:
    return (DeepLearningTask("n").model(seq(fc(32), relu(), fc(32), relu(), fc(4)))
            .data(datasets.from_arrays((X, Y), (X[:64], Y[:64])), batch_size=64).total_epochs(epochs).seed(0))


def test_region_map_and_lifetimes_count_a_family_alike() -> None:
    t = task().lock_memory()
    regions, life = views.region_view(t), views.lifetime_view(t)
    in_map = {f["family"]: f["bytes"] for f in regions["families"]}
    assert sum(in_map.values()) == t.memory.total_bytes
    packed = 0
    for f in life["families"]:
        assert f["bytes"] == in_map[f["family"]], f["family"]
        slots = sum(x["slot_bytes"] for x in life["tensors"] if x["family"] == f["family"])
        assert f["slots"] == slots
        if slots > f["bytes"]:  # liveness reuse packed this family: the note says by how much
            packed += 1
            assert f["note"].startswith("its tensors' slots add up to") and f["human"] in f["note"]
        else:
            assert f["note"] == ""
    assert packed >= 1  # the feature maps share bytes in this plan
    for r in regions["regions"]:  # the region map's "(−n reused)": only where liveness packed the slots
        slots = sum(x["slot_bytes"] for x in regions["tensors"] if x["region"] == r["region"])
        assert slots <= r["size_without_reuse"] == r["size"] + r["saved"]
        assert r["saved"] == 0 or (r["reusable"] and slots > r["size"]), r["region"]


def test_the_optimizer_names_only_the_regions_the_model_has() -> None:
    t = task().lock_memory()
    plan = t.plans["train_base"]
    node = next(n for gid, nodes in t.graphs.train.buckets.items() for n in nodes if n.op == "optimizer")
    reads, writes = range_operands(node, plan)
    have = {x.region.name for x in plan}
    for op in reads + writes:
        named = [s.strip() for s in op["span"].replace("…", ",").split("(")[0].split(",") if s.strip()]
        assert named and set(named) <= have, (op["span"], sorted(have))
    assert any(op["span"] == "W_FC_BIAS, W_FC_WEIGHT" for op in reads), [op["span"] for op in reads]


def test_the_monitor_tells_the_step_within_an_epoch_the_rate_and_the_time_left() -> None:
    t = task(epochs=4).compile()
    mon = TrainingMonitor(t)
    spe = t.steps_per_epoch
    mon("start", {"epoch": 0, "total_epochs": 4})
    first = mon.step_progress(3, now=100.0)
    assert first["steps_per_s"] is None and first["seconds_left"] is None
    p = mon.step_progress(spe + 3, now=102.0)  # spe steps in 2 s, in the second epoch
    assert p["epoch"] == 2 and p["step_in_epoch"] == 3 and p["steps_per_epoch"] == spe
    assert p["total_steps"] == 4 * spe
    assert p["steps_per_s"] == pytest.approx(spe / 2.0)
    assert p["seconds_left"] == pytest.approx((4 * spe - spe - 3) / (spe / 2.0))
    mon("end", None)
    assert mon.progress == {}

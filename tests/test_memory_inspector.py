"""The memory inspector (renaissance_nb/inspector): zero hidden allocations per step, every byte in
the plan, the peak and its live tensors, what-if plans and diffs, and the largest batch that fits."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from renaissance_nb import AdamW, DeepLearningTask, PlanError, fc, flatten, relu, seq
from renaissance_nb.blueprint import RESNET_3_3, block, bn, cbr, conv, gap, maxpool
from renaissance_nb.errors import ConfigError
from renaissance_nb.inspector import CATEGORIES, MemoryInspector

MODELS = """
import numpy as np
from renaissance_nb import AdamW, DeepLearningTask, fc, flatten, relu, seq
from renaissance_nb.blueprint import RESNET_3_3, block, bn, cbr, conv, gap, maxpool

def make(which, n=None, batch_size=None):
    rng = np.random.default_rng(0)
    if which == "mlp":  # the seed MLP
        n = n or 1280
        data = rng.standard_normal((n, 784)).astype(np.float32), rng.integers(0, 10, n)
        model, batch = seq(fc(1024), relu(), fc(512), relu(), fc(256), relu(), fc(10)), 128
    else:
        n = n or 320
        data = rng.standard_normal((n, 3, 16, 16)).astype(np.float32), rng.integers(0, 4, n)
        batch = 32
        if which == "conv":
            model = seq(conv(8, 3, 1, 1, bias=True), relu(), maxpool(2), conv(16, 3, 1, 1), bn(), relu(), flatten(),
                        fc(4))
        else:  # a ResNet block net
            model = seq(cbr(8, 3, 1, 1), block(8, RESNET_3_3), gap(), fc(4))
    return (DeepLearningTask().model(model).data(train=data, batch_size=batch_size or batch).optimizer(AdamW())
            .total_epochs(1).seed(0))
"""
exec(MODELS)  # make() for the in-process tests too


AUDIT = MODELS + """
import json, sys
from renaissance_nb.inspector.allocations import audit_allocations
out = {}
for which in sys.argv[1:]:
    task = make(which)
    task.compile()
    r = audit_allocations(task.runner, steps=100)
    out[which] = dict(steps=r.steps, allocs=r.nrt_allocs, frees=r.nrt_frees, args=r.array_arguments,
                      growth=r.python_growth, per_kernel=r.per_kernel)
print("RESULT" + json.dumps(out))
"""


def test_a_training_step_allocates_nothing_but_numbas_argument_records(tmp_path) -> None:
    """100 steps after a warm-up, with numba's NRT statistics on from its start (a subprocess):
    Python's traced memory (NRT's buffers included) does not grow, NRT holds nothing at the end,
    and every NRT allocation is the record numba makes for an array argument of a Python call
    (counted by wrapping the kernels' numba functions): no kernel allocates a buffer."""
    script = tmp_path / "audit.py"
    script.write_text(AUDIT)
    env = {**os.environ, "NUMBA_NRT_STATS": "1"}
    run = subprocess.run([sys.executable, str(script), "mlp", "conv", "resnet"], capture_output=True, text=True,
                         env=env, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.split("RESULT", 1)[1])
    for which, r in result.items():
        assert r["steps"] >= 100, which
        assert r["growth"] == 0, (which, r)
        assert r["allocs"] == r["frees"], (which, r)
        assert r["allocs"] == r["args"] > 0, (which, r)  # the documented residual, exactly
        assert r["allocs"] % r["steps"] == 0, (which, r)  # the same count every step
    # the batch-norm kernels' per-call np.zeros are gone: bn_fwd hands numba 11 arrays, nothing more
    bn_calls = result["conv"]["steps"] // 10  # one bn layer; per_kernel counts one 10-step pass
    assert result["conv"]["per_kernel"]["bn_fwd.<lambda>"] == 11 * bn_calls


@pytest.mark.parametrize("which", ["mlp", "conv", "resnet"])
def test_every_byte_is_in_the_region_map_and_no_kernel_holds_memory_outside_it(which: str) -> None:
    task = make(which)
    task.compile()
    plan = task.compiled.plan
    spans = sorted(plan.regions.values(), key=lambda s: s.base)
    assert sum(s.size for s in spans) == task.runner.arena.nbytes == plan.total_bytes
    assert all(a.end == b.base for a, b in zip(spans, spans[1:]))  # no bytes between regions
    assert task.runner.bind_buffers() == []
    assert task.memory_inspector.plan() is task.locked.plans["train_base"]
    # the kernels' scratch is named arena tensors in the temporaries region
    names = {t.name for t in plan}
    assert "nan.partials" in names
    if which != "mlp":
        assert {"bn1.stat_sums", "bn1.affine", "bn1.grad_sums", "bn1.grad_coef", "conv2.dw_partials"} <= names


def test_a_hand_built_node_without_scratch_lists_its_buffers() -> None:
    from renaissance_nb.kernels.cpu import KERNELS, BindEnv
    env = BindEnv()
    x = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    c = (4,)
    outs = [np.zeros_like(x), *(np.zeros(c, np.float32) for _ in range(4))]
    KERNELS["bn_fwd"](outs, [x, np.ones(c, np.float32), np.zeros(c, np.float32)], {}, env)()
    assert [b.what for b in env.outside_arena] == ["batch norm stat_sums", "batch norm affine"]
    assert sum(b.nbytes for b in env.outside_arena) == (9 * 2 * 4) * 8 + 2 * 4 * 4
    np.testing.assert_allclose(outs[0].mean(axis=0), 0, atol=1e-6)


def test_peak_lists_the_live_tensors_with_producer_layer_and_category() -> None:
    task = make("mlp")
    m = task.memory_inspector
    peak = m.peak("train_base")
    live = m.live_bytes("train_base")
    assert peak.peak_bytes == live.max() == sum(t.nbytes for t in peak.tensors)
    assert peak.peak_bytes <= peak.arena_bytes
    cats = peak.by_category
    assert list(cats) == list(CATEGORIES) and sum(cats.values()) == peak.peak_bytes
    by_name = {t.name: t for t in peak.tensors}
    # AdamW: two moments per weight, as large as the weights; the gradients as large too
    assert cats["optimizer state"] == 2 * cats["gradients"]
    w = by_name["fc1.weight@grad"]
    assert (w.category, w.producer, w.layer) == ("gradients", "fc_bwd", "fc1")
    # every live feature map's interval holds the peak tick
    for t in peak.tensors:
        if t.category in ("activations", "temporaries"):
            assert any(a <= peak.time <= b for a, b in t.live), t.name
    # liveness off: everything is live all the time, so the peak is the arena (no packing gaps)
    off = m.what_if(liveness=False)
    assert off.peak().peak_bytes == sum(t.storage_bytes for t in off.plan()) <= off.arena_bytes


def test_what_if_plans_only_and_diff_shows_categories_regions_and_moves() -> None:
    task = make("mlp")
    m = MemoryInspector.of(task)
    assert task.planned is None  # the inspector planned on its own; the task is as it was
    big = m.what_if(batch_size=256)
    d = m.diff(big)
    assert d.arena == (m.arena_bytes, big.arena_bytes) and big.arena_bytes > m.arena_bytes
    assert d.categories["weights"][0] == d.categories["weights"][1]
    assert d.categories["activations"][1] > d.categories["activations"][0]
    assert "F_FEATURE_FP32" in d.grew and not d.shrank
    assert d.resized["fc1.out"] == (128 * 1024 * 4, 256 * 1024 * 4)
    assert all(n in d.moved for n in ("I_B.data",))  # I_A.data grew in place, so I_B moved
    sgd = m.what_if(optimizer="sgd")
    ds = m.diff(sgd)
    assert ds.categories["optimizer state"] == (2 * m.by_category()["gradients"], 0)
    assert set(ds.removed) == {t.name for t in m.plan() if t.name.endswith(("@m", "@v"))}
    assert m.diff(m.what_if(ema=0.99)).categories["weights"][1] > m.by_category()["weights"]
    unpadded = m.diff(m.what_if(pad_rows=False))
    assert unpadded.arena[1] < unpadded.arena[0]  # 784-float rows are not padded, 1024-float ones are
    with pytest.raises(ConfigError, match="what_if"):
        m.what_if(batch=3)
    with pytest.raises(ConfigError, match="batch_size"):
        m.what_if(batch_size=0)


def test_what_if_resolution_replans_an_image_model() -> None:
    m = MemoryInspector.of(make("resnet"))
    big = m.what_if(resolution=(32, 32))
    d = m.diff(big)
    assert d.resized["conv1.out"] == (32 * 16 * 16 * 8 * 4, 32 * 32 * 32 * 8 * 4)
    assert d.categories["weights"][0] == d.categories["weights"][1]
    with pytest.raises(ConfigError, match="resolution"):
        MemoryInspector.of(make("mlp")).what_if(resolution=(8, 8))


@pytest.mark.parametrize("which, budgets", [("mlp", (24 << 20, 26 << 20, 30 << 20)),
                                            ("resnet", (2 << 20, 4 << 20, 6 << 20))])
def test_fit_finds_the_largest_batch_that_compiles_into_the_budget(which: str, budgets: tuple[int, ...]) -> None:
    task = make(which, n=1200)
    m = MemoryInspector.of(task)
    found = []
    for budget in budgets:
        b = m.fit(budget)
        found.append(b)
        arenas = []
        for batch in (b, b + 1):
            t = make(which, n=1200, batch_size=batch)
            assert {k: getattr(t.config, k) for k in m.batch_changes(batch)} == m.batch_changes(batch)
            t.compile()
            arenas.append(t.runner.arena.nbytes)
        assert arenas[0] <= budget < arenas[1], (which, budget, b, arenas)
    assert found == sorted(found) and len(set(found)) == 3
    with pytest.raises(PlanError, match="even batch 1"):
        m.fit(1 << 10)


def test_memory_viz_snapshot_loads_in_pytorchs_own_reader(tmp_path) -> None:
    memory_viz = pytest.importorskip("torch.cuda._memory_viz")
    import pickle
    from renaissance_nb.inspector.export import save_memory_viz
    m = MemoryInspector.of(make("resnet"))
    path = save_memory_viz(m, tmp_path / "plan.pickle")
    snap = pickle.loads(path.read_bytes())
    peak = m.peak()
    (seg,) = snap["segments"]
    assert seg["total_size"] == m.arena_bytes == sum(b["size"] for b in seg["blocks"])
    assert memory_viz.calc_active(seg) == seg["allocated_size"] >= peak.peak_bytes
    summary = memory_viz.segsum(snap)  # torch's fragmentation report reads every block
    assert "segment" in summary
    stacks = memory_viz.memory(snap, format_flamegraph=lambda lines: lines)  # its flame-graph input
    assert "fc1.weight@grad" in stacks and "active_allocated" in stacks
    text = memory_viz.trace(snap)  # replays device_traces: an alloc and a free for every interval
    assert "cudaMalloc" in text and "conv1.out" not in text  # names stay in the frames
    allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
    frees = [e for e in snap["device_traces"][0] if e["action"] == "free_completed"]
    assert len(allocs) - len(frees) == sum(1 for t in m.plan() if t.storage_bytes and not (
        t.region.reusable and m.locked.lifetimes.get(t.id)))
    assert "Active Memory Timeline" in memory_viz.trace_plot(snap)


def test_chrome_trace_has_the_trace_event_fields_and_one_event_per_node(tmp_path) -> None:
    from renaissance_nb.inspector.export import save_chrome_trace
    m = MemoryInspector.of(make("mlp"))
    data = json.loads(save_chrome_trace(m, tmp_path / "plan.json").read_text())
    events = data["traceEvents"]
    for e in events:
        assert {"ph", "ts", "pid", "tid", "name"} <= set(e), e
        assert isinstance(e["ts"], (int, float)) and e["ph"] in ("X", "C", "M")
    nodes = [e for e in events if e["ph"] == "X"]
    assert len(nodes) == len(m.ticks()) and all(e["dur"] == 1 for e in nodes)
    counters = [e for e in events if e["ph"] == "C"]
    assert max(sum(e["args"].values()) for e in counters) == m.peak().peak_bytes


def test_resident_memory_is_sampled_beside_the_planned_arena_and_data() -> None:
    from renaissance_nb.inspector.resident import ResidentMemory, resident_bytes
    task = make("mlp", n=5120).total_epochs(1)  # 40 steps: run() calls step callbacks every 16
    rss = ResidentMemory(every=16)
    task.run(callbacks=[rss], progress=False)
    rows = rss.rows()
    assert rss.arena_bytes == task.runner.arena.nbytes
    assert rss.data_bytes == 5120 * 784 * 4 + 5120 * 4
    steps = [r["step"] for r in rows if r["step"] >= 0]
    assert steps == [16, 32]
    assert len(rows) == 1 + 2 + 1  # the start, the steps, the epoch's end
    # the arena and data are resident after compile: the process holds at least the plan's bytes
    assert all(r["resident"] >= r["arena"] + r["data"] for r in rows)
    assert 0 < resident_bytes()
    with pytest.raises(ConfigError, match="every"):
        ResidentMemory(every=0)

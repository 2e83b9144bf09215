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

from renaissance_nb import AdamW, DeepLearningTask, PhaseError, PlanError, fc, flatten, relu, seq
from renaissance_nb.blueprint import RESNET_3_3, block, bn, cbr, conv, gap, maxpool
from renaissance_nb.errors import ConfigError, DeviceError, ExportError
from renaissance_nb.kernels import native
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


def tiny(n: int = 320, batch_size: int = 64) -> DeepLearningTask:
    """A small MLP whose kernels take microseconds (so an injected 5 ms stands out)."""
    rng = np.random.default_rng(1)
    data = rng.standard_normal((n, 784)).astype(np.float32), rng.integers(0, 10, n)
    return (DeepLearningTask().model(seq(fc(64), relu(), fc(10))).data(train=data, batch_size=batch_size)
            .optimizer(AdamW()).total_epochs(1).seed(0))


AUDIT = MODELS + """
import json, sys
import numpy as np
out = {}
for which in sys.argv[1:]:
    task = make(which)
    task.compile()
    before = task.arena.bytes.copy()
    r = task.memory_inspector.allocations(steps=100)
    out[which] = dict(steps=r.steps, allocs=r.nrt_allocs, frees=r.nrt_frees, net=r.nrt_net, args=r.array_arguments,
                      growth=r.python_growth, per_kernel=r.per_kernel, summary=r.summary(),
                      restored=bool(np.array_equal(before, task.arena.bytes)))
print("RESULT" + json.dumps(out))
"""


def test_100_steps_after_warm_up_grow_nothing_and_numba_frees_every_record(tmp_path) -> None:
    """The issue's zero-allocation test, for the seed MLP, the conv net and the ResNet block net: 100
    training steps after a warm-up, numba's NRT statistics on from the process's start (a subprocess).
    Python's traced memory (NRT's buffers included) grows by 0 bytes and numba frees every allocation
    it makes (alloc == free, net 0). What numba does allocate is counted and reported as such: one
    record per array argument of each kernel call from Python, freed when the call returns (counted by
    wrapping the kernels' numba functions): no kernel allocates a buffer."""
    script = tmp_path / "audit.py"
    script.write_text(AUDIT)
    env = {**os.environ, "NUMBA_NRT_STATS": "1"}
    run = subprocess.run([sys.executable, str(script), "mlp", "conv", "resnet"], capture_output=True, text=True,
                         env=env, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.split("RESULT", 1)[1])
    assert set(result) == {"mlp", "conv", "resnet"}
    for which, r in result.items():
        assert r["steps"] == 100, which
        assert r["growth"] == 0, (which, r)  # tracemalloc: no Python (or NRT) memory growth
        assert r["allocs"] == r["frees"] and r["net"] == 0, (which, r)  # numba holds nothing
        assert r["allocs"] == r["args"], (which, r)  # the documented residual, exactly: argument records
        # every kernel of the three is C where the library is built (kernels/native.py, conv_native.py): no record
        assert (r["args"] == 0) if native.lib() is not None else (r["args"] > 0), (which, r)
        assert r["allocs"] % r["steps"] == 0, (which, r)  # the same count every step (10 whole passes)
        said = "no kernel called numba" if r["allocs"] == 0 else "record"
        assert f"{r['allocs'] // 100}.0 per step" in r["summary"] and said in r["summary"], r["summary"]
        assert "nothing held" in r["summary"] and "grew by 0 B" in r["summary"]
        assert r["restored"], which  # the audit leaves the task's arena as it was
    if native.lib() is None:  # the batch-norm kernels' per-call np.zeros are gone: bn_fwd hands numba 11 arrays
        assert result["conv"]["per_kernel"]["bn_fwd.<lambda>"] == 11 * 100  # one bn layer, 100 steps


def test_allocations_is_a_public_call_with_rows_for_the_dashboard() -> None:
    task = tiny()
    with pytest.raises(PhaseError, match="memory.allocations.*compile"):
        task.memory_inspector.allocations()
    task.compile()
    before = task.arena.bytes.copy()
    r = task.memory_inspector.allocations(steps=12)  # more than a pass (5 batches): the pass starts again
    assert r.steps == 12 and r.nrt_net == 0 and r.python_growth == 0 and r.only_argument_records
    assert r.nrt_allocs == r.array_arguments
    assert (r.nrt_allocs == 0) if native.lib() is not None else (r.nrt_allocs > 0)  # an MLP: all C, or numba's records
    assert np.array_equal(before, task.arena.bytes)
    rows = dict(r.rows())
    assert rows["numba allocations per step"] == f"{r.nrt_allocs / 12:.1f}"
    assert rows["numba allocations still held at the end"] == "0"
    assert rows["Python traced memory growth"] == "0 B"
    assert ("no kernel called numba" if r.nrt_allocs == 0 else "record numba makes for an array argument") in r.summary()
    with pytest.raises(ConfigError, match="steps"):
        task.memory_inspector.allocations(steps=0)


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


def _timed_events(m: MemoryInspector, timings, tmp_path) -> tuple[list[dict], dict]:  # type: ignore[no-untyped-def]
    from renaissance_nb.inspector.export import save_chrome_trace
    data = json.loads(save_chrome_trace(m, tmp_path / "step.json", timings=timings).read_text())
    for e in data["traceEvents"]:  # the Trace Event format's required fields
        assert {"ph", "ts", "pid", "tid", "name"} <= set(e), e
        assert isinstance(e["ts"], (int, float)) and e["ph"] in ("X", "C", "M")
    return [e for e in data["traceEvents"] if e["ph"] == "X" and e["cat"] != "step"], data  # the kernels


def test_profiled_trace_lays_the_kernels_out_on_a_real_time_axis(tmp_path) -> None:
    task = tiny()
    with pytest.raises(PhaseError, match="memory.profile"):
        task.memory_inspector.profile()
    task.compile()
    m = task.memory_inspector
    before = task.arena.bytes.copy()
    timings = m.profile(steps=20)
    assert np.array_equal(before, task.arena.bytes)  # replayed steps leave the task as it was
    assert timings.steps == 20 and timings.step_seconds > 0
    events, data = _timed_events(m, timings, tmp_path)
    train = [k for k in m.ticks() if k.program.startswith("train step")]
    assert len(events) == len(train)  # every node of both training programs was timed
    assert all(e["dur"] > 0 for e in events)
    assert all(a["ts"] + a["dur"] == pytest.approx(b["ts"]) for a, b in zip(events, events[1:]))  # end to end
    for tid in (0, 1):  # each program's kernels add up to about one measured step
        total = sum(e["dur"] for e in events if e["tid"] == tid) * 1e-6
        assert timings.step_seconds / 3 < total < 3 * timings.step_seconds, (tid, total, timings.step_seconds)
    counters = [e for e in data["traceEvents"] if e["ph"] == "C"]
    assert [c["ts"] for c in counters] == [e["ts"] for e in events]
    assert max(sum(c["args"].values()) for c in counters) <= m.peak().peak_bytes
    assert data["otherData"]["steps"] == 20 and data["otherData"]["not_measured"]  # validation: not drawn
    whole = [e for e in data["traceEvents"] if e["ph"] == "X" and e["cat"] == "step"]  # the step as run() runs it
    captured = timings.replay.startswith("CPU step captured as one native program")
    assert len(whole) == 1 and whole[0]["name"] == ("whole step (native program)" if captured else "whole step (replay)")
    assert whole[0]["dur"] == pytest.approx(timings.step_seconds * 1e6) and whole[0]["tid"] == 2  # its own track
    assert whole[0]["args"]["replay"] == timings.replay
    from renaissance_nb.inspector.export import chrome_trace
    assert {e["dur"] for e in chrome_trace(m)["traceEvents"] if e["ph"] == "X"} == {1}  # plan order by default
    with pytest.raises(ExportError, match="variant"):
        chrome_trace(m, "train_last", timings=timings)


def test_a_kernel_made_50_ms_slower_is_the_longest_event(tmp_path) -> None:
    import time

    from renaissance_nb.compiler.ids import GraphId
    from renaissance_nb.inspector.allocations import training_pass
    task = tiny()
    task.compile()
    target = task.executor.kernels("train_base", GraphId.OPTIMIZER)[0]

    def slow() -> None:
        time.sleep(0.05)  # far above the ~12 ms a threaded kernel can stall while a neighbour process
        target()  # holds the cores (two pytest workers on two cores)
    sched, _ = training_pass(task.runner)  # the step programs the runner replays (and profile() times)
    for prog in sched.steps:
        prog[:] = [slow if k is target else k for k in prog]
    timings = task.memory_inspector.profile(steps=10)
    assert timings.slowest(1)[0].key == ("OPTIMIZER", 0) and timings.slowest(1)[0].seconds >= 0.05
    events, _ = _timed_events(task.memory_inspector, timings, tmp_path)
    longest = max(events, key=lambda e: e["dur"])
    assert (longest["cat"], longest["name"]) == ("OPTIMIZER", "optimizer") and longest["dur"] >= 50_000
    others = [e["dur"] for e in events if e["cat"] != "OPTIMIZER"]
    assert max(others) < longest["dur"] / 2


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


# ---- planned vs measured on a GPU ---------------------------------------------------------------
def fake_cupy(used: int, total: int, free: int, device_total: int):  # type: ignore[no-untyped-def]
    """An object with the two CuPy calls device_memory reads (a test of the arithmetic, not of CUDA)."""
    from types import SimpleNamespace
    pool = SimpleNamespace(used_bytes=lambda: used, total_bytes=lambda: total)
    return SimpleNamespace(get_default_memory_pool=lambda: pool,
                           cuda=SimpleNamespace(runtime=SimpleNamespace(memGetInfo=lambda: (free, device_total))))


def test_device_memory_arithmetic_and_report_with_a_fake_cupy() -> None:
    from renaissance_nb.inspector.resident import cupy_with_device, device_memory
    r = device_memory(3 << 20, 1 << 20, cupy=fake_cupy(5 << 20, 8 << 20, 100 << 20, 140 << 20))
    assert (r.planned, r.beyond_plan, r.device_used) == (4 << 20, 1 << 20, 40 << 20)
    assert r.row() == {"device_arena": 3 << 20, "device_data": 1 << 20, "pool_used": 5 << 20, "pool_total": 8 << 20,
                       "device_used": 40 << 20, "device_total": 140 << 20}
    text = r.summary()
    assert "5.0 MiB in live arrays (80.0% of it planned)" in text and "1.0 MiB beyond the plan" in text
    assert "40.0 MiB of 140.0 MiB in use" in text
    if cupy_with_device() is None:  # no CuPy or no device here: a reading is None, and nothing breaks
        assert device_memory(1 << 20) is None
        assert tiny().memory_inspector.device_memory() is None


class StandInPool:
    """CuPy's pool bookkeeping over the CUDA stand-in's device arrays (tests/cuda_emulator.py): each
    allocation through the runtime is recorded; used = bytes of the arrays still alive."""

    def __init__(self) -> None:
        import weakref
        self.ref = weakref.ref
        self.made: list[tuple[str, int, object]] = []

    def counted(self, what: str, make):  # type: ignore[no-untyped-def]
        def alloc(*args):  # type: ignore[no-untyped-def]
            a = make(*args)
            self.made.append((what, a.nbytes, self.ref(a)))
            return a
        return alloc

    def used(self, what: str | None = None) -> int:
        return sum(n for w, n, r in self.made if r() is not None and what in (None, w))

    def as_cupy(self, device_total: int = 1 << 34):  # type: ignore[no-untyped-def]
        ever = sum(n for _, n, _ in self.made)
        return fake_cupy(self.used(), ever, device_total - ever, device_total)


def test_device_memory_on_the_cuda_stand_in_matches_what_the_gpu_executor_allocated() -> None:
    """The GPU executor on the CPU stand-in for CuPy, its allocations recorded as CuPy's pool would
    count them: the data the reading plans on the device is exactly what the executor copied up,
    and what the pool holds beyond the plan is the arena's alignment slack, the cuBLAS workspaces
    and kernel scratch. (The stand-in has no pool of its own; a real device: device_check.sh.)"""
    import dataclasses
    import shutil

    from renaissance_nb.gpu.executor import GpuExecutor
    from renaissance_nb.inspector.resident import ResidentMemory
    from renaissance_nb.memory.dtensor import ALIGNMENT
    if shutil.which("g++") is None:
        pytest.skip("g++ is needed to build the CUDA stand-in")
    import cuda_emulator
    pool = StandInPool()
    rt = cuda_emulator.emulated_runtime(cuda_emulator.EmulatedModule())
    rt = dataclasses.replace(rt, zeros=pool.counted("zeros", rt.zeros), asarray=pool.counted("asarray", rt.asarray))
    task = tiny(n=300)
    task.compile()
    task.runner.replay = GpuExecutor(task.compiled, task.executor, task.runner.env, task.config.nan_policy, "device",
                                     runtime=rt)
    m = task.memory_inspector
    reading = m.device_memory(cupy=pool.as_cupy())
    assert reading.arena == task.arena_bytes
    assert reading.data == pool.used("asarray") == 300 * 784 * 4 + 300 * 4 + 300 * 8  # x, y (int32), order
    assert reading.pool_used == pool.used()
    assert reading.beyond_plan == pool.used("zeros") - task.arena_bytes >= ALIGNMENT
    with pytest.raises(DeviceError, match="memory.profile"):
        m.profile()
    rss = ResidentMemory(cupy=pool.as_cupy())
    task.run(callbacks=[rss], progress=False)
    rows = rss.rows()
    assert rss.reads_device and rss.device_data_bytes == reading.data
    assert all(r["pool_used"] == reading.pool_used and r["device_arena"] == task.arena_bytes for r in rows)
    assert "GPU: CuPy's pool" in rss.summary()


def test_device_memory_on_a_real_gpu() -> None:
    """Runs where CuPy sees a device (scripts/device_check.sh): the pool holds at least the planned
    device arena and data, and the device at least the pool."""
    from renaissance_nb.inspector.resident import ResidentMemory, cupy_with_device
    if cupy_with_device() is None:
        pytest.skip("no CuPy with a CUDA device here")
    task = make("mlp", n=2560).device("cuda", data="device")
    task.compile()
    reading = task.memory_inspector.device_memory()
    print(reading.summary())
    assert reading.arena == task.arena_bytes and reading.data >= 2560 * 784 * 4
    assert reading.pool_used >= reading.planned and reading.device_used >= reading.pool_total >= reading.pool_used
    rss = ResidentMemory(every=16)
    task.run(callbacks=[rss], progress=False)
    assert rss.reads_device and all(r["pool_used"] >= reading.planned for r in rss.rows())
    print(rss.summary())


def test_a_drain_that_fails_after_the_replay_still_restores_the_arena(monkeypatch: pytest.MonkeyPatch) -> None:
    """A prefetch error or a Ctrl-C while the last copies land must not leave the replayed bytes behind."""
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((320, 784)).astype(np.float32), rng.integers(0, 10, 320)
    t = (DeepLearningTask().model(seq(fc(64), relu(), fc(10))).data(train=(x, y), batch_size=64)
         .optimizer(AdamW()).total_epochs(1).seed(0)).compile()
    before = t.arena.bytes.copy()
    calls = []
    drain = t.runner.drain_transfers

    def failing_second_time() -> None:
        calls.append(1)
        drain()
        if len(calls) == 2:
            raise KeyboardInterrupt
    monkeypatch.setattr(t.runner, "drain_transfers", failing_second_time)
    with pytest.raises(KeyboardInterrupt):
        t.memory_inspector.allocations(steps=5)
    assert len(calls) == 2 and np.array_equal(before, t.arena.bytes)

"""Stream overlap derived from the plan (#29), checked without a GPU.

Three layers: the pure dependency edges (gpu/deps.py) on hand-built accesses and on the seed MLP's
plan; the CPU stand-in's race detector (tests/cuda_emulator.py: vector clocks per stream, event and
replayed graph branch; every kernel's const pointers read, the others written); and the real
GpuExecutor with its entries on five streams, trained through task.run() with the detector on:
the CPU's weights, the same bytes over three runs, and a deliberately dropped edge caught by name.
"""
from __future__ import annotations

import numpy as np
import pytest

from renaissance_nb import AdamW, DeepLearningTask, fc, relu, seq
from renaissance_nb.gpu.deps import Access, merge, program_edges, reduce_edges, step_graph
from renaissance_nb.gpu.executor import GpuExecutor
from renaissance_nb.gpu.streams import StreamGemms
from renaissance_nb.runtime.replay import StepPrograms

import cuda_emulator  # noqa: E402  (tests/ is on sys.path)
from test_gpu_backend import assert_same_run, conv_task, mlp_task, module  # noqa: F401  (module: a fixture)


def on_streams(task: DeepLearningTask, module, capture: str = "entry", data: str = "device",  # type: ignore[no-untyped-def]
               drop_edge: tuple[str, str] | None = None) -> DeepLearningTask:
    task.compile()
    task.runner.replay = GpuExecutor(task.compiled, task.executor, task.runner.env, task.config.nan_policy, data,
                                     runtime=cuda_emulator.emulated_runtime(module), capture=capture,
                                     drop_edge=drop_edge)
    return task


def acc(reads: list[tuple[int, int]] = (), writes: list[tuple[int, int]] = ()) -> Access:  # type: ignore[assignment]
    return Access(merge(reads), merge(writes))


# ---- the edges, a pure function of the plan ----------------------------------------------------------
def test_edges_follow_read_and_write_overlaps_and_are_reduced() -> None:
    """0 writes x; 1 reads x (RAW); 2 reads x too (RAW, independent of 1); 3 writes x (WAR on 1 and 2,
    WAW on 0: implied through them); 4 touches only y; 5 reads x and y (after 3 and 4)."""
    x, y = (0, 8), (64, 72)
    prog = [acc(writes=[x]), acc(reads=[x]), acc(reads=[(2, 12)]), acc(writes=[(0, 4)]), acc(writes=[y]),
            acc(reads=[x, y])]
    e = program_edges(prog)
    assert e.within == ((0, 1), (0, 2), (1, 3), (2, 3), (3, 5), (4, 5))
    assert e.across == ()
    # across steps: the next step's writers of x and y wait for the previous step's last reader of both
    # (5); the write-after-write edges 0 -> 0 and 4 -> 4 are implied through it
    assert program_edges(prog, prog).across == ((5, 0), (5, 4))
    assert not acc(reads=[x]).conflicts(acc(reads=[x]))  # two readers never wait for each other
    assert acc(writes=[(0, 1)]).conflicts(acc(reads=[(0, 8)])) and not acc(writes=[(8, 9)]).conflicts(acc(reads=[x]))
    assert reduce_edges(3, [(0, 1), (1, 2), (0, 2)]) == [(0, 1), (1, 2)]


def _named(sg, i: int, kind: str) -> str:  # type: ignore[no-untyped-def]
    return (sg.previous if kind == "across" else sg.entries)[i]["gid"]


def _reaches(sg, a: str, b: str) -> bool:  # type: ignore[no-untyped-def]
    names = [r["gid"] for r in sg.entries]
    seen, todo = set(), [names.index(a)]
    while todo:
        i = todo.pop()
        for s, t, kind in sg.edges:
            if kind == "within" and s == i and t not in seen:
                seen.add(t)
                todo.append(t)
    return names.index(b) in seen


def test_the_mlp_step_edges_let_transfer_metrics_and_ema_overlap() -> None:
    t = mlp_task().compile()
    variants = ["train_base"] * 3
    sg = step_graph(t.compiled, StepPrograms.train_step_gids(variants, 1), StepPrograms.train_step_gids(variants, 0))
    within = {(_named(sg, i, k), sg.entries[j]["gid"]) for i, j, k in sg.edges if k == "within"}
    across = {(_named(sg, i, k), sg.entries[j]["gid"]) for i, j, k in sg.edges if k == "across"}
    assert within == {("FIRST_LAYER_FWD_B", "DEEP_FWD_BWD"), ("DEEP_FWD_BWD", "FIRST_LAYER_BWD_B"),
                      ("DEEP_FWD_BWD", "ACCUM_METRICS"), ("FIRST_LAYER_BWD_B", "CAST_AND_CHECK"),
                      ("CAST_AND_CHECK", "OPTIMIZER"), ("ACCUM_METRICS", "OPTIMIZER"), ("OPTIMIZER", "EMA_UPDATE")}
    # the next batch's transfer: ordered only after the previous step's transfer (the cursor) and the last
    # reader of the buffer it fills (the previous step's first-layer backward)
    assert across == {("TRANSFER_B", "TRANSFER_A"), ("FIRST_LAYER_BWD_A", "TRANSFER_A"),
                      ("TRANSFER_B", "FIRST_LAYER_FWD_B"), ("OPTIMIZER", "FIRST_LAYER_FWD_B"),
                      ("EMA_UPDATE", "CAST_AND_CHECK")}  # the EMA clears the NaN flag the next check sets
    # (which also orders the EMA before the next optimizer: CAST_AND_CHECK precedes it)
    assert _reaches(sg, "DEEP_FWD_BWD", "OPTIMIZER") and _reaches(sg, "FIRST_LAYER_BWD_B", "OPTIMIZER")
    # the metrics run beside the first-layer backward and the NaN check; they precede the optimizer only
    # because they index the loss log by the step counter it increments
    for other in ("FIRST_LAYER_BWD_B", "CAST_AND_CHECK"):
        assert not _reaches(sg, "ACCUM_METRICS", other) and not _reaches(sg, other, "ACCUM_METRICS")
    assert not any(k == "within" and sg.entries[j]["gid"] == "TRANSFER_A" for _, j, k in sg.edges)
    assert not _reaches(sg, "TRANSFER_A", "EMA_UPDATE")  # the EMA reads W: the next forward may run beside it
    assert sg.streams == ("COMP_1", "COMP_2", "TRANS", "UPDATE")


def test_the_seed_mlp_optimizer_waits_for_both_backward_graphs() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(256, 784)).astype(np.float32), rng.integers(0, 10, 256)
    t = DeepLearningTask("seed").model(seq(fc(1024), relu(), fc(10))).data(train=(x, y), batch_size=128)
    t.optimizer(AdamW()).total_epochs(1).compile()
    variants = ["train_base"] * 2
    sg = step_graph(t.compiled, StepPrograms.train_step_gids(variants, 0))
    assert _reaches(sg, "DEEP_FWD_BWD", "OPTIMIZER") and _reaches(sg, "FIRST_LAYER_BWD_A", "OPTIMIZER")
    assert not _reaches(sg, "TRANSFER_B", "OPTIMIZER") and not _reaches(sg, "ACCUM_METRICS", "CAST_AND_CHECK")
    by = {r["gid"]: r for r in sg.entries}
    # the optimizer reads G and writes W, M, V: 1024*784 + 1024 + 10*1024 + 10 parameters, 4 bytes each
    n = 1024 * 784 + 1024 + 10 * 1024 + 10
    assert by["OPTIMIZER"]["write_bytes"] >= 3 * 4 * n and by["OPTIMIZER"]["read_bytes"] >= 4 * n


# ---- the stand-in's race detector -------------------------------------------------------------------
def test_the_detector_orders_accesses_by_events_and_graph_branches(module) -> None:  # type: ignore[no-untyped-def]
    rt = cuda_emulator.emulated_runtime(module)
    a, b, ev = rt.stream(), rt.stream(), rt.event()
    counter = np.zeros(1, np.int64)
    advance = module.get_function("rnb_advance")  # counter[0] += n: a write of counter
    with a:
        advance((1,), (1,), (counter, np.int64(1)))
    ev.record(a)
    b.wait_event(ev)
    with b:
        advance((1,), (1,), (counter, np.int64(1)))  # ordered by the event: fine
    with a, pytest.raises(cuda_emulator.RaceError, match="race"):
        advance((1,), (1,), (counter, np.int64(1)))  # a never waited for b
    rt.synchronize()  # the host waited for both: what it queues next is after them
    # a captured fork whose branch is not ordered before the origin's own later write: a race at replay
    p, side, fork, join = rt.stream(), rt.stream(), rt.event(), rt.event()
    p.begin_capture(cuda_emulator.CAPTURE_THREAD_LOCAL)
    fork.record(p)
    side.wait_event(fork)
    with side:
        advance((1,), (1,), (counter, np.int64(1)))
    join.record(side)
    with p:
        advance((1,), (1,), (counter, np.int64(1)))
    p.wait_event(join)
    graph = p.end_capture()
    with pytest.raises(cuda_emulator.RaceError, match="race"):
        graph.launch(p)


# ---- the executor on five streams, trained -------------------------------------------------------------
def test_entries_run_on_their_streams_with_few_waits(module) -> None:  # type: ignore[no-untyped-def]
    t = on_streams(mlp_task(epochs=2), module)
    rx = t.runner.replay
    checked = cuda_emulator.DETECTOR.checked
    t.run(progress=False)
    assert cuda_emulator.DETECTOR.checked > checked + 1000  # every access of the run went through the detector
    used = {k.gid.stream.name for k, g in zip(rx.atlas.captures, rx.graphs) if g is not None}
    assert used == {"TRANS", "COMP_1", "COMP_2", "UPDATE"}
    # 10 steps of 8 entries; a wait per conflicting pair on two streams, at most, never one per entry pair
    launches = sum(len(v) for v in rx.order.pending.values())
    assert 0 < rx.order.waits < 8 * 8 * 10 and launches > 0
    sg = rx.stream_graph()
    assert [r["stream"] for r in sg.entries][:2] == ["TRANS", "COMP_1"] and len(sg.edges) == 12


@pytest.mark.parametrize("make,capture", [(mlp_task, "entry"), (mlp_task, "step"), (conv_task, "entry"),
                                          (conv_task, "step")])
def test_streams_train_the_cpu_weights_byte_identically_three_times(module, make, capture: str) -> None:  # type: ignore[no-untyped-def]
    cpu = make(epochs=2)
    rc = cpu.run(progress=False)
    runs = []
    for _ in range(3):
        gpu = on_streams(make(epochs=2), module, capture, data="pinned" if make is conv_task else "device")
        rg = gpu.run(progress=False)
        runs.append(gpu.state_dict())
    # the tolerances of test_gpu_backend's CPU comparisons (BN sums in another fixed order on the GPU)
    tol = dict(rtol_loss=1e-5, rtol_w=1e-4, atol_w=1e-5) if make is conv_task else dict(rtol_loss=1e-6, rtol_w=1e-5,
                                                                                          atol_w=1e-6)
    assert_same_run(cpu, rc, gpu, rg, **tol)
    assert all(r[k].tobytes() == runs[0][k].tobytes() for r in runs[1:] for k in runs[0])


@pytest.mark.parametrize("capture,edge", [("entry", ("DEEP_FWD_BWD", "ACCUM_METRICS")),
                                          ("step", ("DEEP_FWD_BWD", "ACCUM_METRICS")),
                                          ("entry", ("OPTIMIZER", "FIRST_LAYER_FWD_B"))])
def test_a_missing_event_is_caught_naming_both_entries(module, capture: str, edge: tuple[str, str]) -> None:  # type: ignore[no-untyped-def]
    t = on_streams(mlp_task(epochs=2), module, capture, drop_edge=edge)
    with pytest.raises(cuda_emulator.RaceError) as err:
        t.run(progress=False)
    message = str(err.value)
    assert f"train/{edge[0]}/" in message and f"train/{edge[1]}/" in message, message


def test_each_stream_that_multiplies_has_its_own_cublas_workspace(module) -> None:  # type: ignore[no-untyped-def]
    t = on_streams(mlp_task(epochs=2), module)
    rx = t.runner.replay
    gemms = rx.gemm.by_stream
    assert set(gemms) == {s.ptr for k, s in rx.streams.items() if k.name != "TRANS"}
    spaces = {g.workspace.ctypes.data for g in gemms.values()}
    assert len(spaces) == len(gemms)
    t.run(progress=False)
    comp1 = rx.streams[next(k for k in rx.streams if k.name == "COMP_1")].ptr
    assert gemms[comp1].streams == {comp1}  # the deep graph's products went through COMP_1's handle
    assert all(g.streams <= {ptr} for ptr, g in gemms.items())
    calls = []
    sg = StreamGemms(lambda ws: type("G", (), {"bind": lambda self, c, a, b: lambda s: calls.append((ws, s.ptr)),
                                               "close": lambda self: None})(),
                     lambda n: f"ws{n}", [type("S", (), {"ptr": p})() for p in (1, 2)], 7)
    launch = sg.bind(None, None, None)
    launch(type("S", (), {"ptr": 2})())
    assert calls == [("ws7", 2)]

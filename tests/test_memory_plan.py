"""MemoryPlan, liveness packing and the GraphAtlas of a compiled task."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from renaissance_nb import (SGD, DeepLearningTask, GraphId, MemoryPlan, PlanError, Region, TaskBase, dropout, fc,
                            node, relu, seq, tanh)
from renaissance_nb.compiler.stages import VARIANTS
from renaissance_nb.memory.dtensor import ALIGNMENT, DTensor
from renaissance_nb.memory.liveness import intervals_meet, lifetimes_from_programs, live_overlaps, pack

PARAM_FAMILIES = ("W", "G", "M", "V")


def data(n: int, d: int = 10, classes: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, d)).astype(np.float32), rng.integers(0, classes, n)


def make_task(n_train: int = 100, batch: int = 32, n_val: int = 0, liveness: bool = True, fuse: bool = True,
              model=None, optimizer=None) -> DeepLearningTask:
    x, y = data(n_train)
    val = data(n_val, seed=1) if n_val else None
    t = (DeepLearningTask().model(model or seq(fc(32), relu(), dropout(0.1), fc(16), tanh(), fc(4)))
         .data(train=(x, y), val=val, batch_size=batch).total_epochs(1).options(liveness=liveness, fuse=fuse))
    if optimizer is not None:
        t.optimizer(optimizer)
    return t.compile()


@pytest.fixture(scope="module")
def task() -> DeepLearningTask:
    return make_task(n_train=100, batch=32, n_val=40)


# ---- layout -----------------------------------------------------------------------------------------
def test_every_offset_and_region_base_is_256_aligned(task) -> None:
    for plan in task.plans.values():
        for t in plan:
            assert t.offset % ALIGNMENT == 0, t
            assert t.offset + t.nbytes <= plan.total_bytes
            assert t.nbytes <= t.slot_bytes
        for span in plan.regions.values():
            assert span.base % ALIGNMENT == 0
    assert task.memory.total_bytes % ALIGNMENT == 0
    # the arena's views are aligned in memory, not only in offsets
    for v in task.executor.views["train_base"]:
        assert v.ctypes.data % ALIGNMENT == 0


def test_region_table_is_in_enum_order_and_holds_its_tensors(task) -> None:
    plan = task.memory
    assert list(plan.regions) == [r for r in Region if r is not Region.END]
    assert len(plan.regions) == 68
    bases = [s.base for s in plan.regions.values()]
    assert bases == sorted(bases)
    spans = list(plan.regions.values())
    for a, b in zip(spans, spans[1:]):
        assert a.end <= b.base  # regions never overlap
    for span in spans:
        for tid in span.tensor_ids:
            t = plan[tid]
            assert t.region is span.region
            assert span.base <= t.offset and t.offset + t.slot_bytes <= span.end
    # a tensor is listed in exactly its own region
    listed = sorted(tid for s in spans for tid in s.tensor_ids)
    assert listed == list(range(len(plan)))


def test_weight_grad_and_moment_ranges_are_parallel(task) -> None:
    plan = task.memory
    ranges = {f: plan.region_range(Region[f"{f}_BN_BIAS"], Region[f"{f}_DEEP_CONV"]) for f in PARAM_FAMILIES}
    lengths = {f: b - a for f, (a, b) in ranges.items()}
    assert len(set(lengths.values())) == 1 and lengths["W"] > 0
    params = [p for p in task.compiled.params]
    assert [f"{p.layer}.{p.role}" for p in params] == list(task.state_dict())
    suffix = {"W": "", "G": "@grad", "M": "@m", "V": "@v"}
    for p in params:
        rel = set()
        for f in PARAM_FAMILIES:
            t = plan[f"{p.layer}.{p.role}{suffix[f]}"]
            assert t.region.family == f
            assert t.shape == p.shape
            rel.add(t.offset - ranges[f][0])
        assert len(rel) == 1, (p, rel)  # same relative offset in W, G, M and V
    # and as arena views: the whole-range views have the same size
    ex = task.executor
    sizes = {f: ex.arena.range_view(f"{f}_BN_BIAS", f"{f}_DEEP_CONV", "float32").size for f in PARAM_FAMILIES}
    assert len(set(sizes.values())) == 1


def test_sgd_without_momentum_has_no_moment_tensors() -> None:
    t = make_task(optimizer=SGD().lr(0.1))
    plan = t.memory
    assert plan.regions[Region.M_FC_WEIGHT].size == 0 and plan.regions[Region.V_FC_WEIGHT].size == 0
    t2 = make_task(optimizer=SGD().lr(0.1).momentum(0.9))
    assert t2.memory.regions[Region.M_FC_WEIGHT].size == t2.memory.regions[Region.W_FC_WEIGHT].size
    assert t2.memory.regions[Region.V_FC_WEIGHT].size == 0


def test_six_variant_plans_share_offsets_and_differ_only_in_shape(task) -> None:
    assert set(task.plans) == set(VARIANTS)
    base = task.plans["train_base"]
    for name, plan in task.plans.items():
        assert plan.name == name
        assert [t.offset for t in plan] == [t.offset for t in base]
        assert [(t.name, t.dtype, t.region, t.slot_bytes) for t in plan] == \
               [(t.name, t.dtype, t.region, t.slot_bytes) for t in base]
        assert plan.total_bytes == base.total_bytes
    # shapes follow the variant's batch: 100 = 3*32 + 4, val 40 = 32 + 8
    assert task.plans["train_last"]["fc1.out"].shape == (4, 32)
    assert task.plans["val_last"]["fc1.out"].shape == (8, 32)
    assert task.plans["train_base"]["fc1.out"].shape == (32, 32)
    assert task.plans["train_last"]["fc1.weight"].shape == (32, 10)
    # each slot is the largest size over the variants
    for i, t in enumerate(base):
        assert t.slot_bytes == max(p[i].nbytes for p in task.plans.values())


# ---- liveness -------------------------------------------------------------------------------------------
def test_liveness_makes_the_arena_smaller_without_live_overlaps() -> None:
    model = seq(fc(256), relu(), fc(128), relu(), fc(64), relu(), fc(4))
    on = make_task(n_train=128, batch=64, liveness=True, model=model)
    off = make_task(n_train=128, batch=64, liveness=False, model=model)
    assert on.memory.reuse and not off.memory.reuse
    assert on.memory.total_bytes < off.memory.total_bytes
    assert on.memory.bytes_without_reuse == off.memory.bytes_without_reuse
    assert off.memory.total_bytes == off.memory.bytes_without_reuse
    assert on.memory.live_overlaps() == []
    assert off.memory.live_overlaps() == []
    # the saving is in the reusable families only
    fam_on, fam_off = on.memory.family_bytes(), off.memory.family_bytes()
    assert fam_on["F"] < fam_off["F"]
    for fam in ("W", "G", "M", "V", "I", "S", "R"):
        assert fam_on[fam] == fam_off[fam]
    # some F tensors really share bytes
    f = [t for t in on.memory if t.region.family == "F"]
    assert any(a.offset < b.end and b.offset < a.end for i, a in enumerate(f) for b in f[i + 1:])


def test_live_overlaps_detects_a_wrong_packing() -> None:
    plan = MemoryPlan("p")
    a = plan.alloc((64,), "float32", Region.F_FEATURE_FP32, "a")
    b = plan.alloc((64,), "float32", Region.F_FEATURE_FP32, "b")
    c = plan.alloc((64,), "float32", Region.F_FEATURE_FP32, "c")
    plan.finalize({a.id: [(0, 1)], b.id: [(2, 3)], c.id: [(1, 2)]})
    assert plan[a.id].offset == plan[b.id].offset  # disjoint lifetimes share bytes
    assert plan[c.id].offset != plan[a.id].offset   # c meets both
    assert plan.live_overlaps() == []
    # now say a and b live at the same time: the packing made for the old lifetimes is wrong
    plan.lifetimes[b.id] = [(0, 5)]
    assert plan.live_overlaps() == [("a", "b")]  # c has bytes of its own

    # placed by hand: overlapping bytes + meeting lifetimes is detected, either alone is not
    t1 = DTensor(0, "t1", (100,), "float32", Region.T_TEMP_FP32, 400, offset=0)
    t2 = DTensor(1, "t2", (100,), "float32", Region.T_TEMP_FP32, 400, offset=256)
    t3 = DTensor(2, "t3", (100,), "float32", Region.T_TEMP_FP32, 400, offset=512)
    lifes = {0: [(0, 3)], 1: [(3, 4)], 2: [(5, 9)]}
    assert live_overlaps([t1, t2, t3], lifes) == [("t1", "t2")]   # bytes [256,400) while both live at 3
    assert live_overlaps([t1, t2, t3], {0: [(0, 2)], 1: [(3, 4)], 2: [(5, 9)]}) == []
    assert live_overlaps([t1, t2, t3], {}) == [("t1", "t2"), ("t2", "t3")]  # unknown lifetime = forever
    assert live_overlaps([t1, replace(t2, offset=512), replace(t3, offset=1024)], lifes) == []


def test_pack_known_case() -> None:
    def dt(i, nbytes):
        return DTensor(i, f"t{i}", (nbytes,), "uint8", Region.F_FEATURE_FP32, nbytes)
    tensors = [dt(0, 1000), dt(1, 512), dt(2, 256), dt(3, 300)]
    lifes = {0: [(0, 2)], 1: [(3, 5)], 2: [(1, 4)]}  # t3 has no lifetime: live for ever
    offsets, size = pack(tensors, lifes)
    # largest first: t0@0; t1 never meets t0 -> @0; t3 meets all -> after both (align 1024);
    # t2 meets t0, t1 and t3 -> after t3 (1024+300 -> 1536)
    assert offsets == {0: 0, 1: 0, 3: 1024, 2: 1536}
    assert size == 1792
    assert all(o % ALIGNMENT == 0 for o in offsets.values())
    placed = [replace(t, offset=offsets[t.id]) for t in tensors]
    assert live_overlaps(placed, lifes) == []
    # a hole left by a short-lived tensor is reused by a later, smaller one
    tensors = [dt(0, 1024), dt(1, 512), dt(2, 256)]
    offsets, size = pack(tensors, {0: [(0, 1)], 1: [(0, 9)], 2: [(5, 6)]})
    assert offsets == {0: 0, 1: 1024, 2: 0} and size == 1536
    # no lifetimes at all: everything side by side
    offsets, size = pack(tensors, {})
    assert sorted(offsets.values()) == [0, 1024, 1536] and size == 1792


def test_lifetimes_from_programs_and_intervals() -> None:
    progs = [[((0,), (1,)), ((1,), (2,)), ((2, 0), (3,))], [((5,), (1,))]]
    life = lifetimes_from_programs(progs)
    assert life == {0: [(0, 2)], 1: [(0, 1), (4, 4)], 2: [(1, 2)], 3: [(2, 2)], 5: [(4, 4)]}
    assert intervals_meet([(0, 1)], [(1, 3)]) and not intervals_meet([(0, 1)], [(2, 3)])
    assert not intervals_meet(life[3], life[5])


def test_hand_built_task_with_liveness_reuses_bytes_and_stays_correct() -> None:
    t = TaskBase()
    a = t.alloc((8, 8), "float32", Region.I_A_DATA, "a")
    w = t.alloc((8, 8), "float32", Region.W_FC_WEIGHT, "w")
    h1 = t.alloc((8, 8), "float32", Region.F_FEATURE_FP32, "h1")
    h2 = t.alloc((8, 8), "float32", Region.F_FEATURE_FP32, "h2")
    h3 = t.alloc((8, 8), "float32", Region.F_FEATURE_FP32, "h3")
    out = t.alloc((8, 8), "float32", Region.R_RESULT, "out")
    nodes = [node("matmul", [a.id, w.id], [h1.id], trans_b=True), node("relu", [h1.id], [h2.id]),
             node("matmul", [h2.id, w.id], [h3.id], trans_b=True), node("relu", [h3.id], [out.id])]
    plan = t.finalize_memory(lifetimes_from_programs([[(n.inputs, n.outputs) for n in nodes]]))
    assert plan.reuse and plan.live_overlaps() == []
    assert plan[h1.id].offset == plan[h3.id].offset  # h1 is dead once h3 is written
    assert plan.total_bytes < plan.bytes_without_reuse
    t.add_graph("g", nodes)
    t.compile()
    rng = np.random.default_rng(0)
    av, wv = rng.standard_normal((8, 8)).astype(np.float32), rng.standard_normal((8, 8)).astype(np.float32)
    t.write(a, av)
    t.write(w, wv)
    t.run("g")
    want = np.maximum(np.maximum(av @ wv.T, 0) @ wv.T, 0)
    np.testing.assert_allclose(t.read(out), want, rtol=1e-5, atol=1e-5)


def test_plan_rejects_bad_allocations_and_use_before_finalize() -> None:
    plan = MemoryPlan()
    plan.alloc((4,), "float32", Region.T_TEMP_FP32, "x")
    with pytest.raises(PlanError):
        plan.alloc((4,), "float32", Region.T_TEMP_FP32, "y", slot_bytes=8)  # slot smaller than the tensor
    with pytest.raises(PlanError):
        plan.live_overlaps()
    with pytest.raises(PlanError):
        plan.with_shapes({}, "v")
    plan.finalize()
    with pytest.raises(PlanError):
        plan.finalize()
    with pytest.raises(PlanError):
        plan.alloc((1,), "float32", Region.T_TEMP_FP32)
    with pytest.raises(PlanError):
        plan.with_shapes({0: (5,)}, "too_big")  # 20 bytes do not fit the 16-byte slot
    assert plan.with_shapes({0: (2,)}, "small")[0].shape == (2,)
    assert plan.with_shapes({"x": (3,)}, "by_name")["x"].shape == (3,)
    # keys and shapes are checked like alloc's, with the library's error naming the entry
    for bad, words in [({5: (2,)}, ["tensor id=5", "[0, 1)"]), ({"y": (2,)}, ["name='y'"]),
                       ({0: (2, 0)}, ["with_shapes[0]", "shape=(2, 0)", ">= 1"]),
                       ({0: (1.5,)}, ["with_shapes[0]", "positive ints"]),
                       ([(0, (2,))], ["shapes=", "a dict"]),
                       ({0: (2,), "x": (3,)}, ["'x' (#0) is given twice"])]:
        with pytest.raises(PlanError) as e:
            plan.with_shapes(bad, "v")
        assert all(w in str(e.value) for w in words), (bad, str(e.value))


# ---- atlas -----------------------------------------------------------------------------------------------
TRAIN = ("train_base", "train_last", "train_lowres", "train_lowres_last")


def test_collapsed_variants_without_partial_batch_or_lowres() -> None:
    t = make_task(n_train=96, batch=32)  # 3 full batches, no val, no low resolution
    a = t.compiled.atlas
    assert a.collapsed == {"train_last": "train_base", "train_lowres": "train_base",
                           "train_lowres_last": "train_base", "val_last": "val_base"}
    assert a.unused == {"train_lowres", "train_lowres_last", "val_base", "val_last"}
    assert a.shape_ids == {0: None, 1: (32, 10)}
    for v in TRAIN:
        for gid in (GraphId.DEEP_FWD_BWD, GraphId.FIRST_LAYER_FWD_A, GraphId.TRANSFER_B, GraphId.OPTIMIZER):
            assert a.entry(v, gid).captured_index == a.entry("train_base", gid).captured_index
    assert "variants collapsed" in t.summary()
    res = t.run(progress=False)
    assert len(res.step_losses) == 3


def test_partial_last_batch_gets_its_own_shape_and_deep_graph() -> None:
    t = make_task(n_train=100, batch=32, n_val=40)
    a = t.compiled.atlas
    assert "train_last" not in a.collapsed and "val_last" not in a.collapsed
    assert a.collapsed == {"train_lowres": "train_base", "train_lowres_last": "train_last"}
    base, last = a.entry("train_base", GraphId.DEEP_FWD_BWD), a.entry("train_last", GraphId.DEEP_FWD_BWD)
    assert base.shape_id != last.shape_id and base.shape_id > 0 and last.shape_id > 0
    assert a.shape_ids[base.shape_id] == (32, 10) and a.shape_ids[last.shape_id] == (4, 10)
    assert base.captured_index != last.captured_index
    assert len({sid for sid in a.shape_ids if sid}) == 3  # (32,10), (4,10), (8,10) for val_last
    # the bound graph of train_last works on 4-row views
    bound = t.executor.bound[last.captured_index]
    assert "DEEP_FWD_BWD" in bound.name
    assert t.executor.views["train_last"][t.compiled.ids["fc2.out"]].shape == (4, 16)
    # the last batch's metrics graph is its own GraphId
    assert a.entry("train_last", GraphId.ACCUM_METRICS_TRAIN_LAST) is not None
    assert a.entry("train_last", GraphId.ACCUM_METRICS) is None
    assert a.entry("val_last", GraphId.ACCUM_METRICS_VAL_LAST) is not None
    # val variants have no training graph
    assert a.entry("val_base", GraphId.DEEP_FWD_BWD) is None and a.entry("val_base", GraphId.OPTIMIZER) is None
    assert a.entry("val_base", GraphId.INF_MAIN_A) is not None
    # O(1) lookup agrees with the entries
    vi = a.variants.index("train_last")
    assert a.lookup(vi, GraphId.DEEP_FWD_BWD) == last.captured_index
    assert a.lookup(vi, GraphId.INF_MAIN_A) == -1


def test_shape_invariant_graphs_are_bound_once_for_all_train_variants() -> None:
    t = make_task(n_train=100, batch=32, n_val=40)
    a = t.compiled.atlas
    for gid in (GraphId.OPTIMIZER, GraphId.CLEAR_METRICS, GraphId.CAST_AND_CHECK):
        assert gid.shape_invariant
        entries = [a.entry(v, gid) for v in TRAIN]
        assert all(e is not None and e.shape_id == 0 for e in entries)
        assert len({e.captured_index for e in entries}) == 1
        assert sum(1 for c in a.captures if c.gid is gid and c.graph == "train") == 1
    for gid in (GraphId.DEEP_FWD_BWD, GraphId.FIRST_LAYER_FWD_A, GraphId.INF_MAIN_A):
        assert not gid.shape_invariant
    # every capture is distinct
    keys = [(c.graph, c.gid, c.shape_id) for c in a.captures]
    assert len(keys) == len(set(keys)) == len(t.executor.bound)


def test_pack_never_overlaps_live_tensors_randomized() -> None:
    """Seeded random cases: aligned offsets, everything inside the size, no live overlap, and
    never more bytes than placing every tensor side by side."""
    rng = np.random.default_rng(0)
    for _ in range(400):
        n = int(rng.integers(1, 12))
        tensors = [DTensor(i, f"t{i}", (1,), "uint8", Region.F_FEATURE_FP32, int(rng.integers(1, 3000)))
                   for i in range(n)]
        lifes = {}
        for i in range(n):
            if rng.random() < 0.9:  # the rest have no lifetime: live for ever
                starts = rng.integers(0, 20, int(rng.integers(1, 3)))
                lifes[i] = [(int(a), int(a + rng.integers(0, 6))) for a in starts]
        offsets, size = pack(tensors, lifes)
        assert set(offsets) == set(range(n))
        assert size % ALIGNMENT == 0 and all(o % ALIGNMENT == 0 for o in offsets.values())
        assert all(offsets[t.id] + t.slot_bytes <= size for t in tensors)
        assert size <= sum(-(-t.slot_bytes // ALIGNMENT) * ALIGNMENT for t in tensors)
        assert live_overlaps([replace(t, offset=offsets[t.id]) for t in tensors], lifes) == []


@pytest.mark.parametrize("model,fuse", [
    (seq(fc(32), relu(), fc(4)), True),
    (seq(fc(32), relu(), dropout(0.5), fc(16), tanh(), fc(4)), False),
    (seq(dropout(0.2), fc(24), tanh(), fc(24), relu(), fc(24), relu(), fc(4)), True),
])
def test_compiled_tasks_have_no_live_overlaps(model, fuse) -> None:
    t = make_task(n_train=100, batch=32, n_val=40, model=model, fuse=fuse)
    for plan in t.plans.values():
        assert plan.live_overlaps() == []
    assert t.memory.total_bytes <= t.memory.bytes_without_reuse
    # every tensor a graph touches has a lifetime; the others (weights, ranges) are not reusable anyway
    touched = t.compiled.graphs.train.tensor_ids() | t.compiled.graphs.inference.tensor_ids()
    for tid in touched:
        if t.memory[tid].region.reusable:
            assert tid in t.memory.lifetimes, t.memory[tid].name


def test_shared_bytes_lists_every_pair_of_temporaries_whose_slots_overlap() -> None:
    """The one place that answers "which tensors share bytes" (views, notebooks): checked against every
    pair of the plan, and none of them live at the same time."""
    from renaissance_nb import DeepLearningTask, datasets, fc, relu, seq
    plan = DeepLearningTask("s").model(seq(fc(64), relu(), fc(32), relu(), fc(10))).data(
        datasets.default_mnist(), batch_size=64).lock_memory().memory
    got = {(a.name, b.name, n) for a, b, n in plan.shared_bytes()}
    temps = [t for t in plan if t.region.reusable]
    want = set()
    for a in temps:
        for b in temps:
            lo, hi = max(a.offset, b.offset), min(a.offset + a.slot_bytes, b.offset + b.slot_bytes)
            if (a.offset, a.id) < (b.offset, b.id) and hi > lo:
                want.add((a.name, b.name, hi - lo))
    assert got == want and got  # liveness reuse shares some bytes here
    assert plan.live_overlaps() == []

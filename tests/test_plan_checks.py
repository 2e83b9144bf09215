"""Bad input to the low-level plan and graph API: a PlanError that names the argument and the
value, and (for finalize) a plan left exactly as it was."""
from __future__ import annotations

import re

import numpy as np
import pytest

from renaissance_nb import GraphId, MemoryPlan, PlanError, Region, TaskBase, node
from renaissance_nb.compiler.atlas import GraphAtlas
from renaissance_nb.compiler.graph import ComputationGraph
from renaissance_nb.memory.liveness import intervals_meet


def raises(call, *names: str) -> PlanError:  # type: ignore[no-untyped-def]
    """Run ``call``; it must raise a PlanError whose message holds every string of ``names``."""
    with pytest.raises(PlanError) as info:
        call()
    for text in names:
        assert text in str(info.value), (text, str(info.value))
    return info.value


def temps() -> TaskBase:
    """Two 100-float temporaries (ids 0, 1) and one feature map (id 2): all reusable."""
    t = TaskBase()
    t.alloc((100,), "float32", Region.T_TEMP_FP32, "a")
    t.alloc((100,), "float32", Region.T_TEMP_FP32, "b")
    t.alloc((10,), "float32", Region.F_FEATURE_FP32, "c")
    return t


def state(plan: MemoryPlan) -> tuple:
    return (plan.finalized, plan.reuse, dict(plan.lifetimes), dict(plan.regions), plan.total_bytes,
            plan.bytes_without_reuse, [(t.name, t.offset, t.slot_bytes) for t in plan])


# ---- 1. finalize(lifetimes) ------------------------------------------------------------------------
BAD_LIFETIMES = [
    ([(0, 1)], "lifetimes=[(0, 1)]"),
    (5, "lifetimes=5"),
    ({0: [(0, 3)], 1: (4, 6)}, "lifetimes[1]=(4, 6)"),
    ({0: (0, 1)}, "lifetimes[0]=(0, 1)"),
    ({0: [(0,)]}, "lifetimes[0] interval=(0,)"),
    ({0: [(0, 1, 2)]}, "lifetimes[0] interval=(0, 1, 2)"),
    ({0: [("a", "b")]}, "lifetimes[0] interval=('a', 'b')"),
    ({0: [(0.5, 2)]}, "lifetimes[0] interval=(0.5, 2)"),
    ({0: [(3, 3)], 1: [(5, 2)]}, "lifetimes[1] interval=(5, 2)"),
    ({"a": [(0, 1)]}, "lifetimes key='a'"),
    ({3: [(0, 1)]}, "lifetimes key=3"),
    ({-1: [(0, 1)]}, "lifetimes key=-1"),
    ({True: [(0, 1)]}, "lifetimes key=True"),
]


@pytest.mark.parametrize("lifetimes, named", BAD_LIFETIMES, ids=[n for _, n in BAD_LIFETIMES])
def test_bad_lifetimes_raise_and_leave_the_plan_unchanged(lifetimes, named: str) -> None:  # type: ignore[no-untyped-def]
    t = temps()
    before = state(t.memory)
    raises(lambda: t.finalize_memory(lifetimes), "finalize", named, "expected", "Fix:")
    assert state(t.memory) == before
    assert t.phase.name == "PLANNING"
    # a correct call afterwards works: a and b meet at step 3, so they get their own bytes
    t.finalize_memory({0: [(0, 3)], 1: [(3, 5)], 2: [(0, 1)]})
    a, b = t.memory["a"], t.memory["b"]
    assert a.end <= b.offset or b.end <= a.offset
    assert t.memory.live_overlaps() == []


def test_reversed_interval_no_longer_packs_live_tensors_together() -> None:
    p = MemoryPlan()
    p.alloc((64,), "float32", Region.T_TEMP_FP32, "a")
    p.alloc((64,), "float32", Region.T_TEMP_FP32, "b")
    raises(lambda: p.finalize({0: [(3, 3)], 1: [(5, 2)]}), "(5, 2)", "start <= end", "(2, 5)")
    assert not p.finalized and not p.reuse and p.lifetimes == {} and p.regions == {}
    p.finalize({0: [(3, 3)], 1: [(2, 5)]})
    assert intervals_meet(p.lifetimes[0], p.lifetimes[1])
    assert p["a"].offset != p["b"].offset and p.live_overlaps() == []


def test_lifetimes_are_copied_as_plain_ints() -> None:
    p = MemoryPlan()
    p.alloc((64,), "float32", Region.T_TEMP_FP32, "a")
    p.alloc((64,), "float32", Region.T_TEMP_FP32, "b")
    given = {np.int64(0): [[np.int32(0), 1]], 1: ((2, np.int64(4)),)}
    p.finalize(given)
    assert p.lifetimes == {0: [(0, 1)], 1: [(2, 4)]}
    assert all(type(x) is int for iv in p.lifetimes.values() for pair in iv for x in pair)
    given[1] = [(0, 9)]  # the caller's dict is not the plan's
    assert p.lifetimes[1] == [(2, 4)]
    assert p["a"].offset == p["b"].offset  # lifetimes that never meet still share bytes


# ---- 2. region_range --------------------------------------------------------------------------------
@pytest.fixture()
def plan() -> MemoryPlan:
    p = MemoryPlan("p")
    p.alloc((4,), "float32", Region.W_FC_BIAS)
    p.alloc((64,), "float32", Region.W_FC_WEIGHT)
    p.alloc((64,), "float32", Region.G_FC_WEIGHT)
    return p.finalize()


def test_region_range_refuses_reversed_regions(plan: MemoryPlan) -> None:
    raises(lambda: plan.region_range(Region.G_FC_WEIGHT, Region.W_FC_BIAS),
           "region_range", "last=<Region.W_FC_BIAS: 8>", "first=G_FC_WEIGHT", "swap first and last")


@pytest.mark.parametrize("first, last, named", [
    ("NOPE", Region.W_FC_BIAS, "first='NOPE'"),
    (Region.W_FC_BIAS, Region.END, "last=<Region.END: 68>"),
    ("END", Region.END, "first='END'"),
    (8, Region.W_FC_WEIGHT, "first=8"),
    (Region.W_FC_BIAS, None, "last=None"),
])
def test_region_range_refuses_what_is_not_a_named_region(plan: MemoryPlan, first, last, named) -> None:  # type: ignore[no-untyped-def]
    raises(lambda: plan.region_range(first, last), "region_range", named, "Region member")


def test_region_range_takes_members_and_names(plan: MemoryPlan) -> None:
    span = plan.region_range(Region.W_FC_BIAS, Region.W_FC_WEIGHT)
    assert span == plan.region_range("W_FC_BIAS", "W_FC_WEIGHT")
    assert span == (plan.regions[Region.W_FC_BIAS].base, plan.regions[Region.W_FC_WEIGHT].end)
    assert plan.region_range(Region.G_FC_WEIGHT, Region.G_FC_WEIGHT) == (plan["t2"].offset, plan["t2"].end)


# ---- 3. alloc ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, named", [
    ({"slot_bytes": "x"}, "slot_bytes='x'"),
    ({"slot_bytes": 100.9}, "slot_bytes=100.9"),
    ({"slot_bytes": True}, "slot_bytes=True"),
    ({"slot_bytes": 8}, "slot_bytes=8"),
    ({"name": 5}, "name=5"),
    ({"name": b"x"}, "name=b'x'"),
    ({"dtype": None}, "dtype=None"),
    ({"shape": True}, "shape=True"),
    ({"shape": (True, 2)}, "shape=(True, 2)"),
    ({"shape": (2, 0)}, "shape=(2, 0)"),
    ({"pitch": True}, "pitch=True"),
])
def test_alloc_refuses_bad_arguments_and_records_nothing(kwargs, named: str) -> None:  # type: ignore[no-untyped-def]
    p = MemoryPlan()
    args = {"shape": (4,), "dtype": "float32", "region": Region.T_TEMP_FP32, "name": "a", **kwargs}
    raises(lambda: p.alloc(**args), "alloc", named, "expected", "Fix:")
    assert len(p) == 0
    p.alloc((4,), "float32", Region.T_TEMP_FP32, "a")  # the name was not taken by the failed call
    assert p["a"].id == 0


def test_alloc_accepts_numpy_ints() -> None:
    p = MemoryPlan()
    t = p.alloc(np.int64(4), "float32", Region.T_TEMP_FP32, "a", slot_bytes=np.int32(64))
    assert t.shape == (4,) and t.slot_bytes == 64 and type(t.slot_bytes) is int
    assert p.alloc((np.int64(2), 3), "float32", Region.T_TEMP_FP32).shape == (2, 3)


# ---- 4. plan[...] and DTensor.end --------------------------------------------------------------------
def test_getitem_refuses_bools_and_end_needs_a_finalized_plan() -> None:
    p = MemoryPlan()
    p.alloc((4,), "float32", Region.T_TEMP_FP32, "a")
    b = p.alloc((4,), "float32", Region.T_TEMP_FP32, "b")
    raises(lambda: p[True], "tensor id=True", "an int in [0, 2)")
    assert not p.has(True) and p.has(np.int64(1))
    assert p[np.int64(1)].name == "b"
    raises(lambda: b.end, "'b'", "finalize_memory()")
    p.finalize()
    assert b.end == p["b"].offset + b.slot_bytes


# ---- 5. graph.py --------------------------------------------------------------------------------------
def test_node_takes_one_bare_id_and_refuses_what_is_not_an_id() -> None:
    assert node("relu", 0, 1) == node("relu", [0], [1])
    assert node("relu", np.int64(0), (np.int64(1),)).inputs == (0,)
    assert node("fill", [], 2, value=0.0).outputs == (2,)
    raises(lambda: node("relu", [True], [1]), "node", "inputs=[True]", "tensor ids")
    raises(lambda: node("relu", [0], True), "node", "outputs=True")
    raises(lambda: node("relu", [0.0], [1]), "inputs=[0.0]")
    raises(lambda: node("relu", [-1], [1]), "inputs=[-1]", "ints >= 0")
    raises(lambda: node("relu", "x", [1]), "inputs='x'")
    raises(lambda: node("relu", None, [1]), "inputs=None")
    raises(lambda: node(5, [0], [1]), "op=5")
    t = TaskBase()
    x = t.alloc((2,), "float32", Region.T_TEMP_FP32, "x")
    raises(lambda: node("relu", [x], [1]), "inputs=[DTensor(", ".id")


def test_graph_append_nodes_and_as_text_check_their_arguments() -> None:
    g = ComputationGraph("cg")
    for gid in (999, -1, True, "OPTIMISER", None):
        raises(lambda: g.append(gid, node("relu", [0], [1])), "append", f"gid={gid!r}", "GraphId")
    raises(lambda: g.nodes(999), "gid=999", "GraphId")
    raises(lambda: g.append(GraphId.OPTIMIZER, ("relu", [0], [1])), "append", "GraphNode")
    assert len(g) == 0 and g.buckets == {}
    g.append("OPTIMIZER", node("relu", [0], [1]))
    g.append(GraphId.DEEP_FWD_BWD, node("copy", [1], [0]))
    assert g.ids() == [GraphId.DEEP_FWD_BWD, GraphId.OPTIMIZER] and len(g.nodes("OPTIMIZER")) == 1
    raises(lambda: g.as_text(["a", "b"]), "as_text", "names=['a', 'b']", "MemoryPlan")
    raises(lambda: g.as_text(5), "names=5")
    assert "relu(a) -> b" in g.as_text({0: "a", 1: "b"})
    t = TaskBase()
    t.alloc((2,), "float32", Region.T_TEMP_FP32, "x")
    t.alloc((2,), "float32", Region.T_TEMP_FP32, "y")
    assert "relu(x) -> y" in g.as_text(t.memory)


# ---- 6. atlas ---------------------------------------------------------------------------------------
@pytest.fixture()
def atlas() -> GraphAtlas:
    a = GraphAtlas(("train_base", "val_base"))
    a.table[0][GraphId.OPTIMIZER] = 0
    return a


def test_atlas_lookup_checks_the_variant_index_and_gid(atlas: GraphAtlas) -> None:
    assert atlas.lookup(0, GraphId.OPTIMIZER) == 0 and atlas.lookup(np.int64(1), "OPTIMIZER") == -1
    for vi in (99, 2, -1, True, "train_base", 0.0):
        err = raises(lambda: atlas.lookup(vi, GraphId.OPTIMIZER), "lookup", f"variant_index={vi!r}", "[0, 2)")
        assert "train_base" in str(err)
    raises(lambda: atlas.lookup(0, 999), "lookup", "gid=999", "GraphId")


def test_atlas_entry_checks_the_variant_and_gid(atlas: GraphAtlas) -> None:
    assert atlas.entry("train_base", "OPTIMIZER") is None  # a name is a GraphId; no entry recorded here
    raises(lambda: atlas.entry("train_base", 999), "entry", "gid=999")
    raises(lambda: atlas.entry("train_base", "OPTIMISER"), "gid='OPTIMISER'")
    err = raises(lambda: atlas.entry("train_bsae", GraphId.OPTIMIZER), "entry", "variant='train_bsae'")
    assert re.search(r"'train_base', 'val_base'", str(err))


@pytest.mark.parametrize("n, batch, ranks, part", [(40, 4, 4, "every"), (42, 8, 2, "the last")])
def test_a_batch_norm_on_one_sample_per_rank_names_the_ranks(n: int, batch: int, ranks: int, part: str) -> None:
    """With data-parallel ranks the batch a batch norm sees is one rank's share: the message says so,
    instead of blaming a last batch (40 samples in batches of 4 have none)."""
    from renaissance_nb import ConfigError, DeepLearningTask, bn, fc, seq
    t = (DeepLearningTask().model(seq(fc(8), bn(), fc(4)))
         .data(train=(np.zeros((n, 8), np.float32), np.arange(n) % 4), batch_size=batch).distributed("mpi", ranks=ranks))
    with pytest.raises(ConfigError, match=rf"on {ranks} ranks, each rank gets 1 sample of {part} step.*at least "
                                          rf"{2 * ranks}"):
        t.plan()

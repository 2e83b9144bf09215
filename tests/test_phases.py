"""The phase machine: PLANNING -> MEMORY_LOCKED -> COMPILED, enforced call by call.

Every phase-guarded call made in the wrong phase raises PhaseError naming the
operation, the current phase and the phase it needs; afterwards the task is
unchanged and still goes on to compile and compute correct numbers.
"""
from __future__ import annotations

import numpy as np
import pytest

from renaissance_nb import (SGD, CosineAnnealingLR, CrossEntropyLoss, DeepLearningTask, Phase, PhaseError, PlanError,
                           Region, StreamKind, TaskBase, fc, node, relu, seq)
from renaissance_nb.errors import RenaissanceError

RNG = np.random.default_rng(0)
X_VAL = RNG.standard_normal((4, 3)).astype(np.float32)
W_VAL = RNG.standard_normal((5, 3)).astype(np.float32)
B_VAL = RNG.standard_normal(5).astype(np.float32)


def expect_phase_error(call, operation: str, current: Phase | str, needed: str):
    with pytest.raises(PhaseError) as info:
        call()
    err = info.value
    msg = str(err)
    assert f"{operation}()" in msg, msg
    assert f"phase {current}" in msg, msg
    assert str(needed) in msg, msg
    assert err.operation == operation
    assert isinstance(err, RuntimeError) and isinstance(err, RenaissanceError)
    return err


def planned_fc_task():
    """The issue's hand-built example, up to (not including) finalize_memory()."""
    t = TaskBase("fc")
    x = t.alloc((4, 3), "float32", Region.I_A_DATA, "X")
    w = t.alloc((5, 3), "float32", Region.W_FC_WEIGHT, "W")
    b = t.alloc((5,), "float32", Region.W_FC_BIAS, "b")
    y = t.alloc((4, 5), "float32", Region.F_FEATURE_FP32, "Y")
    return t, x, w, b, y


def fc_graph(x, w, b, y):
    return [node("fc_fwd", [x.id, w.id, b.id], [y.id], act="relu", slope=0.0)]


def check_fc_numbers(t, x, w, b, y) -> None:
    t.write(x, X_VAL)
    t.write(w, W_VAL)
    t.write(b, B_VAL)
    t.run("fwd")
    np.testing.assert_allclose(t.read(y), np.maximum(X_VAL @ W_VAL.T + B_VAL, 0), rtol=1e-6, atol=1e-6)


# ---- TaskBase: the documented example ---------------------------------------------------------------
def test_hand_built_fc_graph_computes_relu_of_affine() -> None:
    t, x, w, b, y = planned_fc_task()
    assert t.phase is Phase.PLANNING
    plan = t.finalize_memory()
    assert t.phase is Phase.MEMORY_LOCKED
    assert all(d.offset % 256 == 0 for d in plan)
    t.add_graph("fwd", fc_graph(x, w, b, y))
    t.compile()
    assert t.phase is Phase.COMPILED
    check_fc_numbers(t, x, w, b, y)
    assert (t.read(y) == 0).any() and (t.read(y) > 0).any()  # relu actually clipped something
    # read returns a copy; write broadcasts
    t.read(y)[...] = 123.0
    assert not (t.read(y) == 123.0).all()
    t.write(b, 0.0)
    assert (t.read("b") == 0).all()
    assert [tr.target for tr in t.transitions] == [Phase.MEMORY_LOCKED, Phase.COMPILED]


def test_generic_matmul_add_relu_graph() -> None:
    t = TaskBase("generic")
    a = t.alloc((4, 3), "float32", Region.I_A_DATA, "a")
    bm = t.alloc((5, 3), "float32", Region.W_FC_WEIGHT, "bm")
    bias = t.alloc((5,), "float32", Region.W_FC_BIAS, "bias")
    c = t.alloc((4, 5), "float32", Region.F_FEATURE_FP32, "c")
    d = t.alloc((4, 5), "float32", Region.F_FEATURE_FP32, "d")
    e = t.alloc((4, 5), "float32", Region.F_FEATURE_FP32, "e")
    t.finalize_memory()
    t.add_graph("g", [node("matmul", [a.id, bm.id], [c.id], trans_b=True), node("add", [c.id, bias.id], [d.id]),
                      node("relu", [d.id], [e.id])], StreamKind.COMP_2)
    t.compile()
    t.write(a, X_VAL)
    t.write(bm, W_VAL)
    t.write(bias, B_VAL)
    t.run("g")
    np.testing.assert_allclose(t.read(c), X_VAL @ W_VAL.T, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(t.read(d), X_VAL @ W_VAL.T + B_VAL, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(t.read(e), np.maximum(X_VAL @ W_VAL.T + B_VAL, 0), rtol=1e-6, atol=1e-6)


# ---- TaskBase: wrong phases ---------------------------------------------------------------------------
def test_run_read_write_compile_add_graph_in_planning_raise_and_task_still_works() -> None:
    t, x, w, b, y = planned_fc_task()
    expect_phase_error(lambda: t.run("fwd"), "run", Phase.PLANNING, "COMPILED")
    expect_phase_error(lambda: t.read(y), "read", Phase.PLANNING, "COMPILED")
    expect_phase_error(lambda: t.write(y, 1.0), "write", Phase.PLANNING, "COMPILED")
    expect_phase_error(lambda: t.compile(), "compile", Phase.PLANNING, "MEMORY_LOCKED")
    expect_phase_error(lambda: t.add_graph("fwd", fc_graph(x, w, b, y)), "add_graph", Phase.PLANNING,
                       "MEMORY_LOCKED")
    assert t.phase is Phase.PLANNING and len(t.memory) == 4 and not t.memory.finalized
    extra = t.alloc((2,), "float32", Region.T_TEMP_FP32, "extra")  # PLANNING still allows alloc
    assert extra.id == 4
    t.finalize_memory()
    t.add_graph("fwd", fc_graph(x, w, b, y))
    t.compile()
    check_fc_numbers(t, x, w, b, y)


def test_alloc_after_finalize_and_finalize_twice_raise() -> None:
    t, x, w, b, y = planned_fc_task()
    t.finalize_memory()
    offsets = [d.offset for d in t.memory]
    expect_phase_error(lambda: t.alloc((3,), "float32", Region.T_TEMP_FP32), "alloc", Phase.MEMORY_LOCKED,
                       "PLANNING")
    expect_phase_error(lambda: t.finalize_memory(), "finalize_memory", Phase.MEMORY_LOCKED, "PLANNING")
    expect_phase_error(lambda: t.run("fwd"), "run", Phase.MEMORY_LOCKED, "COMPILED")
    expect_phase_error(lambda: t.read(x), "read", Phase.MEMORY_LOCKED, "COMPILED")
    expect_phase_error(lambda: t.write(x, X_VAL), "write", Phase.MEMORY_LOCKED, "COMPILED")
    assert t.phase is Phase.MEMORY_LOCKED and len(t.memory) == 4
    assert [d.offset for d in t.memory] == offsets
    t.add_graph("fwd", fc_graph(x, w, b, y))
    t.compile()
    check_fc_numbers(t, x, w, b, y)
    # COMPILED: planning and locking operations are refused; the arena keeps working
    expect_phase_error(lambda: t.alloc((3,), "float32", Region.T_TEMP_FP32), "alloc", Phase.COMPILED, "PLANNING")
    expect_phase_error(lambda: t.finalize_memory(), "finalize_memory", Phase.COMPILED, "PLANNING")
    expect_phase_error(lambda: t.add_graph("g2", fc_graph(x, w, b, y)), "add_graph", Phase.COMPILED,
                       "MEMORY_LOCKED")
    expect_phase_error(lambda: t.compile(), "compile", Phase.COMPILED, "MEMORY_LOCKED")
    assert t.phase is Phase.COMPILED
    check_fc_numbers(t, x, w, b, y)


# ---- failed calls leave the task as it was -------------------------------------------------------------
@pytest.mark.parametrize("bad", [
    dict(shape=(4, 3), dtype="float32", region="NOT_A_REGION"),
    dict(shape=(4, 3), dtype="float32", region=Region.END),
    dict(shape=(4, 3), dtype="float32", region=None),
    dict(shape=(4, 3), dtype="complex64", region=Region.T_TEMP_FP32),
    dict(shape=(4, 3), dtype="no_such_dtype", region=Region.T_TEMP_FP32),
    dict(shape=(4, 0), dtype="float32", region=Region.T_TEMP_FP32),
    dict(shape="abc", dtype="float32", region=Region.T_TEMP_FP32),
])
def test_failed_alloc_leaves_planning_task_usable(bad) -> None:
    t, x, w, b, y = planned_fc_task()
    with pytest.raises(PlanError):
        t.alloc(bad["shape"], bad["dtype"], bad["region"])
    assert t.phase is Phase.PLANNING and len(t.memory) == 4
    with pytest.raises(PlanError):  # duplicate name
        t.alloc((2,), "float32", Region.T_TEMP_FP32, "X")
    assert len(t.memory) == 4
    t.finalize_memory()
    t.add_graph("fwd", fc_graph(x, w, b, y))
    t.compile()
    check_fc_numbers(t, x, w, b, y)


def test_failed_add_graph_leaves_locked_task_usable() -> None:
    t, x, w, b, y = planned_fc_task()
    t.finalize_memory()
    cases = [
        [node("fc_fwd", [x.id, w.id, 99], [y.id], act="relu", slope=0.0)],   # bad tensor id
        [node("no_such_op", [x.id], [y.id])],                                # unknown op
        [],                                                                  # empty graph
        ["not a node"],
    ]
    for nodes in cases:
        with pytest.raises(PlanError) as info:
            t.add_graph("fwd", nodes)
        assert "fwd" in str(info.value) or "graph" in str(info.value)
        assert t.phase is Phase.MEMORY_LOCKED
    with pytest.raises(PlanError, match=r"outputs=\[-1\]"):  # a negative id is refused by node() itself
        node("fc_fwd", [x.id, w.id, b.id], [-1], act="relu", slope=0.0)
    with pytest.raises(PlanError):
        t.add_graph("", fc_graph(x, w, b, y))
    with pytest.raises(PlanError):
        t.add_graph("fwd", fc_graph(x, w, b, y), stream="COMP_1")  # type: ignore[arg-type]
    assert t.phase is Phase.MEMORY_LOCKED
    t.add_graph("fwd", fc_graph(x, w, b, y))  # the name was never taken by the failed calls
    with pytest.raises(PlanError):
        t.add_graph("fwd", fc_graph(x, w, b, y))  # now it is
    t.compile()
    check_fc_numbers(t, x, w, b, y)
    # failed COMPILED calls: unknown graph, bad value, unknown tensor
    with pytest.raises(PlanError):
        t.run("nope")
    with pytest.raises(PlanError):
        t.write(x, np.zeros((7, 7)))
    with pytest.raises(PlanError):
        t.read(42)
    with pytest.raises(PlanError):
        t.read("nope")
    assert t.phase is Phase.COMPILED
    check_fc_numbers(t, x, w, b, y)


def test_finalize_of_empty_plan_fails_and_stays_in_planning() -> None:
    t = TaskBase()
    with pytest.raises(PlanError):
        t.finalize_memory()
    assert t.phase is Phase.PLANNING
    a = t.alloc((2, 2), "float32", Region.T_TEMP_FP32)
    c = t.alloc((2, 2), "float32", Region.T_TEMP_FP32)
    t.finalize_memory()
    t.add_graph("r", [node("relu", [a.id], [c.id])])
    t.compile()
    t.write(a, [[-1.0, 2.0], [3.0, -4.0]])
    t.run("r")
    np.testing.assert_array_equal(t.read(c), [[0.0, 2.0], [3.0, 0.0]])


# ---- DeepLearningTask -------------------------------------------------------------------------------
def small_data(n: int = 96, d: int = 6, classes: int = 3):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, d)).astype(np.float32)
    y = rng.integers(0, classes, n)
    return x, y


def small_task() -> DeepLearningTask:
    x, y = small_data()
    return (DeepLearningTask("small").model(seq(fc(8), relu(), fc(3))).data(train=(x, y), val=(x[:32], y[:32]),
                                                                            batch_size=32).total_epochs(2))


SETTERS = {
    "model": lambda t: t.model(seq(fc(4), fc(3))),
    "data": lambda t: t.data(train=small_data(), batch_size=16),
    "loss": lambda t: t.loss(CrossEntropyLoss().label_smoothing(0.1)),
    "optimizer": lambda t: t.optimizer(SGD().lr(0.1)),
    "scheduler": lambda t: t.scheduler(CosineAnnealingLR()),
    "total_epochs": lambda t: t.total_epochs(3),
    "seed": lambda t: t.seed(7),
    "options": lambda t: t.options(fuse=False),
}


@pytest.mark.parametrize("stage", ["plan", "lock_memory", "compile"])
def test_settings_cannot_change_after_plan(stage: str) -> None:
    t = small_task()
    getattr(t, stage)()
    arch = t.arch
    for name, setter in SETTERS.items():
        with pytest.raises(PhaseError) as info:
            setter(t)
        msg = str(info.value)
        assert f"{name}()" in msg
        assert f"The setting {name} can no longer change" in msg
        assert "PLANNING (before plan())" in msg
        assert str(t.phase) in msg
    assert t.arch is arch and t.steps_per_epoch == 3 and t.total_steps == 6  # nothing changed
    res = t.run(progress=False)
    assert len(res.history) == 2 and np.isfinite(res.step_losses).all()
    assert len(res.step_losses) == 2 * 3


def test_reset_allows_settings_again() -> None:
    t = small_task()
    t.compile()
    t.reset()
    assert t.phase is Phase.PLANNING and t.arch is None
    t.total_epochs(1).seed(3)
    res = t.run(progress=False)
    assert len(res.history) == 1


def test_run_from_planning_compiles_first() -> None:
    t = small_task()
    assert t.phase is Phase.PLANNING
    res = t.run(progress=False)
    assert t.phase is Phase.COMPILED
    assert [tr.target for tr in t.transitions if tr.source is not tr.target] == [Phase.MEMORY_LOCKED, Phase.COMPILED]
    assert len(res.history) == 2 and res.history[-1].steps == 6
    t2 = small_task()
    t2.lock_memory()
    t2.run(progress=False)  # from MEMORY_LOCKED too
    assert t2.phase is Phase.COMPILED
    for k, v in t.state_dict().items():
        np.testing.assert_array_equal(v, t2.state_dict()[k])


def test_inference_and_parameters_before_compile_raise() -> None:
    x, y = small_data()
    for stage in (None, "plan", "lock_memory"):
        t = small_task()
        if stage:
            getattr(t, stage)()
        phase = t.phase
        expect_phase_error(lambda: t.evaluate(x, y), "evaluate", phase, "COMPILED")
        expect_phase_error(lambda: t.predict(x), "predict", phase, "COMPILED")
        expect_phase_error(lambda: t.state_dict(), "state_dict", phase, "COMPILED")
        expect_phase_error(lambda: t.load_state_dict({}), "load_state_dict", phase, "COMPILED")
        expect_phase_error(lambda: t.read("fc1.weight"), "read", phase, "COMPILED")
        expect_phase_error(lambda: t.write("fc1.weight", 0.0), "write", phase, "COMPILED")
        assert t.phase is phase
        t.compile()
        sd = t.state_dict()
        assert sd["fc1.weight"].shape == (8, 6) and sd["fc2.bias"].shape == (3,)
        np.testing.assert_array_equal(t.read("fc1.weight"), sd["fc1.weight"])
        r = t.evaluate(x, y)
        assert r["n"] == len(x) and 0.0 <= r["top1"] <= 1.0 and np.isfinite(r["loss"])
        assert t.predict(x).shape == (len(x),)


def test_deep_task_refuses_hand_allocation_and_locking_twice() -> None:
    t = small_task()
    with pytest.raises(PlanError):
        t.alloc((2,), "float32", Region.T_TEMP_FP32)
    with pytest.raises(PlanError):
        t.add_graph("g", [])
    t.lock_memory()
    expect_phase_error(lambda: t.lock_memory(), "lock_memory", Phase.MEMORY_LOCKED, "PLANNING")
    expect_phase_error(lambda: t.plan(), "plan", Phase.MEMORY_LOCKED, "PLANNING")
    t.compile()
    assert t.compile() is t  # compile() on a compiled task is a no-op
    res = t.run(progress=False)
    assert len(res.history) == 2

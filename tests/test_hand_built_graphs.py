"""Graphs built by hand on a TaskBase: a node that cannot run is refused when it is added, and
reads, writes and runs touch exactly the tensors they name.

Found by an audit of the low-level API: a bias shorter than the output made the numba bias
pass read the weight's bytes, a handle from another task wrote into this task's tensor of
the same id, and write() stored 300 into a uint8 tensor as 44.
"""
from __future__ import annotations

import numpy as np
import pytest

from renaissance_nb import PhaseError, PlanError, Region, TaskBase, node


def planned(*shapes: tuple[int, ...], dtype: str = "float32") -> tuple[TaskBase, list]:
    t = TaskBase("hand")
    ts = [t.alloc(s, dtype, Region.T_TEMP_FP32 if dtype == "float32" else Region.T_TEMP_INT32) for s in shapes]
    t.finalize_memory()
    return t, ts


@pytest.mark.parametrize("op, shapes, params, problem", [
    ("fc_fwd", [(1, 3), (100, 3), (2,), (1, 100)], {"act": "none"}, r"the bias has 2 values for 100 outputs"),
    ("fc_fwd", [(4, 3), (5, 2), (4, 5)], {}, r"needs x \(m, k\), W \(n, k\), y \(m, n\)"),
    ("fc_fwd", [(4, 3), (5, 3), (4, 5)], {"act": "swish"}, r"act='swish' is not one of"),
    ("act_fwd", [(4, 5), (3,)], {"act": "tanh"}, r"needs equal shapes; got \(4, 5\) -> \(3,\)"),
    ("act_fwd", [(4, 5), (4, 5)], {}, r"act=None is not one of"),
    ("relu", [(4, 5), (4, 4)], {}, r"needs equal shapes"),
    ("add", [(4, 5), (3,), (4, 5)], {}, r"add of \(4, 5\) and \(3,\) does not broadcast to the output"),
    ("copy", [(4, 5), (4, 4)], {}, r"copy of \(4, 5\) does not broadcast"),
    ("matmul", [(4, 3), (4, 5), (4, 5)], {}, r"op\(a\) \(4, 3\) @ op\(b\) \(4, 5\) does not give c"),
    ("reshape_copy", [(4, 5), (21,)], {}, r"keeps the number of values"),
    ("mul", [(4, 5)], {}, r"mul takes 2 inputs and 1 output; got 0 and 1"),
])
def test_a_node_whose_operands_do_not_fit_is_refused_at_add_graph(op, shapes, params, problem) -> None:  # type: ignore[no-untyped-def]
    t, ts = planned(*shapes)
    ids = [x.id for x in ts]
    ins, outs = ids[:-1], ids[-1:]
    with pytest.raises(PlanError, match=problem):
        t.add_graph("g", [node(op, ins, outs, **params)])
    assert t.registered_graphs == {}  # nothing registered: a corrected graph can take the name


def test_the_refused_short_bias_used_to_read_the_weights() -> None:
    """The shape the audit found: a correct bias gives the right numbers where the short one read W."""
    t, (x, w, b, y) = planned((1, 3), (100, 3), (100,), (1, 100))
    t.add_graph("fwd", [node("fc_fwd", [x.id, w.id, b.id], [y.id])])  # act defaults to none
    t.compile()
    t.write(w, 7.0)
    t.write(b, 1.0)
    t.write(x, 0.0)
    t.run("fwd")
    np.testing.assert_array_equal(t.read(y), np.ones((1, 100), np.float32))


def test_mul_broadcasts_like_numpy() -> None:
    t, (a, s, out) = planned((4, 5), (5,), (4, 5))
    t.add_graph("g", [node("mul", [a.id, s.id], [out.id])])
    t.compile()
    av = np.arange(20, dtype=np.float32).reshape(4, 5)
    t.write(a, av)
    t.write(s, np.arange(1, 6))
    t.run("g")
    np.testing.assert_array_equal(t.read(out), av * np.arange(1, 6, dtype=np.float32))


def test_a_registered_graph_can_be_removed_and_replaced_before_compile() -> None:
    t, (x, y) = planned((4, 3), (4, 3))
    t.add_graph("g", [node("fill", [], [y.id], value=2.0)])
    t.remove_graph("g")
    with pytest.raises(PlanError, match=r"remove_graph: name='g'"):
        t.remove_graph("g")
    t.add_graph("g", [node("relu", [x.id], [y.id])])
    t.compile()
    with pytest.raises(PhaseError):
        t.remove_graph("g")
    t.write(x, -np.eye(4, 3) + 0.5)
    t.run("g")
    np.testing.assert_array_equal(t.read(y), np.maximum(-np.eye(4, 3) + 0.5, 0).astype(np.float32))


def test_handles_of_another_task_are_refused() -> None:
    t, (x, _) = planned((4, 3), (5, 3))
    t.add_graph("g", [node("fill", [], [x.id], value=1.0)])
    t.compile()
    other, (z, q) = planned((2, 2), (5, 3))
    for call in (lambda: t.write(z, 7.0), lambda: t.read(q)):
        with pytest.raises(PlanError, match=r"tensor=.* expected a tensor of this task's plan 'hand'"):
            call()
    assert (t.read(x) == 0).all()
    with pytest.raises(PlanError, match="tensor=True"):
        t.read(True)


@pytest.mark.parametrize("value", [300, -1, np.array([300, 1, 2]), 1.7, np.array([np.inf, 1, 2]), None, "3"])
def test_write_refuses_values_the_dtype_cannot_hold(value) -> None:  # type: ignore[no-untyped-def]
    t = TaskBase("ints")
    small = t.alloc((3,), "uint8", Region.T_TEMP_INT32)
    t.finalize_memory()
    t.add_graph("g", [node("fill", [], [small.id], value=5)])
    t.compile()
    t.write(small, [1, 2, 255])
    with pytest.raises(PlanError, match=r"write: value=.*that uint8 holds \(whole numbers"):
        t.write(small, value)
    assert t.read(small).tolist() == [1, 2, 255]
    t.write(small, np.array([3.0, 4.0, 5.0]))  # whole floats fit
    assert t.read(small).tolist() == [3, 4, 5]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_write_refuses_finite_values_beyond_a_float_range(dtype: str) -> None:
    """1e300 into float32 was stored as inf with only NumPy's overflow warning (the next run then failed on a
    non-finite loss, blaming the learning rate); NaN and inf written on purpose stay allowed."""
    t = TaskBase("floats")
    w = t.alloc((3,), dtype, Region.T_TEMP_FP32)
    t.finalize_memory()
    t.add_graph("g", [node("fill", [], [w.id], value=0)])
    t.compile()
    t.write(w, [1.0, -2.0, 0.5])
    big = {"float32": 1e300, "float16": 7e4, "bfloat16": 4e38}[dtype]
    for value in (big, [1.0, -big, 2.0]):
        with pytest.raises(PlanError, match=rf"write: value=.*that {dtype} holds .*finite values within its range"):
            t.write(w, value)
    assert t.read(w).astype(np.float32).tolist() == [1.0, -2.0, 0.5]
    t.write(w, [np.inf, np.nan, 3.0])
    got = t.read(w).astype(np.float32)
    assert np.isinf(got[0]) and np.isnan(got[1]) and got[2] == 3.0


def test_add_graph_and_run_name_their_bad_arguments() -> None:
    t, (x, y) = planned((2,), (2,))
    for bad in (5, None, "relu"):
        with pytest.raises(PlanError, match=r"add_graph: graph="):
            t.add_graph("g", bad)  # type: ignore[arg-type]
    t.add_graph("g", (node("relu", [x.id], [y.id]),))
    t.compile()
    with pytest.raises(PlanError, match=r"run: name=\['g'\]"):
        t.run(["g"])  # type: ignore[arg-type]
    with pytest.raises(PlanError, match=r"fill: parameter value=\[1, 2\]|value=\[1, 2\] is not one number"):
        t2, (z,) = planned((2,))
        t2.add_graph("f", [node("fill", [], [z.id], value=[1, 2])])


def test_a_bfloat16_read_writes_back_and_ints_past_a_float_range_are_refused() -> None:
    """read() of a bfloat16 tensor gives an ml_dtypes array, which write() refused (its kind is not a number's);
    an int beyond float16's range was stored as inf, as a float one was."""
    import ml_dtypes
    t = TaskBase("bf")
    a = t.alloc((2, 2), "bfloat16", Region.T_TEMP_FP32)
    h = t.alloc((2,), "float16", Region.T_TEMP_FP32)
    t.finalize_memory()
    t.add_graph("g", [node("fill", [], [a.id], value=0), node("fill", [], [h.id], value=0)])
    t.compile()
    t.write(a, [[1.5, -2.0], [0.25, 3.0]])
    v = t.read(a)
    assert v.dtype == ml_dtypes.bfloat16
    t.write(a, v)
    assert t.read(a).tobytes() == v.tobytes()
    for big in (100000, np.int64(100000), [1, 100000]):
        with pytest.raises(PlanError, match="finite values within its range"):
            t.write(h, big)
    assert t.read(h).tolist() == [0.0, 0.0]


def test_nodes_the_kernels_would_run_out_of_bounds_or_wrongly_are_refused() -> None:
    """softmax_xent with a gradient not shaped as the logits wrote past it into another tensor; fc_bwd with y
    of other rows summed the wrong bias gradient; fc with act='silu' or 'gelu' skipped the activation (the fused
    pass computes codes 0-4 only); NumPy scalars are values for fill."""
    t = TaskBase("nodes")
    f = Region.F_FEATURE_FP32
    z, d = t.alloc((200, 10), "float32", f), t.alloc((10, 10), "float32", f)
    y, r = t.alloc((200,), "int64", Region.I_A_DATA), t.alloc((3,), "float32", Region.S_SCALAR_FP32)
    x, w, out = t.alloc((8, 3), "float32", f), t.alloc((4, 3), "float32", Region.W_FC_WEIGHT), t.alloc((8, 4), "float32", f)
    small, ones = t.alloc((2, 4), "float32", f), t.alloc((8,), "float32", f)
    dw, db = t.alloc((4, 3), "float32", Region.G_FC_WEIGHT), t.alloc((4,), "float32", Region.G_FC_BIAS)
    t.finalize_memory()
    bad = {"xent": node("softmax_xent", [z.id, y.id], [r.id, d.id], grad=True, smoothing=0.0),
           "fc_bwd": node("fc_bwd", [out.id, x.id, w.id, small.id, ones.id], [dw.id, db.id], bias=True,
                          need_dx=False, act="relu"),
           "silu": node("fc_fwd", [x.id, w.id], [out.id], act="silu"),
           "gelu": node("fc_fwd", [x.id, w.id], [out.id], act="gelu")}
    for name, n in bad.items():
        with pytest.raises(PlanError, match=r"logits' gradient must be shaped|y must hold|act='(silu|gelu)' is not"):
            t.add_graph(name, [n])
    assert t.registered_graphs == {}
    t.add_graph("ok", [node("fill", [], [x.id], value=np.float32(0.5)), node("fc_fwd", [x.id, w.id], [out.id], act="tanh")])


def test_dtypes_the_kernels_cannot_take_are_refused_at_add_graph() -> None:
    """A float copied into an int tensor, float labels, a fill value an int tensor cannot hold: each raised a
    raw NumPy or numba error the first time the graph ran; add_graph refuses them, naming the dtypes."""
    t = TaskBase("dtypes")
    f32, i32 = t.alloc((4,), "float32", Region.T_TEMP_FP32), t.alloc((4,), "int32", Region.T_TEMP_INT32)
    u8 = t.alloc((4,), "uint8", Region.T_TEMP_INT32)
    z, flabels = t.alloc((4, 3), "float32", Region.F_FEATURE_FP32), t.alloc((4,), "float32", Region.T_TEMP_FP32)
    r = t.alloc((3,), "float32", Region.S_SCALAR_FP32)
    t.finalize_memory()
    for n, words in ((node("copy", [f32.id], [i32.id]), "copy of float32 into an int32 tensor"),
                     (node("add", [f32.id, i32.id], [i32.id]), "into an int32 tensor"),
                     (node("softmax_xent", [z.id, flabels.id], [r.id], grad=False, smoothing=0.0), "labels must be integers"),
                     (node("fill", [], [u8.id], value=-1), r"value=-1 is not a whole number in \[0, 255\]"),
                     (node("fill", [], [i32.id], value=0.5), "value=0.5 is not a whole number")):
        with pytest.raises(PlanError, match=words):
            t.add_graph("g", [n])
    t.add_graph("ok", [node("copy", [i32.id], [f32.id]), node("fill", [], [u8.id], value=255)])

"""renaissance_nb.tracing: a Python function traced into forward and backward graphs that compute what
NumPy computes, one variant per input shape, buckets that pad, and refusals that say why."""
from __future__ import annotations

import numpy as np
import pytest

from renaissance_nb.errors import TraceError
from renaissance_nb.tracing import RULES, Jit, relu, tanh, trace

RNG = np.random.default_rng(0)


def f(x, w, b):  # type: ignore[no-untyped-def]
    h = relu(x @ w + b)
    return h * h + tanh(h)


def loss(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> float:
    h = np.maximum(x @ w + b, 0)
    return float((h * h + np.tanh(h)).sum())


def numeric_grad(args: dict[str, np.ndarray], name: str, eps: float = 1e-5) -> np.ndarray:
    base = {k: v.astype(np.float64) for k, v in args.items()}
    out = np.zeros_like(base[name])
    for i in np.ndindex(out.shape):
        up, down = dict(base), dict(base)
        up[name], down[name] = base[name].copy(), base[name].copy()
        up[name][i] += eps
        down[name][i] -= eps
        out[i] = (loss(**up) - loss(**down)) / (2 * eps)
    return out


def test_forward_and_reverse_mode_match_numpy_and_finite_differences() -> None:
    c = trace(f, x=(4, 3), w=(3, 2), b=(1, 2))
    args = {"x": RNG.standard_normal((4, 3)), "w": RNG.standard_normal((3, 2)), "b": RNG.standard_normal((1, 2))}
    out, grads = c.run(**args)
    h = np.maximum(args["x"] @ args["w"] + args["b"], 0)
    assert np.abs(out - (h * h + np.tanh(h))).max() < 1e-5
    for name in args:
        assert grads[name].shape == args[name].shape
        assert np.abs(grads[name] - numeric_grad(args, name)).max() < 1e-3, name
    assert [n.op for n in c.forward] == ["matmul", "add", "relu", "mul", "act_fwd", "add"]
    assert c.rules[0].startswith("seed") and len(c.rules) == 1 + len(c.forward)
    assert RULES["matmul"] in c.rules[-1] and "matmul(dv1, w) -> dx   [trans_b=True]" in c.as_text()
    assert c.task.memory.live_overlaps() == [] and c.task.memory.total_bytes < c.task.memory.bytes_without_reuse


def test_a_branch_on_a_value_is_refused_and_a_branch_on_a_shape_specialises() -> None:
    def by_value(x, w):  # type: ignore[no-untyped-def]
        h = x @ w
        return relu(h) if h else h

    with pytest.raises(TraceError, match="`if` on v1, a value the graph computes"):
        trace(by_value, x=(2, 2), w=(2, 2))

    def by_shape(x, w):  # type: ignore[no-untyped-def]
        h = x @ w
        return relu(h) if h.shape[0] > 4 else tanh(h)

    assert [n.op for n in trace(by_shape, x=(8, 2), w=(2, 2)).forward] == ["matmul", "relu"]
    assert [n.op for n in trace(by_shape, x=(2, 2), w=(2, 2)).forward] == ["matmul", "act_fwd"]


def test_jit_makes_one_variant_per_shape_and_buckets_pad_to_few() -> None:
    per_shape, bucketed = Jit(lambda x, w: relu(x @ w)), Jit(lambda x, w: relu(x @ w), buckets=(8, 32), pad=("x",))
    w = RNG.standard_normal((3, 2))
    for rows in (3, 5, 8, 9, 20, 5):
        x = RNG.standard_normal((rows, 3))
        for jit in (per_shape, bucketed):
            out, grads = jit(x=x, w=w)
            assert out.shape == (rows, 2) and np.abs(out - np.maximum(x @ w, 0)).max() < 1e-5
    assert len(per_shape.variants) == 5 and len(bucketed.variants) == 2
    assert bucketed.arena_bytes < per_shape.arena_bytes and bucketed.compile_seconds > 0
    with pytest.raises(TraceError, match="rows=33 is invalid; expected at most the largest bucket, 32"):
        bucketed(x=np.zeros((33, 3)), w=w)


def test_bad_inputs_name_the_argument() -> None:
    with pytest.raises(TraceError, match=r"trace: x=\(4,\) is invalid; expected a 2-D shape"):
        trace(f, x=(4,), w=(3, 2), b=(1, 2))
    with pytest.raises(TraceError, match="shapes \\(4, 3\\) and \\(2, 2\\) do not multiply"):
        trace(lambda x, w: x @ w, x=(4, 3), w=(2, 2))
    with pytest.raises(TraceError, match="only traced arrays take part"):
        trace(lambda x: x * 2.0, x=(2, 2))
    with pytest.raises(TraceError, match="float\\(v1\\) needs a value"):
        trace(lambda x, w: x @ w if float(x @ w) else x, x=(2, 2), w=(2, 2))
    with pytest.raises(TraceError, match="buckets=\\(32, 8\\) is invalid"):
        Jit(lambda x: x, buckets=(32, 8))


def test_what_a_trace_cannot_record_is_a_trace_error() -> None:
    """A comparison of traced values is a branch on a computed value (h == x compared identities and kept one
    side silently); reflected, unary and NumPy operations, attributes and indexing raised raw TypeErrors and
    AttributeErrors; a function returning its input traced an empty graph; Jit cut a padded input's gradient."""
    import numpy as np

    from renaissance_nb.errors import TraceError
    from renaissance_nb.tracing import Jit, relu, tanh, trace
    cases = {"comparison": lambda x, w: relu(x @ w) if x @ w == x else tanh(x @ w),
             "order": lambda x, w: relu(x @ w) if (x @ w) > 0 else x @ w,
             "reflected": lambda x, w: 2 * (x @ w), "minus": lambda x, w: x - w, "negation": lambda x, w: -(x @ w),
             "numpy": lambda x, w: np.exp(x @ w), "attribute": lambda x, w: x.T @ w, "index": lambda x, w: x[0],
             "nothing": lambda x, w: x}
    for name, fn in cases.items():
        with pytest.raises(TraceError, match="trace: "):
            trace(fn, x=(2, 2), w=(2, 2))
    jit = Jit(lambda x, w: relu(x @ w), buckets=(8,), pad=("x",))
    out, grads = jit(x=np.ones((5, 3), np.float32), w=np.ones((3, 2), np.float32))
    assert out.shape == (5, 2) and grads["x"].shape == (5, 3) and grads["w"].shape == (3, 2)

"""The element-wise passes around a layer's products: bias+activation forward, and the backward
pre-pass that applies the activation's derivative and sums the bias gradient in one go."""
from __future__ import annotations

import numpy as np
import pytest

from renaissance_nb.kernels import cpu, fused

ACTS = ["none", "relu", "tanh", "sigmoid", "leaky_relu"]


def _derivative_from_output(d: np.ndarray, y: np.ndarray, act: str, slope: float) -> np.ndarray:
    """The reference dz = d * act'(z), in float64, from the forward output y."""
    d64, y64 = d.astype(np.float64), y.astype(np.float64)
    return {"none": d64, "relu": np.where(y64 > 0, d64, 0.0), "tanh": d64 * (1 - y64 * y64),
            "sigmoid": d64 * y64 * (1 - y64), "leaky_relu": np.where(y64 > 0, d64, d64 * slope)}[act]


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("rows", [1, 3, 8, 33, 128])
def test_backward_pre_pass_matches_float64_and_gives_the_same_bytes_threaded(act: str, rows: int) -> None:
    rng = np.random.default_rng(rows)
    code, slope, c = fused.ACT_CODES[act], 0.1, 37
    z = rng.standard_normal((rows, c)).astype(np.float32)
    y = z.copy()
    fused.bias_act_(y, np.zeros(0, np.float32), code, slope)
    d0 = rng.standard_normal((rows, c)).astype(np.float32)
    results = []
    for f in (fused.act_grad_colsum_, fused.act_grad_colsum_par_):
        d, db = d0.copy(), np.full(c, np.nan, np.float32)
        f(d, y, code, slope, np.full((fused.PAR_CHUNKS, c), np.nan), db)
        results.append((d, db))
    (d, db), (d_par, db_par) = results
    assert np.array_equal(d, d_par) and np.array_equal(db, db_par)
    ref = _derivative_from_output(d0, y, act, slope)
    assert np.all(np.abs(d - ref) <= 4 * 2.0 ** -24 * (np.abs(ref) + np.abs(d0)))  # float32 rounding of the formula
    single = d0.copy()
    fused.act_grad_from_output_(single, y, code, slope)  # the pass without sums: the same dz
    assert np.array_equal(single, d)
    # the bias gradient: float64 sums of the float32 dz, rounded once (half an ulp of float32)
    exact = d.astype(np.float64).sum(axis=0)
    assert np.all(np.abs(db - exact) <= 0.5 * np.spacing(np.abs(db)) + 1e-12 * np.abs(d).sum(axis=0))


def test_backward_pre_pass_without_a_bias_only_applies_the_derivative() -> None:
    rng = np.random.default_rng(1)
    y = np.maximum(rng.standard_normal((64, 20)).astype(np.float32), 0)
    d0 = rng.standard_normal((64, 20)).astype(np.float32)
    d = d0.copy()
    cpu.act_grad_colsum_pass(d, y, 1, 0.0, None)()
    assert np.array_equal(d, np.where(y > 0, d0, 0).astype(np.float32))


def test_backward_pre_pass_in_float64_sums_exactly_enough_for_gradient_checks() -> None:
    rng = np.random.default_rng(2)
    d0, y = rng.standard_normal((50, 9)), rng.random((50, 9)) - 0.3
    d, db = d0.copy(), np.zeros(9)
    cpu.act_grad_colsum_pass(d, y, 1, 0.0, db)()
    ref = np.where(y > 0, d0, 0.0)
    assert np.array_equal(d, ref)
    np.testing.assert_allclose(db, ref.sum(axis=0), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("act", ACTS)
def test_threaded_bias_activation_gives_the_serial_bytes(act: str) -> None:
    rng = np.random.default_rng(3)
    y0, b = rng.standard_normal((130, 257)).astype(np.float32), rng.standard_normal(257).astype(np.float32)
    for bias in (b, np.zeros(0, np.float32)):
        y1, y2 = y0.copy(), y0.copy()
        fused.bias_act_(y1, bias, fused.ACT_CODES[act], 0.1)
        fused.bias_act_par_(y2, bias, fused.ACT_CODES[act], 0.1)
        assert np.array_equal(y1, y2)
        assert not np.array_equal(y1, y0) or act == "none" and bias.size == 0


@pytest.mark.parametrize("n", [11, 1000, 300_001])
def test_relu_pass_gives_act_forward_and_act_backward_bytes(n: int) -> None:
    """The vectorised ReLU (fused.relu_chunks_, serial and threaded) against the generic activation
    loops, on values with signed zeros, subnormals, infinities and NaN."""
    from renaissance_nb.kernels import fused
    from renaissance_nb.kernels.base import EMPTY_F32
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * np.exp(rng.uniform(-30, 30, n))).astype(np.float32)
    dy = (rng.standard_normal(n) * np.exp(rng.uniform(-30, 30, n))).astype(np.float32)
    for a in (x, dy):
        a[:5] = [0.0, -0.0, np.nan, np.inf, -1e-42]
    dy[5:10] = [-0.0, np.nan, -np.inf, -3.0, 0.0]
    ref_y, ref_dx = np.empty_like(x), np.empty_like(x)
    fused.act_forward(x, ref_y, 1, 0.0)
    fused.act_backward(dy, x, ref_dx, 1, 0.0)
    for run in (lambda y, d: fused.relu_chunks_(x, y, d, 0, fused.PAR_CHUNKS), lambda y, d: fused.relu_chunks_par_(x, y, d)):
        y, dx = np.full_like(x, 7), np.full_like(x, 7)
        run(y, EMPTY_F32)
        run(dx, dy)
        assert y.tobytes() == ref_y.tobytes() and dx.tobytes() == ref_dx.tobytes()


def test_threaded_add_and_copy_give_numpys_bytes() -> None:
    """fused.add_chunks_par_ (the residual add and its gradient copies) against np.add and np.copyto."""
    from renaissance_nb.kernels import fused
    from renaissance_nb.kernels.base import EMPTY_F32
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((2, 300_001)).astype(np.float32)
    a[:4], b[:4] = [np.nan, np.inf, -0.0, 1e-42], [1.0, -np.inf, 0.0, -1e-42]
    out = np.full_like(a, 7)
    fused.add_chunks_par_(a, b, out)
    with np.errstate(invalid="ignore"):  # inf + -inf
        assert out.tobytes() == np.add(a, b).tobytes()
    fused.add_chunks_par_(b, EMPTY_F32, out)
    assert out.tobytes() == b.tobytes()

"""GELU's C pass (kernels/gelu_native.c) against its numba twins (kernels/gelu_math.py), and both against
float64 references built on libm's erfc and exp (which have no cancellation where GELU's tail needs them):
the two twins give the same bytes, and every float32 value is within one unit in the last place of the
correctly rounded GELU, its gradient and its tanh form (in fact equal to it on these samples)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from renaissance_nb.kernels import exp_math, fused, gelu_math, gelu_native, native
from renaissance_nb.ops.gelu_tanh import gelu_tanh_bwd, gelu_tanh_fwd

needs_lib = pytest.mark.skipif(native.lib() is None, reason=f"no C kernels: {native.status().why_not}")
SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 1e-30, -1e-30, 7.42, -7.42, 10.5 * math.sqrt(2),
           -10.5 * math.sqrt(2), 14.9, -14.9, 20.0, -20.0, 1e30, -1e30, 3e38, -3e38]


def _inputs(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.standard_normal(n) * 3, rng.uniform(-16, 16, n), SPECIAL]).astype(np.float32)


def _numba(form: str, x: np.ndarray, dy: np.ndarray | None) -> np.ndarray:
    out = np.empty_like(x)
    if form == "erf":
        fused.act_forward(x, out, 6, 0.0) if dy is None else fused.act_backward(dy, x, out, 6, 0.0)
    else:
        gelu_tanh_fwd(x, out, np.float32(0)) if dy is None else gelu_tanh_bwd(dy, x, out, np.float32(0))
    return out


def _c(form: str, x: np.ndarray, dy: np.ndarray | None, threads: int) -> np.ndarray:
    out = np.empty_like(x)
    kernel = gelu_native.bind_gelu(x, dy, out, form, threads)
    assert kernel is not None
    kernel()
    return out


@needs_lib
@pytest.mark.parametrize("form", ["erf", "tanh"])
@pytest.mark.parametrize("n", [1, 7, 4099, 1 << 17])
def test_the_c_pass_gives_the_numba_loops_bytes(form: str, n: int) -> None:
    x = _inputs(n)
    dy = np.random.default_rng(1).standard_normal(x.size).astype(np.float32)
    for d in (None, dy):
        want = _numba(form, x, d).tobytes()
        assert _c(form, x, d, 1).tobytes() == want and _c(form, x, d, 2).tobytes() == want


@needs_lib
def test_the_c_pass_computes_in_place_and_declines_what_it_does_not_take() -> None:
    x = _inputs(100)
    want = _c("erf", x, None, 2)
    gelu_native.bind_gelu(x, None, x, "erf", 2)()
    assert x.tobytes() == want.tobytes()
    assert gelu_native.bind_gelu(x[::2], None, np.empty(x[::2].size, np.float32), "erf", 1) is None
    assert gelu_native.bind_gelu(x.astype(np.float64), None, np.empty(x.size), "erf", 1) is None


def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Units in the last place between float32 arrays (on one number line through both signs)."""
    ia, ib = (v.view(np.int32).astype(np.int64) for v in (a, b))
    ia, ib = (np.where(i < 0, -(i & 0x7FFFFFFF), i) for i in (ia, ib))
    return np.abs(ia - ib)


def _references(z: np.ndarray) -> dict[str, np.ndarray]:
    """GELU, its gradient and the tanh form in float64 by libm's erfc and exp, rounded to float32."""
    cdf = np.array([0.5 * math.erfc(-v / math.sqrt(2)) for v in z])
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    u = math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3)
    with np.errstate(over="ignore"):
        tanh_form = z / (1 + np.exp(-2 * u))
    return {"fwd": (z * cdf).astype(np.float32), "bwd": (cdf + z * pdf).astype(np.float32),
            "tanh": tanh_form.astype(np.float32)}


def test_gelu_is_correctly_rounded_to_within_one_ulp() -> None:
    """libm's erf in x/2 (1 + erf(x/sqrt 2)) lost every digit below x = -6 (1 + erf cancels); Phi is erfc here."""
    x = _inputs(20000, seed=3)[:-len(SPECIAL)]
    z = x.astype(np.float64)
    ref = _references(z)
    got = {"fwd": _numba("erf", x, None), "bwd": _numba("erf", x, np.ones_like(x)), "tanh": _numba("tanh", x, None)}
    for name in ref:
        u = _ulps(got[name], ref[name])
        assert u.max() <= 1 and np.mean(u == 0) > 0.999, (name, int(u.max()), float(np.mean(u == 0)))


def test_the_math_pieces_match_libm_to_double_precision() -> None:
    a = -np.concatenate([np.linspace(0, 745, 20001), np.random.default_rng(4).uniform(0, 50, 20000)])
    exp = np.array([exp_math.neg_exp(v) for v in a])
    libm = np.exp(a)
    normal = libm > 1e-300  # below, exp(-708) stands in (its bits stay a normal double)
    assert np.max(np.abs(exp[normal] / libm[normal] - 1)) < 4e-16
    z = np.concatenate([np.linspace(-14, 14, 20001), [0.0, -0.0]])
    cdf = np.array([gelu_math.normal_cdf(v)[0] for v in z])
    ref = np.array([0.5 * math.erfc(-v / math.sqrt(2)) for v in z])
    assert np.max(np.abs(cdf / ref - 1)) < 2e-13
    s = np.array([gelu_math.logistic(v)[0] for v in z * 3])
    assert np.max(np.abs(s / (1 / (1 + np.exp(-z * 3))) - 1)) < 1e-15  # the reference rounds twice itself


def test_non_finite_values_stay_non_finite_for_the_nan_check() -> None:
    x = np.array([np.nan, np.inf, -np.inf], np.float32)
    for form in ("erf", "tanh"):
        y = _numba(form, x, None)
        assert np.isnan(y[0]) and y[1] == np.inf and not np.isfinite(y[2])
        assert np.isnan(_numba(form, x, np.ones_like(x))[0])


@needs_lib
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_a_gelu_mlp_runs_as_one_native_program_with_the_numba_plans_bytes(monkeypatch, approximate: str) -> None:  # type: ignore[no-untyped-def]
    from renaissance_nb import AdamW, DeepLearningTask, fc, gelu, seq
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((96, 12)).astype(np.float32), rng.integers(0, 3, 96).astype(np.int32)

    def trained() -> DeepLearningTask:
        task = (DeepLearningTask().model(seq(fc(256), gelu(approximate=approximate), fc(3)))
                .data(train=(x, y), batch_size=16).optimizer(AdamW(lr=3e-3)).total_epochs(2).seed(0).compile())
        task.run(progress=False)
        return task
    c = trained()
    assert any(n.startswith("CPU step captured as one native program") for n in c.runner.notes), c.runner.notes
    monkeypatch.setattr(native, "NUMBA_FREE_OPS", frozenset())  # every plan binds numba
    n = trained()
    assert any("fused passes in numba" in note for note in n.runner.notes)
    sc, sn = c.state_dict(), n.state_dict()
    assert all(sc[k].tobytes() == sn[k].tobytes() for k in sc)

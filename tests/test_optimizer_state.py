"""Optimizer state below the smallest normal float32 is stored as 0 (fused.TINY32): the state
never holds a subnormal, and the weights keep the bits of the unflushed formula."""
from __future__ import annotations

import numpy as np

from renaissance_nb.kernels import fused

TINY = np.finfo(np.float32).tiny


def _adamw_reference(w, g, m, v, lr, t, b1=0.9, b2=0.999, eps=1e-8, wd=1e-2):
    """PyTorch's single-tensor AdamW in float32, without any flushing."""
    f = np.float32
    w = w * f(1.0 - lr * wd)
    m = m + (g - m) * f(1.0 - b1)
    v = v * f(b2) + f(1.0 - b2) * g * g
    denom = np.sqrt(v) / f(np.sqrt(1.0 - b2 ** t)) + f(eps)
    return w - f(lr / (1.0 - b1 ** t)) * (m / denom), m, v


def test_decaying_adam_state_is_flushed_and_the_weights_keep_their_bits() -> None:
    rng = np.random.default_rng(0)
    n = 4096
    w = rng.standard_normal(n).astype(np.float32)
    g_first = rng.standard_normal(n).astype(np.float32) * np.float32(1e-3)
    zero = np.zeros(n, np.float32)
    m, v, step = np.zeros(n, np.float32), np.zeros(n, np.float32), np.zeros(1, np.int64)
    rw, rm, rv = w.copy(), m.copy(), v.copy()
    lr = np.full(2000, 1e-3, np.float32)
    went_subnormal = False
    for t in range(1, 1001):  # one real gradient, then 999 zero gradients: m decays by 0.9 per step
        g = g_first if t == 1 else zero
        fused.adam_update(w, g, m, v, lr, step, 0.9, 0.999, 1e-8, 1e-2, True, False)
        rw, rm, rv = _adamw_reference(rw, g, rm, rv, float(lr[0]), t)
        went_subnormal |= bool(np.any((rm != 0) & (np.abs(rm) < TINY)))
        assert not np.any((m != 0) & (np.abs(m) < TINY)) and not np.any((v != 0) & (np.abs(v) < TINY))
        assert np.array_equal(w, rw), t
    assert went_subnormal, "the reference state never reached the subnormal range: the test tests nothing"
    assert np.count_nonzero(m) == 0 and step[0] == 1000


def test_a_decaying_sgd_buffer_is_flushed() -> None:
    n = 256
    w = np.linspace(-1, 1, n).astype(np.float32)
    m, step = np.zeros(n, np.float32), np.zeros(1, np.int64)
    lr = np.full(1200, 1e-2, np.float32)
    g0 = np.full(n, 1e-3, np.float32)
    for t in range(1000):
        fused.sgd_update(w, g0 if t == 0 else np.zeros(n, np.float32), m, lr, step, 0.9, 0.0, 0.0, False, False)
        assert not np.any((m != 0) & (np.abs(m) < TINY))
    assert np.count_nonzero(m) == 0


def test_the_flush_keeps_nan_and_inf_so_they_reach_the_weights() -> None:
    """With the NaN check off a non-finite gradient must still poison its weight, as in PyTorch."""
    n = 6
    g = np.array([np.nan, np.inf, -np.inf, 1.0, 0.0, 1e-30], np.float32)
    lr = np.full(4, 1e-3, np.float32)
    for threaded in (False, True):
        w, m, v, step = np.ones(n, np.float32), np.zeros(n, np.float32), np.zeros(n, np.float32), np.zeros(1, np.int64)
        (fused.adam_update_par if threaded else fused.adam_update)(w, g, m, v, lr, step, 0.9, 0.999, 1e-8, 0.0,
                                                                   True, False)
        assert np.isnan(m[0]) and np.isnan(v[0]) and np.isnan(w[0])
        assert np.isinf(m[1]) and np.isinf(v[1]) and not np.isfinite(w[1])
        assert np.isinf(m[2]) and np.isinf(v[2]) and not np.isfinite(w[2])
        assert np.all(np.isfinite(w[3:])) and m[5] != 0  # 1e-30 * 0.1 is still a normal float32
        ws, ms, step = np.ones(n, np.float32), np.zeros(n, np.float32), np.zeros(1, np.int64)
        (fused.sgd_update_par if threaded else fused.sgd_update)(ws, g, ms, lr, step, 0.9, 0.0, 0.0, False, False)
        assert np.isnan(ms[0]) and np.isnan(ws[0]) and np.isinf(ms[1]) and np.isinf(ms[2])


def test_the_two_stream_adam_pass_gives_every_length_the_reference_bytes() -> None:
    """_adam_core walks each chunk as two halves side by side (fused.py): odd and even lengths, and
    lengths that leave chunks of 0 or 1 element, update each element exactly once, as PyTorch's
    formula in float32 does."""
    rng = np.random.default_rng(1)
    lr = np.full(4, 1e-3, np.float32)
    for n in (1, 2, 3, 7, 8, 9, 17, 1001):
        w, g = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
        m, v = rng.standard_normal(n).astype(np.float32) * np.float32(0.1), rng.random(n).astype(np.float32)
        rw, rm, rv = _adamw_reference(w, g, m, v, 1e-3, 1)
        step = np.zeros(1, np.int64)
        for update in (fused.adam_update, fused.adam_update_par):
            ww, mm, vv = w.copy(), m.copy(), v.copy()
            step[0] = 0
            update(ww, g, mm, vv, lr, step, 0.9, 0.999, 1e-8, 1e-2, True, False)
            assert np.array_equal(ww, rw) and np.array_equal(mm, rm) and np.array_equal(vv, rv), (n, update)


def test_the_adam_element_step_is_inlined_into_its_loop() -> None:
    """Called out of line, _adam_at made the pass ten times slower; LLVM inlines it today. This
    checks the code numba generates for the loop holds no call to it."""
    import re

    import numba

    fresh = numba.njit(nogil=True, fastmath=False, error_model="numpy")(fused._adam_core.py_func)
    a = np.zeros(8, np.float32)
    fresh(a, a, a, a, 1e-3, 1, 0.9, 0.999, 1e-8, 1e-2, True, False)
    ir = "\n".join(fresh.inspect_llvm().values())
    called = set(re.findall(r"call [^@\n]*@\"?([\w.$]+)", ir))
    assert called and not [c for c in called if "_adam_at" in c], sorted(called)


def test_the_two_stream_ema_pass_matches_the_formula() -> None:
    rng = np.random.default_rng(2)
    for n in (1, 2, 5, 64, 1001):
        e, w = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
        want = np.float32(0.99) * e + np.float32(1.0 - 0.99) * w
        fused.ema_(e, w, 0.99)
        assert np.array_equal(e, want), n

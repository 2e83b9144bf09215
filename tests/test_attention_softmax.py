"""The attention softmax's rows (ops/attention_kernels.py, their C twins in kernels/attention_native.c) are
accurate, and a NaN score still turns its row into NaN.

Why: the rows take exp from exp_math.neg_exp (not libm) and sum in 8 fixed lanes; tests/test_attention_native.py
shows the two twins agree byte for byte, this shows what they agree on is right. The reference is float64
with math.exp and math.fsum on the same float32 scores: each float32 output must be its correct rounding up to
1e-5 ulp (a relative error below about 1e-12 before the one rounding to float32). And neg_exp maps NaN to
exp(-708), so the rows keep NaN themselves: a diverged score must reach the trainer's NaN check.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from renaissance_nb.ops import attention_kernels as ak
from test_attention_native import _flash_fwd_arrays, _qkv, an, garbage, needs_lib

SLACK = 1e-5
"""ulps allowed past half an ulp: the float64 value before rounding is within about 1e-12 relative."""


def scores(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """float32 scores spread wide enough that exp runs from 1 down to underflow."""
    return (rng.standard_normal(shape) * np.exp(rng.uniform(-2, 5, shape))).astype(np.float32)


def ulps(got: np.ndarray, ref: np.ndarray) -> float:
    """The largest |got - ref| in float32 ulps of ref (0 where both are 0)."""
    unit = np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)
    return float(np.max(np.abs(got.astype(np.float64) - ref) / unit, initial=0.0))


def softmax_ref(z: list[float]) -> list[float]:
    """softmax of float64 values with math.exp and an exact sum."""
    m = max(z)
    e = [math.exp(v - m) for v in z]
    tot = math.fsum(e)
    return [v / tot for v in e]


def check_causal(probs: np.ndarray, s: np.ndarray, scale: float) -> None:
    """probs (BH, T, T) is the causal softmax of scale * s (float32 scores), row by row."""
    for g in range(s.shape[0]):
        for i in range(s.shape[1]):
            ref = softmax_ref([float(v) * scale for v in s[g, i, :i + 1]])
            assert ulps(probs[g, i, :i + 1], np.array(ref)) <= 0.5 + SLACK, (g, i)
            assert not probs[g, i, i + 1:].any()


@pytest.mark.parametrize("t", [1, 7, 37, 130])
def test_causal_softmax_rows_are_correctly_rounded(t: int) -> None:
    s = scores(np.random.default_rng(t), (3, t, t))
    probs = s.copy()
    ak.causal_softmax_rows(probs, 0.3, 0, 3)
    check_causal(probs, s, 0.3)


@needs_lib
def test_the_c_softmax_is_correctly_rounded() -> None:
    """Through the C kernel: its probabilities against the reference on the scores q k^T it formed (np.matmul
    of its own q and k forms the same float32 products, tests/test_attention_native.py)."""
    shape = (2, 2, 45, 8)
    b, h, t, hd = shape
    q, k, v, probs = garbage(shape), garbage(shape), garbage(shape), garbage((b, h, t, t))
    kernel = an.bind_scores(_qkv(shape, 3) * np.float32(6), q, k, v, probs, 1)
    assert kernel is not None
    kernel()
    s = np.matmul(q, k.swapaxes(-1, -2)).reshape(b * h, t, t)
    check_causal(probs.reshape(b * h, t, t), s, 1 / math.sqrt(hd))


def test_online_and_recomputed_probabilities_are_correctly_rounded() -> None:
    """Two key blocks of the online softmax (the second raises the max: the correction exp(m_old - m_new)),
    then P recomputed from the log-sum-exp."""
    rng = np.random.default_rng(5)
    bh, nq, nk, scale = 2, 9, 9, 0.7
    first, second = scores(rng, (bh, nq, nk)), scores(rng, (bh, nq, nk))
    second[:, :, 0] = np.abs(second[:, :, 0]) + 40  # the diagonal block's first key: a new max in every row
    m, l, acc = np.full((bh, nq), -np.inf), np.zeros((bh, nq)), np.ones((bh, nq, 3))
    p1, p2 = first.copy(), second.copy()
    ak.online_step_rows(p1, m, l, acc, scale, nk, 0, 0, bh)  # query rows nk.., keys 0..nk-1: all visible
    m1, l1 = m.copy(), l.copy()
    assert not acc.any()  # the first block's correction: 0 (nothing before it)
    acc.fill(1.0)
    ak.online_step_rows(p2, m, l, acc, scale, nk, nk, 0, bh)  # the diagonal block: keys <= the row
    for g in range(bh):
        for r in range(nq):
            z1, z2 = [float(v) * scale for v in first[g, r]], [float(v) * scale for v in second[g, r, :r + 1]]
            assert m1[g, r] == max(z1) and m[g, r] == max(z1 + z2)
            assert ulps(p1[g, r], np.array([math.exp(v - m1[g, r]) for v in z1])) <= 0.5 + SLACK
            assert ulps(p2[g, r, :r + 1], np.array([math.exp(v - m[g, r]) for v in z2])) <= 0.5 + SLACK
            assert not p2[g, r, r + 1:].any()
            corr = math.exp(m1[g, r] - m[g, r])
            assert l[g, r] == pytest.approx(l1[g, r] * corr + math.fsum(p2[g, r, :r + 1]), rel=1e-12)
            assert acc[g, r] == pytest.approx(np.full(3, corr), rel=1e-12)
    lse = (m + np.log(l)).astype(np.float32)
    lse_rows = np.concatenate([np.zeros((bh, nk), np.float32), lse], axis=1)  # rows i0 = nk.. of the block
    p = second.copy()
    ak.recompute_probs_rows(p, lse_rows, scale, nk, nk, 0, bh)
    for g in range(bh):
        for r in range(nq):
            ref = [math.exp(float(v) * scale - float(lse[g, r])) for v in second[g, r, :r + 1]]
            assert ulps(p[g, r, :r + 1], np.array(ref)) <= 0.5 + SLACK


def test_a_nan_score_makes_its_row_nan() -> None:
    """A NaN at or before the diagonal: the row is NaN up to it (0 after); one past it (masked): no effect."""
    s = scores(np.random.default_rng(9), (2, 12, 12))
    clean = s.copy()
    ak.causal_softmax_rows(clean, 0.5, 0, 2)
    bad = s.copy()
    bad[0, 5, 2] = np.nan
    bad[1, 3, 7] = np.nan  # masked
    ak.causal_softmax_rows(bad, 0.5, 0, 2)
    assert np.isnan(bad[0, 5, :6]).all() and not bad[0, 5, 6:].any()
    rows = np.ones((2, 12), bool)
    rows[0, 5] = False
    assert bad[rows].tobytes() == clean[rows].tobytes()
    for fill in (np.nan, np.inf):  # an infinite score too: its row max is inf, and inf - inf is NaN
        one = s[:1, :4, :4].copy()
        one[0, 3, 1] = fill
        ak.causal_softmax_rows(one, 0.5, 0, 1)
        assert np.isnan(one[0, 3]).all() and not np.isnan(one[0, :3]).any()


def same_nan(a: np.ndarray, b: np.ndarray) -> None:
    """The same NaN positions and the same bytes elsewhere (NaN payloads may differ between compilers)."""
    assert a.dtype == b.dtype and a.shape == b.shape
    na, nb = np.isnan(a), np.isnan(b)
    assert (na == nb).all()
    assert a[~na].tobytes() == b[~nb].tobytes()


@needs_lib
@pytest.mark.parametrize("form", ["materialized", "flash"])
def test_a_nan_key_makes_later_rows_nan_in_both_twins(form: str) -> None:
    """A NaN in key j's features: every query from j on sees it (NaN output rows), earlier ones do not (it is
    masked for them); C and numba agree on the NaN positions and on every other byte."""
    shape, block = (1, 2, 21, 4), 8
    b, h, t, hd = shape
    qkv = _qkv(shape, 11)
    qkv[0, 13, h * hd + 1] = np.nan  # head 0's key at position 13
    if form == "materialized":
        outs = [[garbage(shape), garbage(shape), garbage(shape), garbage((b, h, t, t))] for _ in "ab"]
        ak.bind_scores(outs[0], [qkv], {}, None)()
        kernel = an.bind_scores(qkv, *outs[1], 1)
        out_rows = outs[0][3][0, 0, :, 0]  # P[:, 0] of head 0: NaN from query 13 on
    else:
        outs = [_flash_fwd_arrays(shape, block, 0)[0] for _ in "ab"]
        ak.bind_flash_fwd(outs[0], [qkv], {"block": block}, None)()
        kernel = an.bind_flash_fwd(qkv, *outs[1], block, 1)
        out_rows = outs[0][3][0, :, 0]  # y's first feature (head 0) at each position
    assert kernel is not None
    kernel()
    for a, c in zip(*outs):
        same_nan(a, c)
    assert np.isnan(out_rows[13:]).all() and not np.isnan(out_rows[:13]).any()

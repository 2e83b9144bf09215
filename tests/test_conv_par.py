"""The threaded conv-net passes (kernels/conv_par.py) against the serial kernels they split:
the same bytes for im2col, col2im and max pooling; batch norm within float64 rounding of its
sums, with the same bytes on every call."""
from __future__ import annotations

import numpy as np
import pytest

from renaissance_nb.kernels import conv, conv_par, fused


def _geometry(n: int, h: int, w: int, c: int, k: int, s: int, p: int) -> tuple[int, int]:
    return (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1


@pytest.mark.parametrize("n,h,w,c,k,s,p", [(3, 7, 6, 3, 3, 2, 1), (13, 9, 9, 4, 3, 1, 1), (1, 5, 5, 2, 2, 2, 0),
                                           (20, 6, 7, 8, 1, 1, 0)])
def test_im2col_and_col2im_by_image_blocks_are_the_serial_bytes(n, h, w, c, k, s, p) -> None:
    rng = np.random.default_rng(n + h)
    ho, wo = _geometry(n, h, w, c, k, s, p)
    x = rng.standard_normal((n, h, w, c)).astype(np.float32)
    x[0, 0, 0, 0] = np.nan
    cols = [np.full((n * ho * wo, k * k * c), 5.0, np.float32) for _ in range(2)]
    conv.im2col_(x.reshape(n, h, w * c), cols[0], c, k, s, p, ho, wo)
    conv_par.patches_par_(x.reshape(n, h, w * c), cols[1], c, k, s, p, ho, wo, True)
    assert np.array_equal(cols[0], cols[1], equal_nan=True)
    dcols = rng.standard_normal(cols[0].shape).astype(np.float32)
    dx = [np.full((n, h, w, c), 9.0, np.float32) for _ in range(2)]
    conv.col2im_(dcols, dx[0].reshape(n, h, w * c), c, k, s, p, ho, wo)
    conv_par.patches_par_(dx[1].reshape(n, h, w * c), dcols, c, k, s, p, ho, wo, False)
    assert np.array_equal(dx[0], dx[1])


@pytest.mark.parametrize("n,h,w,c", [(1, 4, 4, 3), (11, 7, 9, 5), (32, 8, 8, 16)])
def test_max_pooling_by_image_blocks_is_the_serial_bytes(n, h, w, c) -> None:
    rng = np.random.default_rng(c)
    x = rng.standard_normal((n, h, w, c)).astype(np.float32)
    x[0, 1, 1, 0] = np.nan
    x[-1, 0, :2, -1] = 1.5  # a tie
    for k, s, p in ((2, 2, 0), (3, 2, 1)):
        ho, wo = _geometry(n, h, w, c, k, s, p)
        ys = [np.zeros((n, ho, wo, c), np.float32) for _ in range(2)]
        ams = [np.zeros((n, ho, wo, c), np.int32) for _ in range(2)]
        two = (k, s, p) == (2, 2, 0)
        aff = np.stack([np.linspace(-1, 2, c), np.linspace(0.5, -0.5, c)]).astype(np.float32)
        for bn_relu in (True, False):  # last: the plain pool, whose output the backward below reads
            if two:
                conv.maxpool2_fwd_(x, ys[0], ams[0], aff, bn_relu)
            else:
                conv.maxpool_fwd_(x, ys[0], ams[0], k, s, p, aff, bn_relu)
            conv_par.maxpool_fwd_par_(x, ys[1], ams[1], k, s, p, two, aff, bn_relu)
            assert np.array_equal(ys[0], ys[1], equal_nan=True) and np.array_equal(ams[0], ams[1])
        dy = rng.standard_normal(ys[0].shape).astype(np.float32)
        for relu in (False, True):  # with relu, the masked gradient of a fused ReLU before the pool
            dxs = [np.full((n, h, w, c), 3.0, np.float32) for _ in range(2)]
            if two:
                conv.maxpool2_bwd_(dy, ams[0], dxs[0], ys[0], relu)
            else:
                conv.maxpool_bwd_(dy, ams[0], dxs[0].reshape(n, h * w, c), ys[0], relu)
            conv_par.maxpool_bwd_par_(dy, ams[0], dxs[1], two, ys[0], relu)
            assert np.array_equal(dxs[0], dxs[1])


@pytest.mark.parametrize("m,c,act", [(5, 3, 0), (777, 16, 1), (4096, 64, 1)])
def test_batch_norm_by_row_blocks_matches_the_one_pass_sums(m, c, act) -> None:
    rng = np.random.default_rng(m)
    x = (rng.standard_normal((m, c)) * 3 + 100).astype(np.float32)  # a large mean: the shift matters
    g, b = rng.standard_normal(c).astype(np.float32), rng.standard_normal(c).astype(np.float32)
    dy0 = rng.standard_normal((m, c)).astype(np.float32)
    runs = []
    for threaded in (False, True, True):
        y, dx, dy = np.empty_like(x), np.empty_like(x), dy0.copy()
        mean, inv, dg, db = (np.zeros(c, np.float32) for _ in range(4))
        rm, rv = np.zeros(c, np.float32), np.ones(c, np.float32)
        acc, aff, aff3 = np.zeros((2, c)), np.zeros((2, c), np.float32), np.zeros((3, c))
        parts = np.zeros((fused.PAR_CHUNKS, 2, c))
        if threaded:
            conv_par.bn_train_fwd_par_(x, g, b, y, mean, inv, rm, rv, 0.1, 1e-5, act, acc, aff, parts)
            conv_par.bn_train_bwd_par_(dy, x, y, g, mean, inv, dx, dg, db, act, acc, aff3, parts)
        else:
            conv.bn_train_fwd_(x, g, b, y, mean, inv, rm, rv, 0.1, 1e-5, act, acc, aff)
            conv.bn_train_bwd_(dy, x, y, g, mean, inv, dx, dg, db, act, acc, aff3)
        runs.append((y, dx, dy, mean, inv, rm, rv, dg, db))
    for serial, threaded in zip(runs[0], runs[1]):
        np.testing.assert_allclose(threaded, serial, rtol=2e-6, atol=2e-6)
    assert all(np.array_equal(a, b) for a, b in zip(runs[1], runs[2]))  # the same bytes every call


@pytest.mark.parametrize("m,c", [(3, 5), (64, 32), (1001, 17)])
def test_batch_norm_sums_are_within_float32_rounding_of_the_exact_sums(m, c) -> None:
    """The sums add eight-row float32 blocks into float64: each block is good to a few ulps of
    its terms, so each total is within a few ulps of the sum of its terms' magnitudes."""
    rng = np.random.default_rng(c)
    x = (rng.standard_normal((m, c)) * 3 + 100).astype(np.float32)
    dy = rng.standard_normal((m, c)).astype(np.float32)
    y = np.where(rng.random((m, c)) < 0.5, 0.0, 1.0).astype(np.float32)
    mean = x.mean(0, dtype=np.float64).astype(np.float32)
    s1, s2 = np.zeros(c), np.zeros(c)
    conv.bn_shifted_sums_(x, x[0], s1, s2, 0, m)
    d = x.astype(np.float64) - x[0].astype(np.float64)
    tol = 8 * 2.0**-24
    np.testing.assert_array_less(np.abs(s1 - d.sum(0)), tol * np.abs(d).sum(0) + 1e-30)
    np.testing.assert_array_less(np.abs(s2 - (d * d).sum(0)), tol * (d * d).sum(0) + 1e-30)
    g = dy.copy()
    conv.bn_grad_sums_(g, x, y, mean, 1, s1, s2, 0, m)
    masked = np.where(y > 0, dy, 0).astype(np.float64)
    assert np.array_equal(g, masked.astype(np.float32))  # the ReLU mask, applied in place
    t2 = masked * (x.astype(np.float64) - mean.astype(np.float64))
    np.testing.assert_array_less(np.abs(s1 - masked.sum(0)), tol * np.abs(masked).sum(0) + 1e-30)
    np.testing.assert_array_less(np.abs(s2 - t2.sum(0)), tol * np.abs(t2).sum(0) + 1e-30)

"""Convolution, batch-norm and pooling CPU kernels (registered into ``cpu.KERNELS``).

Layout decision
---------------
Feature maps are channels-last NHWC: ``(N, H, W, C)``, float32 in training (every
kernel also runs on float64 arrays: the numba loops take the arrays' dtype, which
the finite-difference tests rely on). Why channels-last on this CPU:

* Every convolution is ONE GEMM. ``im2col`` writes, for every output pixel of every
  image, the row ``x[n, ih0:ih0+k, iw0:iw0+k, :]`` flattened in (kh, kw, Cin) order
  into a preallocated ``cols`` view of shape ``(N*Ho*Wo, k*k*Cin)``: the batch folds
  into the GEMM's M dimension, so OpenBLAS sees one big well-shaped product per layer
  instead of N small ones. With NHWC each kernel row of a patch (``k`` neighbouring
  pixels times all channels) is ONE contiguous run in ``x`` and in ``cols``, so
  im2col / col2im are ``k`` straight memcpy-like loops per output pixel.
* The weight is stored ``(Cout, kh, kw, Cin)``, so ``Wmat = w.reshape(Cout, -1)``
  matches the column order, and the GEMM ``y.reshape(N*Ho*Wo, Cout) = cols @ Wmat.T``
  writes the NHWC output directly: no transposes anywhere, forward or backward.
* Backward: ``dW = dy2d.T @ cols`` (one GEMM whose inner dimension is the whole
  batch), ``db`` = column sums, ``dcols = dy2d @ Wmat`` (one GEMM) and
  ``dx = col2im(dcols)`` (zero, then scatter-add of contiguous runs).
* 1x1 / stride-1 / unpadded convolutions skip im2col: ``x.reshape(N*H*W, Cin)`` is
  already the column matrix (and ``dx`` comes straight out of the dcols GEMM).
* One input channel (a grayscale first layer) makes a patch row k scalars, too short for
  the per-pixel loops: there im2col is k*k strided copies, one per tap (4x faster).
* Batch norm, ReLU and pooling run over contiguous channel vectors (the inner loop
  is over C with per-channel constants), which vectorises.

Zero padding ``p``, stride ``s``, square kernel ``k``: ``Ho = (H + 2p - k)//s + 1``.
Max pooling pads with -inf; 2x2/stride-2 windows (the common case) have their own forward
and a one-pass backward (they do not overlap, so no zeroing and no scatter). Average
pooling counts the padding (PyTorch's default ``count_include_pad=True``).
The max-pool ``argmax`` stores, per output element,
the spatial index ``ih*W + iw`` of the max inside its sample (its channel is the
output's own), first max in row-major window order, NaN propagating, as PyTorch.

Closures allocate nothing: GEMMs write into arena views (kernels/blas.py),
the rest are numba loops. Batch-norm statistics and bias/BN reductions accumulate
in float64; the few per-channel accumulators they need (at most 3*C values, and 16*C
for the threaded batch-norm sums of kernels/conv_par.py) are allocated once at bind time,
never per step. Where the products run on numba's threads (kernels/blas.py), im2col,
col2im, pooling and batch norm are bound to their conv_par.py variants, which split the
same loops by images or rows.
"""
from __future__ import annotations

import math

from typing import Any, NamedTuple, Sequence

import numpy as np

from ..errors import PlanError
from . import fused
from .blas import THREADED, gemm
from .cpu import EMPTY_F32, Kernel, act_grad_colsum_pass, bias_act_pass, kernel

jit = fused.jit


def _out_size(h: int, k: int, s: int, p: int) -> int:
    return (h + 2 * p - k) // s + 1


def _check(op: str, name: str, got, want) -> None:
    if tuple(got) != tuple(want):
        raise PlanError(f"{op}: {name} has shape {tuple(got)}, expected {tuple(want)}.")


def _act(op: str, p: dict) -> int:
    act = p.get("act", "none")
    if act not in ("none", "relu"):
        raise PlanError(f"{op}: act must be 'none' or 'relu', got {act!r}.")
    return 1 if act == "relu" else 0


# ---- numba loops -----------------------------------------------------------------------------
@jit
def im2col_(x3, cols, c, k, s, p, ho, wo):
    """cols[r, (i*k + j)*c + q] = x[n, oh*s-p+i, ow*s-p+j, q] (0 outside), r = (n*Ho + oh)*Wo + ow.

    x3 is x viewed as (N, H, W*C): a kernel row of a patch is one contiguous run.
    Copies go through sub-views indexed from 0 by a range variable, so numba's
    negative-index (wraparound) checks fold away and the loops vectorise (4x faster
    than indexing the whole row with an offset).
    """
    n_, h, wc = x3.shape
    w = wc // c
    kc = k * c
    r = 0
    for n in range(n_):
        for oh in range(ho):
            h0 = oh * s - p
            for ow in range(wo):
                w0 = ow * s - p
                row = cols[r]
                j0 = max(0, -w0)
                j1 = max(j0, min(k, w - w0))
                length = (j1 - j0) * c
                for i in range(k):
                    ih = h0 + i
                    seg = row[i * kc:(i + 1) * kc]
                    if ih < 0 or ih >= h:
                        for q in range(kc):
                            seg[q] = 0.0
                        continue
                    for q in range(j0 * c):
                        seg[q] = 0.0
                    dst = seg[j0 * c:j1 * c]
                    src = x3[n, ih, (w0 + j0) * c:(w0 + j0) * c + length]
                    for q in range(length):
                        dst[q] = src[q]
                    for q in range(j1 * c, kc):
                        seg[q] = 0.0
                r += 1


@jit
def col2im_(dcols, dx3, c, k, s, p, ho, wo):
    """dx = 0, then dx[n, oh*s-p+i, ow*s-p+j, :] += dcols[r, (i*k + j)*c : ...] (inside only)."""
    n_, h, wc = dx3.shape
    w = wc // c
    kc = k * c
    for n in range(n_):
        for ih in range(h):
            d = dx3[n, ih]
            for q in range(wc):
                d[q] = 0.0
    r = 0
    for n in range(n_):
        for oh in range(ho):
            h0 = oh * s - p
            for ow in range(wo):
                w0 = ow * s - p
                row = dcols[r]
                j0 = max(0, -w0)
                j1 = min(k, w - w0)
                if j1 > j0:
                    length = (j1 - j0) * c
                    for i in range(k):
                        ih = h0 + i
                        if ih < 0 or ih >= h:
                            continue
                        dst = dx3[n, ih, (w0 + j0) * c:(w0 + j0) * c + length]
                        src = row[i * kc + j0 * c:i * kc + j0 * c + length]
                        for q in range(length):
                            dst[q] += src[q]
                r += 1


@jit
def bn_train_fwd_(x2, gamma, beta, y2, mean, invstd, rmean, rvar, momentum, eps, act, acc, aff):
    """Training batch norm over the rows of x2 (M, C): statistics, running stats, y = act(x*a + b).

    Sums are shifted by the first row (sum (x - x0), sum (x - x0)^2) and accumulated in
    float64 (eight-row blocks at a time, bn_shifted_sums_), so the one-pass variance does not
    cancel catastrophically.
    """
    bn_shifted_sums_(x2, x2[0], acc[0], acc[1], 0, x2.shape[0])
    bn_train_fwd_finish_(x2, gamma, beta, mean, invstd, rmean, rvar, momentum, eps, acc, aff)
    affine_act_(x2, y2, aff, act)


@jit
def bn_shifted_sums_(x2, x0, s1, s2, r0, r1):
    """s1[j] = sum (x[i, j] - x0[j]), s2[j] = the sum of squares, over rows r0 <= i < r1.

    Blocks of eight rows are summed pairwise in the input's precision, and the block sums
    into float64 accumulators: the float64 work per value was what bound this pass (2.1
    against 1.5 ms for 100352x32 on one thread), and an eight-term float32 sum of shifted
    values is good to a few ulps. The accumulators are local, so they stay out of x2's way.
    """
    c = x2.shape[1]
    a1 = np.zeros(c)
    a2 = np.zeros(c)
    i = r0
    while i + 8 <= r1:
        p0, p1, p2, p3 = x2[i], x2[i + 1], x2[i + 2], x2[i + 3]
        p4, p5, p6, p7 = x2[i + 4], x2[i + 5], x2[i + 6], x2[i + 7]
        for j in range(c):
            z = x0[j]
            d0, d1, d2, d3 = p0[j] - z, p1[j] - z, p2[j] - z, p3[j] - z
            d4, d5, d6, d7 = p4[j] - z, p5[j] - z, p6[j] - z, p7[j] - z
            a1[j] += np.float64(((d0 + d1) + (d2 + d3)) + ((d4 + d5) + (d6 + d7)))
            a2[j] += np.float64(((d0 * d0 + d1 * d1) + (d2 * d2 + d3 * d3))
                                + ((d4 * d4 + d5 * d5) + (d6 * d6 + d7 * d7)))
        i += 8
    for r in range(i, r1):
        p0 = x2[r]
        for j in range(c):
            d0 = p0[j] - x0[j]
            a1[j] += np.float64(d0)
            a2[j] += np.float64(d0 * d0)
    for j in range(c):
        s1[j] = a1[j]
        s2[j] = a2[j]


@jit
def bn_train_fwd_finish_(x2, gamma, beta, mean, invstd, rmean, rvar, momentum, eps, acc, aff):
    """From the shifted sums: mean, invstd, running stats, and the affine y = x*aff[0] + aff[1]."""
    m, c = x2.shape
    x0 = x2[0]
    inv_m = 1.0 / m
    unbias = m / (m - 1.0) if m > 1 else np.nan
    for j in range(c):
        ms = acc[0, j] * inv_m
        var = acc[1, j] * inv_m - ms * ms
        if var < 0.0:
            var = 0.0
        mu = np.float64(x0[j]) + ms
        istd = 1.0 / np.sqrt(var + eps)
        mean[j] = mu
        invstd[j] = istd
        if math.isfinite(mu) and math.isfinite(var):  # a non-finite batch must not poison inference for good
            rmean[j] = (1.0 - momentum) * rmean[j] + momentum * mu
            rvar[j] = (1.0 - momentum) * rvar[j] + momentum * (var * unbias)
        a = np.float64(gamma[j]) * istd
        aff[0, j] = a
        aff[1, j] = np.float64(beta[j]) - mu * a


@jit
def affine_act_(x2, y2, aff, act):
    """y = act(x * aff[0] + aff[1]) per channel, over rows."""
    channel_affine_(x2, y2, aff[0], aff[1], act)


@jit
def channel_affine_(x2, y2, a, b, act):
    """y = act(x * a + b) with per-channel a, b over the rows of (rows, C) views; act 1 = relu."""
    m, c = x2.shape
    for i in range(m):
        xr = x2[i]
        yr = y2[i]
        if act == 1:
            for j in range(c):
                z = xr[j] * a[j] + b[j]
                yr[j] = z if z > 0 else 0.0
        else:
            for j in range(c):
                yr[j] = xr[j] * a[j] + b[j]


@jit
def bn_train_bwd_(dy2, x2, y2, gamma, mean, invstd, dx2, dgamma, dbeta, act, acc, aff):
    """dx = gamma*invstd*(dy - mean(dy) - xhat*mean(dy*xhat)); dgamma = sum(dy*xhat); dbeta = sum(dy)."""
    bn_grad_sums_(dy2, x2, y2, mean, act, acc[0], acc[1], 0, x2.shape[0])
    bn_train_bwd_finish_(x2, gamma, invstd, dgamma, dbeta, acc, aff)
    bn_dx_(dy2, x2, mean, dx2, aff)


@jit
def bn_grad_sums_(dy2, x2, y2, mean, act, s1, s2, r0, r1):
    """Rows r0 <= i < r1: dy *= (y > 0) with a fused ReLU, in place; s1[j] = sum dy,
    s2[j] = sum dy * (x - mean). As bn_shifted_sums_: blocks of eight rows summed pairwise
    in the input's precision (masked first, while the block is in L1), block sums added in
    float64 (8.5 against 1.9 ms for 100352x32 on one thread: the per-value float64 work and
    a branch per value had bound it)."""
    c = x2.shape[1]
    a1 = np.zeros(c)
    a2 = np.zeros(c)
    i = r0
    while i < r1:
        e = min(r1, i + 8)
        if act == 1:
            for r in range(i, e):
                dr = dy2[r]
                yr = y2[r]
                for j in range(c):
                    if not yr[j] > 0:
                        dr[j] = 0.0
        if e - i == 8:
            g0, g1, g2, g3 = dy2[i], dy2[i + 1], dy2[i + 2], dy2[i + 3]
            g4, g5, g6, g7 = dy2[i + 4], dy2[i + 5], dy2[i + 6], dy2[i + 7]
            q0, q1, q2, q3 = x2[i], x2[i + 1], x2[i + 2], x2[i + 3]
            q4, q5, q6, q7 = x2[i + 4], x2[i + 5], x2[i + 6], x2[i + 7]
            for j in range(c):
                mu = mean[j]
                a1[j] += np.float64(((g0[j] + g1[j]) + (g2[j] + g3[j])) + ((g4[j] + g5[j]) + (g6[j] + g7[j])))
                a2[j] += np.float64(((g0[j] * (q0[j] - mu) + g1[j] * (q1[j] - mu))
                                     + (g2[j] * (q2[j] - mu) + g3[j] * (q3[j] - mu)))
                                    + ((g4[j] * (q4[j] - mu) + g5[j] * (q5[j] - mu))
                                       + (g6[j] * (q6[j] - mu) + g7[j] * (q7[j] - mu))))
        else:
            for r in range(i, e):
                g = dy2[r]
                q = x2[r]
                for j in range(c):
                    a1[j] += np.float64(g[j])
                    a2[j] += np.float64(g[j] * (q[j] - mean[j]))
        i = e
    for j in range(c):
        s1[j] = a1[j]
        s2[j] = a2[j]


@jit
def bn_train_bwd_finish_(x2, gamma, invstd, dgamma, dbeta, acc, aff):
    """dgamma, dbeta, and dx's per-channel coefficients (aff) from the gradient sums."""
    m, c = x2.shape
    inv_m = 1.0 / m
    for j in range(c):
        istd = np.float64(invstd[j])
        sdy = acc[0, j]
        sdyx = acc[1, j]
        dbeta[j] = sdy
        dgamma[j] = sdyx * istd
        a = np.float64(gamma[j]) * istd
        aff[0, j] = a                                   # dy coefficient
        aff[1, j] = -a * istd * istd * sdyx * inv_m     # (x - mean) coefficient
        aff[2, j] = -a * sdy * inv_m                    # constant


@jit
def bn_dx_(dy2, x2, mean, dx2, aff):
    """dx = aff[0]*dy + aff[1]*(x - mean) + aff[2], per channel, over rows."""
    m, c = x2.shape
    a = aff[0]
    b = aff[1]
    k = aff[2]
    for i in range(m):
        dr = dy2[i]
        xr = x2[i]
        o = dx2[i]
        for j in range(c):
            o[j] = a[j] * dr[j] + b[j] * (xr[j] - mean[j]) + k[j]


@jit
def bn_fold_(gamma, beta, rmean, rvar, eps, scale, bias):
    for j in range(gamma.shape[0]):
        sc = np.float64(gamma[j]) / np.sqrt(np.float64(rvar[j]) + eps)
        scale[j] = sc
        bias[j] = np.float64(beta[j]) - np.float64(rmean[j]) * sc


@jit
def bn_inf_(x2, scale, bias, y2, act):
    channel_affine_(x2, y2, scale, bias, act)


@jit
def window_(o, s, p, k, n):
    """Input rows [start, end) that output position o's window covers (padding clipped)."""
    start = o * s - p
    return max(start, 0), min(start + k, n)


@jit
def maxpool_fwd_(x, y, am, k, s, p):
    """y = max over the window (-inf padding); am = ih*W + iw of the first max (NaN wins, as PyTorch)."""
    n_, h, w, c = x.shape
    ho, wo = y.shape[1], y.shape[2]
    for n in range(n_):
        for oh in range(ho):
            hs, he = window_(oh, s, p, k, h)
            for ow in range(wo):
                ws, we = window_(ow, s, p, k, w)
                yr = y[n, oh, ow]
                ar = am[n, oh, ow]
                first = hs * w + ws
                for q in range(c):
                    yr[q] = -np.inf
                    ar[q] = first
                for ih in range(hs, he):
                    for iw in range(ws, we):
                        xr = x[n, ih, iw]
                        idx = ih * w + iw
                        for q in range(c):
                            v = xr[q]
                            b = yr[q]
                            take = (v > b) | (v != v)
                            yr[q] = v if take else b
                            ar[q] = idx if take else ar[q]


@jit
def pool2_rows_(big, small, am):
    """The 2x2 pooling kernels' views: input-sized and output-sized (N, H, W, C) arrays, and the
    argmax, as (N, rows, W*C), so a whole row of pixels is one contiguous run."""
    n_, h, w, c = big.shape
    ho, wo = small.shape[1], small.shape[2]
    return big.reshape(n_, h, w * c), small.reshape(n_, ho, wo * c), am.reshape(n_, ho, wo * c)


@jit
def maxpool2_fwd_(x, y, am):
    """maxpool_fwd_ for the common 2x2 window, stride 2, no padding: views are made once per
    output row (not per window), each window's four inputs are read once, and the running max
    and argmax stay in registers, so the channel loop vectorises (2x the general loop); the
    same values and first-max indices, NaN included."""
    n_, h, w, c = x.shape
    ho, wo = y.shape[1], y.shape[2]
    x3, y3, a3 = pool2_rows_(x, y, am)
    for n in range(n_):
        for oh in range(ho):
            ra = x3[n, 2 * oh]
            rb = x3[n, 2 * oh + 1]
            yr = y3[n, oh]
            ar = a3[n, oh]
            i0 = 2 * oh * w
            for ow in range(wo):
                base = 2 * ow * c
                ob = ow * c
                i00 = i0 + 2 * ow
                for q in range(c):
                    b = ra[base + q]
                    i = i00
                    v = ra[base + c + q]
                    take = (v > b) | (v != v)
                    b = v if take else b
                    i = i00 + 1 if take else i
                    v = rb[base + q]
                    take = (v > b) | (v != v)
                    b = v if take else b
                    i = i00 + w if take else i
                    v = rb[base + c + q]
                    take = (v > b) | (v != v)
                    b = v if take else b
                    i = i00 + w + 1 if take else i
                    yr[ob + q] = b
                    ar[ob + q] = i


@jit
def maxpool_bwd_(dy, am, dx3):
    """dx = 0, then dx[n, am, q] += dy[n, oh, ow, q] (dx3 is dx viewed as (N, H*W, C))."""
    n_, hw, c = dx3.shape
    ho, wo = dy.shape[1], dy.shape[2]
    for n in range(n_):
        for t in range(hw):
            d = dx3[n, t]
            for q in range(c):
                d[q] = 0.0
        for oh in range(ho):
            for ow in range(wo):
                gr = dy[n, oh, ow]
                ar = am[n, oh, ow]
                for q in range(c):
                    dx3[n, ar[q], q] += gr[q]


@jit
def maxpool2_bwd_(dy, am, dx):
    """maxpool_bwd_ for 2x2 windows, stride 2, no padding. Such windows do not overlap, so each
    input gets at most one output's gradient and dx is written in one pass (no zeroing pass, no
    scatter): 0.0 + g where the argmax points, 0 elsewhere, the general loop's bits (-0.0 and
    odd sizes included)."""
    n_, h, w, c = dx.shape
    ho, wo = dy.shape[1], dy.shape[2]
    dx3, dy3, a3 = pool2_rows_(dx, dy, am)
    for n in range(n_):
        for ih in range(h):
            dr = dx3[n, ih]
            oh = ih // 2
            if oh >= ho:
                for q in range(w * c):
                    dr[q] = 0.0
                continue
            gr = dy3[n, oh]
            ar = a3[n, oh]
            for iw in range(w):
                ow = iw // 2
                base = iw * c
                if ow >= wo:
                    for q in range(c):
                        dr[base + q] = 0.0
                    continue
                idx = ih * w + iw
                ob = ow * c
                for q in range(c):
                    dr[base + q] = (gr[ob + q] + 0.0) if ar[ob + q] == idx else 0.0


@jit
def avgpool_fwd_(x, y, k, s, p, kk):
    """y = (sum of the window's inside values) / k^2 (padding counts as zeros).

    kk = k*k as a scalar of the arrays' dtype, so float32 stays float32 (vectorised).
    """
    n_, h, w, c = x.shape
    ho, wo = y.shape[1], y.shape[2]
    for n in range(n_):
        for oh in range(ho):
            hs, he = window_(oh, s, p, k, h)
            for ow in range(wo):
                ws, we = window_(ow, s, p, k, w)
                yr = y[n, oh, ow]
                for q in range(c):
                    yr[q] = 0.0
                for ih in range(hs, he):
                    for iw in range(ws, we):
                        xr = x[n, ih, iw]
                        for q in range(c):
                            yr[q] += xr[q]
                for q in range(c):
                    yr[q] = yr[q] / kk


@jit
def avgpool_bwd_(dy, dx, k, s, p, kk):
    n_, h, w, c = dx.shape
    ho, wo = dy.shape[1], dy.shape[2]
    for n in range(n_):
        for ih in range(h):
            for iw in range(w):
                d = dx[n, ih, iw]
                for q in range(c):
                    d[q] = 0.0
        for oh in range(ho):
            hs, he = window_(oh, s, p, k, h)
            for ow in range(wo):
                ws, we = window_(ow, s, p, k, w)
                gr = dy[n, oh, ow]
                for ih in range(hs, he):
                    for iw in range(ws, we):
                        d = dx[n, ih, iw]
                        for q in range(c):
                            d[q] += gr[q] / kk


@jit
def gap_fwd_(x3, y, div):
    """y[n, q] = mean over the H*W pixels of x3 (N, H*W, C); div = H*W in the arrays' dtype."""
    n_, hw, c = x3.shape
    for n in range(n_):
        yr = y[n]
        for q in range(c):
            yr[q] = 0.0
        for t in range(hw):
            xr = x3[n, t]
            for q in range(c):
                yr[q] += xr[q]
        for q in range(c):
            yr[q] = yr[q] / div


@jit
def gap_bwd_(dy, dx3, div):
    n_, hw, c = dx3.shape
    for n in range(n_):
        gr = dy[n]
        for t in range(hw):
            d = dx3[n, t]
            for q in range(c):
                d[q] = gr[q] / div


# ---- convolution -------------------------------------------------------------------------------
def _conv_geometry(op, x, w, k, s, p):
    if x.ndim != 4 or w.ndim != 4:
        raise PlanError(f"{op}: x must be (N, H, W, Cin) and w (Cout, k, k, Cin); got {x.shape} and {w.shape}.")
    n, h, wd, cin = x.shape
    cout = w.shape[0]
    _check(op, "w", w.shape, (cout, k, k, cin))
    ho, wo = _out_size(h, k, s, p), _out_size(wd, k, s, p)
    if ho < 1 or wo < 1:
        raise PlanError(f"{op}: a {k}x{k} kernel (stride {s}, padding {p}) does not fit a {h}x{wd} input.")
    return n, h, wd, cin, cout, ho, wo


def _tap_span(i: int, size: int, out: int, s: int, p: int) -> tuple[int, int]:
    """Outputs o whose tap i lands inside the input: 0 <= o*s - p + i < size, as [lo, hi)."""
    lo = min(out, max(0, -(-(p - i) // s)))
    return lo, max(lo, min(out, (size - 1 + p - i) // s + 1))


@jit
def im2col_taps_(x3, cols_t, spans, k, s, p, ho, wo, n0, n1):
    """cols_t[i*k + j, (n*ho + oh)*wo + ow] = x[n, oh*s-p+i, ow*s-p+j] (0 outside), images n0 <= n < n1:
    one-channel columns stored tap-major, so a tap's values along an output row are one
    contiguous run, a shifted copy of an input row. spans[i*k + j] = (oh_lo, oh_hi, ow_lo, ow_hi),
    the outputs whose tap lands inside the image (_tap_span)."""
    for n in range(n0, n1):
        for i in range(k):
            for j in range(k):
                tap = cols_t[i * k + j]
                h_lo, h_hi, w_lo, w_hi = spans[i * k + j, 0], spans[i * k + j, 1], spans[i * k + j, 2], spans[i * k + j, 3]
                for oh in range(ho):
                    r = (n * ho + oh) * wo
                    dst = tap[r:r + wo]
                    if oh < h_lo or oh >= h_hi:
                        for q in range(wo):
                            dst[q] = 0.0
                        continue
                    for q in range(w_lo):
                        dst[q] = 0.0
                    for q in range(w_hi, wo):
                        dst[q] = 0.0
                    src = x3[n, oh * s - p + i]
                    inside = dst[w_lo:w_hi]
                    if s == 1:
                        seg = src[w_lo - p + j:w_hi - p + j]
                        for q in range(w_hi - w_lo):
                            inside[q] = seg[q]
                    else:
                        for q in range(w_hi - w_lo):
                            inside[q] = src[(w_lo + q) * s - p + j]


def tap_major(cols: np.ndarray) -> np.ndarray:
    """The (M, k*k) columns of a one-channel convolution as the products read them: the cols
    region holds them tap-major, (k*k, M) (im2col_one_channel), so this is a transposed view."""
    m, kk = cols.shape
    if not cols.flags.c_contiguous:
        raise PlanError(f"conv: the im2col buffer of a one-channel convolution must be one contiguous block, got "
                        f"strides {cols.strides} for shape {cols.shape}. Fix: give it a region of its own.")
    return cols.reshape(-1).reshape(kk, m).T


def im2col_one_channel(x: np.ndarray, cols: np.ndarray, k: int, s: int, p: int, ho: int, wo: int) -> Kernel:
    """im2col for Cin = 1 (grayscale first layers), written tap-major into cols' memory (read it
    through tap_major(cols)). With one channel a patch row is k scalars, too short for im2col_'s
    per-pixel loops; tap-major, each tap of an output row is one contiguous copy. For the conv
    net's 128x28x28 batch (3x3, padding 1) it took 0.85 ms against 2.66 ms for the k*k strided
    NumPy copies into (M, k*k) it replaced, caches evicted before each; the products read the
    transposed operand as fast (forward 1.07 against 1.05 ms, weight gradient 2.3 against 2.0)."""
    n, h, w, _ = x.shape
    x3, cols_t = x.reshape(n, h, w), tap_major(cols).T
    spans = np.array([_tap_span(i, h, ho, s, p) + _tap_span(j, w, wo, s, p) for i in range(k) for j in range(k)],
                     np.int64)
    if THREADED:
        fp = conv_par.im2col_taps_par_
        return lambda: fp(x3, cols_t, spans, k, s, p, ho, wo)
    f = im2col_taps_
    return lambda: f(x3, cols_t, spans, k, s, p, ho, wo, 0, n)


def patch_pass(x3: np.ndarray, cols: np.ndarray, c: int, k: int, s: int, p: int, ho: int, wo: int,
               to_cols: bool) -> Kernel:
    """im2col (x3 -> cols) or, with to_cols=False, col2im (cols -> x3) as a bound kernel; by
    blocks of images on numba's threads when the products use that pool (conv_par.py)."""
    if THREADED:
        fp = conv_par.patches_par_
        return lambda: fp(x3, cols, c, k, s, p, ho, wo, to_cols)
    if to_cols:
        f = im2col_
        return lambda: f(x3, cols, c, k, s, p, ho, wo)
    g = col2im_
    return lambda: g(cols, x3, c, k, s, p, ho, wo)


@kernel("conv_fwd")
def conv_fwd(outs, ins, p, env):
    """y = act(im2col(x) @ Wmat^T + b): one im2col pass, one GEMM, one fused bias+ReLU pass."""
    k, s, pad = int(p["k"]), int(p.get("s", 1)), int(p.get("p", 0))
    x, w = ins[0], ins[1]
    has_b = bool(p.get("bias", False))
    b = ins[2] if has_b else EMPTY_F32.astype(x.dtype)
    act = _act("conv_fwd", p)
    n, h, wd, cin, cout, ho, wo = _conv_geometry("conv_fwd", x, w, k, s, pad)
    y = outs[0]
    _check("conv_fwd", "y", y.shape, (n, ho, wo, cout))
    m = n * ho * wo
    y2 = y.reshape(m, cout)
    wt = w.reshape(cout, -1).T
    post = has_b or act
    if k == 1 and s == 1 and pad == 0:
        product1 = gemm(x.reshape(m, cin), wt, y2)
        if not post:
            return product1
        bias_act1 = bias_act_pass(y2, b, act, 0.0)

        def run1() -> None:
            product1()
            bias_act1()
        return run1
    if len(outs) < 2:
        raise PlanError(f"conv_fwd: a {k}x{k} convolution (stride {s}, padding {pad}) needs the im2col buffer "
                        f"'cols' ({m}, {k * k * cin}) as its second output.")
    cols = outs[1]
    _check("conv_fwd", "cols", cols.shape, (m, k * k * cin))
    if conv_tiled.applies(x, w, cols, k, s, pad) and y.flags.c_contiguous and b.flags.c_contiguous:
        return conv_tiled.bind_fwd(x, w, y, cols, b, act, k, s, pad, ho, wo)
    if cin == 1:
        im2col = im2col_one_channel(x, cols, k, s, pad, ho, wo)
    else:
        im2col = patch_pass(x.reshape(n, h, wd * cin), cols, cin, k, s, pad, ho, wo, to_cols=True)

    product = gemm(tap_major(cols) if cin == 1 else cols, wt, y2)
    bias_act = bias_act_pass(y2, b, act, 0.0) if post else (lambda: None)

    def run() -> None:
        im2col()
        product()
        bias_act()
    return run


class ConvBwd(NamedTuple):
    """The operands of a conv_bwd node, checked and reshaped (shared by the CPU and GPU tables)."""

    geometry: tuple[int, int, int, int, int, int, int]  # n, h, w, cin, cout, ho, wo
    k: int
    s: int
    pad: int
    act: int
    dy2: Any     # (M, Cout) view of dy
    y2: Any      # (M, Cout) view of the forward output (dy2 when there is no ReLU)
    cols: Any    # (M, k*k*Cin): the im2col buffer, or x as (M, Cin) for a 1x1/stride-1 conv
    wmat: Any    # (Cout, k*k*Cin)
    dw2: Any     # (Cout, k*k*Cin)
    db: Any      # (Cout,) or None
    dx: Any      # like x, or None (first layer)
    dx2: Any     # dx as (M, Cin) for a 1x1/stride-1 conv (written by the GEMM), else None
    dcols: Any   # like cols when dx goes through col2im, else None


def conv_bwd_operands(outs: Sequence[Any], ins: Sequence[Any], p: dict) -> ConvBwd:
    k, s, pad = int(p["k"]), int(p.get("s", 1)), int(p.get("p", 0))
    dy, x, w = ins[0], ins[1], ins[2]
    cols = ins[3] if len(ins) > 3 else None
    y = ins[4] if len(ins) > 4 else None
    act = _act("conv_bwd", p)
    if act and y is None:
        raise PlanError("conv_bwd: act='relu' needs the forward output y as the fifth input.")
    has_b, need_dx = bool(p.get("bias", False)), bool(p.get("need_dx", True))
    geometry = _conv_geometry("conv_bwd", x, w, k, s, pad)
    n, h, wd, cin, cout, ho, wo = geometry
    _check("conv_bwd", "dy", dy.shape, (n, ho, wo, cout))
    m = n * ho * wo
    outs = list(outs)
    dw = outs.pop(0)
    _check("conv_bwd", "dw", dw.shape, w.shape)
    db = outs.pop(0) if has_b else None
    dx = outs.pop(0) if need_dx else None
    dcols = outs.pop(0) if (need_dx and outs) else None
    direct = k == 1 and s == 1 and pad == 0
    if direct:
        cols = x.reshape(m, cin)
    else:
        if cols is None:
            raise PlanError("conv_bwd: the im2col buffer 'cols' of the forward pass is the fourth input.")
        _check("conv_bwd", "cols", cols.shape, (m, k * k * cin))
    dy2 = dy.reshape(m, cout)
    dx2 = None
    if dx is not None:
        _check("conv_bwd", "dx", dx.shape, x.shape)
        if direct:
            dx2, dcols = dx.reshape(m, cin), None
        else:
            if dcols is None:
                raise PlanError("conv_bwd: need_dx needs a dcols scratch view shaped like cols.")
            _check("conv_bwd", "dcols", dcols.shape, cols.shape)
    return ConvBwd(geometry, k, s, pad, act, dy2, y.reshape(m, cout) if act else dy2, cols, w.reshape(cout, -1),
                   dw.reshape(cout, -1), db, dx, dx2, dcols)


@kernel("conv_bwd")
def conv_bwd(outs, ins, p, env):
    """dy *= (y > 0) if relu; dW = dy2d^T cols; db = 1^T dy2d; dcols = dy2d Wmat; dx = col2im(dcols)."""
    o = conv_bwd_operands(outs, ins, p)
    n, h, wd, cin, cout, ho, wo = o.geometry
    k, s, pad, act, dy2, y2, cols, wmat, dw2, db, dx2, dcols = (o.k, o.s, o.pad, o.act, o.dy2, o.y2, o.cols,
                                                                 o.wmat, o.dw2, o.db, o.dx2, o.dcols)
    dx3 = o.dx.reshape(n, h, wd * cin) if dcols is not None else None
    pre = act_grad_colsum_pass(dy2, y2, act, 0.0, db) if (act or db is not None) else (lambda: None)
    x, w = ins[1], ins[2]
    remake: Kernel = lambda: None  # noqa: E731
    if conv_tiled.applies(x, w, cols, k, s, pad):  # the forward ran by tiles: cols holds its scratch
        if all(a is None or a.flags.c_contiguous for a in (dy2, o.dx, dcols)):
            grads = conv_tiled.bind_bwd(x, dy2, w, dw2, cols, o.dx, dcols, k, s, pad, ho, wo)

            def run_tiled() -> None:
                pre()
                grads()
            return run_tiled
        remake = patch_pass(x.reshape(n, h, wd * cin), cols, cin, k, s, pad, ho, wo, to_cols=True)
    into = dx2 if dx2 is not None else dcols  # dx itself for a 1x1 conv, else the columns col2im scatters
    # banded one after the other: side by side (gemm_pair, as fc_bwd) was no faster at these tall shapes
    one_channel = cin == 1 and not (k == 1 and s == 1 and pad == 0)  # cols tap-major (im2col_one_channel)
    weight_grad = gemm(dy2.T, tap_major(cols) if one_channel else cols, dw2)
    input_grad = gemm(dy2, wmat, into) if into is not None else None
    scatter = patch_pass(dx3, dcols, cin, k, s, pad, ho, wo, to_cols=False) if dx3 is not None else (lambda: None)

    def run() -> None:
        pre()
        remake()
        weight_grad()
        if input_grad is not None:
            input_grad()
        scatter()
    return run


# ---- batch norm ------------------------------------------------------------------------------
def _rows(a: np.ndarray) -> np.ndarray:
    """(N, H, W, C) or (N, C) -> (rows, C), a view."""
    return a.reshape(-1, a.shape[-1])


def bn_fwd_operands(outs: Sequence[Any], ins: Sequence[Any], p: dict) -> tuple[Any, ...]:
    """(x2, gamma, beta, y2, mean, invstd, rmean, rvar, momentum, eps, act) of a bn_fwd node, checked,
    x and y as (rows, C) (shared by the CPU and GPU tables)."""
    x, gamma, beta = ins
    y, mean, invstd, rmean, rvar = outs
    _check("bn_fwd", "y", y.shape, x.shape)
    c = x.shape[-1]
    for name, a in (("gamma", gamma), ("beta", beta), ("mean", mean), ("invstd", invstd),
                    ("running_mean", rmean), ("running_var", rvar)):
        _check("bn_fwd", name, a.shape, (c,))
    x2, y2 = _rows(x), _rows(y)
    if x2.shape[0] < 2:
        raise PlanError(f"bn_fwd: training batch norm needs more than one value per channel, got input {x.shape}.")
    momentum, eps = float(p.get("momentum", 0.1)), float(p.get("eps", 1e-5))
    return x2, gamma, beta, y2, mean, invstd, rmean, rvar, momentum, eps, _act("bn_fwd", p)


def bn_bwd_operands(outs: Sequence[Any], ins: Sequence[Any], p: dict) -> tuple[Any, ...]:
    """(dy2, x2, y2, gamma, mean, invstd, dx2, dgamma, dbeta, act) of a bn_bwd node, checked, feature maps
    as (rows, C); y2 is x2 without a fused ReLU (shared by the CPU and GPU tables)."""
    dy, x, y, gamma, mean, invstd = ins
    dx, dgamma, dbeta = outs
    _check("bn_bwd", "dx", dx.shape, x.shape)
    _check("bn_bwd", "dy", dy.shape, x.shape)
    act = _act("bn_bwd", p)
    x2 = _rows(x)
    return _rows(dy), x2, (_rows(y) if act else x2), gamma, mean, invstd, _rows(dx), dgamma, dbeta, act


@kernel("bn_fwd")
def bn_fwd(outs, ins, p, env):
    """Training batch norm: batch statistics (float64), running stats as PyTorch, y = act(xhat*g + b)."""
    x2, gamma, beta, y2, mean, invstd, rmean, rvar, momentum, eps, act = bn_fwd_operands(outs, ins, p)
    c = x2.shape[1]
    acc = np.zeros((2, c), np.float64)  # bind-time scratch: shifted sums
    aff = np.zeros((2, c), x2.dtype)    # bind-time scratch: per-channel scale and shift
    if THREADED:
        parts, fp = np.zeros((fused.PAR_CHUNKS, 2, c), np.float64), conv_par.bn_train_fwd_par_
        return lambda: fp(x2, gamma, beta, y2, mean, invstd, rmean, rvar, momentum, eps, act, acc, aff, parts)
    f = bn_train_fwd_
    return lambda: f(x2, gamma, beta, y2, mean, invstd, rmean, rvar, momentum, eps, act, acc, aff)


@kernel("bn_bwd")
def bn_bwd(outs, ins, p, env):
    dy2, x2, y2, gamma, mean, invstd, dx2, dgamma, dbeta, act = bn_bwd_operands(outs, ins, p)
    c = x2.shape[1]
    acc = np.zeros((2, c), np.float64)
    aff = np.zeros((3, c), np.float64)
    if THREADED:
        parts, fp = np.zeros((fused.PAR_CHUNKS, 2, c), np.float64), conv_par.bn_train_bwd_par_
        return lambda: fp(dy2, x2, y2, gamma, mean, invstd, dx2, dgamma, dbeta, act, acc, aff, parts)
    f = bn_train_bwd_
    return lambda: f(dy2, x2, y2, gamma, mean, invstd, dx2, dgamma, dbeta, act, acc, aff)


@kernel("bn_fold")
def bn_fold(outs, ins, p, env):
    """Inference batch norm as a per-channel affine: scale = g/sqrt(rv+eps), bias = b - rm*scale."""
    gamma, beta, rmean, rvar = ins
    scale, bias = outs
    eps, f = float(p.get("eps", 1e-5)), bn_fold_
    return lambda: f(gamma, beta, rmean, rvar, eps, scale, bias)


@kernel("bn_inf")
def bn_inf(outs, ins, p, env):
    x, scale, bias = ins
    (y,) = outs
    _check("bn_inf", "y", y.shape, x.shape)
    x2, y2 = _rows(x), _rows(y)
    act, f = _act("bn_inf", p), bn_inf_
    return lambda: f(x2, scale, bias, y2, act)


# ---- pooling -----------------------------------------------------------------------------------
def _pool_geometry(op, x, y, p):
    k, s, pad = int(p["k"]), int(p.get("s", p["k"])), int(p.get("p", 0))
    if pad * 2 > k:
        raise PlanError(f"{op}: padding {pad} must be at most half the kernel size {k} (as in PyTorch).")
    n, h, w, c = x.shape
    _check(op, "output", y.shape, (n, _out_size(h, k, s, pad), _out_size(w, k, s, pad), c))
    return k, s, pad


@kernel("maxpool_fwd")
def maxpool_fwd(outs, ins, p, env):
    (x,) = ins
    y, am = outs
    k, s, pad = _pool_geometry("maxpool_fwd", x, y, p)
    _check("maxpool_fwd", "argmax", am.shape, y.shape)
    two_by_two = (k, s, pad) == (2, 2, 0) and all(a.flags.c_contiguous for a in (x, y, am))
    if THREADED:
        fp = conv_par.maxpool_fwd_par_
        return lambda: fp(x, y, am, k, s, pad, two_by_two)
    if two_by_two:
        f2 = maxpool2_fwd_
        return lambda: f2(x, y, am)
    f = maxpool_fwd_
    return lambda: f(x, y, am, k, s, pad)


@kernel("maxpool_bwd")
def maxpool_bwd(outs, ins, p, env):
    dy, am = ins
    (dx,) = outs
    n, h, w, c = dx.shape
    k = p.get("k")
    two_by_two = (k, p.get("s", k), p.get("p", 0)) == (2, 2, 0) and all(a.flags.c_contiguous for a in (dy, am, dx))
    if THREADED:
        fp = conv_par.maxpool_bwd_par_
        return lambda: fp(dy, am, dx, two_by_two)
    if two_by_two:
        f2 = maxpool2_bwd_
        return lambda: f2(dy, am, dx)
    dx3 = dx.reshape(n, h * w, c)
    f = maxpool_bwd_
    return lambda: f(dy, am, dx3)


@kernel("avgpool_fwd")
def avgpool_fwd(outs, ins, p, env):
    (x,), (y,) = ins, outs
    k, s, pad = _pool_geometry("avgpool_fwd", x, y, p)
    f, kk = avgpool_fwd_, x.dtype.type(k * k)
    return lambda: f(x, y, k, s, pad, kk)


@kernel("avgpool_bwd")
def avgpool_bwd(outs, ins, p, env):
    (dy,), (dx,) = ins, outs
    k, s, pad = _pool_geometry("avgpool_bwd", dx, dy, p)
    f, kk = avgpool_bwd_, dx.dtype.type(k * k)
    return lambda: f(dy, dx, k, s, pad, kk)


@kernel("gap_fwd")
def gap_fwd(outs, ins, p, env):
    (x,), (y,) = ins, outs
    n, h, w, c = x.shape
    _check("gap_fwd", "y", y.shape, (n, c))
    x3 = x.reshape(n, h * w, c)
    f, div = gap_fwd_, x.dtype.type(h * w)
    return lambda: f(x3, y, div)


@kernel("gap_bwd")
def gap_bwd(outs, ins, p, env):
    (dy,), (dx,) = ins, outs
    n, h, w, c = dx.shape
    _check("gap_bwd", "dy", dy.shape, (n, c))
    dx3 = dx.reshape(n, h * w, c)
    f, div = gap_bwd_, dx.dtype.type(h * w)
    return lambda: f(dy, dx3, div)


# ---- benchmark -------------------------------------------------------------------------------------
def benchmark(n: int = 128, hw: int = 14, cin: int = 32, cout: int = 64, k: int = 3, reps: int = 30) -> dict:
    """Forward+backward of one conv (bias, ReLU, dx) vs the same three GEMMs alone; best-of-reps.

    ``python -c "from renaissance_nb.kernels.conv import benchmark; print(benchmark())"``. On a shared machine take the
    best of a few runs: the numbers are minima, so noise only ever makes them worse.
    """
    import time

    from .cpu import KERNELS, BindEnv

    rng = np.random.default_rng(0)
    pad = k // 2
    ho = _out_size(hw, k, 1, pad)
    m, kk = n * ho * ho, k * k * cin
    x = rng.standard_normal((n, hw, hw, cin), dtype=np.float32)
    w = (rng.standard_normal((cout, k, k, cin)) / np.sqrt(kk)).astype(np.float32)
    b = np.zeros(cout, np.float32)
    y, cols = np.empty((n, ho, ho, cout), np.float32), np.empty((m, kk), np.float32)
    dy, dw, db, dx, dcols = (rng.standard_normal(y.shape, dtype=np.float32), np.empty_like(w), np.empty_like(b),
                             np.empty_like(x), np.empty_like(cols))
    prm = dict(k=k, s=1, p=pad, bias=True, act="relu", need_dx=True)
    fwd = KERNELS["conv_fwd"]([y, cols], [x, w, b], prm, BindEnv())
    bwd = KERNELS["conv_bwd"]([dw, db, dx, dcols], [dy, x, w, cols, y], prm, BindEnv())
    y2, dy2, dw2, wmat = y.reshape(m, cout), dy.reshape(m, cout), dw.reshape(cout, -1), w.reshape(cout, -1)
    mm = np.matmul

    def gemms() -> None:
        mm(cols, wmat.T, out=y2)
        mm(dy2.T, cols, out=dw2)
        mm(dy2, wmat, out=dcols)

    best = {"fwd": 1e9, "bwd": 1e9, "gemms": 1e9}
    fwd(), bwd(), gemms()
    for _ in range(reps):
        for name, f in (("fwd", fwd), ("bwd", bwd), ("gemms", gemms)):
            t0 = time.perf_counter()
            f()
            best[name] = min(best[name], time.perf_counter() - t0)
    flop = 3 * 2.0 * m * kk * cout
    return {"fwd_ms": best["fwd"] * 1e3, "bwd_ms": best["bwd"] * 1e3,
            "conv_gflops": flop / (best["fwd"] + best["bwd"]) / 1e9, "gemm_only_gflops": flop / best["gemms"] / 1e9}


from . import conv_par  # noqa: E402 - the threaded variants import this module's serial kernels
from . import conv_tiled  # noqa: E402 - the tiled convolutions import this module's im2col_ and col2im_

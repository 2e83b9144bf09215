"""The numba loops of the convolution, batch-norm and pooling kernels.

conv.py binds them (its docstring gives the NHWC layout and the formulation: im2col + one
GEMM); conv_par.py splits the same loops by images or rows on numba's threads and
conv_tiled.py runs im2col_ / col2im_ by tiles. Every loop writes into arrays it is given
and allocates nothing; each takes the arrays' dtype (float32 in training, float64 in the
finite-difference tests).
"""
from __future__ import annotations

import math

import numpy as np

from .fused import jit


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
    bn_train_stats_(x2, gamma, beta, mean, invstd, rmean, rvar, momentum, eps, acc, aff)
    affine_act_(x2, y2, aff, act)


@jit
def bn_train_stats_(x2, gamma, beta, mean, invstd, rmean, rvar, momentum, eps, acc, aff):
    """bn_train_fwd_ without y: the statistics, running statistics and the affine aff, which the max pool
    after it applies (maxpool_fwd_'s bn_relu)."""
    bn_shifted_sums_(x2, x2[0], acc[0], acc[1], 0, x2.shape[0])
    bn_train_fwd_finish_(x2, gamma, beta, mean, invstd, rmean, rvar, momentum, eps, acc, aff)


@jit
def bn_shifted_sums_(x2, x0, s1, s2, r0, r1):
    """s1[j] = sum (x[i, j] - x0[j]), s2[j] = the sum of squares, over rows r0 <= i < r1.

    Blocks of eight rows are summed pairwise in the input's precision, and the block sums
    into float64 accumulators: the float64 work per value was what bound this pass (2.1
    against 1.5 ms for 100352x32 on one thread), and an eight-term float32 sum of shifted
    values is good to a few ulps. s1 and s2 are the accumulators (zeroed first): a local
    np.zeros here was two numba allocations per call, per chunk, every step.
    """
    c = x2.shape[1]
    a1 = s1
    a2 = s2
    for j in range(c):
        a1[j] = 0.0
        a2[j] = 0.0
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
    a branch per value had bound it). s1 and s2 are the accumulators (zeroed first, no allocation)."""
    c = x2.shape[1]
    a1 = s1
    a2 = s2
    for j in range(c):
        a1[j] = 0.0
        a2[j] = 0.0
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
def bn_relu_(v, a, b):
    """channel_affine_'s value with act=relu: what a batch norm with a fused ReLU writes for its input v (the max
    pools of bn_relu=True read the batch norm's input and affine instead of its output). np.float32(0.0) keeps
    a float32 value float32 (a 0.0 literal would widen it, and the loops that use it, to float64)."""
    z = v * a + b
    return z if z > 0 else np.float32(0.0)


@jit
def maxpool_fwd_(x, y, am, k, s, p, aff, bn_relu):
    """y = max over the window (-inf padding); am = ih*W + iw of the first max (NaN wins, as PyTorch). With
    ``bn_relu`` the window's values are bn_relu_(x, aff[0], aff[1]): x is a batch norm's input."""
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
                            v = bn_relu_(xr[q], aff[0, q], aff[1, q]) if bn_relu else xr[q]
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
def maxpool2_fwd_(x, y, am, aff, bn_relu):
    """maxpool_fwd_ for the common 2x2 window, stride 2, no padding: views are made once per
    output row (not per window), each window's four inputs are read once, and the running max
    and argmax stay in registers, so the channel loop vectorises (2x the general loop); the
    same values and first-max indices, NaN included; ``bn_relu`` as in maxpool_fwd_."""
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
                    a0, a1 = aff[0, q], aff[1, q]
                    b = bn_relu_(ra[base + q], a0, a1) if bn_relu else ra[base + q]
                    i = i00
                    v = bn_relu_(ra[base + c + q], a0, a1) if bn_relu else ra[base + c + q]
                    take = (v > b) | (v != v)
                    b = v if take else b
                    i = i00 + 1 if take else i
                    v = bn_relu_(rb[base + q], a0, a1) if bn_relu else rb[base + q]
                    take = (v > b) | (v != v)
                    b = v if take else b
                    i = i00 + w if take else i
                    v = bn_relu_(rb[base + c + q], a0, a1) if bn_relu else rb[base + c + q]
                    take = (v > b) | (v != v)
                    b = v if take else b
                    i = i00 + w + 1 if take else i
                    yr[ob + q] = b
                    ar[ob + q] = i


@jit
def maxpool_bwd_(dy, am, dx3, py, relu):
    """dx = 0, then dx[n, am, q] += dy[n, oh, ow, q] (dx3 is dx viewed as (N, H*W, C)). With ``relu``, the
    gradient of a fused ReLU before the pool too: a window whose max py (the forward's output) is not above
    0 passes 0.0 (see ops/pool.py relu_through_pool)."""
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
                pr = py[n, oh, ow]
                for q in range(c):
                    dx3[n, ar[q], q] += gr[q] if not relu or pr[q] > 0 else np.float32(0.0)  # float32 stays


@jit
def maxpool2_bwd_(dy, am, dx, py, relu):
    """maxpool_bwd_ for 2x2 windows, stride 2, no padding. Such windows do not overlap, so each
    input gets at most one output's gradient and dx is written in one pass (no zeroing pass, no
    scatter): 0.0 + g where the argmax points (and, with ``relu``, py > 0), 0 elsewhere, the general
    loop's bits (-0.0 and odd sizes included)."""
    n_, h, w, c = dx.shape
    ho, wo = dy.shape[1], dy.shape[2]
    dx3, dy3, a3 = pool2_rows_(dx, dy, am)
    p3 = py.reshape(n_, ho, wo * c)
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
            pr = p3[n, oh]
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
                    keep = ar[ob + q] == idx and (not relu or pr[ob + q] > 0)
                    dr[base + q] = (gr[ob + q] + 0.0) if keep else 0.0


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

"""The conv net's memory passes (im2col, col2im, batch norm, max pooling) on numba's threads.

The products already run as bands on numba's pool (kernels/blas.py), so the passes between
them can use both cores too without a second pool fighting the first. Each variant splits
its work so that every output value is computed exactly as by the serial kernel in
conv_loops.py: by images (im2col, col2im and pooling are independent per image) or by rows (the
element-wise batch-norm passes): those give the serial kernels' bytes. The batch-norm sums
are the exception: they are float64 partial sums of PAR_CHUNKS fixed row blocks (edges on
multiples of eight rows, so each chunk adds the serial kernel's eight-row float32 blocks),
added in order, so they can differ from the one-pass sums in the last float64 bits (tests
bound it), and they are the same on every machine whatever its thread count.
"""
from __future__ import annotations

import numba

from .conv_loops import (affine_act_, bn_dx_, bn_grad_sums_, bn_shifted_sums_, bn_train_bwd_finish_,
                         bn_train_fwd_finish_, col2im_, im2col_, im2col_taps_, maxpool2_bwd_, maxpool2_fwd_,
                         maxpool_bwd_, maxpool_fwd_)
from .fused import PAR_CHUNKS, fold_blocks, jit, par
from .fused import cut as _cut


@par
def patches_par_(x3, cols, c, k, s, p, ho, wo, to_cols):
    """By blocks of images: im2col_ (x3 -> cols) when to_cols, else col2im_ (cols -> x3, each
    image's scatter in its serial order)."""
    n = x3.shape[0]
    parts = min(n, PAR_CHUNKS)
    per = ho * wo
    for t in numba.prange(parts):
        n0, n1 = _cut(n, parts, t), _cut(n, parts, t + 1)
        if to_cols:
            im2col_(x3[n0:n1], cols[n0 * per:n1 * per], c, k, s, p, ho, wo)
        else:
            col2im_(cols[n0 * per:n1 * per], x3[n0:n1], c, k, s, p, ho, wo)


@par
def im2col_taps_par_(x3, cols_t, spans, k, s, p, ho, wo):
    """im2col_taps_ (one-channel columns, tap-major) by blocks of images."""
    n = x3.shape[0]
    parts = min(n, PAR_CHUNKS)
    for t in numba.prange(parts):
        im2col_taps_(x3, cols_t, spans, k, s, p, ho, wo, _cut(n, parts, t), _cut(n, parts, t + 1))


@par
def maxpool_fwd_par_(x, y, am, k, s, p, two_by_two, aff, bn_relu):
    """maxpool_fwd_ (maxpool2_fwd_ when two_by_two) by blocks of images."""
    n = x.shape[0]
    parts = min(n, PAR_CHUNKS)
    for t in numba.prange(parts):
        n0, n1 = _cut(n, parts, t), _cut(n, parts, t + 1)
        if two_by_two:
            maxpool2_fwd_(x[n0:n1], y[n0:n1], am[n0:n1], aff, bn_relu)
        else:
            maxpool_fwd_(x[n0:n1], y[n0:n1], am[n0:n1], k, s, p, aff, bn_relu)


@par
def maxpool_bwd_par_(dy, am, dx, two_by_two, py, relu):
    """maxpool_bwd_ (maxpool2_bwd_ when two_by_two) by blocks of images; dx is (N, H, W, C)."""
    n, h, w, c = dx.shape
    parts = min(n, PAR_CHUNKS)
    for t in numba.prange(parts):
        n0, n1 = _cut(n, parts, t), _cut(n, parts, t + 1)
        if two_by_two:
            maxpool2_bwd_(dy[n0:n1], am[n0:n1], dx[n0:n1], py[n0:n1], relu)
        else:
            maxpool_bwd_(dy[n0:n1], am[n0:n1], dx[n0:n1].reshape(n1 - n0, h * w, c), py[n0:n1], relu)


@jit
def _cut8(m, chunks, t):
    """cut() with inner edges rounded up to a multiple of 8 rows: the batch-norm sums add
    eight-row blocks in float32 first, so chunks on those edges sum the serial kernel's blocks."""
    return min(m, (_cut(m, chunks, t) + 7) // 8 * 8)


@jit
def _fold_parts(parts, acc):
    """acc[k] = sum over t of parts[t, k], t in order (a fixed order: the same bytes every step)."""
    for k in range(2):
        fold_blocks(parts[:, k], acc[k])


@par
def bn_train_fwd_par_(x2, gamma, beta, y2, mean, invstd, rmean, rvar, momentum, eps, act, acc, aff, parts):
    """bn_train_fwd_ on numba's threads: the sums in PAR_CHUNKS row blocks (each shifted by the
    first row, as the serial sums), added in block order, then the affine pass in row blocks."""
    m = x2.shape[0]
    chunks = parts.shape[0]
    bn_train_stats_par_(x2, gamma, beta, mean, invstd, rmean, rvar, momentum, eps, acc, aff, parts)
    for t in numba.prange(chunks):
        r0, r1 = _cut(m, chunks, t), _cut(m, chunks, t + 1)
        affine_act_(x2[r0:r1], y2[r0:r1], aff, act)


@par
def bn_train_stats_par_(x2, gamma, beta, mean, invstd, rmean, rvar, momentum, eps, acc, aff, parts):
    """bn_train_fwd_par_ without y (conv_loops.bn_train_stats_)."""
    m = x2.shape[0]
    x0 = x2[0]
    chunks = parts.shape[0]
    for t in numba.prange(chunks):
        bn_shifted_sums_(x2, x0, parts[t, 0], parts[t, 1], _cut8(m, chunks, t), _cut8(m, chunks, t + 1))
    _fold_parts(parts, acc)
    bn_train_fwd_finish_(x2, gamma, beta, mean, invstd, rmean, rvar, momentum, eps, acc, aff)


@par
def bn_train_bwd_par_(dy2, x2, y2, gamma, mean, invstd, dx2, dgamma, dbeta, act, acc, aff, parts):
    """bn_train_bwd_ on numba's threads: the gradient sums in row blocks, added in block order,
    then dx in row blocks."""
    m = x2.shape[0]
    chunks = parts.shape[0]
    for t in numba.prange(chunks):
        bn_grad_sums_(dy2, x2, y2, mean, act, parts[t, 0], parts[t, 1], _cut8(m, chunks, t),
                      _cut8(m, chunks, t + 1))
    _fold_parts(parts, acc)
    bn_train_bwd_finish_(x2, gamma, invstd, dgamma, dbeta, acc, aff)
    for t in numba.prange(chunks):
        r0, r1 = _cut(m, chunks, t), _cut(m, chunks, t + 1)
        bn_dx_(dy2[r0:r1], x2[r0:r1], mean, dx2[r0:r1], aff)

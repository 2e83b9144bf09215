"""3x3 stride-1 convolutions by Winograd's F(2x2, 3x3) on the CPU: 16 multiplications for 4 outputs
instead of 36; and by F(4x4, 3x3), 36 for 16 (its transforms: winograd43.py), from 7x7 maps up (tile).

Why: in the README's ResNet three of the five convolutions are 3x3, stride 1, padding 1, and they were
two thirds of the step, im2col + sgemm already at 84-89% of the sgemm's peak. Fewer
multiplications was the gain left. For each 4x4 input patch d (stride 2, so neighbouring patches
overlap by 2) and each channel, V = B^T d B; for each pair of channels U = G g G^T (g the 3x3
filter); then 16 products M[xi] = V[xi] U[xi], one sgemm per xi over a chunk of tiles (K = Cin, the
tiles as rows); the 2x2 outputs are A^T M A (Lavin and Gray, 2015). The same kernel gives the input
gradient: dx is the convolution of dy with the filters turned 180 degrees and Cin/Cout swapped
(``weights_(..., flip=True)``). The weight gradient is the same algebra run backwards (``dw_``):
dU[xi] = sum over tiles of V[xi]^T (A dY A^T)[xi], one sgemm per xi with the tiles as K, and
dW = G^T dU G.

F(4x4, 3x3) is the same with 6x6 patches (stride 4), 36 planes and 4x4 outputs; every pass below
takes the output tile m (2 or 4): p = (m + 2)^2 planes where this says 16.

Layout: x and y are NHWC, as everywhere on the CPU. A thread walks its share of the batch's tile
rows (image n, tile row ti) a chunk at a time; its buffer holds the chunk's V and M, one row per tile
(the tile's 16 planes of Cin or Cout channels side by side, so the products read plane xi with a
leading dimension of 16 C + PAD), a staging patch for tiles at the border, and in the weight-gradient
pass its dU partial. Each transform is a few loops over the channels with few streams each: numba
vectorises those (written as one loop with 16 streams it ran scalar: each pass 20-25% slower), and rows of
V a multiple of 4 KiB apart would collide in L1 (PAD). The buffers come out of the conv's planned
column scratch (``cols`` forward, ``bwd_cols`` backward): U first, then one buffer per thread; where
they do not fit, the convolution stays im2col (``plan``).

Numbers: the transforms are exact in real arithmetic, and in float32 the result differs from im2col's
by rounding: F(2x2, 3x3) ~3e-7 of the largest output, as im2col's own against a float64 sum;
F(4x4, 3x3) 0.3-5e-6 (tests/test_winograd43.py). A machine and thread count give the same bytes
every step. ``python benchmarks/winograd_cpu.py`` times each layer shape three ways
(benchmarks/results/winograd_cpu.txt, the 2-core EPYC VM, batch 128, from 16 channels up: F(4x4, 3x3)
0.31-0.60x of im2col's time forward and 0.34-0.65x backward; F(2x2, 3x3) 0.46-0.66x and 0.52-0.77x).
``RNB_WINOGRAD=0`` keeps every convolution on im2col; 2 or 4 runs that tile wherever Winograd applies.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Iterable, NamedTuple

import numba
import numpy as np

from . import blas, conv_native
from .blas import NO_TRANS, TRANS, sgemm_at
from .conv_tiled import add_parts_
from .fused import bias_act_, cut, jit, par
from .operands import CONV_THREADS
from .winograd43 import copy_clipped, dw_from_total43, dy_tile4, in_tile6, out_tile4, weights43_

PAD = 16
"""Floats each tile's row of V and M has beyond its 16 planes (see the module's doc)."""
MIN_CHANNELS = 16
"""Fewer input or output channels than this stay im2col. At 8 (K = 8 in the products, the transforms'
loops one vector long) Winograd took 1.03-1.09x of im2col's time forward and 1.33-1.58x backward;
at 16, 0.77x and 0.74x at 28x28 but 1.08x and 1.13x at 7x7, where a 4x4 grid of 2x2 tiles computes
64 outputs for 49: there it takes twice as many (min_channels; 7x7 at 64 -> 128 took 0.64x and 0.72x)
(benchmarks/results/winograd_cpu.txt, the 2-core EPYC VM, batch 128)."""
WASTE = 1.2
"""See min_channels: 7x7 (1.31) needs twice the channels, 13x13 (1.16) and even sizes do not."""
F4_MIN_SIZE = 7
"""Maps smaller than this (either side) stay F(2x2, 3x3) (tile). From 7x7 up F(4x4, 3x3) took 0.65-0.85x
of F(2x2, 3x3)'s time (benchmarks/results/winograd_cpu.txt), even at 7x7 and 14x14, where its 4x4 tiles
compute 1.31 times the outputs; below 7 its tiles waste more than F(2x2, 3x3)'s (unmeasured)."""
CHUNK_BYTES = 256 << 10
"""Target size of a thread's V and M for one chunk of tile rows (in L2)."""


@jit
def weights_(w4, u, flip):
    """u[xi, ci, co] = (G g G^T)[xi] with g = w4[co, :, :, ci] (w4 is (Cout, 3, 3, Cin)); with ``flip``
    the input gradient's filters: u[xi, co, ci] from g = w4[co, ::-1, ::-1, ci]. In float64, rounded
    once."""
    cout, _, _, cin = w4.shape
    for co in range(cout):
        for ci in range(cin):
            if flip:
                g00, g01, g02 = w4[co, 2, 2, ci], w4[co, 2, 1, ci], w4[co, 2, 0, ci]
                g10, g11, g12 = w4[co, 1, 2, ci], w4[co, 1, 1, ci], w4[co, 1, 0, ci]
                g20, g21, g22 = w4[co, 0, 2, ci], w4[co, 0, 1, ci], w4[co, 0, 0, ci]
                i, j = co, ci
            else:
                g00, g01, g02 = w4[co, 0, 0, ci], w4[co, 0, 1, ci], w4[co, 0, 2, ci]
                g10, g11, g12 = w4[co, 1, 0, ci], w4[co, 1, 1, ci], w4[co, 1, 2, ci]
                g20, g21, g22 = w4[co, 2, 0, ci], w4[co, 2, 1, ci], w4[co, 2, 2, ci]
                i, j = ci, co
            g00, g01, g02 = np.float64(g00), np.float64(g01), np.float64(g02)
            # G g, row by row (three columns each), then each row times G^T
            _g_row(u, 0, i, j, g00, g01, g02)
            _g_row(u, 4, i, j, (g00 + g10 + g20) * 0.5, (g01 + g11 + g21) * 0.5, (g02 + g12 + g22) * 0.5)
            _g_row(u, 8, i, j, (g00 - g10 + g20) * 0.5, (g01 - g11 + g21) * 0.5, (g02 - g12 + g22) * 0.5)
            _g_row(u, 12, i, j, np.float64(g20), np.float64(g21), np.float64(g22))


@jit
def _g_row(u, r, ci, co, a0, a1, a2):
    """Row r // 4 of (G g) G^T: u[r..r+3, ci, co]."""
    u[r, ci, co] = a0
    u[r + 1, ci, co] = (a0 + a1 + a2) * 0.5
    u[r + 2, ci, co] = (a0 - a1 + a2) * 0.5
    u[r + 3, ci, co] = a2


@jit
def _in_row(pa, pb, sign, v, c):
    """One row i of B^T d B, planes 4i..4i+3 into v (4c): e = pa + sign * pb pixel by pixel (B^T's row
    i picks two patch rows), then (e0 - e2, e1 + e2, e2 - e1, e1 - e3). Few streams, so it vectorises."""
    for k in range(c):
        e0 = pa[k] + sign * pb[k]
        e1 = pa[c + k] + sign * pb[c + k]
        e2 = pa[2 * c + k] + sign * pb[2 * c + k]
        e3 = pa[3 * c + k] + sign * pb[3 * c + k]
        v[k] = e0 - e2
        v[c + k] = e1 + e2
        v[2 * c + k] = e2 - e1
        v[3 * c + k] = e1 - e3


@jit
def _in_tile(p0, p1, p2, p3, v, c):
    """v (16c: plane xi at xi*c) = B^T d B for the 4x4 patch whose rows are p0..p3 (each 4c: 4 pixels
    of c channels). B^T's rows: (1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1)."""
    one = np.float32(1.0)
    _in_row(p0, p2, -one, v[0:4 * c], c)
    _in_row(p1, p2, one, v[4 * c:8 * c], c)
    _in_row(p2, p1, -one, v[8 * c:12 * c], c)
    _in_row(p1, p3, -one, v[12 * c:16 * c], c)


@jit
def _stage(x3, n, r0, c0, c, stage):
    """stage (t, tc) = the t x t patch of image n at rows r0.., pixels c0.. (zeros outside)."""
    h = x3.shape[1]
    w = x3.shape[2] // c
    t = stage.shape[0]
    for a in range(t):
        row = stage[a]
        r = r0 + a
        for b in range(t):
            col = c0 + b
            seg = row[b * c:(b + 1) * c]
            if r < 0 or r >= h or col < 0 or col >= w:
                for k in range(c):
                    seg[k] = 0.0
            else:
                src = x3[n, r, col * c:(col + 1) * c]
                for k in range(c):
                    seg[k] = src[k]


@jit
def _out_row(m, ra, rb, rc, sign, y, co):
    """One output row of A^T M A: g = M[ra] + sign * (M[rb] + M[rc])... as A^T's row picks: row 0 is
    M0 + M1 + M2 (ra, rb, rc = 0, 1, 2, sign 1), row 1 is M1 - M2 - M3 (1, 2, 3, sign -1); then
    y = (g0 + g1 + g2, g1 - g2 - g3) (2co)."""
    a, b, c = ra * 4 * co, rb * 4 * co, rc * 4 * co
    for k in range(co):
        g0 = m[a + k] + sign * m[b + k] + sign * m[c + k]
        g1 = m[a + co + k] + sign * m[b + co + k] + sign * m[c + co + k]
        g2 = m[a + 2 * co + k] + sign * m[b + 2 * co + k] + sign * m[c + 2 * co + k]
        g3 = m[a + 3 * co + k] + sign * m[b + 3 * co + k] + sign * m[c + 3 * co + k]
        y[k] = g0 + g1 + g2
        y[co + k] = g1 - g2 - g3


@jit
def _out_tile(m, y3, n, oh, ow, co, ho, wo, stage):
    """y[n, oh:oh+2, ow:ow+2, :] = A^T M A for the tile whose M is m (16co), clipped at the bottom and
    right edges (through ``stage``, 4co floats)."""
    one = np.float32(1.0)
    if oh + 1 < ho and ow + 1 < wo:
        _out_row(m, 0, 1, 2, one, y3[n, oh, ow * co:(ow + 2) * co], co)
        _out_row(m, 1, 2, 3, -one, y3[n, oh + 1, ow * co:(ow + 2) * co], co)
        return
    _out_row(m, 0, 1, 2, one, stage[0:2 * co], co)
    _out_row(m, 1, 2, 3, -one, stage[2 * co:4 * co], co)
    copy_clipped(stage, y3, n, oh, ow, ho, wo, co, 2)


@jit
def _layout(buf, rows, tw, c, co, m):
    """A thread's buffer for chunks of ``rows`` tile rows of F(m x m, 3x3) (p = (m + 2)^2 planes): V
    (tiles, p c + PAD), M (tiles, p co + PAD), the staging area and the weight-gradient pass's dU
    partial (p c co)."""
    cap, p = rows * tw, (m + 2) * (m + 2)
    vt, mt = p * c + PAD, p * co + PAD
    v = buf[:cap * vt].reshape(cap, vt)
    mb = buf[cap * vt:cap * (vt + mt)].reshape(cap, mt)
    at = _part_at(cap, c, co, m)
    return v, mb, buf[cap * (vt + mt):at], buf[at:at + p * c * co]


def part_at(cap: int, c: int, co: int, m: int = 2) -> int:
    """Where a thread's dU partial starts in its buffer (_layout) for chunks of ``cap`` tiles of
    F(m x m, 3x3): V, M, then the staging area (F(2x2, 3x3): a 4x4 patch, a 2x2 tile; F(4x4, 3x3):
    a 6x6 patch and B^T d, then A^T M or A dY and a 4x4 tile). Plain Python for plan(); the kernels
    call its numba twin, _part_at (one source: a numba dispatcher called at bind time cost 0.5 s of
    compile() in a fresh process)."""
    p = (m + 2) * (m + 2)
    return cap * (p * (c + co) + 2 * PAD) + (16 * (c + co) if m == 2 else 72 * c + 40 * co)


_part_at = jit(part_at)


@jit
def _inputs(x3, v, stage, u0, u1, th, tw, c, m):
    """V of the tiles of tile rows u0..u1 (unit = image * th + tile row), one row of v per tile, for
    F(m x m, 3x3); returns how many tiles."""
    h, w, t = x3.shape[1], x3.shape[2] // c, m + 2
    st, tmp = stage[:t * t * c].reshape(t, t * c), stage[t * t * c:2 * t * t * c]
    q = 0
    for un in range(u0, u1):
        n = un // th
        r0 = m * (un % th) - 1
        inner = r0 >= 0 and r0 + t <= h
        for tj in range(tw):
            c0 = m * tj - 1
            if inner and c0 >= 0 and c0 + t <= w:
                a, b = c0 * c, (c0 + t) * c
                if m == 2:
                    _in_tile(x3[n, r0, a:b], x3[n, r0 + 1, a:b], x3[n, r0 + 2, a:b], x3[n, r0 + 3, a:b], v[q], c)
                else:
                    in_tile6(x3[n, r0, a:b], x3[n, r0 + 1, a:b], x3[n, r0 + 2, a:b], x3[n, r0 + 3, a:b],
                             x3[n, r0 + 4, a:b], x3[n, r0 + 5, a:b], v[q], c, tmp)
            else:
                _stage(x3, n, r0, c0, c, st)
                if m == 2:
                    _in_tile(st[0], st[1], st[2], st[3], v[q], c)
                else:
                    in_tile6(st[0], st[1], st[2], st[3], st[4], st[5], v[q], c, tmp)
            q += 1
    return q


@jit
def _fwd_share(fptr, wide, x3, u, y3, y2, b, act, buf, c, co, rows, u0, u1, m):
    """fwd_'s work for tile rows u0..u1, ``rows`` at a time, in one thread's buffer: (m + 2)^2 products
    M[:, xi] = V[:, xi] U[xi] per chunk, rows of V and M a tile each (lda p c + PAD)."""
    ho, wo = x3.shape[1], y3.shape[2] // co
    th, tw = (ho + m - 1) // m, (wo + m - 1) // m
    v, mb, stage, _ = _layout(buf, rows, tw, c, co, m)
    vt, mt = v.shape[1], mb.shape[1]
    post = act != 0 or b.shape[0] > 0
    while u0 < u1:
        ue = min(u1, u0 + rows)
        q = _inputs(x3, v, stage, u0, ue, th, tw, c, m)
        for xi in range((m + 2) * (m + 2)):
            sgemm_at(fptr, wide, NO_TRANS, NO_TRANS, q, co, c, v.ctypes.data + 4 * xi * c, vt, u[xi].ctypes.data, co,
                     mb.ctypes.data + 4 * xi * co, mt, False)
        q = 0
        for un in range(u0, ue):
            n = un // th
            oh = m * (un % th)
            for tj in range(tw):
                if m == 2:
                    _out_tile(mb[q], y3, n, oh, 2 * tj, co, ho, wo, stage)
                else:
                    out_tile4(mb[q], y3, n, oh, 4 * tj, co, ho, wo, stage)
                q += 1
        if post:  # the chunk's output rows are one run of y2's rows
            first = (u0 // th * ho + m * (u0 % th)) * wo
            last = ((ue - 1) // th * ho + min(ho, m * ((ue - 1) % th) + m)) * wo
            bias_act_(y2[first:last], b, act, 0.0)
        u0 = ue


@jit
def _dy_tile(r0, r1, dm, co):
    """dm (16co: plane xi at xi*co) = A dY A^T for the 2x2 output-gradient tile whose rows are r0, r1
    (each 2co): rows (a, b), (a + c, b + d), (a - c, b - d), (-c, -d) of A dY, each (p, q) then
    (p, p + q, p - q, -q)."""
    for k in range(co):
        a, b, c, d = r0[k], r0[co + k], r1[k], r1[co + k]
        p1, q1 = a + c, b + d
        dm[k] = a
        dm[co + k] = a + b
        dm[2 * co + k] = a - b
        dm[3 * co + k] = -b
        dm[4 * co + k] = p1
        dm[5 * co + k] = p1 + q1
        dm[6 * co + k] = p1 - q1
        dm[7 * co + k] = -q1
    for k in range(co):
        a, b, c, d = r0[k], r0[co + k], r1[k], r1[co + k]
        p2, q2 = a - c, b - d
        dm[8 * co + k] = p2
        dm[9 * co + k] = p2 + q2
        dm[10 * co + k] = p2 - q2
        dm[11 * co + k] = -q2
        dm[12 * co + k] = -c
        dm[13 * co + k] = -c - d
        dm[14 * co + k] = d - c
        dm[15 * co + k] = d


@jit
def _stage_dy(dy3, n, oh, ow, co, ho, wo, stage):
    """stage (m, m co) = dy[n, oh:oh+m, ow:ow+m, :], zeros past the bottom/right edge."""
    t = stage.shape[0]
    for a in range(t):
        for b in range(t):
            seg = stage[a, b * co:(b + 1) * co]
            if oh + a < ho and ow + b < wo:
                src = dy3[n, oh + a, (ow + b) * co:(ow + b + 1) * co]
                for k in range(co):
                    seg[k] = src[k]
            else:
                for k in range(co):
                    seg[k] = 0.0


@jit
def _dy_tiles(dy3, mb, stage, u0, ue, th, tw, co, m):
    """A dY A^T of the output-gradient tiles of tile rows u0..ue, one row of mb per tile."""
    ho, wo = dy3.shape[1], dy3.shape[2] // co
    sd, tmp = stage[:m * m * co].reshape(m, m * co), stage[m * m * co:(m * m + 6 * m) * co]
    q = 0
    for un in range(u0, ue):
        n = un // th
        oh = m * (un % th)
        for tj in range(tw):
            ow = m * tj
            a, b = ow * co, (ow + m) * co
            if oh + m - 1 < ho and ow + m - 1 < wo:
                if m == 2:
                    _dy_tile(dy3[n, oh, a:b], dy3[n, oh + 1, a:b], mb[q], co)
                else:
                    dy_tile4(dy3[n, oh, a:b], dy3[n, oh + 1, a:b], dy3[n, oh + 2, a:b], dy3[n, oh + 3, a:b], mb[q],
                             co, tmp)
            else:
                _stage_dy(dy3, n, oh, ow, co, ho, wo, sd)
                if m == 2:
                    _dy_tile(sd[0], sd[1], mb[q], co)
                else:
                    dy_tile4(sd[0], sd[1], sd[2], sd[3], mb[q], co, tmp)
            q += 1
    return q


@jit
def _dw_share(fptr, wide, x3, dy3, buf, c, co, rows, u0, u1, m):
    """dw_'s work for tile rows u0..u1: V^T (A dY A^T) added into this thread's dU partial (zero if
    it has no tiles)."""
    ho, wo = x3.shape[1], dy3.shape[2] // co
    th, tw = (ho + m - 1) // m, (wo + m - 1) // m
    v, mb, stage, part = _layout(buf, rows, tw, c, co, m)
    vt, mt = v.shape[1], mb.shape[1]
    if u0 >= u1:
        part[:] = 0.0
    first = True
    while u0 < u1:
        ue = min(u1, u0 + rows)
        _inputs(x3, v, stage, u0, ue, th, tw, c, m)  # the stage is free again before the dy tiles use it
        q = _dy_tiles(dy3, mb, stage, u0, ue, th, tw, co, m)
        for xi in range((m + 2) * (m + 2)):
            sgemm_at(fptr, wide, TRANS, NO_TRANS, c, co, q, v.ctypes.data + 4 * xi * c, vt,
                     mb.ctypes.data + 4 * xi * co, mt, part[xi * c * co:].ctypes.data, co, not first)
        first = False
        u0 = ue


@par
def fwd_(fptr, wide, x3, u, y3, y2, b, act, bufs, c, co, rows, m):
    """y = act(conv3x3(x) + b), stride 1, padding 1, by F(m x m, 3x3): each thread walks its share of
    the batch's tile rows (unit = image * th + tile row) ``rows`` at a time in bufs[t]; u is
    weights_'s (m = 2) or weights43_'s (m = 4)."""
    units = x3.shape[0] * ((x3.shape[1] + m - 1) // m)
    threads = bufs.shape[0]
    for t in numba.prange(threads):
        _fwd_share(fptr, wide, x3, u, y3, y2, b, act, bufs[t], c, co, rows, cut(units, threads, t),
                   cut(units, threads, t + 1), m)


@par
def dw_(fptr, wide, x3, dy3, dw4, bufs, first, others, c, co, rows, m):
    """dw = the weight gradient of conv3x3 (stride 1, padding 1) through F(m x m, 3x3): each thread adds
    V[xi]^T (A dY A^T)[xi] over its share of the tiles into its own dU partial (p, c, co) in bufs[t]
    (``first``: thread 0's as (1, p c co), ``others``: the rest as (threads - 1, 1, p c co)); the
    partials are summed in thread order, as conv_tiled's dW partials, and dw = G^T dU G."""
    units = x3.shape[0] * ((x3.shape[1] + m - 1) // m)
    threads = bufs.shape[0]
    for t in numba.prange(threads):
        _dw_share(fptr, wide, x3, dy3, bufs[t], c, co, rows, cut(units, threads, t), cut(units, threads, t + 1), m)
    add_parts_(others, first)
    if m == 2:
        _dw_from_total(first[0], dw4, c, co)
    else:
        dw_from_total43(first[0], dw4, c, co)


@jit
def _dw_from_total(d, dw4, c, co):
    """dw4[co, :, :, ci] = G^T D G for D = dU[:, ci, co], dU summed over the threads (float64, rounded
    once)."""
    d2 = d.reshape(16, c * co)
    for ci in range(c):
        for o in range(co):
            j = ci * co + o
            for r in range(3):
                t0 = _gt(d2[0, j], d2[4, j], d2[8, j], d2[12, j], r)
                t1 = _gt(d2[1, j], d2[5, j], d2[9, j], d2[13, j], r)
                t2 = _gt(d2[2, j], d2[6, j], d2[10, j], d2[14, j], r)
                t3 = _gt(d2[3, j], d2[7, j], d2[11, j], d2[15, j], r)
                for s in range(3):
                    dw4[o, r, s, ci] = _gt(t0, t1, t2, t3, s)


@jit
def _gt(p0, p1, p2, p3, r):
    """Row r of G^T (p0, p1, p2, p3): p0 + (p1 + p2)/2, (p1 - p2)/2 or (p1 + p2)/2 + p3, in float64."""
    a, b = np.float64(p1), np.float64(p2)
    if r == 0:
        return np.float64(p0) + (a + b) * 0.5
    if r == 1:
        return (a - b) * 0.5
    return (a + b) * 0.5 + np.float64(p3)


class Chunks(NamedTuple):
    """How a Winograd convolution walks the batch: threads, tile rows per chunk, floats per thread."""

    threads: int
    rows: int
    per_thread: int
    m: int = 2


def enabled() -> bool:
    """False under RNB_WINOGRAD=0 (every convolution on im2col, e.g. to compare the two)."""
    return os.environ.get("RNB_WINOGRAD", "1") != "0"


def applies(k: int, s: int, pad: int, cin: int, cout: int, *arrays: np.ndarray) -> bool:
    """Whether a convolution runs by Winograd here: 3x3, stride 1, padding 1, products on the library's
    threads, every operand C-contiguous float32 (the first an NHWC map of the layer's size), and
    channels enough (min_channels)."""
    if not (enabled() and blas.THREADED and (k, s, pad) == (3, 1, 1) and arrays and arrays[0].ndim == 4):
        return False
    if min(cin, cout) < min_channels(arrays[0].shape[1], arrays[0].shape[2]):
        return False
    return all(isinstance(a, np.ndarray) and a.dtype == np.float32 and a.flags.c_contiguous for a in arrays)


def min_channels(h: int, w: int) -> int:
    """The fewest channels in and out at which F(2x2, 3x3) pays on an h x w output: MIN_CHANNELS, twice
    that where its grid of 2x2 tiles computes over WASTE times the outputs the layer has (odd sizes:
    7x7 takes 64 for 49)."""
    tiles = ((h + 1) // 2) * ((w + 1) // 2)
    return MIN_CHANNELS if 4 * tiles <= WASTE * h * w else 2 * MIN_CHANNELS


def tile(h: int, w: int) -> int:
    """The output tile, m of F(m x m, 3x3), for an h x w map: 4 from F4_MIN_SIZE up, else 2.
    RNB_WINOGRAD=2 or 4 asks for that one wherever Winograd applies."""
    forced = os.environ.get("RNB_WINOGRAD", "1")
    if forced in ("2", "4"):
        return int(forced)
    return 4 if min(h, w) >= F4_MIN_SIZE else 2


def _need(rows: int, tw: int, c: int, co: int, m: int) -> int:
    """Floats one thread's buffer needs for chunks of ``rows`` tile rows (_layout, without dU)."""
    return part_at(rows * tw, c, co, m)


def dw_need(rows: int, tw: int, c: int, co: int, m: int = 2) -> int:
    """Floats one thread's buffer needs in the weight-gradient pass: the forward's and its dU partial."""
    return _need(rows, tw, c, co, m) + (m + 2) ** 2 * c * co


def plan(n: int, h: int, w: int, c: int, co: int, floats: int, weight_grad: bool = False, m: int = 2) -> Chunks | None:
    """Threads and chunk size for n images of h x w, c -> co channels, by F(m x m, 3x3), out of a scratch
    of ``floats`` float32 (U takes the first (m + 2)^2 c co, except in the weight-gradient pass); None
    where not one tile row per thread fits."""
    th, tw, p = (h + m - 1) // m, (w + m - 1) // m, (m + 2) ** 2
    threads = max(1, min(numba.get_num_threads(), CONV_THREADS, n * th))
    per_thread = (floats - (0 if weight_grad else p * c * co)) // threads
    rows = min(max(1, CHUNK_BYTES // (4 * p * tw * (c + co))), n * th)
    while rows > 0 and (dw_need if weight_grad else _need)(rows, tw, c, co, m) > per_thread:
        rows -= 1
    return Chunks(threads, rows, per_thread, m) if rows > 0 else None


def chosen(n: int, h: int, w: int, c: int, co: int, floats: int, weight_grad: bool) -> Chunks | None:
    """plan() for tile()'s F(m x m, 3x3), F(2x2, 3x3) where F(4x4, 3x3)'s buffers do not fit."""
    m = tile(h, w)
    ch = plan(n, h, w, c, co, floats, weight_grad, m)
    return plan(n, h, w, c, co, floats, weight_grad, 2) if ch is None and m == 4 else ch


def _split(scratch: np.ndarray, head: int, ch: Chunks) -> tuple[np.ndarray, np.ndarray]:
    """(the first ``head`` floats, the threads' buffers (threads, per_thread)) of a flat scratch."""
    flat = scratch.reshape(-1)
    return flat[:head], flat[head:head + ch.threads * ch.per_thread].reshape(ch.threads, ch.per_thread)


def bind(x: np.ndarray, w: np.ndarray, y: np.ndarray, scratch: np.ndarray, b: np.ndarray, act: int,
         flip: bool = False) -> Callable[[], None] | None:
    """y = act(conv3x3(x, w) + b) as a zero-argument kernel (None: the scratch is too small).

    ``flip``: the input gradient, dx = conv3x3(dy, w turned and transposed): pass dy as x and dx as y."""
    n, h, wd, c = x.shape
    co = y.shape[3]
    ch = chosen(n, h, wd, c, co, scratch.size, False)
    if ch is None:
        return None
    assert w.shape == ((c, 3, 3, co) if flip else (co, 3, 3, c)), (w.shape, c, co, flip)
    m, p = ch.m, (ch.m + 2) ** 2
    head, bufs = _split(scratch, p * c * co, ch)
    u = head.reshape(p, c, co)
    x3, y3, y2 = x.reshape(n, h, wd * c), y.reshape(n, h, wd * co), y.reshape(n * h * wd, co)
    sg = blas.SGEMM
    fptr, wide, f, transform = sg.address, sg.int_bits == 64, fwd_, (weights_ if m == 2 else weights43_)
    bound = conv_native.bind_winograd_fwd(fptr, wide, w, flip, u, x, y, b, act, bufs, ch.rows, m)
    if bound is not None:  # the same passes in C, on the pool's threads (a plan bound to C)
        return _with_tile(blas.on_own_cores(bound), m)

    def run() -> None:
        transform(w, u, flip)
        f(fptr, wide, x3, u, y3, y2, b, act, bufs, c, co, ch.rows, m)
    return _with_tile(blas.on_own_cores(run), m)


def bind_dw(x: np.ndarray, dy: np.ndarray, dw: np.ndarray, scratch: np.ndarray) -> Callable[[], None] | None:
    """dw = the weight gradient of conv3x3(x) (stride 1, padding 1) for output gradient dy, as a
    zero-argument kernel (None: the scratch is too small)."""
    n, h, wd, c = x.shape
    co = dy.shape[3]
    ch = chosen(n, h, wd, c, co, scratch.size, True)
    if ch is None:
        return None
    assert dw.shape == (co, 3, 3, c), (dw.shape, c, co)
    m = ch.m
    bufs = _split(scratch, 0, ch)[1]
    at, size = part_at(ch.rows * ((wd + m - 1) // m), c, co, m), (m + 2) ** 2 * c * co
    first, others = bufs[:1, at:at + size], bufs[1:, None, at:at + size]  # the threads' dU partials
    x3, dy3 = x.reshape(n, h, wd * c), dy.reshape(n, h, wd * co)
    sg = blas.SGEMM
    fptr, wide, f = sg.address, sg.int_bits == 64, dw_
    bound = conv_native.bind_winograd_dw(fptr, wide, x, dy, dw, bufs, ch.rows, m)
    return _with_tile(blas.on_own_cores(bound or (lambda: f(fptr, wide, x3, dy3, dw, bufs, first, others, c, co,
                                                             ch.rows, m))), m)


def _with_tile(kernel: Callable[[], None], m: int) -> Callable[[], None]:
    """``kernel`` with ``tile`` = m, the F(m x m, 3x3) it runs by (tagged collects it)."""
    kernel.tile = m  # type: ignore[attr-defined]
    return kernel


def tile_name(m: int) -> str:
    return f"F({m}x{m}, 3x3)"


def tagged(kernel: Callable[[], None], passes: tuple[str, ...], *bound: Callable[[], None]) -> Callable[[], None]:
    """``kernel`` marked as running ``passes`` of its conv ("forward", "weight gradient", "input
    gradient") by Winograd, with the tiles of the Winograd kernels ``bound`` it calls (none: it is one): its ``winograd``
    and ``winograd_tiles`` attributes, which layers_using and tiles_of read."""
    kernel.winograd = passes  # type: ignore[attr-defined]
    kernel.winograd_tiles = tuple(sorted({k.tile for k in bound or (kernel,)}))  # type: ignore[attr-defined]
    return kernel


def layers_using(nodes_and_kernels: Iterable[tuple[Any, Callable[[], None]]]) -> dict[str, tuple[str, ...]]:
    """layer -> the passes of it that run by F(2x2, 3x3), over (node, kernel) pairs, in order."""
    out: dict[str, tuple[str, ...]] = {}
    for n, k in nodes_and_kernels:
        for p in getattr(k, "winograd", ()):
            if p not in out.get(n.layer, ()):
                out[n.layer] = out.get(n.layer, ()) + (p,)
    return out


def tiles_of(nodes_and_kernels: Iterable[tuple[Any, Callable[[], None]]]) -> dict[str, tuple[int, ...]]:
    """layer -> the tiles m of the F(m x m, 3x3) its Winograd passes run by, over (node, kernel) pairs."""
    out: dict[str, set[int]] = {}
    for n, k in nodes_and_kernels:
        if getattr(k, "winograd", ()):
            out.setdefault(n.layer, set()).update(getattr(k, "winograd_tiles", ()))
    return {layer: tuple(sorted(ms)) for layer, ms in out.items()}


def describe(nodes_and_kernels: Iterable[tuple[Any, Callable[[], None]]]) -> str:
    """The compile note's list, by tile: "conv2, conv3 by F(4x4, 3x3); conv6 by F(2x2, 3x3)", a layer named alone
    where every pass it has runs by Winograd, else with the passes that do: "conv6 (forward, input gradient)";
    "" where none."""
    pairs = list(nodes_and_kernels)
    every: dict[str, set[str]] = {}
    for n, _ in pairs:
        every.setdefault(n.layer, set()).update(_passes_of(n))
    tiles, groups = tiles_of(pairs), {}  # type: ignore[var-annotated]
    for name, p in layers_using(pairs).items():
        label = name if set(p) >= every[name] else f"{name} ({', '.join(p)})"
        groups.setdefault(" and ".join(tile_name(m) for m in tiles[name]), []).append(label)
    return "; ".join(f"{', '.join(labels)} by {tile}" for tile, labels in groups.items())


def _passes_of(node: Any) -> tuple[str, ...]:
    """The passes a conv node computes."""
    if node.op == "conv_fwd":
        return ("forward",)
    if node.op == "conv_bwd":
        return ("weight gradient",) + (("input gradient",) if node.p.get("need_dx", True) else ())
    return ()

"""3x3 stride-1 convolutions by Winograd's F(2x2, 3x3) on the CPU: 16 multiplications for 4 outputs
instead of 36.

Why: in the README's ResNet three of the five convolutions are 3x3, stride 1, padding 1, and they were
two thirds of the step, im2col + sgemm already at 84-89% of the sgemm's peak. Fewer
multiplications was the gain left. For each 4x4 input patch d (stride 2, so neighbouring patches
overlap by 2) and each channel, V = B^T d B; for each pair of channels U = G g G^T (g the 3x3
filter); then 16 products M[xi] = V[xi] U[xi], one sgemm per xi over a chunk of tiles (K = Cin, the
tiles as rows); the 2x2 outputs are A^T M A (Lavin and Gray, 2015). The same kernel gives the input
gradient: dx is the convolution of dy with the filters turned 180 degrees and Cin/Cout swapped
(``weights_(..., flip=True)``). The weight gradient stays im2col + sgemm (conv_tiled.py).

Layout: x and y are NHWC, as everywhere on the CPU. A thread walks its share of the batch's tile
rows (image n, tile row ti) a chunk at a time; its buffer holds the chunk's V (16 planes of tiles x
Cin), M (16 planes of tiles x Cout) and a 4x4 staging patch for tiles at the border. The planes are
PAD floats longer than they need: a multiple of 4 KiB apart, the 16 streams of a transform collided in
L1 (the forward took 32 ms instead of 13). The buffers come out of the conv's planned column scratch
(``cols`` forward, ``bwd_cols`` backward): U first, then one buffer per thread; where they do not fit,
the convolution stays im2col (``plan``).

Numbers: the transforms are exact in real arithmetic, and in float32 the result differs from im2col's
by rounding (relative error ~3e-7 of the largest output, as im2col's own against a float64 sum). A
machine and thread count give the same bytes every step. Measured on the 2-core EPYC VM (batch 128):
32x32x32 -> 32 forward 13.0 ms against 19.8 for im2col + sgemm; 16x16x64 -> 64 9.0 ms against 15.8.
``RNB_WINOGRAD=0`` keeps every convolution on im2col.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Iterable, NamedTuple

import numba
import numpy as np

from . import blas
from .blas import NO_TRANS, TRANS, sgemm_at
from .fused import bias_act_, cut, jit, par
from .operands import CONV_THREADS

PAD = 16
"""Floats each plane of V and M has beyond its tiles (see the module's doc)."""
ALGORITHM = "Winograd F(2x2, 3x3)"
"""The tag a kernel bound here carries as its ``algorithm`` attribute (the compile notes list the layers)."""
MIN_CHANNELS = 8
"""Fewer input or output channels than this stay im2col: the transforms do not vectorise and K is tiny."""
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
def _in_tile(p0, p1, p2, p3, v, c):
    """v[:, q, :] = B^T d B for the 4x4 patch whose rows are p0..p3 (each 4*c: 4 pixels of c channels)."""
    for k in range(c):
        d00, d01, d02, d03 = p0[k], p0[c + k], p0[2 * c + k], p0[3 * c + k]
        d10, d11, d12, d13 = p1[k], p1[c + k], p1[2 * c + k], p1[3 * c + k]
        d20, d21, d22, d23 = p2[k], p2[c + k], p2[2 * c + k], p2[3 * c + k]
        d30, d31, d32, d33 = p3[k], p3[c + k], p3[2 * c + k], p3[3 * c + k]
        e00, e01, e02, e03 = d00 - d20, d01 - d21, d02 - d22, d03 - d23
        e10, e11, e12, e13 = d10 + d20, d11 + d21, d12 + d22, d13 + d23
        e20, e21, e22, e23 = d20 - d10, d21 - d11, d22 - d12, d23 - d13
        e30, e31, e32, e33 = d10 - d30, d11 - d31, d12 - d32, d13 - d33
        v[0, k] = e00 - e02
        v[1, k] = e01 + e02
        v[2, k] = e02 - e01
        v[3, k] = e01 - e03
        v[4, k] = e10 - e12
        v[5, k] = e11 + e12
        v[6, k] = e12 - e11
        v[7, k] = e11 - e13
        v[8, k] = e20 - e22
        v[9, k] = e21 + e22
        v[10, k] = e22 - e21
        v[11, k] = e21 - e23
        v[12, k] = e30 - e32
        v[13, k] = e31 + e32
        v[14, k] = e32 - e31
        v[15, k] = e31 - e33


@jit
def _stage(x3, n, r0, c0, c, stage):
    """stage (4, 4c) = the 4x4 patch of image n at rows r0.., pixels c0.. (zeros outside)."""
    h = x3.shape[1]
    w = x3.shape[2] // c
    for a in range(4):
        row = stage[a]
        r = r0 + a
        for b in range(4):
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
def _out_tile(m, y3, n, oh, ow, co, ho, wo):
    """y[n, oh:oh+2, ow:ow+2, :] = A^T m A for tile q (clipped at the bottom/right edge)."""
    full = oh + 1 < ho and ow + 1 < wo
    if full:
        y0 = y3[n, oh, ow * co:(ow + 2) * co]
        y1 = y3[n, oh + 1, ow * co:(ow + 2) * co]
        for k in range(co):
            m0, m1, m2, m3 = m[0, k], m[1, k], m[2, k], m[3, k]
            m4, m5, m6, m7 = m[4, k], m[5, k], m[6, k], m[7, k]
            m8, m9, m10, m11 = m[8, k], m[9, k], m[10, k], m[11, k]
            m12, m13, m14, m15 = m[12, k], m[13, k], m[14, k], m[15, k]
            g0, g1, g2, g3 = m0 + m4 + m8, m1 + m5 + m9, m2 + m6 + m10, m3 + m7 + m11
            f0, f1, f2, f3 = m4 - m8 - m12, m5 - m9 - m13, m6 - m10 - m14, m7 - m11 - m15
            y0[k] = g0 + g1 + g2
            y0[co + k] = g1 - g2 - g3
            y1[k] = f0 + f1 + f2
            y1[co + k] = f1 - f2 - f3
        return
    for k in range(co):
        m0, m1, m2, m3 = m[0, k], m[1, k], m[2, k], m[3, k]
        m4, m5, m6, m7 = m[4, k], m[5, k], m[6, k], m[7, k]
        m8, m9, m10, m11 = m[8, k], m[9, k], m[10, k], m[11, k]
        m12, m13, m14, m15 = m[12, k], m[13, k], m[14, k], m[15, k]
        g0, g1, g2, g3 = m0 + m4 + m8, m1 + m5 + m9, m2 + m6 + m10, m3 + m7 + m11
        f0, f1, f2, f3 = m4 - m8 - m12, m5 - m9 - m13, m6 - m10 - m14, m7 - m11 - m15
        y3[n, oh, ow * co + k] = g0 + g1 + g2
        if ow + 1 < wo:
            y3[n, oh, (ow + 1) * co + k] = g1 - g2 - g3
        if oh + 1 < ho:
            y3[n, oh + 1, ow * co + k] = f0 + f1 + f2
            if ow + 1 < wo:
                y3[n, oh + 1, (ow + 1) * co + k] = f1 - f2 - f3


@jit
def _inputs(x3, v, stage, u0, u1, th, tw, c):
    """V of the tiles of tile rows u0..u1 (unit = image * th + tile row), one tile after another;
    returns how many tiles."""
    h, w = x3.shape[1], x3.shape[2] // c
    q = 0
    for un in range(u0, u1):
        n = un // th
        r0 = 2 * (un % th) - 1
        inner = r0 >= 0 and r0 + 4 <= h
        for tj in range(tw):
            c0 = 2 * tj - 1
            if inner and c0 >= 0 and c0 + 4 <= w:
                _in_tile(x3[n, r0, c0 * c:(c0 + 4) * c], x3[n, r0 + 1, c0 * c:(c0 + 4) * c],
                         x3[n, r0 + 2, c0 * c:(c0 + 4) * c], x3[n, r0 + 3, c0 * c:(c0 + 4) * c],
                         v[:, q * c:(q + 1) * c], c)
            else:
                _stage(x3, n, r0, c0, c, stage)
                _in_tile(stage[0], stage[1], stage[2], stage[3], v[:, q * c:(q + 1) * c], c)
            q += 1
    return q


@jit
def _fwd_share(fptr, wide, x3, u, y3, y2, b, act, buf, c, co, rows, u0, u1):
    """fwd_'s work for tile rows u0..u1, ``rows`` at a time, in one thread's buffer."""
    ho, wo = x3.shape[1], y3.shape[2] // co
    th, tw = (ho + 1) // 2, (wo + 1) // 2
    cap = rows * tw
    vs, ms = cap * c + PAD, cap * co + PAD
    v = buf[:16 * vs].reshape(16, vs)
    m = buf[16 * vs:16 * (vs + ms)].reshape(16, ms)
    stage = buf[16 * (vs + ms):16 * (vs + ms) + 16 * c].reshape(4, 4 * c)
    post = act != 0 or b.shape[0] > 0
    while u0 < u1:
        ue = min(u1, u0 + rows)
        q = _inputs(x3, v, stage, u0, ue, th, tw, c)
        for xi in range(16):
            sgemm_at(fptr, wide, NO_TRANS, NO_TRANS, q, co, c, v[xi].ctypes.data, c, u[xi].ctypes.data, co,
                     m[xi].ctypes.data, co, False)
        q = 0
        for un in range(u0, ue):
            n = un // th
            oh = 2 * (un % th)
            for tj in range(tw):
                _out_tile(m[:, q * co:(q + 1) * co], y3, n, oh, 2 * tj, co, ho, wo)
                q += 1
        if post:  # the chunk's output rows are one run of y2's rows
            first = (u0 // th * ho + 2 * (u0 % th)) * wo
            last = ((ue - 1) // th * ho + min(ho, 2 * ((ue - 1) % th) + 2)) * wo
            bias_act_(y2[first:last], b, act, 0.0)
        u0 = ue


@jit
def _dy_tile(r0, r1, dm, co):
    """dm[:, :] = A dY A^T for the 2x2 output-gradient tile whose rows are r0, r1 (each 2*co)."""
    for k in range(co):
        a, b, c, d = r0[k], r0[co + k], r1[k], r1[co + k]
        p1, q1, p2, q2 = a + c, b + d, a - c, b - d
        dm[0, k] = a
        dm[1, k] = a + b
        dm[2, k] = a - b
        dm[3, k] = -b
        dm[4, k] = p1
        dm[5, k] = p1 + q1
        dm[6, k] = p1 - q1
        dm[7, k] = -q1
        dm[8, k] = p2
        dm[9, k] = p2 + q2
        dm[10, k] = p2 - q2
        dm[11, k] = -q2
        dm[12, k] = -c
        dm[13, k] = -c - d
        dm[14, k] = d - c
        dm[15, k] = d


@jit
def _stage_dy(dy3, n, oh, ow, co, ho, wo, stage):
    """stage (2, 2co) = dy[n, oh:oh+2, ow:ow+2, :], zeros past the bottom/right edge."""
    for a in range(2):
        for b in range(2):
            seg = stage[a, b * co:(b + 1) * co]
            if oh + a < ho and ow + b < wo:
                src = dy3[n, oh + a, (ow + b) * co:(ow + b + 1) * co]
                for k in range(co):
                    seg[k] = src[k]
            else:
                for k in range(co):
                    seg[k] = 0.0


@jit
def _dw_share(fptr, wide, x3, dy3, buf, c, co, rows, u0, u1):
    """dw_'s work for tile rows u0..u1: V^T (A dY A^T) added into this thread's dU partial (zero if
    it has no tiles)."""
    ho, wo = x3.shape[1], dy3.shape[2] // co
    th, tw = (ho + 1) // 2, (wo + 1) // 2
    cap = rows * tw
    vs, ms = cap * c + PAD, cap * co + PAD
    v = buf[:16 * vs].reshape(16, vs)
    m = buf[16 * vs:16 * (vs + ms)].reshape(16, ms)
    stage = buf[16 * (vs + ms):16 * (vs + ms) + 16 * c].reshape(4, 4 * c)
    stage_dy = buf[16 * (vs + ms):16 * (vs + ms) + 4 * co].reshape(2, 2 * co)
    at = 16 * (vs + ms) + 16 * (c + co)
    part = buf[at:at + 16 * c * co].reshape(16, c * co)
    if u0 >= u1:
        part[:, :] = 0.0
    first = True
    while u0 < u1:
        ue = min(u1, u0 + rows)
        _inputs(x3, v, stage, u0, ue, th, tw, c)  # stage is free again before the dy tiles use it
        q = 0
        for un in range(u0, ue):
            n = un // th
            oh = 2 * (un % th)
            for tj in range(tw):
                ow = 2 * tj
                if oh + 1 < ho and ow + 1 < wo:
                    _dy_tile(dy3[n, oh, ow * co:(ow + 2) * co], dy3[n, oh + 1, ow * co:(ow + 2) * co],
                             m[:, q * co:(q + 1) * co], co)
                else:
                    _stage_dy(dy3, n, oh, ow, co, ho, wo, stage_dy)
                    _dy_tile(stage_dy[0], stage_dy[1], m[:, q * co:(q + 1) * co], co)
                q += 1
        for xi in range(16):
            sgemm_at(fptr, wide, TRANS, NO_TRANS, c, co, q, v[xi].ctypes.data, c, m[xi].ctypes.data, co,
                     part[xi].ctypes.data, co, not first)
        first = False
        u0 = ue
    return at


@par
def fwd_(fptr, wide, x3, u, y3, y2, b, act, bufs, c, co, rows):
    """y = act(conv3x3(x) + b), stride 1, padding 1, by F(2x2, 3x3): each thread walks its share of the
    batch's tile rows (unit = image * th + tile row) ``rows`` at a time in bufs[t]; u is weights_'s."""
    units = x3.shape[0] * ((x3.shape[1] + 1) // 2)
    threads = bufs.shape[0]
    for t in numba.prange(threads):
        _fwd_share(fptr, wide, x3, u, y3, y2, b, act, bufs[t], c, co, rows, cut(units, threads, t),
                   cut(units, threads, t + 1))


@par
def dw_(fptr, wide, x3, dy3, dw4, bufs, c, co, rows):
    """dw = the weight gradient of conv3x3 (stride 1, padding 1) through F(2x2, 3x3): each thread adds
    V[xi]^T (A dY A^T)[xi] over its share of the tiles into its own dU partial (16, c, co) in bufs[t];
    the partials are summed in thread order and dw = G^T dU G."""
    units = x3.shape[0] * ((x3.shape[1] + 1) // 2)
    threads = bufs.shape[0]
    for t in numba.prange(threads):
        _dw_share(fptr, wide, x3, dy3, bufs[t], c, co, rows, cut(units, threads, t), cut(units, threads, t + 1))
    cap = rows * ((dy3.shape[2] // co + 1) // 2)
    _dw_from_parts(bufs, 16 * (cap * (c + co) + 2 * PAD) + 16 * (c + co), dw4, c, co)


@jit
def _dw_from_parts(bufs, at, dw4, c, co):
    """The threads' dU partials summed into thread 0's, in thread order (float32, as conv_tiled's dW
    partials), then dw4[co, :, :, ci] = G^T D G for D = dU[:, ci, co] (float64, rounded once)."""
    size = 16 * c * co
    d = bufs[0, at:at + size]
    for t in range(1, bufs.shape[0]):
        other = bufs[t, at:at + size]
        for j in range(size):
            d[j] += other[j]
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


def enabled() -> bool:
    """False under RNB_WINOGRAD=0 (every convolution on im2col, e.g. to compare the two)."""
    return os.environ.get("RNB_WINOGRAD", "1") != "0"


def applies(k: int, s: int, pad: int, cin: int, cout: int, *arrays: np.ndarray) -> bool:
    """Whether a convolution runs by F(2x2, 3x3) here: 3x3, stride 1, padding 1, at least MIN_CHANNELS
    in and out, products on the library's threads, every operand C-contiguous float32."""
    if not (enabled() and blas.THREADED and (k, s, pad) == (3, 1, 1) and min(cin, cout) >= MIN_CHANNELS):
        return False
    return all(isinstance(a, np.ndarray) and a.dtype == np.float32 and a.flags.c_contiguous for a in arrays)


def _need(rows: int, tw: int, c: int, co: int) -> int:
    """Floats one thread's buffer needs for chunks of ``rows`` tile rows."""
    return 16 * (rows * tw * (c + co) + 2 * PAD) + 16 * c


def plan(n: int, h: int, w: int, c: int, co: int, floats: int, weight_grad: bool = False) -> Chunks | None:
    """Threads and chunk size for n images of h x w, c -> co channels, out of a scratch of ``floats``
    float32 (U takes the first 16*c*co, except in the weight-gradient pass); None where not one tile
    row per thread fits."""
    th, tw = (h + 1) // 2, (w + 1) // 2
    threads = max(1, min(numba.get_num_threads(), CONV_THREADS, n * th))
    need = dw_need if weight_grad else _need
    per_thread = (floats - (0 if weight_grad else 16 * c * co)) // threads
    rows = min(max(1, CHUNK_BYTES // (4 * 16 * tw * (c + co))), n * th)
    while rows > 0 and need(rows, tw, c, co) > per_thread:
        rows -= 1
    return Chunks(threads, rows, per_thread) if rows > 0 else None


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
    ch = plan(n, h, wd, c, co, scratch.size)
    if ch is None:
        return None
    assert w.shape == ((c, 3, 3, co) if flip else (co, 3, 3, c)), (w.shape, c, co, flip)
    head, bufs = _split(scratch, 16 * c * co, ch)
    u = head.reshape(16, c, co)
    x3, y3, y2 = x.reshape(n, h, wd * c), y.reshape(n, h, wd * co), y.reshape(n * h * wd, co)
    sg = blas.SGEMM
    fptr, wide, f, tw = sg.address, sg.int_bits == 64, fwd_, weights_

    def run() -> None:
        tw(w, u, flip)
        f(fptr, wide, x3, u, y3, y2, b, act, bufs, c, co, ch.rows)
    return tagged(blas.on_own_cores(run))


def bind_dw(x: np.ndarray, dy: np.ndarray, dw: np.ndarray, scratch: np.ndarray) -> Callable[[], None] | None:
    """dw = the weight gradient of conv3x3(x) (stride 1, padding 1) for output gradient dy, as a
    zero-argument kernel (None: the scratch is too small)."""
    n, h, wd, c = x.shape
    co = dy.shape[3]
    ch = plan(n, h, wd, c, co, scratch.size, weight_grad=True)
    if ch is None:
        return None
    assert dw.shape == (co, 3, 3, c), (dw.shape, c, co)
    bufs = _split(scratch, 0, ch)[1]
    x3, dy3 = x.reshape(n, h, wd * c), dy.reshape(n, h, wd * co)
    sg = blas.SGEMM
    fptr, wide, f = sg.address, sg.int_bits == 64, dw_
    return tagged(blas.on_own_cores(lambda: f(fptr, wide, x3, dy3, dw, bufs, c, co, ch.rows)))


def tagged(kernel: Callable[[], None]) -> Callable[[], None]:
    """``kernel`` marked as this module's (its ``algorithm`` attribute): layers_using reads it."""
    kernel.algorithm = ALGORITHM  # type: ignore[attr-defined]
    return kernel


def layers_using(nodes_and_kernels: Iterable[tuple[Any, Callable[[], None]]]) -> list[str]:
    """The layers (node.layer) among (node, kernel) pairs whose kernel runs by F(2x2, 3x3), in order, once each."""
    seen = [n.layer for n, k in nodes_and_kernels if getattr(k, "algorithm", None) == ALGORITHM]
    return list(dict.fromkeys(seen))


def dw_need(rows: int, tw: int, c: int, co: int) -> int:
    """Floats one thread's buffer needs in the weight-gradient pass: the forward's and its dU partial."""
    return _need(rows, tw, c, co) + 16 * co + 16 * c * co

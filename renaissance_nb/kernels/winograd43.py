"""The transforms of Winograd's F(4x4, 3x3) (winograd.py runs them; winograd43_native.c is their C twin).

Why: F(2x2, 3x3) does 16 multiplications for 4 outputs (2.25x fewer than direct); F(4x4, 3x3) does 36
for 16 (4x fewer), so its 36 products per chunk of tiles do 0.56x the work of F(2x2, 3x3)'s 16, at the
price of larger transforms (6x6 input tiles, 4x4 outputs) and more rounding. Lavin and Gray's (2015)
matrices:

    B^T = [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
           [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]]
    G = [[1/4, 0, 0], [-1/6, -1/6, -1/6], [-1/6, 1/6, -1/6], [1/24, 1/12, 1/6], [1/24, -1/12, 1/6], [0, 0, 1]]
    A^T = [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]

A tile's planes: xi = 6 i + j (i the row), each of c (or co) channels, so row i of V or M is 6c
contiguous floats. Each 2-D transform is two passes with few streams each (so they vectorise): the
rows' combination over whole 6c-float rows into ``tmp``, then each row's own 6-point transform.
In float32 (the products' weights U = G g G^T and the weight gradient G^T dU G in float64, rounded
once), in the same order as the C twin's, which is built with -ffp-contract=off.
"""
from __future__ import annotations

import numpy as np

from .fused import jit


@jit
def _gg(a0, a1, a2, k):
    """Row k of G times (a0, a1, a2), in float64."""
    if k == 0:
        return a0 * 0.25
    if k == 1:
        return -(a0 + a1 + a2) / 6.0
    if k == 2:
        return -(a0 - a1 + a2) / 6.0
    if k == 3:
        return (a0 + 2.0 * a1 + 4.0 * a2) / 24.0
    if k == 4:
        return (a0 - 2.0 * a1 + 4.0 * a2) / 24.0
    return a2


@jit
def _tap(w4, co, a, b, ci, flip):
    """g[a, b] of filter (co, ci) in float64; ``flip``: turned 180 degrees (the input gradient's)."""
    if flip:
        return np.float64(w4[co, 2 - a, 2 - b, ci])
    return np.float64(w4[co, a, b, ci])


@jit
def weights43_(w4, u, flip):
    """u[xi, ci, co] = (G g G^T)[xi] (36 planes) with g = w4[co, :, :, ci]; with ``flip`` the input
    gradient's u[xi, co, ci] from g turned 180 degrees. In float64, rounded once."""
    cout, _, _, cin = w4.shape
    for co in range(cout):
        for ci in range(cin):
            i, j = (co, ci) if flip else (ci, co)
            g00, g01, g02 = _tap(w4, co, 0, 0, ci, flip), _tap(w4, co, 0, 1, ci, flip), _tap(w4, co, 0, 2, ci, flip)
            g10, g11, g12 = _tap(w4, co, 1, 0, ci, flip), _tap(w4, co, 1, 1, ci, flip), _tap(w4, co, 1, 2, ci, flip)
            g20, g21, g22 = _tap(w4, co, 2, 0, ci, flip), _tap(w4, co, 2, 1, ci, flip), _tap(w4, co, 2, 2, ci, flip)
            for k in range(6):  # row k of G g, then that row times G^T
                a0, a1, a2 = _gg(g00, g10, g20, k), _gg(g01, g11, g21, k), _gg(g02, g12, g22, k)
                for s in range(6):
                    u[6 * k + s, i, j] = _gg(a0, a1, a2, s)


@jit
def _bt_rows(p0, p1, p2, p3, p4, p5, t, n):
    """t (6 rows of n floats) = B^T d for the patch rows p0..p5 (n floats each)."""
    two, four, five = np.float32(2.0), np.float32(4.0), np.float32(5.0)
    for k in range(n):
        d0, d1, d2, d3, d4, d5 = p0[k], p1[k], p2[k], p3[k], p4[k], p5[k]
        a = d4 - four * d2
        b = d3 - four * d1
        e = d4 - d2
        f = two * (d3 - d1)
        t[k] = four * d0 - five * d2 + d4
        t[n + k] = a + b
        t[2 * n + k] = a - b
        t[3 * n + k] = e + f
        t[4 * n + k] = e - f
        t[5 * n + k] = four * d1 - five * d3 + d5


@jit
def _bt_cols(t, v, c):
    """v (6 planes of c) = B^T x for the 6 pixels x of one row t (6c)."""
    _bt_rows(t[0:c], t[c:2 * c], t[2 * c:3 * c], t[3 * c:4 * c], t[4 * c:5 * c], t[5 * c:6 * c], v, c)


@jit
def in_tile6(p0, p1, p2, p3, p4, p5, v, c, tmp):
    """v (36c: plane xi at xi*c) = B^T d B for the 6x6 patch whose rows are p0..p5 (each 6c: 6 pixels
    of c channels); tmp: 36c floats of scratch."""
    _bt_rows(p0, p1, p2, p3, p4, p5, tmp, 6 * c)
    for i in range(6):
        _bt_cols(tmp[i * 6 * c:(i + 1) * 6 * c], v[i * 6 * c:(i + 1) * 6 * c], c)


@jit
def _at_rows(m, t, n):
    """t (4 rows of n floats) = A^T x for the 6 rows of m (n floats each)."""
    two, four, eight = np.float32(2.0), np.float32(4.0), np.float32(8.0)
    for k in range(n):
        x0, x1, x2, x3, x4, x5 = m[k], m[n + k], m[2 * n + k], m[3 * n + k], m[4 * n + k], m[5 * n + k]
        s = x1 + x2
        d = x1 - x2
        p = x3 + x4
        q = x3 - x4
        t[k] = x0 + s + p
        t[n + k] = d + two * q
        t[2 * n + k] = s + four * p
        t[3 * n + k] = d + eight * q + x5


@jit
def out_tile4(m, y3, n, oh, ow, co, ho, wo, stage):
    """y[n, oh:oh+4, ow:ow+4, :] = A^T M A for the tile whose M is m (36co), clipped at the bottom and
    right edges; stage: 40co floats (A^T M, then the clipped tile)."""
    tmp, clip = stage[:24 * co], stage[24 * co:40 * co]
    _at_rows(m, tmp, 6 * co)
    full = oh + 3 < ho and ow + 3 < wo
    for i in range(4):
        dst = y3[n, oh + i, ow * co:(ow + 4) * co] if full else clip[i * 4 * co:(i + 1) * 4 * co]
        _at_rows(tmp[i * 6 * co:(i + 1) * 6 * co], dst, co)
    if not full:
        copy_clipped(clip, y3, n, oh, ow, ho, wo, co, 4)


@jit
def copy_clipped(tile, y3, n, oh, ow, ho, wo, co, m):
    """The part inside the ho x wo map of an m x m output tile at (oh, ow) (``tile``: its m rows of m pixels of co
    channels) into y3: a tile at the bottom or right edge (both Winograd tiles' last step)."""
    for a in range(m):
        for b in range(m):
            if oh + a < ho and ow + b < wo:
                dst = y3[n, oh + a, (ow + b) * co:(ow + b + 1) * co]
                src = tile[(m * a + b) * co:(m * a + b + 1) * co]
                for k in range(co):
                    dst[k] = src[k]


@jit
def _a_rows(r0, r1, r2, r3, t, n):
    """t (6 rows of n floats) = A x for the 4 rows r0..r3 (n floats each)."""
    two, four, eight = np.float32(2.0), np.float32(4.0), np.float32(8.0)
    for k in range(n):
        a, b, c, d = r0[k], r1[k], r2[k], r3[k]
        s = a + c
        e = b + d
        s2 = a + four * c
        e2 = two * b + eight * d
        t[k] = a
        t[n + k] = s + e
        t[2 * n + k] = s - e
        t[3 * n + k] = s2 + e2
        t[4 * n + k] = s2 - e2
        t[5 * n + k] = d


@jit
def dy_tile4(r0, r1, r2, r3, dm, co, tmp):
    """dm (36co: plane xi at xi*co) = A dY A^T for the 4x4 output-gradient tile whose rows are r0..r3
    (each 4co); tmp: 24co floats of scratch."""
    _a_rows(r0, r1, r2, r3, tmp, 4 * co)
    for i in range(6):
        t = tmp[i * 4 * co:(i + 1) * 4 * co]
        _a_rows(t[0:co], t[co:2 * co], t[2 * co:3 * co], t[3 * co:4 * co], dm[i * 6 * co:(i + 1) * 6 * co], co)


@jit
def _gt6(p0, p1, p2, p3, p4, p5, r):
    """Row r of G^T times (p0, ..., p5), in float64."""
    a, b, c, d = np.float64(p1), np.float64(p2), np.float64(p3), np.float64(p4)
    if r == 0:
        return np.float64(p0) * 0.25 - (a + b) / 6.0 + (c + d) / 24.0
    if r == 1:
        return (b - a) / 6.0 + (c - d) / 12.0
    return ((c + d) - (a + b)) / 6.0 + np.float64(p5)


@jit
def dw_from_total43(d, dw4, c, co):
    """dw4[co, :, :, ci] = G^T D G for D = dU[:, ci, co] (36 planes), summed over the threads (float64,
    rounded once)."""
    d2 = d.reshape(36, c * co)
    for ci in range(c):
        for o in range(co):
            j = ci * co + o
            for r in range(3):
                t0 = _gt6(d2[0, j], d2[6, j], d2[12, j], d2[18, j], d2[24, j], d2[30, j], r)
                t1 = _gt6(d2[1, j], d2[7, j], d2[13, j], d2[19, j], d2[25, j], d2[31, j], r)
                t2 = _gt6(d2[2, j], d2[8, j], d2[14, j], d2[20, j], d2[26, j], d2[32, j], r)
                t3 = _gt6(d2[3, j], d2[9, j], d2[15, j], d2[21, j], d2[27, j], d2[33, j], r)
                t4 = _gt6(d2[4, j], d2[10, j], d2[16, j], d2[22, j], d2[28, j], d2[34, j], r)
                t5 = _gt6(d2[5, j], d2[11, j], d2[17, j], d2[23, j], d2[29, j], d2[35, j], r)
                for s in range(3):
                    dw4[o, r, s, ci] = _gt6(t0, t1, t2, t3, t4, t5, s)

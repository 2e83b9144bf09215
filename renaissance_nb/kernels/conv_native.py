"""Binders of the conv nets' C kernels (conv_native.c, winograd_native.c): batch norm, pooling, global
average pooling, im2col / col2im, ReLU, the image batch gather, dropout, and the convolutions by im2col
tiles and by Winograd F(2x2, 3x3) or F(4x4, 3x3).

Why: a plan runs on one thread pool (native.chosen_for), so while a conv net's conv, batch norm and
pooling kernels were numba's, its whole step stayed on numba, compiled on a first run (5.5 s of it for
Winograd alone, benchmarks/results/cold_start_conv.txt). Each binder here returns the C kernel as a
zero-argument kernel (native.py's ``call``) giving the bytes of its numba twin (tests/test_conv_native.py),
or None where the library is not in use for this plan or the operands are not the float32, contiguous
ones the C loops take: the caller then binds the numba kernel, as before.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .native import Kernel, active, address, all_flat, binder, call, row_stride

F32, I32, I64 = np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.int64)


def _c32(*arrays: np.ndarray) -> bool:
    """Every array C-contiguous float32."""
    return all(isinstance(a, np.ndarray) and a.dtype == F32 and a.flags.c_contiguous for a in arrays)


@binder
def bind_bn_fwd(x2, gamma, beta, y2, mean, invstd, rmean, rvar, momentum, eps, act, acc, aff, parts,  # type: ignore[no-untyped-def]
                threads: int) -> Kernel | None:
    """conv_par.bn_train_fwd_par_ (parts (PAR_CHUNKS, 2, C)) or, with one block of parts, bn_train_fwd_."""
    L, ldx, ldy = active(), row_stride(x2), (0 if y2 is None else row_stride(y2))  # y2 None: no affine pass
    c = x2.shape[1] if x2.ndim == 2 else -1
    ok = (L is not None and ldx is not None and ldy is not None and x2.dtype == F32 and (y2 is None or y2.dtype == F32)
          and all_flat(gamma, beta, mean, invstd, rmean, rvar) and _c32(gamma, beta, mean, invstd, rmean, rvar, aff)
          and acc.dtype == parts.dtype == np.float64 and acc.flags.c_contiguous and parts.flags.c_contiguous
          and acc.shape == (2, c) and aff.shape == (2, c) and parts.ndim == 3 and parts.shape[1:] == (2, c)
          and gamma.size == c and (y2 is None or y2.shape == x2.shape) and act in (0, 1))
    if not ok:
        return None
    m = x2.shape[0]
    args = (address(x2), m, c, ldx, address(gamma), address(beta), 0 if y2 is None else address(y2), ldy, address(mean),
            address(invstd), address(rmean), address(rvar), float(momentum), float(eps), act, address(acc), address(aff),
            address(parts), parts.shape[0], threads)
    return call(L.rnb_bn_fwd, args, (x2, gamma, beta, y2, mean, invstd, rmean, rvar, acc, aff, parts))


@binder
def bind_bn_bwd(dy2, x2, y2, gamma, mean, invstd, dx2, dgamma, dbeta, act, acc, aff, parts,  # type: ignore[no-untyped-def]
                threads: int, pooled=None) -> Kernel | None:
    """conv_par.bn_train_bwd_par_ (parts (PAR_CHUNKS, 2, C)) or, with one block of parts, bn_train_bwd_; with
    ``pooled`` (operands.PooledGrad, dy2 None) dy is made from the pool's gradient, argmax and output into dx's
    rows as the sums pass goes (numba's twin: maxpool_bwd into dx, then those kernels with dy = dx)."""
    L = active()
    src = dy2 if pooled is None else x2
    lds = [row_stride(a) for a in (src, x2, y2, dx2)]
    c = x2.shape[1] if x2.ndim == 2 else -1
    ok = (L is not None and None not in lds and src.dtype == x2.dtype == y2.dtype == dx2.dtype == F32
          and src.shape == x2.shape == y2.shape == dx2.shape and all_flat(gamma, mean, invstd, dgamma, dbeta)
          and _c32(gamma, mean, invstd, dgamma, dbeta) and gamma.size == c
          and acc.dtype == aff.dtype == parts.dtype == np.float64 and acc.shape == (2, c) and aff.shape == (3, c)
          and all(a.flags.c_contiguous for a in (acc, aff, parts)) and parts.ndim == 3 and parts.shape[1:] == (2, c)
          and act in (0, 1))
    if pooled is not None:
        ok = ok and act == 0 and _c32(pooled.dy, pooled.y) and pooled.argmax.dtype == I32 and pooled.argmax.flags.c_contiguous
    if not ok:
        return None
    ldd, ldx, ldy, ldo = lds
    h, w, k = (0, 0, 0) if pooled is None else (pooled.h, pooled.w, pooled.k)
    args = (address(dy2) if pooled is None else 0, x2.shape[0], c, ldd, address(x2), ldx, address(y2), ldy,
            address(gamma), address(mean), address(invstd), address(dx2), ldo, address(dgamma), address(dbeta), act,
            address(acc), address(aff), address(parts), parts.shape[0], threads,
            *((0, 0, 0) if pooled is None else (address(pooled.dy), address(pooled.argmax), address(pooled.y))), h, w, k)
    keep = (x2, y2, gamma, mean, invstd, dx2, dgamma, dbeta, acc, aff, parts)
    return call(L.rnb_bn_bwd, args, keep + ((dy2,) if pooled is None else (pooled.dy, pooled.argmax, pooled.y)))


@binder
def bind_bn_fold(gamma, beta, rmean, rvar, eps, scale, bias) -> Kernel | None:  # type: ignore[no-untyped-def]
    """conv_loops.bn_fold_."""
    L = active()
    arrays = (gamma, beta, rmean, rvar, scale, bias)
    if L is None or not (_c32(*arrays) and all_flat(*arrays) and len({a.size for a in arrays}) == 1):
        return None
    args = (address(gamma), address(beta), address(rmean), address(rvar), gamma.size, float(eps), address(scale), address(bias))
    return call(L.rnb_bn_fold, args, arrays)


@binder
def bind_channel_affine(x2, a, b, y2, act, threads: int) -> Kernel | None:  # type: ignore[no-untyped-def]
    """conv_loops.bn_inf_ (channel_affine_): y = act(x * a + b) per channel."""
    L, ldx, ldy = active(), row_stride(x2), row_stride(y2)
    ok = (L is not None and ldx is not None and ldy is not None and x2.dtype == y2.dtype == F32
          and x2.shape == y2.shape and _c32(a, b) and all_flat(a, b) and a.size == b.size == x2.shape[1]
          and act in (0, 1))
    if not ok:
        return None
    args = (address(x2), x2.shape[0], x2.shape[1], ldx, address(a), address(b), address(y2), ldy, act, threads)
    return call(L.rnb_channel_affine, args, (x2, a, b, y2))


@binder
def bind_maxpool_fwd(x, y, am, k: int, s: int, p: int, two_by_two: bool, threads: int,  # type: ignore[no-untyped-def]
                     aff=None) -> Kernel | None:
    """conv_par.maxpool_fwd_par_ (argmax int32); ``aff`` a batch norm's (2, C) affine for bn_relu."""
    L = active()
    if L is None or not (_c32(x, y) and am.dtype == I32 and am.flags.c_contiguous and am.shape == y.shape
                         and x.ndim == 4 and y.shape[::3] == x.shape[::3] and (aff is None or _c32(aff))):
        return None
    n, h, w, c = x.shape
    args = (address(x), 0 if aff is None else address(aff), n, h, w, c, address(y), address(am), y.shape[1], y.shape[2],
            k, s, p, int(two_by_two), threads)
    return call(L.rnb_maxpool_fwd, args, (x, y, am) + (() if aff is None else (aff,)))


@binder
def bind_maxpool_bwd(dy, am, dx, two_by_two: bool, threads: int, py=None) -> Kernel | None:  # type: ignore[no-untyped-def]
    """conv_par.maxpool_bwd_par_ (argmax int32); ``py`` (the forward's output) for relu=True."""
    L = active()
    if L is None or not (_c32(dy, dx) and am.dtype == I32 and am.flags.c_contiguous and am.shape == dy.shape
                         and dx.ndim == 4 and dy.shape[::3] == dx.shape[::3]
                         and (py is None or (_c32(py) and py.shape == dy.shape))):
        return None
    n, h, w, c = dx.shape
    args = (address(dy), address(am), 0 if py is None else address(py), address(dx), n, h, w, c, dy.shape[1],
            dy.shape[2], int(two_by_two), threads)
    return call(L.rnb_maxpool_bwd, args, (dy, am, dx) + (() if py is None else (py,)))


@binder
def bind_avgpool(x, y, k: int, s: int, p: int, backward: bool, threads: int) -> Kernel | None:
    """conv_loops.avgpool_fwd_ (x -> y) or, backward, avgpool_bwd_ (y is dy, x is dx)."""
    L = active()
    if L is None or not (_c32(x, y) and x.ndim == y.ndim == 4 and y.shape[::3] == x.shape[::3]):
        return None
    n, h, w, c = x.shape
    args = (address(x), n, h, w, c, address(y), y.shape[1], y.shape[2], k, s, p, float(k * k), int(backward), threads)
    return call(L.rnb_avgpool, args, (x, y))


@binder
def bind_gap(x, y, backward: bool, threads: int) -> Kernel | None:
    """conv_loops.gap_fwd_ (x (N, H, W, C) -> y (N, C)) or, backward, gap_bwd_ (y is dy, x is dx)."""
    L, ldy = active(), row_stride(y)
    if L is None or ldy is None or not (_c32(x) and y.dtype == F32 and x.ndim == 4 and y.shape == x.shape[::3]):
        return None
    n, h, w, c = x.shape
    return call(L.rnb_gap, (address(x), n, h * w, c, address(y), ldy, float(h * w), int(backward), threads), (x, y))


@binder
def bind_patches(x3, cols, c: int, k: int, s: int, p: int, ho: int, wo: int, to_cols: bool,
                 threads: int) -> Kernel | None:
    """conv_par.patches_par_: im2col (x3 (N, H, W*C) -> cols) or col2im (cols -> x3)."""
    L = active()
    if L is None or not (_c32(x3, cols) and x3.ndim == 3 and cols.shape == (x3.shape[0] * ho * wo, k * k * c)):
        return None
    n, h, wc = x3.shape
    args = (address(x3), n, h, wc // c, c, address(cols), k, s, p, ho, wo, int(to_cols), threads)
    return call(L.rnb_patches, args, (x3, cols))


@binder
def bind_im2col_taps(x3, cols_t, spans, k: int, s: int, p: int, ho: int, wo: int, threads: int) -> Kernel | None:
    """conv_par.im2col_taps_par_: one-channel columns, tap-major (cols_t (k*k, N*ho*wo))."""
    L = active()
    ok = (L is not None and _c32(x3, cols_t) and x3.ndim == 3 and cols_t.shape == (k * k, x3.shape[0] * ho * wo)
          and spans.dtype == I64 and spans.flags.c_contiguous and spans.shape == (k * k, 4))
    if not ok:
        return None
    n, h, w = x3.shape
    args = (address(x3), n, h, w, address(cols_t), address(spans), k, s, p, ho, wo, threads)
    return call(L.rnb_im2col_taps, args, (x3, cols_t, spans))


@binder
def bind_relu(x, y, dy, threads: int) -> Kernel | None:
    """fused.relu_chunks_par_: forward (dy empty) or backward."""
    L = active()
    arrays = (x, y) + ((dy,) if dy.size else ())
    if L is None or not (_c32(*arrays) and all(a.size == x.size for a in arrays)):
        return None
    return call(L.rnb_relu, (address(x), address(y), address(dy) if dy.size else None, x.size, threads), (x, y, dy))


@binder
def bind_activation(code: int) -> Kernel | None:
    """An activation other than ReLU (bind_relu) and GELU (gelu_native.bind_gelu): the C kernels have none, so
    this declines (recorded as a plan's decline, native.covers) and the caller binds its numba loop."""
    return None


@binder
def bind_mul(out, a, b, threads: int) -> Kernel | None:
    """fused.mul_: out = a * b over flat float32 values of one size."""
    L = active()
    if L is None or not (_c32(out, a, b) and out.size == a.size == b.size):
        return None
    return call(L.rnb_mul, (address(out), address(a), address(b), out.size, threads), (out, a, b))


@binder
def bind_add(out, a, b, threads: int, relu: bool = False) -> Kernel | None:
    """out = a + b (np.add; out may be a or b), relu(a + b) with ``relu`` (the add and the ReLU kernel's bytes), or,
    with b None, out = a, over flat float32 values of one size."""
    L = active()
    arrays = (out, a) + (() if b is None else (b,))
    if L is None or not (_c32(*arrays) and all(x.size == out.size for x in arrays)) or (relu and b is None):
        return None
    args = (address(out), address(a), None if b is None else address(b), out.size, int(relu), threads)
    return call(L.rnb_add, args, arrays)


@binder
def bind_dropout(x, y, mask, offset, k0: int, k1: int, stream: int, threshold: Any, scale: Any,
                 threads: int) -> Kernel | None:
    """philox.dropout_kernel into mask from the offset, the offset advanced, then fused.mul_ (y = x * mask)."""
    L = active()
    if L is None or not (_c32(x, y, mask) and x.size == y.size == mask.size and offset.dtype == I64
                         and offset.size >= 1):
        return None
    args = (address(x), address(y), address(mask), x.size, address(offset), k0, k1, stream, float(threshold), float(scale),
            threads)
    return call(L.rnb_dropout_fwd, args, (x, y, mask, offset))


@binder
def bind_gather_images(cursor, aug_offset, xs, ys, perm, x4, y_out, rng: tuple, tables: tuple,  # type: ignore[no-untyped-def]
                       claimed: bool = False) -> Callable[[], int] | None:
    """augment.transfer_images_step for float32 NCHW sources: returns its status (0, 1 or 2). ``claimed``:
    transfer_images_claimed, the batch claimed into ``cursor`` (2,) = (start, aug_base) by bind_claim's
    kernel (aug_offset is then ignored and nothing is advanced)."""
    L = active()
    if claimed:
        cursor, aug_offset = cursor[:1], cursor[1:]
    ok = (L is not None and _c32(xs, x4) and xs.ndim == x4.ndim == 4 and ys.dtype in (I32, I64) and all_flat(ys, perm)
          and perm.dtype == I64 and y_out.dtype == I32 and all_flat(y_out, cursor, aug_offset) and cursor.dtype == I64
          and aug_offset.dtype == I64 and ys.shape[0] == xs.shape[0] and xs.shape[1] == x4.shape[3]
          and all(t.flags.c_contiguous for t in tables[:8]))
    if not ok:
        return None
    k0, k1, stream, pad, flip, fill = rng
    (yi0, yi1, yw0, yw1, xi0, xi1, xw0, xw1, resize), (rows, cn, hs, ws), (b, h, w) = tables, xs.shape, x4.shape[:3]
    args = (address(xs), rows, cn, hs, ws, address(ys), int(ys.dtype == I64), address(perm), perm.size, address(cursor),
            address(aug_offset), address(x4), address(y_out), b, h, w, k0, k1, stream, pad, flip, float(fill),
            *(address(t) for t in (yi0, yi1, yw0, yw1, xi0, xi1, xw0, xw1)), int(resize), int(not claimed))
    return call(L.rnb_gather_images, args, (cursor, aug_offset, xs, ys, perm, x4, y_out, *tables[:8]))


@binder
def bind_claim(cursor, aug_offset, n: int, state) -> Kernel | None:  # type: ignore[no-untyped-def]
    """augment.claim_batch: state = (cursor, aug_offset), the cursor moved on by n."""
    L = active()
    arrays = (cursor, aug_offset, state)
    if L is None or not (all_flat(*arrays) and all(a.dtype == I64 for a in arrays) and state.size >= 2):
        return None
    return call(L.rnb_claim_batch, (address(cursor), address(aug_offset), n, address(state)), arrays)


# ---- the convolutions that call sgemm: by im2col tiles, by Winograd F(2x2, 3x3) -----------------
@binder
def bind_conv_fwd_tiles(fptr: int, wide: bool, x3, w2, y2, scratch, c: int, k: int, s: int, p: int, ho: int, wo: int,  # type: ignore[no-untyped-def]
                        tile: int, b, act: int) -> Kernel | None:
    """conv_tiled.conv_fwd_tiles_ (scratch (threads, tile*ho*wo, k*k*c))."""
    L = active()
    if L is None or not (_c32(x3, w2, y2, scratch, b) and x3.ndim == 3 and scratch.ndim == 3):
        return None
    n, h, wc = x3.shape
    args = (fptr, int(wide), address(x3), n, h, wc // c, c, address(w2), w2.shape[0], address(y2), address(scratch),
            scratch.shape[0], k, s, p, ho, wo, tile, address(b), b.size, act)
    return call(L.rnb_conv_fwd_tiles, args, (x3, w2, y2, scratch, b))


@binder
def bind_conv_bwd_tiles(fptr: int, wide: bool, x3, dy2, w2, dw2, parts, scratch, dscratch, dx3, c: int, k: int,  # type: ignore[no-untyped-def]
                        s: int, p: int, ho: int, wo: int, tile: int) -> Kernel | None:
    """conv_tiled.conv_bwd_tiles_ (dx3 empty: no input gradient)."""
    L = active()
    need_dx = dx3.shape[0] > 0
    ok = (L is not None and _c32(x3, dy2, w2, dw2, parts, scratch) and (not need_dx or _c32(dscratch, dx3))
          and x3.ndim == 3 and scratch.ndim == 3 and parts.shape[0] == scratch.shape[0] - 1)
    if not ok:
        return None
    n, h, wc = x3.shape
    args = (fptr, int(wide), address(x3), n, h, wc // c, c, address(dy2), address(w2), w2.shape[0], address(dw2), address(parts),
            address(scratch), address(dscratch) if need_dx else None, address(dx3) if need_dx else None, scratch.shape[0],
            k, s, p, ho, wo, tile)
    return call(L.rnb_conv_bwd_tiles, args, (x3, dy2, w2, dw2, parts, scratch, dscratch, dx3))


@binder
def bind_winograd_fwd(fptr: int, wide: bool, w, flip: bool, u, x, y, b, act: int, bufs,  # type: ignore[no-untyped-def]
                      rows: int, m: int = 2) -> Kernel | None:
    """winograd.weights_ (m = 2) or weights43_ (m = 4) then winograd.fwd_ (x, y NHWC; bufs (threads,
    per_thread))."""
    L = active()
    if L is None or not (_c32(w, u, x, y, b, bufs) and x.ndim == y.ndim == 4 and bufs.ndim == 2):
        return None
    n, h, wd, c = x.shape
    args = (fptr, int(wide), address(w), int(flip), address(u), address(x), n, h, wd, c, address(y), y.shape[3], address(b), b.size,
            act, address(bufs), bufs.shape[0], bufs.shape[1], rows, m)
    return call(L.rnb_winograd_fwd, args, (w, u, x, y, b, bufs))


@binder
def bind_winograd_dw(fptr: int, wide: bool, x, dy, dw, bufs, rows: int, m: int = 2) -> Kernel | None:  # type: ignore[no-untyped-def]
    """winograd.dw_ (dU partials inside bufs, at part_at of each thread's buffer)."""
    L = active()
    if L is None or not (_c32(x, dy, dw, bufs) and x.ndim == dy.ndim == 4 and bufs.ndim == 2):
        return None
    n, h, wd, c = x.shape
    args = (fptr, int(wide), address(x), n, h, wd, c, address(dy), dy.shape[3], address(dw), address(bufs), bufs.shape[0],
            bufs.shape[1], rows, m)
    return call(L.rnb_winograd_dw, args, (x, dy, dw, bufs))

"""Convolutions by tiles of a few images: im2col into a buffer that stays in L2, then sgemm.

Why: the plain CPU convolution writes the whole im2col matrix (28.9 MB for the conv net's
14x14x32 -> 64 layer at batch 128, nine times the input) and reads it back in the GEMM,
and its backward writes and reads a matrix as large again for the input gradient. Neither
fits in cache, so those passes ran at memory speed. Here each numba thread takes a block
of images and walks it a tile of images at a time, a tile's columns (about 512 KiB) made
and used while they sit in L2:

* forward: im2col the tile, one sgemm into its rows of y, bias and activation on them;
* backward: im2col the tile again from x (cheaper than reading the saved matrix back),
  add dy_tile^T cols_tile into the thread's own dW partial (sgemm with beta 1), and for
  dx: dcols_tile = dy_tile W, scattered by col2im into the tile's images at once.

Thread 0 sums into dW itself and the others into partials (cout x k*k*Cin floats each, the
layer's ``dw_partials`` arena tensor), added in thread order, so a machine and thread count give the same bytes every step;
dW differs from one whole product in float32 rounding only, as the GEMM bands of
kernels/blas.py do. Measured on the conv net's two deep layers (batch 128,
caches evicted between runs, 2-core Xeon VM): the forward took 6.0 and 4.8 ms against 9.2
and 6.1 ms for im2col + the banded product.

A tile is at least one image: where one image's columns outgrow L2 (a 56x56x64 layer's are
7 MB), each tile is still made and used at once, but from L3 or memory.

The plan sizes the columns for the tiles alone (operands.conv_scratch_shape: one tile per
thread, CONV_THREADS at most), not for the whole im2col matrix, and gives the backward a scratch
of its own (``bwd_cols``, which holds a tile's columns and then, over them, its dcols): so each
lives through its own pass only. The README's ResNet (batch 128, 32x32) planned 486.5 MiB of T
for whole matrices, and now 9.2 MiB. The backward never reads what its forward left in ``cols``:
it tiles too, or, where its operands cannot, walks the batch a scratch-full of images at a time
(``conv_bwd`` in conv.py).
"""
from __future__ import annotations

from typing import Callable

import numba
import numpy as np

from ..errors import PlanError
from . import blas, conv_native
from .operands import CONV_THREADS, conv_tile_images, conv_tiles
from .blas import NO_TRANS, TRANS, sgemm_at
from .conv_loops import col2im_, im2col_
from .fused import bias_act_, cut, jit, par


def applies(x: np.ndarray, w: np.ndarray, cols: np.ndarray | None, k: int, s: int, pad: int) -> bool:
    """Whether a convolution with these operands runs by tiles on the CPU: the products use
    the library's threads, the im2col path applies (not a 1x1/stride-1 product, Cin > 1),
    and every operand is a C-contiguous float32 array with a BLAS address."""
    if not blas.THREADED or cols is None or x.ndim != 4 or not conv_tiles(k, s, pad, x.shape[-1]):
        return False
    return all(isinstance(a, np.ndarray) and a.dtype == np.float32 and a.flags.c_contiguous for a in (x, w, cols))


def max_threads(n: int) -> int:
    """The threads a tiled convolution of n images uses at most here: numba's, one per image,
    CONV_THREADS at most (the plan's scratch holds a tile for each of those)."""
    return max(1, min(numba.get_num_threads(), n, CONV_THREADS))


def plan_tiles(n: int, rows_per_image: int, width: int, room: int, most: int | None = None) -> tuple[int, int]:
    """(threads, images per tile): one block of images per numba thread (at most one thread per
    image, and at most ``most``), tiles of about CONV_TILE_BYTES of columns; threads * tile is at
    most n and at most ``room``, the images whose columns the scratch holds at once, so the tiles'
    buffers fit in the columns scratch the plan gave (operands.conv_scratch_shape)."""
    threads = min(max_threads(n), room, most if most is not None else n)
    tile = max(1, min(n // threads, conv_tile_images(rows_per_image, width), room // threads))
    return threads, tile


@par
def conv_fwd_tiles_(fptr, wide, x3, w2, y2, scratch, c, k, s, p, ho, wo, tile, b, act):
    """y2 = act(im2col(x) w2^T + b), a tile of images at a time per thread (scratch[t] holds
    thread t's tile of columns)."""
    n = x3.shape[0]
    threads = scratch.shape[0]
    per = ho * wo
    kk = w2.shape[1]
    cout = w2.shape[0]
    post = act != 0 or b.shape[0] > 0
    for t in numba.prange(threads):
        buf = scratch[t]
        b0 = cut(n, threads, t)
        n1 = cut(n, threads, t + 1)
        while b0 < n1:
            b1 = min(n1, b0 + tile)
            r0 = b0 * per
            r1 = b1 * per
            im2col_(x3[b0:b1], buf[:r1 - r0], c, k, s, p, ho, wo)
            sgemm_at(fptr, wide, NO_TRANS, TRANS, r1 - r0, cout, kk, buf.ctypes.data, kk, w2.ctypes.data, kk,
                     y2[r0:r1].ctypes.data, cout, False)
            if post:
                bias_act_(y2[r0:r1], b, act, 0.0)
            b0 = b1


@par
def conv_bwd_tiles_(fptr, wide, x3, dy2, w2, dw2, parts, scratch, dscratch, dx3, c, k, s, p, ho, wo, tile):
    """dW = sum over tiles of dy_tile^T im2col(x)_tile (thread 0 into dw2 itself, thread t > 0 into
    parts[t - 1], added in thread order at the end); with dx3 non-empty also dcols_tile = dy_tile w2,
    col2im'd into dx3."""
    n = x3.shape[0]
    threads = scratch.shape[0]
    per = ho * wo
    cout, kk = w2.shape
    need_dx = dx3.shape[0] > 0
    for t in numba.prange(threads):
        buf = scratch[t]
        dbuf = dscratch[t] if need_dx else buf
        part = dw2 if t == 0 else parts[t - 1]
        b0 = cut(n, threads, t)
        n1 = cut(n, threads, t + 1)
        first = True
        while b0 < n1:
            b1 = min(n1, b0 + tile)
            r0 = b0 * per
            rows = (b1 - b0) * per
            im2col_(x3[b0:b1], buf[:rows], c, k, s, p, ho, wo)
            dyt = dy2[r0:r0 + rows]
            sgemm_at(fptr, wide, TRANS, NO_TRANS, cout, kk, rows, dyt.ctypes.data, cout, buf.ctypes.data, kk,
                     part.ctypes.data, kk, not first)
            if need_dx:
                sgemm_at(fptr, wide, NO_TRANS, NO_TRANS, rows, kk, cout, dyt.ctypes.data, cout, w2.ctypes.data, kk,
                         dbuf.ctypes.data, kk, False)
                col2im_(dbuf[:rows], dx3[b0:b1], c, k, s, p, ho, wo)
            first = False
            b0 = b1
        if first:  # no images for this thread
            part[:, :] = 0.0
    add_parts_(parts, dw2)


@jit
def add_parts_(parts, out):
    """out = out + parts[0] + parts[1] + ... in that order."""
    cout, kk = out.shape
    for i in range(cout):
        for j in range(kk):
            acc = out[i, j]
            for t in range(parts.shape[0]):
                acc += parts[t, i, j]
            out[i, j] = acc


def bind_fwd(x: np.ndarray, w: np.ndarray, y: np.ndarray, cols: np.ndarray, b: np.ndarray, act: int,
             k: int, s: int, pad: int, ho: int, wo: int) -> Callable[[], None]:
    """The tiled forward of one conv_fwd node as a zero-argument kernel; cols (rows, k*k*Cin) is its
    scratch, a whole number of images' columns."""
    n, h, wd, cin = x.shape
    cout = w.shape[0]
    kk = k * k * cin
    threads, tile = plan_tiles(n, ho * wo, kk, cols.shape[0] // (ho * wo))
    scratch = cols.reshape(-1)[:threads * tile * ho * wo * kk].reshape(threads, tile * ho * wo, kk)
    x3, w2, y2 = x.reshape(n, h, wd * cin), w.reshape(cout, kk), y.reshape(n * ho * wo, cout)
    sg = blas.SGEMM
    fptr, wide, f = sg.address, sg.int_bits == 64, conv_fwd_tiles_
    bound = conv_native.bind_conv_fwd_tiles(fptr, wide, x3, w2, y2, scratch, cin, k, s, pad, ho, wo, tile, b, act)
    return blas.on_own_cores(bound or (lambda: f(fptr, wide, x3, w2, y2, scratch, cin, k, s, pad, ho, wo, tile, b,
                                                 act)))


def bind_bwd(x: np.ndarray, dy2: np.ndarray, w: np.ndarray, dw: np.ndarray, cols: np.ndarray,
             dx: np.ndarray | None, dcols: np.ndarray | None, k: int, s: int, pad: int, ho: int,
             wo: int, partials: np.ndarray) -> Callable[[], None]:
    """The tiled weight and input gradients of one conv_bwd node (after its pre-pass on dy).
    ``partials`` (P, Cout, k*k*Cin) float32 holds the dW partials of threads 1..P: the layer's
    ``dw_partials`` arena tensor, so this runs on at most P + 1 threads."""
    n, h, wd, cin = x.shape
    cout = w.shape[0]
    kk = k * k * cin
    if partials.ndim != 3 or partials.shape[1:] != (cout, kk) or partials.dtype != np.float32:
        raise PlanError(f"conv_bwd: the weight-gradient partials have shape {partials.shape} ({partials.dtype}), "
                        f"expected (P, {cout}, {kk}) float32. Fix: plan them with the layer's tensors.")
    threads, tile = plan_tiles(n, ho * wo, kk, cols.shape[0] // (ho * wo), partials.shape[0] + 1)
    size = threads * tile * ho * wo * kk
    scratch = cols.reshape(-1)[:size].reshape(threads, tile * ho * wo, kk)
    if dx is not None and dcols is not None:
        dscratch = dcols.reshape(-1)[:size].reshape(threads, tile * ho * wo, kk)
        dx3 = dx.reshape(n, h, wd * cin)
    else:
        dscratch, dx3 = scratch[:0], np.zeros((0, 1, 1), np.float32)
    parts = partials[:threads - 1]  # the other threads' dW partials
    x3, w2, dw2 = x.reshape(n, h, wd * cin), w.reshape(cout, kk), dw.reshape(cout, kk)
    sg = blas.SGEMM
    fptr, wide, f = sg.address, sg.int_bits == 64, conv_bwd_tiles_
    bound = conv_native.bind_conv_bwd_tiles(fptr, wide, x3, dy2, w2, dw2, parts, scratch, dscratch, dx3, cin, k, s,
                                            pad, ho, wo, tile)
    return blas.on_own_cores(bound or (lambda: f(fptr, wide, x3, dy2, w2, dw2, parts, scratch, dscratch, dx3, cin,
                                                 k, s, pad, ho, wo, tile)))

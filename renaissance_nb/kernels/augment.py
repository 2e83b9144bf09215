"""The numba loops of the image transfer: gather, resize, crop, flip, NCHW -> NHWC.

What each sample goes through, the order of the steps and which Philox words draw the crop
and the flip are described in :mod:`renaissance_nb.data.augment`, which also holds the
bilinear tables these loops read (:func:`~renaissance_nb.data.augment.bilinear_weights`)
and the NumPy reference of the draws (:func:`~renaissance_nb.data.augment.augment_draws`).
The bound kernels that call these are in kernels/transfer.py. Each returns a status code of
kernels/status.py (0 ok, 1 cursor past the end, 2 bad row) and allocates nothing.
"""
from __future__ import annotations

import numba
import numpy as np

from .philox import philox_block

_MASK32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
_S31 = np.uint64(31)

_jit = numba.njit(cache=True, nogil=True, fastmath=False, error_model="numpy")


@_jit
def gather_images_nhwc(xs, ys, perm, start, aug_base, x_out, y_out, k0, k1, stream, pad, flip, fill,
                       yi0, yi1, yw0, yw1, xi0, xi1, xw0, xw1, resize):  # pragma: no cover - compiled
    """Rows ``perm[start:start+B]`` of NCHW ``xs`` -> resized, cropped, flipped NHWC ``x_out``; labels -> ``y_out``.

    ``aug_base`` (int64, reinterpreted as uint64) + sample position gives each sample's
    Philox block; ``k0, k1`` are the key words, ``pad`` the crop padding (0 = no crop),
    ``flip`` 1 to allow mirroring. ``resize`` 1 reads through the precomputed bilinear
    tables (``yi0..xw1``), else pixels are copied (source size == output size).
    Allocates nothing; returns a status code (0 ok, 1 cursor past the end, 2 bad row).
    """
    b_n = y_out.shape[0]
    h_out = x_out.shape[1]
    w_out = x_out.shape[2]
    c_n = x_out.shape[3]
    n_src = xs.shape[0]
    if start < 0 or start + b_n > perm.shape[0]:
        return 1
    m = np.uint64(2 * pad + 1)
    key0 = np.uint64(k0)
    key1 = np.uint64(k1)
    c2 = np.uint64(stream)
    zero = np.uint64(0)
    base = np.uint64(aug_base)
    for i in range(b_n):
        j = start + i
        r = perm[j]
        if r < 0 or r >= n_src:
            return 2
        blk = base + np.uint64(j)
        w0, w1, w2, _w3 = philox_block(blk & _MASK32, blk >> _S32, c2, zero, key0, key1)
        dy = np.int64((w0 * m) >> _S32) - pad
        dx = np.int64((w1 * m) >> _S32) - pad
        mirror = flip != 0 and (w2 >> _S31) != zero
        y_out[i] = ys[r]
        for y in range(h_out):
            sy = y + dy  # row of the resized image (outside [0, h_out): padding)
            if sy < 0 or sy >= h_out:
                for x in range(w_out):
                    for c in range(c_n):
                        x_out[i, y, x, c] = fill
                continue
            for x in range(w_out):
                xx = w_out - 1 - x if mirror else x
                sx = xx + dx
                if sx < 0 or sx >= w_out:
                    for c in range(c_n):
                        x_out[i, y, x, c] = fill
                elif resize:
                    ya = yi0[sy]
                    yb = yi1[sy]
                    xa = xi0[sx]
                    xb = xi1[sx]
                    wya = yw0[sy]
                    wyb = yw1[sy]
                    wxa = xw0[sx]
                    wxb = xw1[sx]
                    for c in range(c_n):
                        top = wxa * xs[r, c, ya, xa] + wxb * xs[r, c, ya, xb]
                        bot = wxa * xs[r, c, yb, xa] + wxb * xs[r, c, yb, xb]
                        x_out[i, y, x, c] = wya * top + wyb * bot
                else:
                    for c in range(c_n):
                        x_out[i, y, x, c] = xs[r, c, sy, sx]
    return 0


@_jit
def transfer_images_step(cursor, aug_offset, xs, ys, perm, x_out, y_out, k0, k1, stream, pad, flip, fill,
                         yi0, yi1, yw0, yw1, xi0, xi1, xw0, xw1, resize):  # pragma: no cover - compiled
    """The synchronous step: read ``cursor[0]`` and ``aug_offset[0]``, gather, advance the cursor by B."""
    start = cursor[0]
    rc = gather_images_nhwc(xs, ys, perm, start, aug_offset[0], x_out, y_out, k0, k1, stream, pad, flip, fill,
                            yi0, yi1, yw0, yw1, xi0, xi1, xw0, xw1, resize)
    if rc == 0:
        cursor[0] = start + y_out.shape[0]
    return rc


@_jit
def claim_batch(cursor, aug_offset, n, state):  # pragma: no cover - compiled
    """Asynchronous step, main-thread half: ``state = (cursor, aug_offset)``, then advance the cursor by n."""
    state[0] = cursor[0]
    state[1] = aug_offset[0]
    cursor[0] = cursor[0] + n


@_jit
def transfer_images_claimed(state, xs, ys, perm, x_out, y_out, k0, k1, stream, pad, flip, fill,
                            yi0, yi1, yw0, yw1, xi0, xi1, xw0, xw1, resize):  # pragma: no cover - compiled
    """Asynchronous step, worker half: gather the batch claimed into ``state``."""
    return gather_images_nhwc(xs, ys, perm, state[0], state[1], x_out, y_out, k0, k1, stream, pad, flip, fill,
                              yi0, yi1, yw0, yw1, xi0, xi1, xw0, xw1, resize)

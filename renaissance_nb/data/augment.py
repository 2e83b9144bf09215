"""Image augmentation and resizing for the image transfer kernel (NCHW source -> NHWC batch).

What one sample of a batch goes through, in this order (all in one numba pass, no
temporaries):

1. **resize** to the target (H, W) with bilinear interpolation, ``align_corners=False``
   (the semantics of ``torch.nn.functional.interpolate(mode="bilinear",
   antialias=False)``; the per-row and per-column source indices and weights are
   precomputed by :func:`bilinear_weights`);
2. **random crop** with zero padding ``pad`` (torchvision ``RandomCrop((H, W),
   padding=pad)``): pad the image by ``pad`` pixels of ``fill`` on each side and take
   the (H, W) window at top ``dy`` and left ``dx``, both uniform in ``[0, 2*pad]``;
   ``fill`` is in the stored (normalized) value space, 0.0 by default;
3. **random horizontal flip** with probability 1/2;
4. **layout**: written channels-last into ``x_out[i]`` of shape (H, W, C).

Randomness is counter-based (see :mod:`renaissance_nb.train.rng`): sample ``j`` of an
epoch (its position in the epoch order) uses the single Philox4x32-10 block at offset
``aug_base + j`` of stream ``StreamId.AUGMENT`` under the task seed. Of its four words,
``dy = (word0 * (2*pad + 1)) >> 32``, ``dx = (word1 * (2*pad + 1)) >> 32`` and
``flip = word2 >> 31`` (word3 is unused). The draws are therefore the same whatever
thread does the work and whenever it runs. :func:`augment_draws` is the NumPy reference.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numba
import numpy as np

from ..errors import DataError, PlanError, bad_argument
from ..train.rng import Philox, StreamId, _philox_block

__all__ = [
    "augment_draws",
    "bilinear_weights",
    "gather_images_nhwc",
    "resize_bilinear",
]

_MASK32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
_S31 = np.uint64(31)

#: Kernel status codes (0 = ok); the binding layer turns them into errors.
STATUS_OK = 0
STATUS_CURSOR = 1  # cursor + batch runs past the end of the permutation
STATUS_ROW = 2  # a permutation entry is not a row of the source


def status_error(rc: int, name: str, source: str, b: int, perm: np.ndarray, start: int) -> PlanError:
    """The PlanError for a batch gather's status code (STATUS_CURSOR or STATUS_ROW)."""
    if rc == STATUS_CURSOR:
        return PlanError(f"{name}: batch [{start}, {start + b}) runs past the end of the {source!r} permutation "
                         f"(length {len(perm)}). Fix: reset the cursor at each epoch and size the last batch to fit.")
    return PlanError(f"{name}: the {source!r} permutation holds an index outside the data set near position "
                     f"{start}. Fix: rebuild env.perms[{source!r}] as a permutation of range(N).")


_jit = numba.njit(cache=True, nogil=True, fastmath=False, error_model="numpy")


# --------------------------------------------------------------------------- resize weights


def bilinear_weights(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Source indices and weights of a 1-D bilinear resize, ``align_corners=False``.

    Returns ``(i0, i1, w0, w1)``: output position ``o`` reads ``w0[o] * s[i0[o]] +
    w1[o] * s[i1[o]]``. Computed in float32 the way PyTorch's CPU kernel does:
    ``src = max(scale * (o + 0.5) - 0.5, 0)`` with ``scale = in/out``, ``i0 =
    floor(src)``, ``i1 = min(i0 + 1, in - 1)``, ``w1 = src - i0``, ``w0 = 1 - w1``.
    """
    for name, v in (("in_size", in_size), ("out_size", out_size)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 1:
            raise bad_argument(DataError, "bilinear_weights", name, v, "an integer >= 1",
                               "pass image sizes in pixels, e.g. 32")
    n_in, n_out = int(in_size), int(out_size)
    scale = np.float32(n_in) / np.float32(n_out)
    o = np.arange(n_out, dtype=np.float32)
    src = scale * (o + np.float32(0.5)) - np.float32(0.5)
    src = np.maximum(src, np.float32(0.0))
    i0 = src.astype(np.int64)  # truncation == floor for src >= 0
    i0 = np.minimum(i0, n_in - 1)
    w1 = np.clip(src - i0.astype(np.float32), np.float32(0.0), np.float32(1.0)).astype(np.float32)
    i1 = np.where(i0 < n_in - 1, i0 + 1, i0).astype(np.int64)
    w0 = (np.float32(1.0) - w1).astype(np.float32)
    return np.ascontiguousarray(i0), np.ascontiguousarray(i1), w0, w1


def _check_hw(out_hw: Any, where: str) -> tuple[int, int]:
    ok = (isinstance(out_hw, Sequence) and len(out_hw) == 2
          and all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and v >= 1 for v in out_hw))
    if not ok:
        raise bad_argument(DataError, where, "out_hw", out_hw, "a pair (H, W) of integers >= 1",
                           "pass the target resolution, e.g. out_hw=(64, 64)")
    return int(out_hw[0]), int(out_hw[1])


def resize_bilinear(x: np.ndarray, out_hw: Sequence[int]) -> np.ndarray:
    """Resize NCHW float images to ``out_hw`` (bilinear, align_corners=False); a new float32 array.

    The same arithmetic as the transfer kernel's resize, for preprocessing a whole set
    once (e.g. a validation set) or for checking.
    """
    h, w = _check_hw(out_hw, "resize_bilinear")
    a = np.asarray(x)
    if a.ndim != 4 or a.dtype.kind != "f":
        raise bad_argument(DataError, "resize_bilinear", "x", a, "a float array of shape (N, C, H, W)",
                           "pass images in NCHW layout, e.g. data.train.x of an image data set")
    a = a.astype(np.float32, copy=False)
    yi0, yi1, yw0, yw1 = bilinear_weights(a.shape[2], h)
    xi0, xi1, xw0, xw1 = bilinear_weights(a.shape[3], w)
    r0, r1 = a[:, :, yi0, :], a[:, :, yi1, :]  # (N, C, h, Ws)
    wx0, wx1 = xw0.reshape(1, 1, 1, w), xw1.reshape(1, 1, 1, w)
    top = wx0 * r0[..., xi0] + wx1 * r0[..., xi1]
    bot = wx0 * r1[..., xi0] + wx1 * r1[..., xi1]
    out = yw0.reshape(1, 1, h, 1) * top + yw1.reshape(1, 1, h, 1) * bot
    return np.ascontiguousarray(out, dtype=np.float32)


# --------------------------------------------------------------------------- random draws (reference)


def augment_draws(seed: int, aug_base: int, first: int, n: int, crop_pad: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """NumPy reference of the kernel's draws for samples ``first .. first+n-1`` of an epoch.

    Returns ``(dy, dx, flip)`` int64 arrays: crop offsets in ``[0, 2*crop_pad]`` and flip
    bits (1 = mirror). The words come from ``Philox(seed).random_bits(4*n,
    StreamId.AUGMENT, aug_base + first)``, one 4-word block per sample.
    """
    words = Philox(int(seed)).random_bits(4 * int(n), int(StreamId.AUGMENT), int(aug_base) + int(first))
    blocks = words.reshape(-1, 4).astype(np.uint64)
    m = np.uint64(2 * int(crop_pad) + 1)
    dy = ((blocks[:, 0] * m) >> _S32).astype(np.int64)
    dx = ((blocks[:, 1] * m) >> _S32).astype(np.int64)
    flip = (blocks[:, 2] >> _S31).astype(np.int64)
    return dy, dx, flip


# --------------------------------------------------------------------------- the numba kernel


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
        w0, w1, w2, _w3 = _philox_block(blk & _MASK32, blk >> _S32, c2, zero, key0, key1)
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

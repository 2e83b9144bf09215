"""Image augmentation and resizing for the image transfer kernel (NCHW source -> NHWC batch).

What one sample of a batch goes through, in this order (all in one numba pass, no
temporaries: the loops are in kernels/augment.py):

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

import numpy as np

from ..errors import DataError, bad_argument
from ..kernels.augment import gather_images_nhwc  # noqa: F401 - the kernel, listed in __all__
from ..train.rng import Philox, StreamId

__all__ = [
    "augment_draws",
    "bilinear_weights",
    "gather_images_nhwc",
    "resize_bilinear",
]

_S32 = np.uint64(32)
_S31 = np.uint64(31)


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


def check_out_hw(out_hw: Any, where: str) -> tuple[int, int]:
    """``out_hw`` as (H, W), two ints >= 1, or a DataError naming ``where`` (the transfer kernel checks with it too)."""
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
    h, w = check_out_hw(out_hw, "resize_bilinear")
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

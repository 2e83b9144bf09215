"""The numba loops of the Philox4x32-10 generator (the algorithm and its counter layout:
:mod:`renaissance_nb.train.rng`, which calls these through its public functions).

:func:`philox_block` is one 4-word block, inlined into every loop that draws: the three
fills below and the image gathers of kernels/augment.py. Operands are uint64 holding 32-bit
values, so a product is the exact 64-bit mulhi:mullo.
"""
from __future__ import annotations

import numba
import numpy as np

PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
MASK32 = 0xFFFFFFFF
U24_SCALE = 2.0**-24
"""A uniform is the top 24 bits of a word times 2**-24 (exact in float32)."""

_M0 = np.uint64(PHILOX_M0)
_M1 = np.uint64(PHILOX_M1)
_W0 = np.uint64(PHILOX_W0)
_W1 = np.uint64(PHILOX_W1)
_MK = np.uint64(MASK32)
_S32 = np.uint64(32)
_S8 = np.uint64(8)


@numba.njit(cache=True, nogil=True, inline="always")
def _round(c0, c1, c2, c3, k0, k1):  # pragma: no cover - compiled
    # uint64 operands holding 32-bit values: the product is the exact 64-bit mulhi:mullo.
    p0 = _M0 * c0
    p1 = _M1 * c2
    return (p1 >> _S32) ^ c1 ^ k0, p1 & _MK, (p0 >> _S32) ^ c3 ^ k1, p0 & _MK


@numba.njit(cache=True, nogil=True, inline="always")
def philox_block(c0, c1, c2, c3, k0, k1):  # pragma: no cover - compiled
    """Philox4x32-10 of the counter (c0, c1, c2, c3) under the key (k0, k1): four uint64 words < 2**32."""
    # Rounds written out by hand: a rolled loop here is ~5x slower (no SIMD across blocks).
    c0, c1, c2, c3 = _round(c0, c1, c2, c3, k0, k1)
    k0, k1 = (k0 + _W0) & _MK, (k1 + _W1) & _MK
    c0, c1, c2, c3 = _round(c0, c1, c2, c3, k0, k1)
    k0, k1 = (k0 + _W0) & _MK, (k1 + _W1) & _MK
    c0, c1, c2, c3 = _round(c0, c1, c2, c3, k0, k1)
    k0, k1 = (k0 + _W0) & _MK, (k1 + _W1) & _MK
    c0, c1, c2, c3 = _round(c0, c1, c2, c3, k0, k1)
    k0, k1 = (k0 + _W0) & _MK, (k1 + _W1) & _MK
    c0, c1, c2, c3 = _round(c0, c1, c2, c3, k0, k1)
    k0, k1 = (k0 + _W0) & _MK, (k1 + _W1) & _MK
    c0, c1, c2, c3 = _round(c0, c1, c2, c3, k0, k1)
    k0, k1 = (k0 + _W0) & _MK, (k1 + _W1) & _MK
    c0, c1, c2, c3 = _round(c0, c1, c2, c3, k0, k1)
    k0, k1 = (k0 + _W0) & _MK, (k1 + _W1) & _MK
    c0, c1, c2, c3 = _round(c0, c1, c2, c3, k0, k1)
    k0, k1 = (k0 + _W0) & _MK, (k1 + _W1) & _MK
    c0, c1, c2, c3 = _round(c0, c1, c2, c3, k0, k1)
    k0, k1 = (k0 + _W0) & _MK, (k1 + _W1) & _MK
    return _round(c0, c1, c2, c3, k0, k1)


@numba.njit(cache=True, nogil=True, inline="always")
def _u24(w):  # pragma: no cover - compiled
    return np.float32(w >> _S8) * np.float32(U24_SCALE)


@numba.njit(cache=True, nogil=True, inline="always")
def _mask(w, threshold, scale):  # pragma: no cover - compiled
    return scale if _u24(w) < threshold else np.float32(0.0)


@numba.njit(cache=True, nogil=True)
def uniform_kernel(out, k0_i, k1_i, stream_i, off_lo_i, off_hi_i):  # pragma: no cover
    """out[i] = the uniform of word i, from blocks at offset (off_hi:off_lo) of the stream (rng.uniform_into)."""
    k0, k1, c2, zero = np.uint64(k0_i), np.uint64(k1_i), np.uint64(stream_i), np.uint64(0)
    base = (np.uint64(off_hi_i) << _S32) | np.uint64(off_lo_i)
    n = out.shape[0]
    full = n // 4
    for b in range(full):  # branch-free body so LLVM vectorises across blocks
        blk = base + np.uint64(b)
        w0, w1, w2, w3 = philox_block(blk & _MK, blk >> _S32, c2, zero, k0, k1)
        out[4 * b] = _u24(w0)
        out[4 * b + 1] = _u24(w1)
        out[4 * b + 2] = _u24(w2)
        out[4 * b + 3] = _u24(w3)
    blk = base + np.uint64(full)
    w0, w1, w2, w3 = philox_block(blk & _MK, blk >> _S32, c2, zero, k0, k1)
    for j in range(4 * full, n):  # tail block: only the first n % 4 words are used
        w = w0 if j % 4 == 0 else (w1 if j % 4 == 1 else w2)
        out[j] = _u24(w)


@numba.njit(cache=True, nogil=True)
def keys_kernel(out, k0_i, k1_i, stream_i, off_lo_i, off_hi_i):  # pragma: no cover - compiled
    """out[i] = word 2i << 32 | word 2i + 1: the sort keys of Philox.permutation."""
    k0, k1, c2, zero = np.uint64(k0_i), np.uint64(k1_i), np.uint64(stream_i), np.uint64(0)
    base = (np.uint64(off_hi_i) << _S32) | np.uint64(off_lo_i)
    n = out.shape[0]
    for b in range(n // 2):  # a block's four words make two keys
        blk = base + np.uint64(b)
        w0, w1, w2, w3 = philox_block(blk & _MK, blk >> _S32, c2, zero, k0, k1)
        out[2 * b] = (w0 << _S32) | w1
        out[2 * b + 1] = (w2 << _S32) | w3
    if n % 2:
        blk = base + np.uint64(n // 2)
        w0, w1, w2, w3 = philox_block(blk & _MK, blk >> _S32, c2, zero, k0, k1)
        out[n - 1] = (w0 << _S32) | w1


@numba.njit(cache=True, nogil=True)
def dropout_kernel(out, k0_i, k1_i, stream_i, off_lo_i, off_hi_i, threshold, scale):  # pragma: no cover
    """out[i] = scale where the uniform of word i < threshold, else 0 (rng.dropout_mask_into)."""
    k0, k1, c2, zero = np.uint64(k0_i), np.uint64(k1_i), np.uint64(stream_i), np.uint64(0)
    base = (np.uint64(off_hi_i) << _S32) | np.uint64(off_lo_i)
    n = out.shape[0]
    full = n // 4
    for b in range(full):
        blk = base + np.uint64(b)
        w0, w1, w2, w3 = philox_block(blk & _MK, blk >> _S32, c2, zero, k0, k1)
        out[4 * b] = _mask(w0, threshold, scale)
        out[4 * b + 1] = _mask(w1, threshold, scale)
        out[4 * b + 2] = _mask(w2, threshold, scale)
        out[4 * b + 3] = _mask(w3, threshold, scale)
    blk = base + np.uint64(full)
    w0, w1, w2, w3 = philox_block(blk & _MK, blk >> _S32, c2, zero, k0, k1)
    for j in range(4 * full, n):
        w = w0 if j % 4 == 0 else (w1 if j % 4 == 1 else w2)
        out[j] = _mask(w, threshold, scale)

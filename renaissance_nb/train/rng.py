"""Counter-based random numbers (Philox4x32-10, the Random123 algorithm).

Why counter-based: every random draw in a compiled plan (weight init, shuffle,
dropout, augmentation) is a pure function of ``(seed, stream, offset)`` fixed at
compile time, so the same seed gives byte-identical results on any run, in any
order, with no hidden generator state to save in a checkpoint.

Counter layout (the contract every caller relies on):

* key     = ``(seed & 0xffffffff, (seed >> 32) & 0xffffffff)``
* counter = ``(offset_lo, offset_hi, stream, 0)`` for one 4-word block, where
  ``offset`` is a 64-bit *block* index and ``stream`` a 32-bit id (:class:`StreamId`).
* A call that needs ``w`` 32-bit words uses the blocks ``offset .. offset +
  ceil(w/4) - 1`` and word ``i`` is word ``i % 4`` of block ``offset + i // 4``.
  :meth:`Philox.blocks_needed` gives the count to advance ``offset`` by.

``random_bits``, ``uniform`` and ``normal`` use one word per value; ``permutation``
uses two words per element (a 64-bit sort key).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np

from renaissance_nb.errors import ConfigError, bad_argument

try:  # numba is a hard dependency, but the module must still import without it
    import numba

    _HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised only on broken installs
    numba = None
    _HAVE_NUMBA = False

__all__ = [
    "StreamId",
    "Philox",
    "philox4x32_10",
    "uniform_into",
    "dropout_mask_into",
]

PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
_MASK32 = 0xFFFFFFFF
_U24_SCALE = 2.0**-24


class StreamId(IntEnum):
    """Separate counter spaces per use, so two uses of one seed never share counters."""

    INIT = 1
    SHUFFLE = 2
    DROPOUT = 3
    AUGMENT = 4


# --------------------------------------------------------------------------- NumPy reference


def philox4x32_10(counters: np.ndarray, key: Any) -> np.ndarray:
    """Philox4x32-10 of each row of ``counters`` ((n, 4) uint32) under ``key`` (two uint32).

    The vectorised reference: products are done in uint64 so mulhi/mullo are exact.
    """
    ctr = np.asarray(counters)
    if ctr.ndim != 2 or ctr.shape[1] != 4:
        raise bad_argument(ConfigError, "philox4x32_10", "counters", ctr, "an (n, 4) uint32 array",
                           "pass one row of four 32-bit counter words per block")
    k = np.asarray(key, dtype=np.uint64).reshape(-1)
    if k.shape != (2,) or np.any(k > _MASK32):
        raise bad_argument(ConfigError, "philox4x32_10", "key", key, "two integers in [0, 2**32)",
                           "pass (seed & 0xffffffff, seed >> 32)")
    c = ctr.astype(np.uint64)
    c0, c1, c2, c3 = c[:, 0], c[:, 1], c[:, 2], c[:, 3]
    k0, k1 = np.uint64(k[0]), np.uint64(k[1])
    m0, m1 = np.uint64(PHILOX_M0), np.uint64(PHILOX_M1)
    w0, w1 = np.uint64(PHILOX_W0), np.uint64(PHILOX_W1)
    mask, s32 = np.uint64(_MASK32), np.uint64(32)
    for r in range(10):
        if r:
            k0 = (k0 + w0) & mask
            k1 = (k1 + w1) & mask
        p0 = m0 * c0
        p1 = m1 * c2
        c0, c1, c2, c3 = (p1 >> s32) ^ c1 ^ k0, p1 & mask, (p0 >> s32) ^ c3 ^ k1, p0 & mask
    return np.stack([c0, c1, c2, c3], axis=1).astype(np.uint32)


def _check_int(where: str, name: str, value: Any, lo: int, hi: int, fix: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise bad_argument(ConfigError, where, name, value, f"an integer in [{lo}, {hi}]", fix)
    v = int(value)
    if not lo <= v <= hi:
        raise bad_argument(ConfigError, where, name, value, f"an integer in [{lo}, {hi}]", fix)
    return v


def _check_call(where: str, n: Any, stream: Any, offset: Any) -> tuple[int, int, int]:
    n = _check_int(where, "n", n, 0, 2**62, "pass the number of values to draw (>= 0)")
    stream = _check_int(where, "stream", stream, 0, _MASK32, "use a StreamId (INIT, SHUFFLE, DROPOUT, AUGMENT)")
    offset = _check_int(where, "offset", offset, 0, 2**64 - 1,
                        "pass a block offset >= 0 (advance it by Philox.blocks_needed(n))")
    return n, stream, offset


@dataclass(frozen=True)
class Philox:
    """An immutable Philox4x32-10 generator: all draws are pure functions of (seed, stream, offset)."""

    seed: int

    def __post_init__(self) -> None:
        _check_int("Philox", "seed", self.seed, 0, 2**64 - 1, "pass a seed in [0, 2**64), e.g. seed=0")
        object.__setattr__(self, "seed", int(self.seed))

    @property
    def key(self) -> tuple[int, int]:
        """The Philox key: (low 32 bits, high 32 bits) of the seed."""
        return self.seed & _MASK32, (self.seed >> 32) & _MASK32

    @staticmethod
    def blocks_needed(n: int, words_per_item: int = 1) -> int:
        """Blocks consumed by a call drawing ``n`` items (``words_per_item=2`` for permutation)."""
        n = _check_int("Philox.blocks_needed", "n", n, 0, 2**62, "pass the number of values drawn (>= 0)")
        return -(-n * words_per_item // 4)

    def _words(self, words: int, stream: int, offset: int) -> np.ndarray:
        nb = -(-words // 4)
        if offset + nb > 2**64:
            raise bad_argument(ConfigError, "Philox", "offset", offset,
                               f"offset + {nb} blocks <= 2**64", "use a smaller block offset")
        blk = np.uint64(offset) + np.arange(nb, dtype=np.uint64) if nb else np.zeros(0, np.uint64)
        ctr = np.zeros((nb, 4), dtype=np.uint32)
        ctr[:, 0] = blk & np.uint64(_MASK32)
        ctr[:, 1] = blk >> np.uint64(32)
        ctr[:, 2] = stream
        return philox4x32_10(ctr, self.key).reshape(-1)[:words]

    def random_bits(self, n: int, stream: int, offset: int) -> np.ndarray:
        """``n`` uint32 words from blocks starting at ``offset`` of ``stream``."""
        n, stream, offset = _check_call("Philox.random_bits", n, stream, offset)
        return self._words(n, stream, offset)

    def uniform(self, n: int, stream: int, offset: int) -> np.ndarray:
        """float32 in [0, 1): top 24 bits * 2**-24 (exact in float32, so kernels match bit for bit)."""
        n, stream, offset = _check_call("Philox.uniform", n, stream, offset)
        bits = self._words(n, stream, offset)
        return (bits >> np.uint32(8)).astype(np.float32) * np.float32(_U24_SCALE)

    def normal(self, n: int, stream: int, offset: int) -> np.ndarray:
        """float32 standard normals by Box-Muller on word pairs (cos then sin), in float64.

        Uniforms are ``(top24 + 0.5) * 2**-24`` in the open interval (0, 1), so log never sees 0.
        """
        n, stream, offset = _check_call("Philox.normal", n, stream, offset)
        pairs = -(-n // 2)
        bits = self._words(2 * pairs, stream, offset).reshape(pairs, 2)
        u = ((bits >> np.uint32(8)).astype(np.float64) + 0.5) * _U24_SCALE
        r = np.sqrt(-2.0 * np.log(u[:, 0]))
        theta = (2.0 * math.pi) * u[:, 1]
        z = np.stack([r * np.cos(theta), r * np.sin(theta)], axis=1).reshape(-1)[:n]
        return z.astype(np.float32)

    def permutation(self, n: int, stream: int, offset: int) -> np.ndarray:
        """A permutation of ``range(n)`` (int64): stable argsort of 64-bit keys from word pairs.

        Consumes ``blocks_needed(n, words_per_item=2)`` blocks. The keys come from the numba
        generator, the order from NumPy's unstable argsort (vectorised, twice as fast as its
        stable one), and equal keys, which 64 random bits make rare, are put in index order
        after: the stable argsort's permutation, at a quarter of its time for 2**24 items.
        """
        n, stream, offset = _check_call("Philox.permutation", n, stream, offset)
        keys = self._keys(n, stream, offset)
        order = np.argsort(keys)
        sk = keys[order]
        tied = np.flatnonzero(sk[1:] == sk[:-1])  # position i ties with i + 1
        if tied.size:  # each run of equal keys in ascending index, as a stable sort leaves them
            breaks = np.flatnonzero(np.diff(tied) > 1)
            for first, last in zip(tied[np.r_[0, breaks + 1]], tied[np.r_[breaks, tied.size - 1]] + 1):
                order[first:last + 1].sort()
        return order

    def _keys(self, n: int, stream: int, offset: int) -> np.ndarray:
        """``n`` uint64 keys, word ``2i`` high and ``2i + 1`` low, from blocks at ``offset``."""
        if offset + -(-n // 2) > 2**64:
            raise bad_argument(ConfigError, "Philox", "offset", offset, f"offset + {-(-n // 2)} blocks <= 2**64",
                               "use a smaller block offset")
        if _HAVE_NUMBA:
            keys = np.empty(n, np.uint64)
            _keys_kernel(keys, *self.key, stream, offset & _MASK32, offset >> 32)
            return keys
        bits = self._words(2 * n, stream, offset).astype(np.uint64).reshape(n, 2)  # NumPy fallback
        return (bits[:, 0] << np.uint64(32)) | bits[:, 1]


# --------------------------------------------------------------------------- numba hot path

if _HAVE_NUMBA:
    _M0 = np.uint64(PHILOX_M0)
    _M1 = np.uint64(PHILOX_M1)
    _W0 = np.uint64(PHILOX_W0)
    _W1 = np.uint64(PHILOX_W1)
    _MK = np.uint64(_MASK32)
    _S32 = np.uint64(32)
    _S8 = np.uint64(8)

    @numba.njit(cache=True, nogil=True, inline="always")
    def _round(c0, c1, c2, c3, k0, k1):  # pragma: no cover - compiled
        # uint64 operands holding 32-bit values: the product is the exact 64-bit mulhi:mullo.
        p0 = _M0 * c0
        p1 = _M1 * c2
        return (p1 >> _S32) ^ c1 ^ k0, p1 & _MK, (p0 >> _S32) ^ c3 ^ k1, p0 & _MK

    @numba.njit(cache=True, nogil=True, inline="always")
    def _philox_block(c0, c1, c2, c3, k0, k1):  # pragma: no cover - compiled
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
        return np.float32(w >> _S8) * np.float32(_U24_SCALE)

    @numba.njit(cache=True, nogil=True, inline="always")
    def _mask(w, threshold, scale):  # pragma: no cover - compiled
        return scale if _u24(w) < threshold else np.float32(0.0)

    @numba.njit(cache=True, nogil=True)
    def _uniform_kernel(out, k0_i, k1_i, stream_i, off_lo_i, off_hi_i):  # pragma: no cover
        k0, k1, c2, zero = np.uint64(k0_i), np.uint64(k1_i), np.uint64(stream_i), np.uint64(0)
        base = (np.uint64(off_hi_i) << _S32) | np.uint64(off_lo_i)
        n = out.shape[0]
        full = n // 4
        for b in range(full):  # branch-free body so LLVM vectorises across blocks
            blk = base + np.uint64(b)
            w0, w1, w2, w3 = _philox_block(blk & _MK, blk >> _S32, c2, zero, k0, k1)
            out[4 * b] = _u24(w0)
            out[4 * b + 1] = _u24(w1)
            out[4 * b + 2] = _u24(w2)
            out[4 * b + 3] = _u24(w3)
        blk = base + np.uint64(full)
        w0, w1, w2, w3 = _philox_block(blk & _MK, blk >> _S32, c2, zero, k0, k1)
        for j in range(4 * full, n):  # tail block: only the first n % 4 words are used
            w = w0 if j % 4 == 0 else (w1 if j % 4 == 1 else w2)
            out[j] = _u24(w)

    @numba.njit(cache=True, nogil=True)
    def _keys_kernel(out, k0_i, k1_i, stream_i, off_lo_i, off_hi_i):  # pragma: no cover - compiled
        k0, k1, c2, zero = np.uint64(k0_i), np.uint64(k1_i), np.uint64(stream_i), np.uint64(0)
        base = (np.uint64(off_hi_i) << _S32) | np.uint64(off_lo_i)
        n = out.shape[0]
        for b in range(n // 2):  # a block's four words make two keys
            blk = base + np.uint64(b)
            w0, w1, w2, w3 = _philox_block(blk & _MK, blk >> _S32, c2, zero, k0, k1)
            out[2 * b] = (w0 << _S32) | w1
            out[2 * b + 1] = (w2 << _S32) | w3
        if n % 2:
            blk = base + np.uint64(n // 2)
            w0, w1, w2, w3 = _philox_block(blk & _MK, blk >> _S32, c2, zero, k0, k1)
            out[n - 1] = (w0 << _S32) | w1

    @numba.njit(cache=True, nogil=True)
    def _dropout_kernel(out, k0_i, k1_i, stream_i, off_lo_i, off_hi_i, threshold, scale):  # pragma: no cover
        k0, k1, c2, zero = np.uint64(k0_i), np.uint64(k1_i), np.uint64(stream_i), np.uint64(0)
        base = (np.uint64(off_hi_i) << _S32) | np.uint64(off_lo_i)
        n = out.shape[0]
        full = n // 4
        for b in range(full):
            blk = base + np.uint64(b)
            w0, w1, w2, w3 = _philox_block(blk & _MK, blk >> _S32, c2, zero, k0, k1)
            out[4 * b] = _mask(w0, threshold, scale)
            out[4 * b + 1] = _mask(w1, threshold, scale)
            out[4 * b + 2] = _mask(w2, threshold, scale)
            out[4 * b + 3] = _mask(w3, threshold, scale)
        blk = base + np.uint64(full)
        w0, w1, w2, w3 = _philox_block(blk & _MK, blk >> _S32, c2, zero, k0, k1)
        for j in range(4 * full, n):
            w = w0 if j % 4 == 0 else (w1 if j % 4 == 1 else w2)
            out[j] = _mask(w, threshold, scale)

def _check_out(where: str, out: Any) -> None:
    if not (isinstance(out, np.ndarray) and out.dtype == np.float32 and out.ndim == 1
            and out.flags.c_contiguous and out.flags.writeable):
        raise bad_argument(ConfigError, where, "out", out, "a writeable, contiguous 1-D float32 array",
                           "preallocate it with np.empty(n, dtype=np.float32)")


def _split(where: str, n: int, seed: Any, stream: Any, offset: Any) -> tuple[int, int, int, int, int]:
    seed = _check_int(where, "seed", seed, 0, 2**64 - 1, "pass a seed in [0, 2**64)")
    stream = _check_int(where, "stream", stream, 0, _MASK32, "use a StreamId (e.g. StreamId.DROPOUT)")
    offset = _check_int(where, "offset", offset, 0, min(2**64 - 1, 2**64 - (n + 3) // 4),
                        "pass a block offset >= 0 with offset + blocks_needed(len(out)) <= 2**64")
    return seed & _MASK32, seed >> 32, stream, offset & _MASK32, offset >> 32


def uniform_into(out: np.ndarray, seed: int, stream: int, offset: int) -> None:
    """Write ``Philox(seed).uniform(len(out), stream, offset)`` into ``out`` without allocating."""
    _check_out("uniform_into", out)
    args = _split("uniform_into", out.shape[0], seed, stream, offset)
    if _HAVE_NUMBA:
        _uniform_kernel(out, *args)
    else:  # NumPy fallback: allocates, same bits (tests/test_rng.py)
        out[:] = Philox(int(seed)).uniform(out.shape[0], stream, offset)


def dropout_mask_into(out: np.ndarray, seed: int, stream: int, offset: int, keep_prob: float) -> None:
    """Write an inverted-dropout mask: ``1/keep_prob`` where uniform < keep_prob, else 0.

    Bit-identical to ``((Philox(seed).uniform(n, stream, offset) < keep_prob) / keep_prob)``
    cast to float32: the comparison is done in float32 (as NumPy does for a Python float)
    and the scale is ``float32(1.0 / keep_prob)`` computed in float64.
    """
    _check_out("dropout_mask_into", out)
    args = _split("dropout_mask_into", out.shape[0], seed, stream, offset)
    kp = float(keep_prob) if isinstance(keep_prob, (int, float, np.floating, np.integer)) else math.nan
    if not 0.0 < kp <= 1.0 or isinstance(keep_prob, bool):
        raise bad_argument(ConfigError, "dropout_mask_into", "keep_prob", keep_prob, "a number in (0, 1]",
                           "pass 1 - dropout_rate, e.g. keep_prob=0.9 for 10% dropout")
    threshold, scale = np.float32(kp), np.float32(1.0 / kp)
    if _HAVE_NUMBA:
        _dropout_kernel(out, *args, threshold, scale)
    else:  # NumPy fallback (tests/test_rng.py)
        u = Philox(int(seed)).uniform(out.shape[0], stream, offset)
        out[:] = np.where(u < threshold, scale, np.float32(0.0))

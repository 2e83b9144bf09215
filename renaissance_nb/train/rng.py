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

from ..errors import ConfigError, bad_argument
from ..kernels import native
from ..kernels import philox as _kernels
from ..kernels.philox import MASK32 as _MASK32
from ..kernels.philox import PHILOX_M0, PHILOX_M1, PHILOX_W0, PHILOX_W1
from ..kernels.philox import U24_SCALE as _U24_SCALE

_HAVE_NUMBA = True
"""Draw through the numba loops of kernels/philox.py; False takes the NumPy paths, the same bits (tests)."""

__all__ = [
    "StreamId",
    "Philox",
    "philox4x32_10",
    "uniform_into",
    "dropout_mask_into",
]


class StreamId(IntEnum):
    """Separate counter spaces per use, so two uses of one seed never share counters."""

    INIT = 1
    SHUFFLE = 2
    DROPOUT = 3
    AUGMENT = 4
    SAMPLE = 5  # generate(): one uniform per sampled token


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
            if not native.philox_keys(keys, *self.key, stream, offset & _MASK32, offset >> 32):
                _kernels.keys_kernel(keys, *self.key, stream, offset & _MASK32, offset >> 32)
            return keys
        bits = self._words(2 * n, stream, offset).astype(np.uint64).reshape(n, 2)  # NumPy fallback
        return (bits[:, 0] << np.uint64(32)) | bits[:, 1]


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
        _kernels.uniform_kernel(out, *args)
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
        _kernels.dropout_kernel(out, *args, threshold, scale)
    else:  # NumPy fallback (tests/test_rng.py)
        u = Philox(int(seed)).uniform(out.shape[0], stream, offset)
        out[:] = np.where(u < threshold, scale, np.float32(0.0))

"""DTensor: a descriptor of a tensor in the arena; it owns no memory."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .region import Region

ALIGNMENT = 256
"""Every slot starts on a 256-byte boundary (AVX-512 lines and CUDA transactions)."""


def align_up(n: int, alignment: int = ALIGNMENT) -> int:
    """Round n up to a multiple of alignment."""
    return (n + alignment - 1) // alignment * alignment


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides in elements."""
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


@dataclass(frozen=True)
class DTensor:
    """Where a tensor lives: id, name, shape, dtype, region, offset and strides.

    ``offset`` is None until the plan is finalized. ``slot_bytes`` is the space
    reserved for it, the largest size over all variants, so that its offset is
    the same in every variant.
    """

    id: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    region: Region
    slot_bytes: int
    offset: int | None = None

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def strides(self) -> tuple[int, ...]:
        """Row-major strides in elements (computed from this variant's shape)."""
        return contiguous_strides(self.shape)

    @property
    def end(self) -> int:
        """One past the last byte of the slot."""
        if self.offset is None:
            raise ValueError(f"{self.name} has no offset yet")
        return self.offset + self.slot_bytes

    def with_shape(self, shape: tuple[int, ...]) -> "DTensor":
        return replace(self, shape=tuple(shape))

    def __repr__(self) -> str:
        off = "unplaced" if self.offset is None else f"offset={self.offset}"
        return (
            f"DTensor(#{self.id} {self.name!r}, shape={self.shape}, {self.dtype}, "
            f"{self.region.name}, {off}, slot={self.slot_bytes}B)"
        )

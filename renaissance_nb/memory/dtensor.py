"""DTensor: a descriptor of a tensor in the arena; it owns no memory."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import PlanError
from .region import Region

if TYPE_CHECKING:  # pragma: no cover
    from .plan import MemoryPlan


def register_dtype(dtype: object) -> None:
    """Make NumPy know ``dtype`` by name before it is used: "bfloat16" (mixed precision's storage) comes from
    ml_dtypes, imported here on first use rather than with the package, since its import alone takes about
    0.6 s (2-core AMD EPYC) that a float32 job would pay at every start."""
    if dtype == "bfloat16":  # every time: a second thread waits here for the first one's import to finish
        import ml_dtypes  # noqa: F401 - registers numpy's "bfloat16" dtype


ALIGNMENT = 256
"""Every slot starts on a 256-byte boundary (AVX-512 lines and CUDA transactions)."""


def align_up(n: int, alignment: int = ALIGNMENT) -> int:
    """Round n up to a multiple of alignment."""
    return (n + alignment - 1) // alignment * alignment


ROW_ALIAS_BYTES = 4096
"""Rows whose byte length is a multiple of this alias in the cache: a GEMM walking down a column
(or packing a panel) touches one cache set per row, and the sets run out."""

ROW_PAD_BYTES = 64
"""What such a row gets added, one cache line: the next row starts in the next set."""


def row_pitch(shape: tuple[int, ...], itemsize: int) -> int | None:
    """The padded row length, in elements, of a 2-D matrix whose rows alias in the cache; None
    for every other tensor (stored contiguous).

    oneMKL's developer guide ("Coding Techniques"): leading dimensions should not be a multiple
    of a large power of 2 such as 4096 bytes; 4096 + 64 bytes can be faster. Measured on the
    MLP's products (784-1024-512-256-10, batch 128, oneMKL): 2-5% less GEMM time; whole epochs
    0.87-0.98x (README, "Padded rows").
    """
    if len(shape) != 2 or shape[0] < 2 or (shape[1] * itemsize) % ROW_ALIAS_BYTES:
        return None
    return shape[1] + ROW_PAD_BYTES // itemsize


def padded_bytes(shape: tuple[int, ...], itemsize: int, pitch: int) -> int:
    """The bytes of a 2-D tensor stored with rows ``pitch`` elements apart (its slot's minimum)."""
    return shape[0] * pitch * itemsize


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
    the same in every variant. ``pitch`` (2-D only): the row length in elements
    of its storage when rows are padded (see ``row_pitch``); None when contiguous.

    A DTensor is immutable, so the handle ``alloc()`` returned keeps ``offset=None``
    after ``finalize()`` placed it; ``placed`` finds the placed record in its ``plan``.
    """

    id: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    region: Region
    slot_bytes: int
    offset: int | None = None
    pitch: int | None = None
    plan: "MemoryPlan | None" = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        register_dtype(self.dtype)  # a bfloat16 tensor's views need ml_dtypes

    @property
    def placed(self) -> "DTensor":
        """This tensor with its offset: itself once placed, else its plan's record once that plan is finalized."""
        if self.offset is None and self.plan is not None and self.plan.finalized:
            return self.plan[self.id]
        return self

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
    def storage_bytes(self) -> int:
        """The bytes its view spans: its data plus the padding of its rows."""
        if self.pitch is None:
            return self.nbytes
        return padded_bytes(self.shape, self.itemsize, self.pitch)

    @property
    def strides(self) -> tuple[int, ...]:
        """Row-major strides in elements (computed from this variant's shape and the pitch)."""
        if self.pitch is not None:
            return (self.pitch, 1)
        return contiguous_strides(self.shape)

    @property
    def end(self) -> int:
        """One past the last byte of the slot."""
        offset = self.placed.offset
        if offset is None:
            raise PlanError(f"end: {self.name!r} has no offset yet; its plan is not finalized. "
                            "Fix: call finalize_memory() (or finalize() on a bare MemoryPlan) first.")
        return offset + self.slot_bytes

    def with_shape(self, shape: tuple[int, ...]) -> "DTensor":
        shape = tuple(shape)
        if self.pitch is not None and (len(shape) != 2 or shape[1] != self.shape[1]):
            raise PlanError(f"with_shape: {self.name} has rows padded to {self.pitch} elements, which keep "
                            f"their length {self.shape[1]}; shape={shape} changes it. Fix: pad rows only of "
                            "tensors whose shape is the same in every variant (parameters).")
        return replace(self, shape=shape)

    def __repr__(self) -> str:
        placed = self.placed
        off = (f"offset={self.offset}" if self.offset is not None else "unplaced" if placed.offset is None
               else f"placed at offset={placed.offset} (see .placed)")
        pitch = "" if self.pitch is None else f", rows padded to {self.pitch}"
        return (
            f"DTensor(#{self.id} {self.name!r}, shape={self.shape}, {self.dtype}, "
            f"{self.region.name}, {off}, slot={self.slot_bytes}B{pitch})"
        )


def span_bytes(x: Any) -> int:
    """Bytes from a view's first element to one past its last (NumPy or CuPy): its nbytes when
    contiguous; for a view of padded rows, the padding between its rows too. What a copy or a
    fill of the view's bytes must cover."""
    if x.flags.c_contiguous:
        return int(x.nbytes)
    if x.ndim == 2 and x.strides[1] == x.itemsize and x.strides[0] >= x.shape[1] * x.itemsize:
        return (x.shape[0] - 1) * x.strides[0] + x.shape[1] * x.itemsize if x.size else 0
    raise ValueError(f"a view of shape {x.shape} with strides {x.strides} is neither contiguous nor "
                     "padded rows of a row-major matrix")


def torch_layout(a: Any) -> Any:
    """A parameter as PyTorch lays it out: conv weights live channels-last in the arena,
    (out, kh, kw, in), and PyTorch's are (out, in, kh, kw); others are the same."""
    return a.transpose(0, 3, 1, 2) if a.ndim == 4 else a


def arena_layout(a: Any) -> Any:
    """torch_layout's inverse."""
    return a.transpose(0, 2, 3, 1) if a.ndim == 4 else a


def tensor_view(buffer: Any, t: DTensor) -> Any:
    """The typed, shaped view of ``t`` in an arena's byte buffer (NumPy or CuPy): a strided view
    of its padded rows when it has a pitch."""
    raw = buffer[t.offset: t.offset + t.storage_bytes].view(t.dtype)
    if t.pitch is None:
        return raw.reshape(t.shape)
    return raw.reshape(t.shape[0], t.pitch)[:, : t.shape[1]]

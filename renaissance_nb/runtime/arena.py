"""The arena: one NumPy buffer per task; every tensor is a view into it."""
from __future__ import annotations

import numpy as np

from ..memory.dtensor import ALIGNMENT
from ..memory.plan import MemoryPlan
from ..memory.region import Region


class Arena:
    """One aligned, zeroed byte buffer of a finalized plan's size."""

    def __init__(self, plan: MemoryPlan) -> None:
        raw = np.zeros(plan.total_bytes + ALIGNMENT, np.uint8)
        shift = (-raw.ctypes.data) % ALIGNMENT
        self.bytes = raw[shift: shift + plan.total_bytes]
        self.plan = plan

    @property
    def nbytes(self) -> int:
        return self.bytes.nbytes

    def views(self, plan: MemoryPlan) -> list[np.ndarray]:
        """A typed, shaped view per tensor id, for one variant's plan."""
        out = []
        for t in plan:
            out.append(self.bytes[t.offset: t.offset + t.nbytes].view(t.dtype).reshape(t.shape))
        return out

    def range_view(self, first: str, last: str, dtype: str) -> np.ndarray:
        """The bytes from the base of region ``first`` to the end of ``last`` as one flat array."""
        a, b = self.plan.region_range(Region[first], Region[last])
        return self.bytes[a:b].view(dtype)

    def locate(self, first: str, byte_in_range: int) -> str:
        """Name the tensor and region holding a byte of a range (for error messages)."""
        a, _ = self.plan.region_range(Region[first], Region[first])
        pos = a + byte_in_range
        for t in self.plan:
            if t.offset <= pos < t.offset + t.nbytes:
                return f"{t.name} (region {t.region.name}, element {(pos - t.offset) // t.itemsize})"
        return f"padding at byte {pos}"

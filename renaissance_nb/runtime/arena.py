"""The arena: one NumPy buffer per task; every tensor is a view into it."""
from __future__ import annotations

import numpy as np

from ..errors import PlanError
from ..memory.dtensor import ALIGNMENT, tensor_view
from ..memory.plan import MemoryPlan
from ..text import human_bytes
from ..memory.region import Region


class Arena:
    """One aligned, zeroed byte buffer of a finalized plan's size."""

    def __init__(self, plan: MemoryPlan) -> None:
        try:
            raw = np.zeros(plan.total_bytes + ALIGNMENT, np.uint8)
        except (MemoryError, ValueError):  # ValueError: past NumPy's largest array (2**63 bytes)
            raise PlanError(f"arena: the plan {plan.name!r} needs {human_bytes(plan.total_bytes)} in one buffer and "
                            "this machine cannot allocate it. Fix: a smaller model, batch_size or val_batch_size "
                            "(task.summary() shows the arena by region).") from None
        shift = (-raw.ctypes.data) % ALIGNMENT
        self.bytes = raw[shift: shift + plan.total_bytes]
        self.plan = plan

    @property
    def nbytes(self) -> int:
        return self.bytes.nbytes

    def views(self, plan: MemoryPlan) -> list[np.ndarray]:
        """A typed, shaped view per tensor id, for one variant's plan (strided where rows are padded)."""
        return [tensor_view(self.bytes, t) for t in plan]

    def range_view(self, first: str, last: str, dtype: str) -> np.ndarray:
        """The bytes from the base of region ``first`` to the end of ``last`` as one flat array."""
        a, b = self.plan.region_range(Region[first], Region[last])
        return self.bytes[a:b].view(dtype)

    def locate(self, first: str, byte_in_range: int) -> str:
        """Name the tensor and region holding a byte of a range (for error messages)."""
        a, _ = self.plan.region_range(Region[first], Region[first])
        pos = a + byte_in_range
        for t in self.plan:
            if t.offset <= pos < t.offset + t.storage_bytes:
                i = (pos - t.offset) // t.itemsize
                if t.pitch is None:
                    return f"{t.name} (region {t.region.name}, element {i})"
                row, col = divmod(i, t.pitch)
                where = f"element [{row}, {col}]" if col < t.shape[1] else f"the padding of row {row}"
                return f"{t.name} (region {t.region.name}, {where})"
        return f"padding at byte {pos}"

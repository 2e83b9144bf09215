"""read()/write() of one plan's tensors in an arena: the low-level access both task kinds share."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import PlanError, bad_argument
from ..memory.dtensor import DTensor
from ..memory.plan import MemoryPlan


def exact_values(value: Any, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray | None:
    """``value`` as ``dtype`` when it broadcasts to ``shape`` and converts without changing: no None or
    strings, for integer tensors no fractions, no NaN and nothing out of range (300 is not 44), and for float
    tensors no finite value beyond the type's range (1e300 would be stored as inf; NaN and inf pass as they are)."""
    try:
        raw = np.asarray(value)
        np.broadcast_to(raw, shape)
    except (ValueError, TypeError):
        return None
    if raw.dtype.name == "bfloat16":  # ml_dtypes' (kind V): read() of a bfloat16 tensor gives one; float32 holds it
        raw = raw.astype(np.float32)
    if raw.dtype.kind not in "biuf":
        return None
    if dtype.kind in "iu" and raw.size:
        info = np.iinfo(dtype)
        as_float = raw.astype(np.float64)
        if not (np.isfinite(as_float).all() and (as_float == np.round(as_float)).all()
                and info.min <= raw.min() and raw.max() <= info.max):
            return None
    if dtype.kind in "fV" and raw.dtype.kind in "fiu" and raw.size:  # V: ml_dtypes' bfloat16
        finite = np.abs(raw[np.isfinite(raw)].astype(np.float64))
        if finite.size and finite.max() > float(_finfo(dtype).max):
            return None
    return raw.astype(dtype)


def _finfo(dtype: np.dtype) -> Any:
    """NumPy's finfo, or ml_dtypes' for bfloat16 (NumPy's does not know it)."""
    try:
        return np.finfo(dtype)
    except ValueError:
        import ml_dtypes
        return ml_dtypes.finfo(dtype)


class TensorIO:
    """Tensors of ``plan`` by handle, id or name, as the views of one arena."""

    def __init__(self, plan: MemoryPlan, views: Sequence[np.ndarray]) -> None:
        self.plan = plan
        self.views = views

    def resolve(self, op: str, tensor: DTensor | int | str) -> DTensor:
        """This plan's record of a handle, an id or a name; a handle from another task's plan is refused
        (its id would name some other tensor here)."""
        if isinstance(tensor, DTensor):
            if tensor.plan is not None and tensor.plan is not self.plan:
                raise bad_argument(PlanError, op, "tensor", tensor, f"a tensor of this task's plan {self.plan.name!r}",
                                   "use the handles this task's alloc() returned")
            return self.plan[tensor.id]
        if isinstance(tensor, (bool, np.bool_)):
            raise bad_argument(PlanError, op, "tensor", tensor, "a DTensor, an int id or a tensor name",
                               "pass the DTensor alloc() returned")
        return self.plan[tensor]

    def read(self, tensor: DTensor | int | str) -> np.ndarray:
        return self.views[self.resolve("read", tensor).id].copy()

    def write(self, tensor: DTensor | int | str, value: Any) -> None:
        t = self.resolve("write", tensor)
        arr = exact_values(value, np.dtype(t.dtype), t.shape)
        if arr is None:
            raise bad_argument(PlanError, "write", "value", value,
                               f"numbers broadcastable to {t.shape} that {t.dtype} holds (whole numbers in its range for an "
                               "integer tensor, finite values within its range for a float one)", f"pass values shaped like {t.name}")
        self.views[t.id][...] = arr

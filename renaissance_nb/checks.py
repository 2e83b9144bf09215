"""The plain numbers a user passes as settings, read the same way everywhere.

Why one place: every validator (layer builders, optimizers, losses, schedulers) must
accept Python and NumPy numbers alike, refuse bools, and treat an int too large for a
float as out of range instead of letting ``float()`` raise OverflowError. Each caller
keeps its own exception type and message; these helpers only say whether (and as what)
a value counts as a number.
"""
from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

import numpy as np


def as_int(value: Any) -> int | None:
    """``value`` as a Python int when it is an int or a NumPy integer (not a bool), else None."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, Integral):
        return None
    return int(value)


def as_float(value: Any) -> float | None:
    """``value`` as a finite Python float when it is a real number (int, float or NumPy scalar,
    not a bool), else None: also for NaN, +-Inf and ints too large for a float (10**400)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, Real):
        return None
    try:
        v = float(value)
    except (OverflowError, ValueError, TypeError):
        return None
    return v if math.isfinite(v) else None

"""Binder of GELU's C pass (gelu_native.c): the erf form (the ``act`` code 'gelu' of ops/activation.py) and the
tanh form (ops/gelu_tanh.py), forward and backward.

Why a pass of its own: GELU and its gradient were a third of a small GPT's CPU step while they called
libm's erf per element, and every numba loop kept the GPT's whole plan on numba (native.chosen_for).
The C pass gives the bytes of its numba twins (kernels/gelu_math.py, tests/test_gelu_native.py).
"""
from __future__ import annotations

import numpy as np

from .native import Kernel, active, address, binder, call, with_part

FORMS = {"erf": 0, "tanh": 1}
"""The form codes rnb_gelu takes."""
GELU_PAR_MIN = 1 << 14
"""Values from which the pass is threaded: about 3 ns a value, so lower than the cheap passes' PASS_PAR_MIN."""


@binder
def bind_gelu(x: np.ndarray, dy: np.ndarray | None, out: np.ndarray, form: str, threads: int) -> Kernel | None:
    """out = gelu(x) (dy None) or dy * gelu'(x), over flat float32 values of one size; None where the library is
    not in use for this plan or the arrays are not contiguous float32 (the numba loop serves)."""
    L = with_part(active())
    arrays = (x, out) + ((dy,) if dy is not None else ())
    if L is None or not all(a.dtype == np.float32 and a.flags.c_contiguous and a.size == x.size for a in arrays):
        return None
    args = (address(x), address(dy) if dy is not None else None, address(out), x.size, FORMS[form], threads)
    return call(L.rnb_gelu, args, arrays)

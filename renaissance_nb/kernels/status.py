"""Status codes of the batch-gather kernels and the errors they stand for.

A numba loop cannot raise a helpful exception, so the gathers (kernels/fused.py's
``gather_batch``, kernels/augment.py's image gathers and the CUDA gather) return a code and
the bound kernel turns it into a :class:`PlanError` with :func:`status_error`.
"""
from __future__ import annotations

from typing import Sized

from ..errors import PlanError

STATUS_OK = 0
STATUS_CURSOR = 1  # cursor + batch runs past the end of the permutation
STATUS_ROW = 2  # a permutation entry is not a row of the source


def status_error(rc: int, name: str, source: str, b: int, perm: Sized, start: int) -> PlanError:
    """The PlanError for a batch gather's status code (STATUS_CURSOR or STATUS_ROW)."""
    if rc == STATUS_CURSOR:
        return PlanError(f"{name}: batch [{start}, {start + b}) runs past the end of the {source!r} permutation "
                         f"(length {len(perm)}). Fix: reset the cursor at each epoch and size the last batch to fit.")
    return PlanError(f"{name}: the {source!r} permutation holds an index outside the data set near position "
                     f"{start}. Fix: rebuild env.perms[{source!r}] as a permutation of range(N).")

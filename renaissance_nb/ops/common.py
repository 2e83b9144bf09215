"""What several ops share: the fused-activation slot of a producer's parameters, the bias
gradient's partial sums, the output size of a window, and reading PyTorch's int-or-pair arguments."""
from __future__ import annotations

from typing import Any

from ..errors import ShapeError
from ..kernels import blas, native
from ..kernels.operands import PAR_CHUNKS
from ..kernels.passes import PASS_PAR_MIN
from ..memory.region import Region
from .registry import Refused


def with_act_slot(params: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, Any], ...]:
    """A producer's parameters with no activation fused yet (the compiler's fusion fills act and slope)."""
    return tuple(sorted({**dict(params), "act": "none", "slope": 0.0}.items()))


def bias_partials(ctx: Any, layer: str, out: int) -> None:
    """The float64 row-block sums of a bias gradient (the backward pre-pass's scratch)."""
    ctx.t.add(f"{layer}.bias_partials", (PAR_CHUNKS, out), "float64", Region.T_TEMP_FP32)


def window_out(where: str, n: int, k: int, s: int, p: int) -> int:
    """The output size of a k-wide window at stride s over n values padded by p on each side."""
    o = (n + 2 * p - k) // s + 1
    if o < 1:
        raise ShapeError(f"plan: {where} gets spatial size {n}, too small for k={k}, s={s}, p={p}. "
                         "Fix: use a larger input, a smaller kernel, or fewer downsampling layers.")
    return o


def needs_image(layer: Any, x: tuple[int, ...], fix: str) -> None:
    if len(x) != 3:
        raise ShapeError(f"plan: {layer.name} ({layer.kind}) needs image features, got shape {x}. Fix: {fix}.")


def square(value: Any, what: str) -> int:
    """A PyTorch int-or-pair argument as one int: only square kernels, strides and paddings exist here."""
    if isinstance(value, (tuple, list)):
        if len(set(value)) != 1:
            raise Refused(f"{what}={tuple(value)} is not square (this library's layers take one size for both axes)")
        value = value[0]
    if not isinstance(value, int):
        raise Refused(f"{what}={value!r} is not a whole number of pixels")
    return value


def threaded(work: int) -> bool:
    """Whether an op's pass over ``work`` values runs on numba's threads: as the element-wise passes decide
    (kernels/passes.py: large enough to pay for waking the threads), and never in a plan bound to the C
    kernels' own pool (kernels/native.py: one thread pool per plan, or the two fight over the cores)."""
    return blas.THREADED and native.active() is None and work >= PASS_PAR_MIN

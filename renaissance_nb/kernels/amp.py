"""The CPU kernels of mixed precision (compiler/autocast.py): casts, unscaling, the loss scale's update.

``cast`` converts between a low-precision tensor (bf16 stored as ml_dtypes.bfloat16, fp16 as IEEE
half) and its fp32 buffer, rounding to nearest even as ``tensor.to(torch.bfloat16)`` does (lowp.c's
conversions, NumPy's where the library is absent: the same bytes); with
``via`` it rounds an fp32 tensor to low precision and back (an fp32 activation a matrix product
reads), and with a scale input it multiplies first (the logits' gradient by GradScaler's scale).
``amp_unscale`` and ``amp_update_scale`` are GradScaler's ``unscale_`` and ``update``.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from . import blas, fused, lowp, native
from .base import Factory, Kernel, registrar

AMP_KERNELS: dict[str, Factory] = {}
kernel = registrar(AMP_KERNELS)


def _numpy_cast(y: np.ndarray, x: np.ndarray, via: str | None, scale: np.ndarray | None) -> Kernel:
    """The NumPy path: ml_dtypes' and NumPy's casts round to nearest even (overflow -> inf, as torch)."""
    step = np.dtype(via) if via else None

    def run() -> None:
        with np.errstate(over="ignore", invalid="ignore"):
            src = x if scale is None else x * scale[0]
            if step is not None:
                src = src.astype(step).astype(np.float32)
            np.copyto(y, src, casting="unsafe")
    return run


@kernel("cast")
def cast(outs: Any, ins: Any, p: dict, env: Any) -> Kernel:
    """y = x in y's dtype (rounded to nearest even); ``via``: x rounded to that dtype and back;
    a second input: x times that scale first."""
    x, y = ins[0], outs[0]
    scale = ins[1] if len(ins) > 1 else None
    if scale is None and p.get("via") is None and (x.dtype == np.float32) != (y.dtype == np.float32):
        a, b = lowp.bits(x), lowp.bits(y)
        if a.flags.c_contiguous and b.flags.c_contiguous:  # as one row
            a, b = a.reshape(-1), b.reshape(-1)
        elif a.ndim != 2 or b.ndim != 2:  # a matrix with padded rows (W, G) beside its contiguous copy: by rows
            a, b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
        bound = lowp.bind_convert(a, b, blas.pass_threads(blas.THREADED))
        if bound is not None:
            return bound
    return _numpy_cast(y, x, p.get("via"), scale)



@kernel("amp_unscale")
def amp_unscale(outs: Any, ins: Any, p: dict, env: Any) -> Kernel:
    """GradScaler.unscale_: every fp32 gradient (the G range, the widened low-precision ones included)
    times 1/scale in fp32, the reciprocal taken in double as torch does. The NaN check after it finds
    what overflowed."""
    (scale,) = ins
    grads = env.range_view(p["first"], p["last"], "float32")
    threads = blas.pass_threads(blas.THREADED)
    bound = native.bind_clip(grads, threads)
    scale_by = bound[1] if bound else ((lambda f: fused.scale_par(grads, f)) if blas.THREADED
                                       else (lambda f: fused.scale_(grads, f)))

    def run() -> None:
        scale_by(np.float32(1.0 / float(scale[0])))
    return run


@kernel("amp_update_scale")
def amp_update_scale(outs: Any, ins: Any, p: dict, env: Any) -> Kernel:
    """GradScaler.update after the NaN check: an overflowed step (the check's flag) multiplies the scale
    by ``backoff`` and restarts the count; ``interval`` clean steps in a row multiply it by ``growth``
    (kept only if finite, as torch's _amp_update_scale_)."""
    (flag,) = ins
    scale, count = outs
    growth, backoff, interval = np.float32(p["growth"]), np.float32(p["backoff"]), int(p["interval"])

    def run() -> None:
        if flag[0]:
            scale[0] = scale[0] * backoff
            count[0] = 0
            return
        count[0] += 1
        if count[0] == interval:
            grown = scale[0] * growth
            if np.isfinite(grown):
                scale[0] = grown
            count[0] = 0
    return run

"""The two fused element-wise passes around a GEMM, as bound kernels (fc and conv layers use both).

Each binds the C loop (kernels/native.py) where the library is built, else the serial numba loop or
its threaded twin: all give the same bytes.
"""
from __future__ import annotations

import numpy as np

from ..errors import PlanError
from . import blas, fused, native
from .base import EMPTY_F32, BindEnv, Kernel

PASS_PAR_MIN = 1 << 17
"""Element-wise passes over fewer values than this stay on the calling thread: below it, waking
the other thread cost more than it saved (a 128x512 pass: 9.5 us serial, 9.9 us threaded;
128x1024: 18 against 11 us). The threaded variants give the same bytes."""
NO_PARTIALS = np.zeros((fused.PAR_CHUNKS, 0), np.float64)
"""The partial sums of a pre-pass without a bias: no values, but the loops still count the chunks."""


def bias_act_pass(y2: np.ndarray, b: np.ndarray, act: int, slope: float) -> Kernel:
    """y2 = act(y2 + b) in place (b may be empty) as a bound kernel; by row blocks on numba's
    threads when the products use that pool."""
    threaded = blas.THREADED and y2.size >= PASS_PAR_MIN
    bound = native.bind_bias_act(y2, b, act, slope, blas.pass_threads(threaded))
    if bound is not None:
        return bound
    f = fused.bias_act_par_ if threaded else fused.bias_act_
    return lambda: f(y2, b, act, slope)


def act_grad_colsum_pass(d2: np.ndarray, y2: np.ndarray, act: int, slope: float, db: np.ndarray | None,
                         parts: np.ndarray | None = None) -> Kernel:
    """The pre-pass of a backward GEMM, as a bound kernel: d2 *= act'(z) in place (from the
    output y2), and db = the column sums of d2, the bias gradient, when db is given. One pass
    where a GEMV with a ones vector read d2 again: for 128x1024, 36 us against 16 + 44 us.
    The sums are float64 partials of fixed row blocks added in order, so the serial and
    threaded variants give the same bytes. ``parts`` (PAR_CHUNKS, bias size) float64 holds the
    partial sums: the layer's ``bias_partials`` arena tensor (bias_partials() below) for a bound node."""
    out = db.reshape(-1) if db is not None else EMPTY_F32
    if parts is None:  # a direct caller (tests): its own buffer; bound nodes pass the planned tensor
        parts = np.zeros((fused.PAR_CHUNKS, out.size), np.float64) if out.size else NO_PARTIALS
    if parts.shape != (fused.PAR_CHUNKS, out.size) or parts.dtype != np.float64:
        raise PlanError(f"bias gradient: the partial sums have shape {parts.shape} ({parts.dtype}), expected "
                        f"{(fused.PAR_CHUNKS, out.size)} float64. Fix: plan them with the layer's tensors.")
    threaded = blas.THREADED and d2.size >= PASS_PAR_MIN
    bound = native.bind_act_grad_colsum(d2, y2, act, slope, parts, out, blas.pass_threads(threaded))
    if bound is not None:
        return bound
    f = fused.act_grad_colsum_par_ if threaded else fused.act_grad_colsum_
    return lambda: f(d2, y2, act, slope, parts, out)


def bias_partials(scratch: dict[str, np.ndarray], db: np.ndarray | None, env: BindEnv, layer: str) -> np.ndarray:
    """The partial sums act_grad_colsum_pass needs: the node's planned ``bias_partials`` tensor,
    none without a bias, or (a hand-built graph) a buffer the bind environment lists."""
    if db is None:
        return NO_PARTIALS
    if "bias_partials" in scratch:
        return scratch["bias_partials"]
    return env.scratch(f"{layer}: bias gradient partial sums", (fused.PAR_CHUNKS, db.size), np.float64)

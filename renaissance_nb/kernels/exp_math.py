"""neg_exp: exp of a non-positive double in plain arithmetic, the numba twin of native.h's neg_exp (GELU's normal
CDF and logistic, gelu_math.py; the attention softmax's rows, ops/attention_kernels.py).

Why not math.exp: libm's exp is a call per value (no vector loop), and its last bit differs between libm
versions; this one vectorises in numba and in C and gives the same bits on every machine.
"""
from __future__ import annotations

import numba
import numpy as np
from numba.core import types
from numba.extending import intrinsic

jit = numba.njit(cache=True, nogil=True, fastmath=False, error_model="numpy", inline="always")
"""fused.jit, inlined into the loops that call these (as philox.py's pieces are)."""


@intrinsic
def _double_of_bits(typingctx, bits):  # type: ignore[no-untyped-def]
    """The double whose IEEE bits are the int64 ``bits`` (C's memcpy; math.ldexp is a libm call per value)."""
    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], context.get_value_type(types.float64))
    return types.float64(types.int64), codegen


@jit
def neg_exp(a):
    """exp(a) for a <= 0 (below -708, or NaN, as -708): native.h's neg_exp."""
    a = a if a > -708.0 else -708.0
    a = a if a < 709.0 else 709.0  # a discarded padding lane of the softmax may be positive (native.h)
    k = np.floor(a * 1.4426950408889634 + 0.5)
    r = (a - k * 0.6931471803691238) - k * 1.9082149292705877e-10
    p = 1.0 / 479001600.0
    p = p * r + 1.0 / 39916800.0
    p = p * r + 1.0 / 3628800.0
    p = p * r + 1.0 / 362880.0
    p = p * r + 1.0 / 40320.0
    p = p * r + 1.0 / 5040.0
    p = p * r + 1.0 / 720.0
    p = p * r + 1.0 / 120.0
    p = p * r + 1.0 / 24.0
    p = p * r + 1.0 / 6.0
    p = p * r + 0.5
    p = p * r + 1.0
    p = p * r + 1.0
    return p * _double_of_bits((np.int64(k) + 1023) << 52)

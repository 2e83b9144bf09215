"""The numba twins of gelu_native.c's math: the normal CDF Phi and the logistic function (on exp_math.neg_exp), in
plain double arithmetic in the C file's order, so a GELU bound to numba (no C compiler, RNB_NATIVE=0) gives
the C pass's bytes (tests/test_gelu_native.py). gelu_native.c says why GELU does not call libm's erf.

The erfc polynomial's coefficients are read from the C source: one table for both twins.
"""
from __future__ import annotations

import re
from pathlib import Path

from .exp_math import jit, neg_exp

C_SOURCE = Path(__file__).with_name("gelu_native.c")


def _table(name: str) -> tuple[float, ...]:
    """The doubles of ``static const double <name>[] = {...};`` in gelu_native.c (Python parses a decimal
    literal to the double the C compiler does: both round correctly)."""
    found = re.search(rf"static const double {name}\[\] = \{{([^}}]*)\}};", C_SOURCE.read_text())
    assert found is not None, f"{name} is not in {C_SOURCE.name}"
    return tuple(float(v) for v in found.group(1).replace("\n", " ").split(",") if v.strip())


ERFC_Q = _table("ERFC_Q")
ERFC_DEGREE = len(ERFC_Q) - 1
assert ERFC_DEGREE == 16, "_horner16 takes 17 coefficients"
ERFC_T_SCALE, ERFC_X_MAX = 0.3, 10.5
INV_SQRT2, INV_SQRT_2PI, SQRT_2_OVER_PI = 0.7071067811865476, 0.3989422804014327, 0.7978845608028654


@jit
def _horner16(t, c):
    """c[16] t^16 + ... + c[0], highest power first (gelu_native.c's loop; written out, each c[i] is a constant:
    a loop over the tuple indexes it at run time, 8x slower)."""
    q = c[16]
    q = q * t + c[15]
    q = q * t + c[14]
    q = q * t + c[13]
    q = q * t + c[12]
    q = q * t + c[11]
    q = q * t + c[10]
    q = q * t + c[9]
    q = q * t + c[8]
    q = q * t + c[7]
    q = q * t + c[6]
    q = q * t + c[5]
    q = q * t + c[4]
    q = q * t + c[3]
    q = q * t + c[2]
    q = q * t + c[1]
    return q * t + c[0]


@jit
def normal_cdf(z):
    """(Phi(z), exp(-z^2/2)): gelu_native.c's normal_cdf."""
    x = abs(z) * INV_SQRT2
    t = 1.0 / (1.0 + ERFC_T_SCALE * (x if x < ERFC_X_MAX else ERFC_X_MAX))
    q = _horner16(t, ERFC_Q)
    e = neg_exp(-(x * x))
    half_erfc = 0.5 * ((t * q) * e)
    return (half_erfc if z < 0 else 1.0 - half_erfc), e


@jit
def logistic(v):
    """(sigmoid(v), sigmoid(v) (1 - sigmoid(v))): gelu_native.c's logistic."""
    e = neg_exp(-abs(v))
    d = 1.0 / (1.0 + e)
    return (e * d if v < 0 else d), (e * d) * d


@jit
def gelu_tanh_value(z):
    """GELU's tanh form z sigmoid(2u), u = sqrt(2/pi) (z + 0.044715 z^3), z a float64."""
    s, _ = logistic(2.0 * (SQRT_2_OVER_PI * (z + 0.044715 * z * z * z)))
    return z * s


@jit
def gelu_tanh_slope(z):
    """Its derivative sigmoid(2u) + 2 z sigmoid'(2u) du/dz."""
    s, sl = logistic(2.0 * (SQRT_2_OVER_PI * (z + 0.044715 * z * z * z)))
    return s + ((z * (2.0 * sl)) * SQRT_2_OVER_PI) * (1.0 + 0.134145 * z * z)


@jit
def gelu_value(z):
    """GELU(z) = z Phi(z), z a float64."""
    p, _ = normal_cdf(z)
    return z * p


@jit
def gelu_slope(z):
    """GELU'(z) = Phi(z) + z exp(-z^2/2) / sqrt(2 pi)."""
    p, e = normal_cdf(z)
    return p + z * (e * INV_SQRT_2PI)

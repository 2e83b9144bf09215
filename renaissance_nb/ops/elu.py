"""elu: x above 0, alpha * (exp(x) - 1) at or below it (nn.ELU; ONNX Elu). exp in float64, rounded
once to float32; the gradient below 0 is dy * alpha * exp(x), as torch's elu_backward from x."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..blueprint_nodes import Layer, layer_args
from ..checks import as_float
from ..errors import BluePrintError, bad_argument
from ..kernels.fused import jit  # the package's numba options, one place
from .pointwise import Pointwise
from .registry import register



@layer_args
def elu(alpha: float = 1.0) -> Layer:
    """x for x > 0, alpha * (exp(x) - 1) otherwise, as nn.ELU(alpha)."""
    a = as_float(alpha)
    if a is None or not math.isfinite(a) or a < 0:
        raise bad_argument(BluePrintError, "elu", "alpha", alpha, "a finite float >= 0", "use e.g. elu(alpha=1.0)")
    return Layer("elu", (("alpha", a),))


@jit
def elu_fwd(x, y, alpha):
    fx, fy = x.reshape(-1), y.reshape(-1)
    a = np.float64(alpha)
    for k in range(fx.shape[0]):
        z = fx[k]
        fy[k] = z if z > 0 else np.float32(a * math.expm1(np.float64(z)))


@jit
def elu_bwd(dy, x, dx, alpha):
    fd, fx, fo = dy.reshape(-1), x.reshape(-1), dx.reshape(-1)
    a = np.float64(alpha)
    for k in range(fx.shape[0]):
        z = fx[k]
        fo[k] = fd[k] if z > 0 else np.float32(np.float64(fd[k]) * a * math.exp(np.float64(z)))


CUDA = r'''
extern "C" __global__ void rnb_elu_fwd(const float* x, float* y, rnb_i64 n, float alpha) {
    for (rnb_i64 k = blockIdx.x * (rnb_i64)blockDim.x + threadIdx.x; k < n; k += (rnb_i64)gridDim.x * blockDim.x) {
        float z = x[k];
        y[k] = z > 0.0f ? z : (float)((double)alpha * expm1((double)z));
    }
}

extern "C" __global__ void rnb_elu_bwd(const float* dy, const float* x, float* dx, rnb_i64 n, float alpha) {
    for (rnb_i64 k = blockIdx.x * (rnb_i64)blockDim.x + threadIdx.x; k < n; k += (rnb_i64)gridDim.x * blockDim.x) {
        float z = x[k];
        dx[k] = z > 0.0f ? dy[k] : (float)((double)dy[k] * (double)alpha * exp((double)z));
    }
}
'''


@register
class ELU(Pointwise):
    kind = "elu"
    builders = (elu,)
    torch_modules = ("ELU",)
    fwd_loop = staticmethod(elu_fwd)
    bwd_loop = staticmethod(elu_bwd)
    cuda_source = CUDA

    def alpha(self, p: dict[str, Any]) -> float:
        return float(p["alpha"])

    def onnx(self, g: Any, layer: Any, xs: list[str], out: str) -> str:
        return g.node("Elu", [xs[0]], out, alpha=float(layer.p["alpha"]))

    def from_torch(self, m: Any) -> dict[str, Any]:
        return {"layer": "elu", "params": {"alpha": float(m.alpha)}}

"""relu6: min(max(x, 0), 6), MobileNet's activation (nn.ReLU6; ONNX Clip(0, 6)). The gradient passes
where 0 < x < 6 and is zero at both ends, as torch's hardtanh_backward."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..blueprint_nodes import Layer, layer_args
from ..kernels.fused import jit  # the package's numba options, one place
from .pointwise import Pointwise
from .registry import register



@layer_args
def relu6() -> Layer:
    """min(max(x, 0), 6), as nn.ReLU6."""
    return Layer("relu6")


@jit
def relu6_fwd(x, y, alpha):
    fx, fy = x.reshape(-1), y.reshape(-1)
    zero, six = np.float32(0.0), np.float32(6.0)
    for k in range(fx.shape[0]):
        z = fx[k]
        fy[k] = zero if z <= zero else (six if z >= six else z)


@jit
def relu6_bwd(dy, x, dx, alpha):
    fd, fx, fo = dy.reshape(-1), x.reshape(-1), dx.reshape(-1)
    zero, six = np.float32(0.0), np.float32(6.0)
    for k in range(fx.shape[0]):
        z = fx[k]
        fo[k] = fd[k] if (z > zero and z < six) else zero


CUDA = r'''
extern "C" __global__ void rnb_relu6_fwd(const float* x, float* y, rnb_i64 n, float alpha) {
    for (rnb_i64 k = blockIdx.x * (rnb_i64)blockDim.x + threadIdx.x; k < n; k += (rnb_i64)gridDim.x * blockDim.x) {
        float z = x[k];
        y[k] = z <= 0.0f ? 0.0f : (z >= 6.0f ? 6.0f : z);
    }
}

extern "C" __global__ void rnb_relu6_bwd(const float* dy, const float* x, float* dx, rnb_i64 n, float alpha) {
    for (rnb_i64 k = blockIdx.x * (rnb_i64)blockDim.x + threadIdx.x; k < n; k += (rnb_i64)gridDim.x * blockDim.x) {
        float z = x[k];
        dx[k] = (z > 0.0f && z < 6.0f) ? dy[k] : 0.0f;
    }
}
'''


@register
class ReLU6(Pointwise):
    kind = "relu6"
    builders = (relu6,)
    torch_modules = ("ReLU6",)
    fwd_loop = staticmethod(relu6_fwd)
    bwd_loop = staticmethod(relu6_bwd)
    cuda_source = CUDA

    def onnx(self, g: Any, layer: Any, xs: list[str], out: str) -> str:
        lo = g.const(f"{out}.min", np.array(0.0, np.float32))
        hi = g.const(f"{out}.max", np.array(6.0, np.float32))
        return g.node("Clip", [xs[0], lo, hi], out)

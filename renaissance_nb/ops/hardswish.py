"""hardswish: x * relu6(x + 3) / 6, MobileNetV3's activation (nn.Hardswish; ONNX HardSwish, opset 14).
Its gradient is 0 up to -3, x / 3 + 1/2 between -3 and 3 (both ends excluded, as torch 2.x's
hardswish_backward: at x = -3 it gives 0, at x = 3 it gives dy), 1 from 3 on."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..blueprint_nodes import Layer, layer_args
from ..kernels.fused import jit  # the package's numba options, one place
from .pointwise import Pointwise
from .registry import register



@layer_args
def hardswish() -> Layer:
    """x * relu6(x + 3) / 6, as nn.Hardswish."""
    return Layer("hardswish")


@jit
def hardswish_fwd(x, y, alpha):
    """In float32 as torch computes it: x * min(max(x + 3, 0), 6) / 6."""
    fx, fy = x.reshape(-1), y.reshape(-1)
    zero, three, six = np.float32(0.0), np.float32(3.0), np.float32(6.0)
    for k in range(fx.shape[0]):
        z = fx[k]
        r = z + three
        r = zero if r <= zero else (six if r >= six else r)
        fy[k] = z * r / six


@jit
def hardswish_bwd(dy, x, dx, alpha):
    fd, fx, fo = dy.reshape(-1), x.reshape(-1), dx.reshape(-1)
    zero, three, half = np.float32(0.0), np.float32(3.0), np.float32(0.5)
    for k in range(fx.shape[0]):
        z = fx[k]
        if z <= -three:
            fo[k] = zero
        elif z < three:
            fo[k] = fd[k] * (z / three + half)
        elif z >= three:
            fo[k] = fd[k]
        else:  # NaN: NaN, as torch's
            fo[k] = z


CUDA = r'''
extern "C" __global__ void rnb_hardswish_fwd(const float* x, float* y, rnb_i64 n, float alpha) {
    for (rnb_i64 k = blockIdx.x * (rnb_i64)blockDim.x + threadIdx.x; k < n; k += (rnb_i64)gridDim.x * blockDim.x) {
        float z = x[k];
        float r = z + 3.0f;
        r = r <= 0.0f ? 0.0f : (r >= 6.0f ? 6.0f : r);
        y[k] = z * r / 6.0f;  // no contraction: NVRTC_OPTIONS has --fmad=false
    }
}

extern "C" __global__ void rnb_hardswish_bwd(const float* dy, const float* x, float* dx, rnb_i64 n, float alpha) {
    for (rnb_i64 k = blockIdx.x * (rnb_i64)blockDim.x + threadIdx.x; k < n; k += (rnb_i64)gridDim.x * blockDim.x) {
        float z = x[k];
        dx[k] = z <= -3.0f ? 0.0f : (z < 3.0f ? dy[k] * (z / 3.0f + 0.5f) : (z >= 3.0f ? dy[k] : z));
    }
}
'''


@register
class HardSwish(Pointwise):
    kind = "hardswish"
    builders = (hardswish,)
    torch_modules = ("Hardswish",)
    fwd_loop = staticmethod(hardswish_fwd)
    bwd_loop = staticmethod(hardswish_bwd)
    cuda_source = CUDA

    def onnx(self, g: Any, layer: Any, xs: list[str], out: str) -> str:
        return g.node("HardSwish", [xs[0]], out)

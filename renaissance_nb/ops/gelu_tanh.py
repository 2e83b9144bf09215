"""gelu_tanh: GELU in GPT-2's tanh form, x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as
nn.GELU(approximate="tanh"); ``gelu(approximate="tanh")`` builds it (the exact form is an ``act``
code of activation.py). Per element in float64 as x sigmoid(2u) (the same function, without the
cancellation of 1 + tanh u where u is very negative), rounded once to float32: kernels/gelu_math.py's
loops, twins of gelu_native.c's pass. The CUDA kernels below still compute x/2 (1 + tanh u) with CUDA's tanh
(GPU results differ from the CPU's by rounding, as for every op)."""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ..blueprint_nodes import Layer, layer_args
from ..kernels import blas, gelu_native
from ..kernels.fused import jit
from ..kernels.gelu_native import GELU_PAR_MIN
from ..kernels.gelu_math import SQRT_2_OVER_PI, gelu_tanh_slope, gelu_tanh_value
from .pointwise import Pointwise
from .registry import register


@layer_args
def gelu_tanh() -> Layer:
    """GELU's tanh approximation (GPT-2's), as nn.GELU(approximate="tanh")."""
    return Layer("gelu_tanh")


@jit
def gelu_tanh_fwd(x, y, alpha):
    fx, fy = x.reshape(-1), y.reshape(-1)
    for k in range(fx.shape[0]):
        fy[k] = np.float32(gelu_tanh_value(np.float64(fx[k])))


@jit
def gelu_tanh_bwd(dy, x, dx, alpha):
    fd, fx, fo = dy.reshape(-1), x.reshape(-1), dx.reshape(-1)
    for k in range(fx.shape[0]):
        fo[k] = np.float32(np.float64(fd[k]) * gelu_tanh_slope(np.float64(fx[k])))


def _c_pass(x: np.ndarray, dy: np.ndarray | None, out: np.ndarray) -> Callable[[], None] | None:
    """gelu_native.c's tanh form, threaded over large arrays (None: the numba loop above serves)."""
    return gelu_native.bind_gelu(x, dy, out, "tanh", blas.pass_threads(blas.THREADED and x.size >= GELU_PAR_MIN))


CUDA = r'''
extern "C" __global__ void rnb_gelu_tanh_fwd(const float* x, float* y, rnb_i64 n, float alpha) {
    for (rnb_i64 k = blockIdx.x * (rnb_i64)blockDim.x + threadIdx.x; k < n; k += (rnb_i64)gridDim.x * blockDim.x) {
        double z = (double)x[k];
        y[k] = (float)(0.5 * z * (1.0 + tanh(0.7978845608028654 * (z + 0.044715 * z * z * z))));
    }
}

extern "C" __global__ void rnb_gelu_tanh_bwd(const float* dy, const float* x, float* dx, rnb_i64 n, float alpha) {
    for (rnb_i64 k = blockIdx.x * (rnb_i64)blockDim.x + threadIdx.x; k < n; k += (rnb_i64)gridDim.x * blockDim.x) {
        double z = (double)x[k], t = tanh(0.7978845608028654 * (z + 0.044715 * z * z * z));
        double g = 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * z * z);
        dx[k] = (float)((double)dy[k] * g);
    }
}
'''


@register
class GeluTanh(Pointwise):
    kind = "gelu_tanh"
    builders = (gelu_tanh,)
    fwd_loop = staticmethod(gelu_tanh_fwd)
    bwd_loop = staticmethod(gelu_tanh_bwd)
    cuda_source = CUDA

    def describe(self, p: dict[str, Any]) -> str:
        return "gelu(approximate='tanh')"

    def bind_fwd(self, outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Callable[[], None]:
        (x,), (y,) = ins, outs
        return _c_pass(x, None, y) or super().bind_fwd(outs, ins, p, env)

    def bind_bwd(self, outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Callable[[], None]:
        (dy, x), (dx,) = ins, outs
        return _c_pass(x, dy, dx) or super().bind_bwd(outs, ins, p, env)

    def onnx(self, g: Any, layer: Any, xs: list[str], out: str) -> str:
        """Opset 17 has no Gelu: the formula's nodes."""
        x = xs[0]
        c = {name: g.const(f"{out}.{name}", np.array(v, np.float32)) for name, v in
             (("half", 0.5), ("one", 1.0), ("k", SQRT_2_OVER_PI), ("a", 0.044715))}
        cube = g.node("Mul", [x, g.node("Mul", [x, x], f"{out}.sq")], f"{out}.cube")
        inner = g.node("Add", [x, g.node("Mul", [c["a"], cube], f"{out}.acube")], f"{out}.inner")
        t = g.node("Tanh", [g.node("Mul", [c["k"], inner], f"{out}.scaled")], f"{out}.tanh")
        gate = g.node("Mul", [c["half"], g.node("Add", [t, c["one"]], f"{out}.gate")], f"{out}.half_gate")
        return g.node("Mul", [x, gate], out)

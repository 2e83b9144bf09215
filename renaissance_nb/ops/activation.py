"""The element-wise activations the fused kernels switch on by code (kernels/operands.py ACT_CODES):
relu, tanh, sigmoid, silu, gelu (exact erf form) and leaky_relu. They plan into one executable kind,
``act``, which an fc, conv or bn right before it absorbs into its own pass where it can (``Op.fuses``).
Activations with kernels of their own (relu6, hardswish, elu) are ops of their own modules."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..blueprint_nodes import Layer, layer_args
from ..checks import as_float
from ..errors import BluePrintError, ExportError, bad_argument
from .registry import Op, register


@layer_args
def relu() -> Layer:
    return Layer("relu")


@layer_args
def tanh() -> Layer:
    return Layer("tanh")


@layer_args
def sigmoid() -> Layer:
    return Layer("sigmoid")


@layer_args
def silu() -> Layer:
    return Layer("silu")


@layer_args
def gelu(approximate: str = "none") -> Layer:
    """GELU as nn.GELU(approximate=...): the exact erf form x/2 (1 + erf(x/sqrt 2)) (PyTorch's default),
    or with ``approximate="tanh"`` GPT-2's x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (gelu_tanh.py).
    On the CPU both are computed in float64 without cancellation (x Phi(x) with Phi from erfc, and
    x sigmoid(2u)) by the library's own vectorised math (kernels/gelu_native.c), rounded once to float32."""
    if approximate == "tanh":
        from .gelu_tanh import gelu_tanh
        return gelu_tanh()
    if approximate != "none":
        raise bad_argument(BluePrintError, "gelu", "approximate", approximate, "'none' or 'tanh'",
                           "write gelu() for the exact form or gelu(approximate='tanh') for GPT-2's")
    return Layer("gelu")


@layer_args
def leaky_relu(negative_slope: float = 0.01) -> Layer:
    slope = as_float(negative_slope)
    if slope is None or slope < 0:
        raise bad_argument(BluePrintError, "leaky_relu", "negative_slope", negative_slope,
                           "a finite float >= 0", "use a small slope such as 0.01")
    return Layer("leaky_relu", (("negative_slope", slope),))


ONE_ONNX_OP = {"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid"}
"""Activations that are one ONNX op of the same name; leaky_relu, silu and gelu are built in act_onnx."""
TORCH_NAMES = {"ReLU": "relu", "SiLU": "silu", "Tanh": "tanh", "Sigmoid": "sigmoid", "GELU": "gelu",
               "LeakyReLU": "leaky_relu"}


def gradient_is_sign_mask(act: str) -> bool:
    """Whether the activation's gradient is dy where y > 0 and 0 elsewhere, y >= 0 (ReLU): a max pool reading y
    can then apply it from its own output, the window's max (ops/pool.py relu_pool_pairs)."""
    return act == "relu"


def act_onnx(g: Any, act: str, slope: float, x: str, out: str) -> str:
    """ONNX nodes of activation ``act`` (opset 17: GELU as its erf form, SiLU as x * sigmoid(x))."""
    if act in ONE_ONNX_OP:
        return g.node(ONE_ONNX_OP[act], [x], out)
    if act == "leaky_relu":
        return g.node("LeakyRelu", [x], out, alpha=float(slope))
    if act == "silu":
        return g.node("Mul", [x, g.node("Sigmoid", [x], f"{out}.sigmoid")], out)
    if act == "gelu":  # 0.5 * x * (1 + erf(x / sqrt(2))), PyTorch's approximate='none'
        half = g.const(f"{out}.half", np.array(0.5, np.float32))
        root = g.const(f"{out}.sqrt2", np.array(math.sqrt(2.0), np.float32))
        one = g.const(f"{out}.one", np.array(1.0, np.float32))
        erf = g.node("Erf", [g.node("Div", [x, root], f"{out}.scaled")], f"{out}.erf")
        gate = g.node("Mul", [half, g.node("Add", [erf, one], f"{out}.gate")], f"{out}.half_gate")
        return g.node("Mul", [x, gate], out)
    raise ExportError(f"export_onnx: activation {act!r} has no ONNX form here. Fix: report it; use relu, "
                      "tanh, sigmoid, leaky_relu, silu or gelu.")


@register
class Activation(Op):
    kind = "act"
    layer_kinds = ("relu", "tanh", "sigmoid", "silu", "gelu", "leaky_relu")
    builders = (relu, tanh, sigmoid, silu, gelu, leaky_relu)
    torch_modules = tuple(TORCH_NAMES)
    layout = "elementwise"
    folds = True

    def arch(self, layer: Layer) -> tuple[str, tuple[tuple[str, Any], ...]]:
        return layer.kind, (("act", layer.kind), ("slope", layer.p.get("negative_slope", 0.0)))

    def describe(self, p: dict[str, Any]) -> str:
        return p["act"]

    def forward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, training: bool,
                ema: bool) -> None:
        e.emit(g, gid, "act_fwd", [xs[0]], [y], layer.name, act=layer.p["act"], slope=layer.p["slope"])

    def backward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, dy: int,
                 dxs: list[int | None]) -> None:
        if dxs[0] is not None:
            e.emit(g, gid, "act_bwd", [dy, xs[0]], [dxs[0]], layer.name, act=layer.p["act"], slope=layer.p["slope"])

    def decode(self, d: Any, layer: Any, xs: list[str], y: str) -> None:
        d.add(y, d.shapes[xs[0]])
        d.emit("act_fwd", [xs[0]], [y], layer.name, act=layer.p["act"], slope=layer.p["slope"])

    def onnx(self, g: Any, layer: Any, xs: list[str], out: str) -> str:
        return act_onnx(g, layer.p["act"], layer.p["slope"], xs[0], out)

    def from_torch(self, m: Any) -> dict[str, Any]:
        kind = TORCH_NAMES[type(m).__name__]
        if kind == "gelu" and m.approximate == "tanh":
            return {"layer": "gelu_tanh", "params": {}}
        params = {"negative_slope": float(m.negative_slope)} if kind == "leaky_relu" else {}
        return {"layer": kind, "params": params}

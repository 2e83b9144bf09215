"""add: the residual sum of add2 (shortcut(x) + main(x)). Its backward hands dy to both branches: a copy
for a branch whose gradient slot is not dy itself (the compiler gives dy the slot of an input only the add
reads, compiler/layers.py). The compiler sums the gradients of a tensor read twice before its producer's
backward.

A ReLU that alone reads the sum (a ResNet block's ``add2(...) -> relu()``) is fused into it, as into a conv
or a batch norm: one pass writes relu(a + b), and the sum itself is never stored. The backward masks dy by
the output in place (y > 0 exactly where a + b > 0; dy has the output's dtype, fp32 under mixed precision where
a branch is) and hands it on as above: the bytes of the add and the ReLU apart
(tests/test_image_models.py test_a_relu_after_a_residual_add_fuses_into_it)."""
from __future__ import annotations

from typing import Any

from ..errors import ShapeError
from .registry import Op, register


@register
class Add(Op):
    autocast = "promote"
    hands_dy_through = True
    fuses = ("relu",)
    kind = "add"
    layout = "elementwise"

    def tensors(self, ctx: Any, idx: int, layer: Any, ins: list[tuple[int, ...]]) -> tuple[int, ...]:
        if ins[0] != ins[1]:
            raise ShapeError(f"plan: {layer.name} (add2) sums shapes {ins[0]} and {ins[1]}. "
                             "Fix: make the shortcut match the main branch (e.g. a strided 1x1 conv).")
        return ins[0]

    def forward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, training: bool,
                ema: bool) -> None:
        e.emit(g, gid, "add", xs, [y], layer.name, **_act_params(layer))

    def backward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, dy: int,
                 dxs: list[int | None]) -> None:
        if layer.fused_act != "none":  # dy masked by y in place (its slot has the output's dtype)
            if all(d is None for d in dxs):
                return
            e.emit(g, gid, "act_bwd", [dy, y], [dy], layer.name, act=layer.fused_act, slope=layer.p["slope"])
        for d in dxs:
            if d is not None and d != dy:  # an input's slot may be dy itself (compiler/layers.py): nothing to copy
                e.emit(g, gid, "copy", [dy], [d], layer.name)

    def decode(self, d: Any, layer: Any, xs: list[str], y: str) -> None:
        d.add(y, d.shapes[xs[0]])
        d.emit("add", xs, [y], layer.name, **_act_params(layer))

    def onnx(self, g: Any, layer: Any, xs: list[str], out: str) -> str:
        return g.node("Add", xs, out)  # the exporter applies the fused activation (onnx_export.py _Graph.layer)


def _act_params(layer: Any) -> dict[str, Any]:
    """The add node's parameters: the fused activation, where the compiler folded one in."""
    act = layer.fused_act
    return {} if act == "none" else {"act": act, "slope": layer.p["slope"]}

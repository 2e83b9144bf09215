"""dropout: inverted dropout, each element zeroed with probability p in training (a Philox mask in
S_MASK, scaled by 1/(1-p)), the identity in inference (a copy here, nothing in ONNX)."""
from __future__ import annotations

from typing import Any

from ..blueprint_nodes import Layer, layer_args, probability
from ..memory.region import Region
from .registry import Op, register


@layer_args
def dropout(p: float = 0.5) -> Layer:
    """Inverted dropout: zero each element with probability p in training, identity in inference."""
    return Layer("dropout", (("p", probability("dropout", "p", p)),))


@register
class Dropout(Op):
    kind = "dropout"
    builders = (dropout,)
    torch_modules = ("Dropout",)
    layout = "elementwise"

    def describe(self, p: dict[str, Any]) -> str:
        return f"dropout(p={p['p']})"

    def tensors(self, ctx: Any, idx: int, layer: Any, ins: list[tuple[int, ...]]) -> tuple[int, ...]:
        ctx.t.add(f"{layer.name}.mask", (ctx.batch, *ins[0]), "float32", Region.S_MASK)
        return ins[0]

    def forward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, training: bool,
                ema: bool) -> None:
        if training and layer.p["p"] > 0:
            e.dropout(g, gid, xs[0], y, e.ids[f"{layer.name}.mask"], layer.name, layer.p["p"])
        else:
            e.emit(g, gid, "copy", [xs[0]], [y], layer.name)

    def backward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, dy: int,
                 dxs: list[int | None]) -> None:
        dx = dxs[0]
        if dx is None:
            return
        if layer.p["p"] > 0:
            e.emit(g, gid, "mul", [dy, e.ids[f"{layer.name}.mask"]], [dx], layer.name)
        else:
            e.emit(g, gid, "copy", [dy], [dx], layer.name)

    def decode(self, d: Any, layer: Any, xs: list[str], y: str) -> None:
        d.add(y, d.shapes[xs[0]])
        d.emit("copy", [xs[0]], [y], layer.name)  # the identity at inference

    def onnx(self, g: Any, layer: Any, xs: list[str], out: str) -> str:
        return xs[0]  # the identity in inference: nothing to compute

    def from_torch(self, m: Any) -> dict[str, Any]:
        return {"layer": "dropout", "params": {"p": float(m.p)}}

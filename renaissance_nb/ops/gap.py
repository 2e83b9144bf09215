"""gap: global average pooling, (N, H, W, C) -> (N, C). Makes a model resolution-free."""
from __future__ import annotations

from typing import Any

from ..blueprint_nodes import Layer, layer_args
from .common import needs_image, square
from .registry import Op, Refused, register


@layer_args
def gap() -> Layer:
    """Global average pooling: (N, H, W, C) -> (N, C). Makes a model resolution-free."""
    return Layer("gap")


@register
class GlobalAvgPool(Op):
    kind = "gap"
    builders = (gap,)
    torch_modules = ("AdaptiveAvgPool2d",)

    def tensors(self, ctx: Any, idx: int, layer: Any, ins: list[tuple[int, ...]]) -> tuple[int, ...]:
        needs_image(layer, ins[0], "use gap() on convolution features, before flatten")
        return (ins[0][-1],)

    def forward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, training: bool,
                ema: bool) -> None:
        e.emit(g, gid, "gap_fwd", [xs[0]], [y], layer.name)

    def backward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, dy: int,
                 dxs: list[int | None]) -> None:
        if dxs[0] is not None:
            e.emit(g, gid, "gap_bwd", [dy], [dxs[0]], layer.name)

    def onnx(self, g: Any, layer: Any, xs: list[str], out: str) -> str:
        return g.node("Flatten", [g.node("GlobalAveragePool", [xs[0]], f"{out}.nc11")], out, axis=1)

    def from_torch(self, m: Any) -> dict[str, Any]:
        if square(m.output_size, "output_size") != 1:
            raise Refused(f"output_size={m.output_size!r}; only AdaptiveAvgPool2d(1) (global average pooling) is")
        return {"layer": "gap", "params": {}}

"""flatten: every dimension but the batch into one, in PyTorch's (C, H, W) order (the arena's
channels-last maps are transposed by the copy), so an fc after it has PyTorch's weight layout."""
from __future__ import annotations

import math
from typing import Any

from ..blueprint_nodes import Layer, layer_args
from .registry import Op, Refused, register


@layer_args
def flatten() -> Layer:
    """Collapse every dimension but the batch into one."""
    return Layer("flatten")


@register
class Flatten(Op):
    kind = "flatten"
    builders = (flatten,)
    torch_modules = ("Flatten",)
    layout = "flat"

    def tensors(self, ctx: Any, idx: int, layer: Any, ins: list[tuple[int, ...]]) -> tuple[int, ...]:
        return (int(math.prod(ins[0])),)

    def forward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, training: bool,
                ema: bool) -> None:
        e.emit(g, gid, "reshape_copy", [xs[0]], [y], layer.name)

    def backward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, dy: int,
                 dxs: list[int | None]) -> None:
        if dxs[0] is not None:
            e.emit(g, gid, "reshape_copy", [dy], [dxs[0]], layer.name)

    def onnx(self, g: Any, layer: Any, xs: list[str], out: str) -> str:
        return g.node("Flatten", [xs[0]], out, axis=1)

    def from_torch(self, m: Any) -> dict[str, Any]:
        if (m.start_dim, m.end_dim) != (1, -1):
            raise Refused(f"start_dim={m.start_dim}, end_dim={m.end_dim}; flatten() keeps the batch axis only "
                          "(start_dim=1, end_dim=-1)")
        return {"layer": "flatten", "params": {}}

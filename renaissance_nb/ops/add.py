"""add: the residual sum of add2 (shortcut(x) + main(x)). Its backward hands dy to both branches: a copy
for a branch whose gradient slot is not dy itself (the compiler gives dy the slot of an input only the add
reads, compiler/layers.py). The compiler sums the gradients of a tensor read twice before its producer's
backward."""
from __future__ import annotations

from typing import Any

from ..errors import ShapeError
from .registry import Op, register


@register
class Add(Op):
    autocast = "promote"
    hands_dy_through = True
    kind = "add"
    layout = "elementwise"

    def tensors(self, ctx: Any, idx: int, layer: Any, ins: list[tuple[int, ...]]) -> tuple[int, ...]:
        if ins[0] != ins[1]:
            raise ShapeError(f"plan: {layer.name} (add2) sums shapes {ins[0]} and {ins[1]}. "
                             "Fix: make the shortcut match the main branch (e.g. a strided 1x1 conv).")
        return ins[0]

    def forward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, training: bool,
                ema: bool) -> None:
        e.emit(g, gid, "add", xs, [y], layer.name)

    def backward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, dy: int,
                 dxs: list[int | None]) -> None:
        for d in dxs:
            if d is not None and d != dy:  # an input's slot may be dy itself (compiler/layers.py): nothing to copy
                e.emit(g, gid, "copy", [dy], [d], layer.name)

    def decode(self, d: Any, layer: Any, xs: list[str], y: str) -> None:
        d.add(y, d.shapes[xs[0]])
        d.emit("add", xs, [y], layer.name)

    def onnx(self, g: Any, layer: Any, xs: list[str], out: str) -> str:
        return g.node("Add", xs, out)

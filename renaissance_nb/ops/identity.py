"""identity: plans to nothing (the next layer reads this one's input); add2's plain skip."""
from __future__ import annotations

from ..blueprint_nodes import Layer, layer_args
from .registry import Op, register


@layer_args
def identity() -> Layer:
    return Layer("identity")


@register
class Identity(Op):
    kind = "identity"
    builders = (identity,)
    torch_modules = ("Identity",)

    def arch(self, layer: Layer) -> None:
        return None

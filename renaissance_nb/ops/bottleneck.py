"""BOTTLENECK: ResNet-50's block, 1x1 (width) -> 3x3 (width, stride s) -> 1x1 (out) convolutions, each
followed by batch norm, relu after the first two and after the residual sum; the width is out / 4
(the expansion of 4), so ``block(256, BOTTLENECK)`` is torchvision's ``Bottleneck(inplanes=256,
planes=64)``. The stride sits on the 3x3 conv, as in torchvision (ResNet v1.5).

BOTTLENECK keeps the identity shortcut (the input has ``out`` channels, stride 1); BOTTLENECK_DS
projects it by a 1x1 conv (stride s, default 2) + bn: the first block of each stage, where the
resolution or the channel count changes (``s=1`` for ResNet-50's first stage, 64 -> 256 channels)."""
from __future__ import annotations

from ..blueprint_nodes import BluePrint, add2, positive_int, seq
from ..errors import BluePrintError, bad_argument
from .activation import relu
from .blocks import block_kind, cbr
from .bn import bn
from .conv import conv
from .identity import identity

BOTTLENECK = "BOTTLENECK"
BOTTLENECK_DS = "BOTTLENECK_DS"
EXPANSION = 4


def _width(out: int, kind: str) -> int:
    if out % EXPANSION:
        raise bad_argument(BluePrintError, "block", "out", out, f"a multiple of {EXPANSION} for kind={kind}",
                           f"pass e.g. block({max(EXPANSION, out - out % EXPANSION)}, {kind}): the 3x3 conv runs at "
                           f"out / {EXPANSION} channels")
    return out // EXPANSION


def _main(out: int, width: int, s: int) -> BluePrint:
    return seq(cbr(width, 1), cbr(width, 3, s, 1), conv(out, 1, bias=False), bn())


@block_kind(BOTTLENECK)
def bottleneck(out: int) -> tuple[BluePrint, str, None]:
    width = _width(out, BOTTLENECK)
    return seq(add2(identity(), _main(out, width, 1)), relu()), "", None


@block_kind(BOTTLENECK_DS)
def bottleneck_down(out: int, s: int = 2) -> tuple[BluePrint, str, None]:
    width = _width(out, BOTTLENECK_DS)
    s = positive_int("block", "s", s, f"block({out}, BOTTLENECK_DS, s=2)")
    shortcut = seq(conv(out, 1, s, 0, bias=False), bn())
    return seq(add2(shortcut, _main(out, width, s)), relu()), f", s={s}", None

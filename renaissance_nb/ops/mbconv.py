"""MBCONV: MobileNetV2's inverted residual (Sandler et al. 2018; torchvision's InvertedResidual): a 1x1
expansion to ``cin * expand`` channels, a 3x3 depthwise convolution at stride s, each followed by batch
norm and relu6, then a linear 1x1 projection to ``out`` channels and batch norm; the input is added
back where the block keeps its shape (s == 1 and cin == out). ``se=r`` puts squeeze-and-excitation
(reduction r, ops/se.py) after the depthwise conv, as MnasNet and EfficientNet place it.

A BluePrint does not know its input's channels until plan(), so the block is told them: ``cin``
(default ``out``, the repeated blocks of a stage; the first block of a stage, where the width changes,
passes the previous stage's). plan() checks ``cin`` against the width the block really gets."""
from __future__ import annotations

from typing import Any

from ..blueprint_nodes import BluePrint, add2, positive_int, seq
from ..checks import as_float
from ..errors import BluePrintError, bad_argument
from .blocks import block_kind
from .bn import bn
from .conv import conv
from .identity import identity
from .relu6 import relu6
from .se import se as squeeze_excite

MBCONV = "MBCONV"


def _expand(out: int, expand: Any) -> float:
    e = as_float(expand)
    if e is None or not e >= 1:
        raise bad_argument(BluePrintError, "block", "expand", expand, "a number >= 1 (the expansion ratio)",
                           f"pass e.g. block({out}, MBCONV, expand=6) (MobileNetV2's t), or expand=1 for no expansion")
    return e


@block_kind(MBCONV)
def inverted_residual(out: int, expand: float = 6, s: int = 1, cin: int | None = None,
                      se: int | None = None) -> tuple[BluePrint, str, int]:
    """The body, the label's options and the input width of ``block(out, MBCONV, expand=6, s=1, cin=None,
    se=None)``."""
    e = _expand(out, expand)
    s = positive_int("block", "s", s, f"block({out}, MBCONV, s=2)")
    c = out if cin is None else positive_int("block", "cin", cin, f"block({out}, MBCONV, cin=16)")
    hidden = int(round(c * e))  # torchvision: hidden_dim = round(inp * expand_ratio)
    layers: list[BluePrint] = []
    if hidden != c:
        layers += [conv(hidden, 1, bias=False), bn(), relu6()]
    layers += [conv(hidden, 3, s, 1, bias=False, groups=hidden), bn(), relu6()]
    if se is not None:
        layers.append(squeeze_excite(positive_int("block", "se", se, f"block({out}, MBCONV, se=4)")))
    layers += [conv(out, 1, bias=False), bn()]
    main = seq(*layers)
    body = add2(identity(), main) if (s == 1 and c == out) else main
    options = "".join(f", {k}={v}" for k, v in (("expand", expand), ("s", s), ("cin", cin), ("se", se))
                      if v is not None and (k, v) not in (("expand", 6), ("s", 1)))
    return body, options, c

"""Pre-fused building blocks: BluePrints of several layers under one label (``Named``), which the
compiler walks like any other BluePrint. The conv + bn + relu block and ResNet's basic block."""
from __future__ import annotations

from ..blueprint_nodes import Named, add2, conv_args, positive_int, seq
from ..errors import BluePrintError, bad_argument
from .activation import relu
from .bn import bn
from .conv import conv
from .identity import identity

RESNET_3_3 = "RESNET_3_3"
RESNET_3_3_DS = "RESNET_3_3_DS"


@conv_args
def cbr(out: int, k: int, s: int = 1, p: int = 0) -> Named:
    """The pre-fused conv (no bias) + bn + relu block."""
    body = seq(conv(out, k, s, p, bias=False), bn(), relu())
    return Named(f"cbr({out}, k={k}, s={s}, p={p})", body)


@conv_args
def block(out: int, kind: str = RESNET_3_3) -> Named:
    """ResNet basic block: two 3x3 convs with a residual. RESNET_3_3_DS halves the
    resolution (stride 2) and projects the shortcut with a 1x1 conv + bn."""
    out = positive_int("block", "out", out, "block(64, RESNET_3_3)")
    if kind == RESNET_3_3:
        main = seq(cbr(out, 3, 1, 1), conv(out, 3, 1, 1, bias=False), bn())
        body = seq(add2(identity(), main), relu())
    elif kind == RESNET_3_3_DS:
        main = seq(cbr(out, 3, 2, 1), conv(out, 3, 1, 1, bias=False), bn())
        body = seq(add2(seq(conv(out, 1, 2, 0, bias=False), bn()), main), relu())
    else:
        raise bad_argument(BluePrintError, "block", "kind", kind, "RESNET_3_3 or RESNET_3_3_DS",
                           "pass kind=RESNET_3_3 (same size) or RESNET_3_3_DS (downsample)")
    return Named(f"block({out}, {kind})", body)

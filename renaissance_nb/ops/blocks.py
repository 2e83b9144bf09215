"""Pre-fused building blocks: BluePrints of several layers under one label (``Named``), which the
compiler walks like any other BluePrint. ``cbr`` (conv + bn + relu) and ``block(out, kind)``, whose
kinds each live in a module of their own and register here: ResNet's basic blocks below,
BOTTLENECK in bottleneck.py, MBCONV in mbconv.py."""
from __future__ import annotations

import inspect
from typing import Any, Callable

from ..blueprint_nodes import CONV_NAMES, BluePrint, Named, add2, conv_args, positive_int, seq
from ..errors import BluePrintError, bad_argument
from .activation import relu
from .bn import bn
from .conv import conv
from .identity import identity

RESNET_3_3 = "RESNET_3_3"
RESNET_3_3_DS = "RESNET_3_3_DS"
BLOCK_KINDS: dict[str, Callable[..., tuple[BluePrint, str, int | None]]] = {}
"""block kind -> the function building (its body, the options its label shows, the input width it was
built for or None) from (out, **options)."""


def block_kind(name: str) -> Callable[[Callable[..., BluePrint]], Callable[..., BluePrint]]:
    """Register a block kind's body builder under ``name`` (the constant users pass as ``kind=``)."""
    def register(build: Callable[..., BluePrint]) -> Callable[..., BluePrint]:
        assert name not in BLOCK_KINDS, f"block kind {name} registered twice"
        BLOCK_KINDS[name] = build
        return build
    return register


@conv_args
def cbr(out: int, k: int, s: int = 1, p: int = 0) -> Named:
    """The pre-fused conv (no bias) + bn + relu block."""
    body = seq(conv(out, k, s, p, bias=False), bn(), relu())
    return Named(f"cbr({out}, k={k}, s={s}, p={p})", body)


@conv_args
def block(out: int, kind: str = RESNET_3_3, **options: Any) -> Named:
    """A residual block of ``out`` output channels. RESNET_3_3: ResNet's basic block, two 3x3 convs
    with an identity shortcut; RESNET_3_3_DS halves the resolution (stride 2) and projects the shortcut
    with a 1x1 conv + bn. BOTTLENECK / BOTTLENECK_DS: ResNet-50's 1x1-3x3-1x1 (bottleneck.py); MBCONV:
    MobileNetV2's inverted residual (mbconv.py). ``options`` are the kind's own (e.g. ``expand=6``)."""
    out = positive_int("block", "out", out, "block(64, RESNET_3_3)")
    build = BLOCK_KINDS.get(kind) if isinstance(kind, str) else None
    if build is None:
        raise bad_argument(BluePrintError, "block", "kind", kind, f"one of {', '.join(BLOCK_KINDS)}",
                           "pass kind=RESNET_3_3 (same size) or RESNET_3_3_DS (downsample), or another listed kind")
    _check_options(kind, build, options)
    body, label, channels = build(out, **options)
    return Named(f"block({out}, {kind}{label})", body, channels)


def _check_options(kind: str, build: Callable[..., BluePrint], options: dict[str, Any]) -> None:
    """An option the kind does not take is named with the ones it does (PyTorch's stride= read as s=)."""
    takes = [q for q in inspect.signature(build).parameters if q != "out"]
    for name, value in options.items():
        if name in takes:
            continue
        ours = CONV_NAMES.get(name)
        fix = (f"write {ours}= (PyTorch's {name}=)" if ours in takes else
               f"remove {name}= or use one of those names" + ("" if takes else f" (kind={kind} takes no options)"))
        raise BluePrintError(f"block: {name}={value!r} is invalid; expected one of the names: "
                             f"{', '.join(['out', 'kind', *takes])}. Fix: {fix}.")


@block_kind(RESNET_3_3)
def _basic(out: int) -> tuple[BluePrint, str, None]:
    main = seq(cbr(out, 3, 1, 1), conv(out, 3, 1, 1, bias=False), bn())
    return seq(add2(identity(), main), relu()), "", None


@block_kind(RESNET_3_3_DS)
def _basic_down(out: int) -> tuple[BluePrint, str, None]:
    main = seq(cbr(out, 3, 2, 1), conv(out, 3, 1, 1, bias=False), bn())
    return seq(add2(seq(conv(out, 1, 2, 0, bias=False), bn()), main), relu()), "", None

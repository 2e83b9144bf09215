"""maxpool and avgpool: k x k windows at stride s with zero padding p <= k/2, like nn.MaxPool2d and
nn.AvgPool2d(count_include_pad=True). Max pooling keeps the argmax of each window for its backward."""
from __future__ import annotations

from typing import Any

from ..blueprint_nodes import CONV_NAMES, NOT_HERE, Layer, nonneg_int, positive_int
from ..checks import arguments_checked
from ..errors import BluePrintError, bad_argument
from ..memory.region import Region
from .common import needs_image, square, window_out
from .registry import Op, Refused, register

pool_args = arguments_checked(BluePrintError, aliases={**NOT_HERE, **CONV_NAMES})


def _pool(kind: str, k: int, s: int | None, p: int) -> Layer:
    """maxpool/avgpool: checks p <= k/2 here, as PyTorch does, instead of failing later at compile."""
    k, p = positive_int(kind, "k", k, f"{kind}(2)"), nonneg_int(kind, "p", p)
    if 2 * p > k:
        raise bad_argument(BluePrintError, kind, "p", p,
                           f"at most half the kernel size k (as in PyTorch), here p <= {k // 2} for k={k}",
                           f"use {kind}({k}, p={k // 2}) or less padding, or a larger kernel size k")
    return Layer(kind, (("k", k), ("p", p), ("s", k if s is None else positive_int(kind, "s", s, f"{kind}(2, s=2)"))))


@pool_args
def maxpool(k: int = 2, s: int | None = None, p: int = 0) -> Layer:
    """Max pooling, k x k windows, stride s (default k), padding p <= k/2 (like nn.MaxPool2d)."""
    return _pool("maxpool", k, s, p)


@pool_args
def avgpool(k: int = 2, s: int | None = None, p: int = 0) -> Layer:
    """Average pooling (count_include_pad=True, padding p <= k/2, like nn.AvgPool2d)."""
    return _pool("avgpool", k, s, p)


class _Pool(Op):
    """What both pools share: shapes, the call they print, PyTorch's settings they accept."""

    onnx_op = ""

    def describe(self, p: dict[str, Any]) -> str:
        return f"{self.kind}(k={p['k']}, s={p['s']}, p={p['p']})"

    def out_shape(self, layer: Any, x: tuple[int, ...]) -> tuple[int, ...]:
        needs_image(layer, x, "pool before flatten")
        p = layer.p
        h, w, c = x
        return (window_out(layer.name, h, p["k"], p["s"], p["p"]), window_out(layer.name, w, p["k"], p["s"], p["p"]), c)

    def window(self, layer: Any) -> dict[str, int]:
        return {"k": layer.p["k"], "s": layer.p["s"], "p": layer.p["p"]}

    def onnx(self, g: Any, layer: Any, xs: list[str], out: str) -> str:
        p = layer.p
        return g.node(self.onnx_op, [xs[0]], out, kernel_shape=[p["k"]] * 2, strides=[p["s"]] * 2, pads=[p["p"]] * 4,
                      **self.onnx_extra())

    def onnx_extra(self) -> dict[str, int]:
        return {}

    def from_torch(self, m: Any) -> dict[str, Any]:
        if m.ceil_mode:
            raise Refused("ceil_mode=True, dilation or return_indices is not supported")
        k = square(m.kernel_size, "kernel_size")
        return {"layer": self.kind, "params": {"k": k, "s": square(m.stride if m.stride is not None else k, "stride"),
                                               "p": square(m.padding, "padding")}}


@register
class MaxPool(_Pool):
    kind = "maxpool"
    builders = (maxpool,)
    torch_modules = ("MaxPool2d",)
    onnx_op = "MaxPool"

    def tensors(self, ctx: Any, idx: int, layer: Any, ins: list[tuple[int, ...]]) -> tuple[int, ...]:
        y = self.out_shape(layer, ins[0])
        ctx.t.add(f"{layer.name}.argmax", (ctx.batch, *y), "int32", Region.T_TEMP_INT32)
        return y

    def forward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, training: bool,
                ema: bool) -> None:
        e.emit(g, gid, "maxpool_fwd", [xs[0]], [y, e.ids[f"{layer.name}.argmax"]], layer.name, **self.window(layer))

    def backward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, dy: int,
                 dxs: list[int | None]) -> None:
        if dxs[0] is not None:
            e.emit(g, gid, "maxpool_bwd", [dy, e.ids[f"{layer.name}.argmax"]], [dxs[0]], layer.name,
                   **self.window(layer))

    def from_torch(self, m: Any) -> dict[str, Any]:
        if square(m.dilation, "dilation") != 1 or m.return_indices:
            raise Refused("ceil_mode=True, dilation or return_indices is not supported")
        return super().from_torch(m)


@register
class AvgPool(_Pool):
    kind = "avgpool"
    builders = (avgpool,)
    torch_modules = ("AvgPool2d",)
    onnx_op = "AveragePool"

    def tensors(self, ctx: Any, idx: int, layer: Any, ins: list[tuple[int, ...]]) -> tuple[int, ...]:
        return self.out_shape(layer, ins[0])

    def forward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, training: bool,
                ema: bool) -> None:
        e.emit(g, gid, "avgpool_fwd", [xs[0]], [y], layer.name, **self.window(layer))

    def backward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, dy: int,
                 dxs: list[int | None]) -> None:
        if dxs[0] is not None:
            e.emit(g, gid, "avgpool_bwd", [dy], [dxs[0]], layer.name, **self.window(layer))

    def onnx_extra(self) -> dict[str, int]:
        return {"count_include_pad": 1}

    def from_torch(self, m: Any) -> dict[str, Any]:
        if not m.count_include_pad or m.divisor_override is not None:
            raise Refused("count_include_pad=False or divisor_override is not supported (avgpool counts the padding)")
        return super().from_torch(m)

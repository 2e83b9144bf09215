"""maxpool and avgpool: k x k windows at stride s with zero padding p <= k/2, like nn.MaxPool2d and
nn.AvgPool2d(count_include_pad=True). Max pooling keeps the argmax of each window for its backward."""
from __future__ import annotations

from typing import Any

from ..blueprint_nodes import CONV_NAMES, NOT_HERE, Layer, nonneg_int, positive_int
from ..checks import arguments_checked
from ..errors import BluePrintError, bad_argument
from ..memory.region import Region
from .activation import gradient_is_sign_mask
from .common import needs_image, square, window_out
from .registry import Op, Refused, op_of, register

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


def relu_pool_pairs(arch: Any) -> dict[str, str]:
    """{layer: max pool} for each layer with a fused ReLU (conv, bn) whose output only a max pool reads: that
    pool's backward applies the ReLU's gradient as well, and the layer's backward reads dy as it comes.

    Why: the ReLU's gradient needs y > 0 at every position, y being the layer's full-size output; but dy is 0
    wherever the pool's argmax does not point, and where it points y is that window's max, the pool's own
    (smaller) output. So the pool's backward tests its output (a window whose max is not above 0 passes 0.0,
    which is what the mask made of it), and nothing reads y after the pool's forward: the plan lets its bytes
    go to other tensors from there, and the batch norm's backward no longer reads y nor writes dy back masked
    (the conv net's bn1: 1.14 against 1.83 ms). The bytes are the same: where the mask passes, the pool's
    sum is the same additions; where it does not, both give 0.0 (tests/test_relu_through_pool.py)."""
    readers: dict[str, list[Any]] = {}
    for layer in arch.layers:
        for t in layer.inputs:
            readers.setdefault(t, []).append(layer)
    pairs = {}
    for layer in arch.layers:
        only = readers.get(layer.output, [])
        if (gradient_is_sign_mask(layer.p.get("act", "none")) and op_of(layer.kind).relu_grad_movable and len(only) == 1
                and type(op_of(only[0].kind)) is MaxPool and layer.output != arch.output):
            pairs[layer.name] = only[0].name
    return pairs


def relu_through_pool(e: Any, layer: Any) -> str | None:
    """The max pool whose backward applies ``layer``'s fused ReLU gradient (relu_pool_pairs, as the ArchPlan
    keeps them: ``relu_pools``), or None."""
    return e.arch.relu_pools.get(layer.name)


def grad_from_pool(arch: Any, elide: bool, layer: Any, recompute: bool = False) -> Any | None:
    """The max pool (its layer) whose input gradient ``layer``'s backward makes itself, value by value as it
    reads it, or None. A layer with that capability (Op.grad_from_pool: batch norm) whose relu output the pool
    makes in training (Op.pooled_from, so ``elide``: StepOptions.elide_outputs), from windows that do not
    overlap (k == s, no padding): each value of the pool's input gradient is then the pool's gradient where
    the window's argmax points and its max is above 0, else 0.0, which is all maxpool_bwd would write. So
    maxpool_bwd is not a node and the layer's dy is not a tensor (compiler/layers.py leaves it out); the
    batch norm's two passes read the pool's gradient, argmax and output (a quarter the size at 2x2) instead
    of dy: the same values, so the same bytes (tests/test_bn_grad_from_pool.py). Not under ``recompute`` where
    the pool is in a block: its backward reads the block's recomputed twins, which the batch norm outside
    would not."""
    name = arch.relu_pools.get(layer.name)
    if not (elide and name and op_of(layer.kind).grad_from_pool and layer.inputs[0] != "input"):
        return None
    pool = next(l for l in arch.layers if l.name == name)
    if recompute and pool.block:
        return None
    return pool if pool.p["k"] == pool.p["s"] and pool.p["p"] == 0 else None


def pool_grad_inputs(e: Any, pool: Any) -> list[int]:
    """A max pool's (dy, argmax, y): what its backward reads with relu=True, and a batch norm that makes the
    pool's input gradient itself (grad_from_pool)."""
    return [e.ids[f"{pool.output}@grad"], e.ids[f"{pool.name}.argmax"], e.ids[pool.output]]


def backward_act(e: Any, layer: Any) -> tuple[bool, dict[str, Any]]:
    """(whether the backward reads y, its act parameters) for a conv or batch norm: none of y, act='none' and
    relu_grad=<pool> where a max pool applies its ReLU's gradient (relu_through_pool)."""
    pool = relu_through_pool(e, layer)
    return (False, {"act": "none", "relu_grad": pool}) if pool else (True, {"act": layer.p["act"]})


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
        prod = next((p for p in e.arch.layers if p.output == layer.inputs[0]), None)
        src = op_of(prod.kind).pooled_from(e, prod) if training and prod is not None else None
        if src is not None:  # the producer's relu output made here from its input and affine: it writes none
            e.emit(g, gid, "maxpool_fwd", list(src), [y, e.ids[f"{layer.name}.argmax"]], layer.name,
                   **self.window(layer), bn_relu=prod.name)
            return
        e.emit(g, gid, "maxpool_fwd", [xs[0]], [y, e.ids[f"{layer.name}.argmax"]], layer.name, **self.window(layer))

    def backward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, dy: int,
                 dxs: list[int | None]) -> None:
        if dxs[0] is None:  # also where the layer before makes this gradient itself (grad_from_pool): no tensor
            return
        relu = layer.name in e.arch.relu_pools.values()  # with its input's ReLU gradient: reads y too
        ins = pool_grad_inputs(e, layer) if relu else [dy, e.ids[f"{layer.name}.argmax"]]
        e.emit(g, gid, "maxpool_bwd", ins, [dxs[0]], layer.name, **self.window(layer),
               **({"relu": True} if relu else {}))

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

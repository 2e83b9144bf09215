"""conv: 2-D convolution (square kernel k, stride s, zero padding p), like nn.Conv2d(in, out, k, s, p).

Feature maps are channels-last (N, H, W, C) in the arena (kernels/conv.py says why); the weight is
stored (out, k, k, in) and leaves as PyTorch's (out, in, k, k) through the state dict. The CPU runs
it by im2col tiles or, for 3x3 stride-1 ones, Winograd F(4x4, 3x3) or F(2x2, 3x3) in the same scratch.

A grouped conv (``groups`` > 1: depthwise when groups == in == out) is another op with kernels of its
own (ops/grouped_conv.py): the builder is this one, and ``plans_into`` sends such a layer to that op
(labelled conv<n> in one count with the others, as from_torch counts Conv2d modules).
``groups`` is a parameter only when above 1, so an ungrouped conv's Layer,
BluePrint description, plan and checkpoint are what they were before groups existed.
"""
from __future__ import annotations

from typing import Any

from ..blueprint_nodes import Layer, boolean, conv_args, nonneg_int, positive_int
from ..errors import BluePrintError, ShapeError, bad_argument
from ..kernels.operands import CONV_THREADS, conv_scratch_shape, conv_tiles
from ..memory.region import Region
from .common import bias_partials, square, window_out, with_act_slot
from .grouped_conv import GROUPED_CONV, signature as grouped_signature
from .pool import backward_act
from .registry import Op, Refused, op_of, register

CONV_DW_PARTIALS = CONV_THREADS - 1
"""Weight-gradient partials of a tiled conv backward (kernels/conv_tiled.py): one per numba thread
after the first, so the tiled backward runs on at most CONV_DW_PARTIALS + 1 threads."""


@conv_args
def conv(out: int, k: int, s: int = 1, p: int = 0, bias: bool = True, groups: int = 1) -> Layer:
    """2-D convolution (square kernel k, stride s, zero padding p), like nn.Conv2d(in, out, k, s, p, groups=groups):
    with groups g, each of g groups of in/g input channels makes out/g of the outputs (depthwise: g == in == out)."""
    o = positive_int("conv", "out", out, "conv(64, 3)")
    params = (("bias", boolean("conv", "bias", bias)), ("k", positive_int("conv", "k", k, "conv(64, 3)")),
              ("out", o), ("p", nonneg_int("conv", "p", p)), ("s", positive_int("conv", "s", s, "conv(64, 3, s=2)")))
    g = positive_int("conv", "groups", groups, "conv(32, 3, p=1, groups=32)")
    if g == 1:  # no groups parameter: an ungrouped conv is the Layer it always was
        return Layer("conv", params)
    if o % g:
        fits = ", ".join(str(d) for d in range(1, o + 1) if o % d == 0)
        raise bad_argument(BluePrintError, "conv", "groups", groups, f"a divisor of out={o} (each group makes "
                           "out/groups channels)", f"use one of {fits}, or an out that groups divides")
    return Layer("conv", tuple(sorted(params + (("groups", g),))))


def _grouped(p: dict[str, Any]) -> Op | None:
    """The grouped conv's op for a layer with groups > 1 (ops/grouped_conv.py), else None."""
    return op_of(GROUPED_CONV) if p.get("groups", 1) > 1 else None


@register
class Convolution(Op):
    autocast = "lowp"
    kind = "conv"
    builders = (conv,)
    torch_modules = ("Conv2d",)
    parametrized = True
    fuses = ("relu",)
    relu_grad_movable = True

    def plans_into(self, layer: Layer) -> Op:
        return _grouped(layer.p) or self

    def signature(self, p: dict[str, Any]) -> str:
        if _grouped(p):
            return grouped_signature(p)
        return f"conv({p['out']}, k={p['k']}, s={p['s']}, p={p['p']}" + ("" if p["bias"] else ", bias=False") + ")"

    def arch(self, layer: Layer) -> tuple[str, tuple[tuple[str, Any], ...]]:
        return "conv", with_act_slot(layer.params)

    def describe(self, p: dict[str, Any]) -> str:
        return self.signature(p)

    def tensors(self, ctx: Any, idx: int, layer: Any, ins: list[tuple[int, ...]]) -> tuple[int, ...]:
        x = ins[0]
        if len(x) != 3:
            raise ShapeError(f"plan: {layer.name} (conv) gets input of shape {x}; conv needs images. "
                             "Fix: load the data with layout='image' (N, C, H, W).")
        p, t, batch = layer.p, ctx.t, ctx.batch
        h, w, c = x
        k, s, pad, out = p["k"], p["s"], p["p"], p["out"]
        ho, wo = window_out(layer.name, h, k, s, pad), window_out(layer.name, w, k, s, pad)
        family = "FIRST_CONV" if layer.inputs == ("input",) else "DEEP_CONV"
        if p["bias"]:
            ctx.param(layer.name, "bias", (out,), "FC_BIAS", c * k * k, "uniform")
        ctx.param(layer.name, "weight", (out, k, k, c), family, c * k * k, "uniform")
        cols = conv_scratch_shape(batch, ho, wo, k, s, pad, c)  # the tiles' columns, not the whole im2col matrix
        t.add(f"{layer.name}.cols", cols, "float32", Region.T_TEMP_FP32)
        if conv_tiles(k, s, pad, c):  # the backward makes its columns again, a tile at a time: x's, then dy W's
            t.add(f"{layer.name}.bwd_cols", cols, "float32", Region.T_TEMP_FP32)
        elif idx > 0:
            t.add(f"{layer.name}.dcols", cols, "float32", Region.T_TEMP_FP32)
        if p["bias"]:
            bias_partials(ctx, layer.name, out)
        if conv_tiles(k, s, pad, c):
            t.add(f"{layer.name}.dw_partials", (CONV_DW_PARTIALS, out, k * k * c), "float32", Region.T_TEMP_FP32)
        return (ho, wo, out)

    def forward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, training: bool,
                ema: bool) -> None:
        p = layer.p
        ins = [xs[0], e.weight(layer, "weight", ema)] + ([e.weight(layer, "bias", ema)] if p["bias"] else [])
        e.emit(g, gid, "conv_fwd", ins, [y, e.ids[f"{layer.name}.cols"]], layer.name, k=p["k"], s=p["s"], p=p["p"],
               bias=p["bias"], act=p["act"])

    def backward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, dy: int,
                 dxs: list[int | None]) -> None:
        ids, p, dx, n = e.ids, layer.p, dxs[0], layer.name
        outs = [ids[f"{n}.weight@grad"]] + ([ids[f"{n}.bias@grad"]] if p["bias"] else [])
        own = ids.get(f"{n}.bwd_cols")  # a tiled conv's backward: its own scratch for both column tiles
        cols = own if own is not None else ids[f"{n}.cols"]  # else the forward's whole matrix
        if dx is not None:
            outs += [dx, own if own is not None else ids[f"{n}.dcols"]]
        scratch = e.scratch(n, ("bias_partials", "dw_partials"))
        reads_y, act = backward_act(e, layer)
        e.emit(g, gid, "conv_bwd", [dy, xs[0], ids[f"{n}.weight"], cols] + ([y] if reads_y else []),
               outs + [ids[f"{n}.{r}"] for r in scratch], n, k=p["k"], s=p["s"], p=p["p"], bias=p["bias"], **act,
               need_dx=dx is not None, scratch=scratch)

    def onnx(self, g: Any, layer: Any, xs: list[str], out: str) -> str:
        p, name = layer.p, layer.name
        ins = [xs[0], g.weight(name, "weight")] + ([g.weight(name, "bias")] if p["bias"] else [])
        return g.node("Conv", ins, out, kernel_shape=[p["k"]] * 2, strides=[p["s"]] * 2, pads=[p["p"]] * 4)

    def from_torch(self, m: Any) -> dict[str, Any]:
        if square(m.dilation, "dilation") != 1 or m.padding_mode != "zeros":
            raise Refused(f"dilation={m.dilation}, padding_mode={m.padding_mode!r} (only dilation=1 and zero padding "
                          "are supported)")
        params = {"out": m.out_channels, "k": square(m.kernel_size, "kernel_size"), "s": square(m.stride, "stride"),
                  "p": square(m.padding, "padding"), "bias": m.bias is not None}
        return {"layer": "conv", "params": params | ({"groups": m.groups} if m.groups != 1 else {})}

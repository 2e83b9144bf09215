"""conv: 2-D convolution (square kernel k, stride s, zero padding p), like nn.Conv2d(in, out, k, s, p).

Feature maps are channels-last (N, H, W, C) in the arena (kernels/conv.py says why); the weight is
stored (out, k, k, in) and leaves as PyTorch's (out, in, k, k) through the state dict. The CPU runs
it by im2col tiles or, for 3x3 stride-1 ones, Winograd F(2x2, 3x3) in the same scratch.
"""
from __future__ import annotations

from typing import Any

from ..blueprint_nodes import Layer, boolean, conv_args, nonneg_int, positive_int
from ..errors import ShapeError
from ..kernels.operands import CONV_THREADS, conv_scratch_shape, conv_tiles
from ..memory.region import Region
from .common import bias_partials, square, window_out, with_act_slot
from .registry import Op, Refused, register

CONV_DW_PARTIALS = CONV_THREADS - 1
"""Weight-gradient partials of a tiled conv backward (kernels/conv_tiled.py): one per numba thread
after the first, so the tiled backward runs on at most CONV_DW_PARTIALS + 1 threads."""


@conv_args
def conv(out: int, k: int, s: int = 1, p: int = 0, bias: bool = True) -> Layer:
    """2-D convolution (square kernel k, stride s, zero padding p), like nn.Conv2d(in, out, k, s, p)."""
    return Layer("conv", (("bias", boolean("conv", "bias", bias)), ("k", positive_int("conv", "k", k, "conv(64, 3)")),
                          ("out", positive_int("conv", "out", out, "conv(64, 3)")), ("p", nonneg_int("conv", "p", p)),
                          ("s", positive_int("conv", "s", s, "conv(64, 3, s=2)"))))


@register
class Convolution(Op):
    kind = "conv"
    builders = (conv,)
    torch_modules = ("Conv2d",)
    parametrized = True
    fuses = ("relu",)

    def signature(self, p: dict[str, Any]) -> str:
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
        e.emit(g, gid, "conv_bwd", [dy, xs[0], ids[f"{n}.weight"], cols, y], outs + [ids[f"{n}.{r}"] for r in scratch],
               n, k=p["k"], s=p["s"], p=p["p"], bias=p["bias"], act=p["act"], need_dx=dx is not None, scratch=scratch)

    def onnx(self, g: Any, layer: Any, xs: list[str], out: str) -> str:
        p, name = layer.p, layer.name
        ins = [xs[0], g.weight(name, "weight")] + ([g.weight(name, "bias")] if p["bias"] else [])
        return g.node("Conv", ins, out, kernel_shape=[p["k"]] * 2, strides=[p["s"]] * 2, pads=[p["p"]] * 4)

    def from_torch(self, m: Any) -> dict[str, Any]:
        if m.groups != 1 or square(m.dilation, "dilation") != 1 or m.padding_mode != "zeros":
            raise Refused(f"groups={m.groups}, dilation={m.dilation}, padding_mode={m.padding_mode!r} (only groups=1, "
                          "dilation=1 and zero padding are supported)")
        return {"layer": "conv", "params": {"out": m.out_channels, "k": square(m.kernel_size, "kernel_size"),
                                            "s": square(m.stride, "stride"), "p": square(m.padding, "padding"),
                                            "bias": m.bias is not None}}

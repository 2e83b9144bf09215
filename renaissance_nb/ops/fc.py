"""fc: the fully connected layer y = act(x W^T + b), W shaped (out, in) as in PyTorch's nn.Linear."""
from __future__ import annotations

from typing import Any

from ..blueprint_nodes import Layer, boolean, fc_args, positive_int
from ..checks import as_int
from ..errors import BluePrintError, ShapeError, bad_argument
from ..kernels.operands import FC_ACTS
from .common import bias_partials, with_act_slot
from .registry import Op, register


@fc_args
def fc(out: int, bias: bool = True) -> Layer:
    """Fully connected layer y = x W^T + b, W shaped (out, in) as in PyTorch's nn.Linear."""
    size = as_int(bias)  # nn.Linear(784, 10) (as_int takes no bools)
    if size is not None:
        fix = (f"write fc({size}) for PyTorch's nn.Linear({out}, {size})" if size >= 1 else
               "write fc(out) with the output size only") + ": the input size comes from the layer before"
        raise bad_argument(BluePrintError, "fc", "bias", bias, "True or False (fc takes the output size only)", fix)
    return Layer("fc", (("out", positive_int("fc", "out", out, "fc(128)")), ("bias", boolean("fc", "bias", bias))))


def linear_onnx(g: Any, x: str, name: str, bias: bool, out: str) -> str:
    """nn.Linear on the last axis of any rank: MatMul by W^T (stored transposed), then the bias."""
    w = g.const(f"{name}.weight_t", g.state[f"{name}.weight"].T)
    y = g.node("MatMul", [x, w], f"{out}.matmul" if bias else out)
    return g.node("Add", [y, g.weight(name, "bias")], out) if bias else y


@register
class FullyConnected(Op):
    kind = "fc"
    autocast = "lowp"
    builders = (fc,)
    torch_modules = ("Linear",)
    parametrized = True
    fuses = FC_ACTS[1:]  # what the fused bias passes compute (kernels/operands.py)
    layout = "flat"

    def signature(self, p: dict[str, Any]) -> str:
        return f"fc({p['out']}, bias={p['bias']})"

    def arch(self, layer: Layer) -> tuple[str, tuple[tuple[str, Any], ...]]:
        return "fc", with_act_slot(layer.params)

    def describe(self, p: dict[str, Any]) -> str:
        return self.signature(p)

    def tensors(self, ctx: Any, idx: int, layer: Any, ins: list[tuple[int, ...]]) -> tuple[int, ...]:
        x = ins[0]
        if len(x) not in (1, 2):
            raise ShapeError(f"plan: {layer.name} (fc) gets input of shape {x}; fc needs flat features (d,) or "
                             "a sequence's (T, d). Fix: put flatten() or gap() before it.")
        p = layer.p
        fan_in, out = x[-1], p["out"]
        if p["bias"]:
            ctx.param(layer.name, "bias", (out,), "FC_BIAS", fan_in, "uniform")
        ctx.param(layer.name, "weight", (out, fan_in), "FC_WEIGHT", fan_in, "uniform")
        if p["bias"]:
            bias_partials(ctx, layer.name, out)
        return (*x[:-1], out)  # on a sequence, per position: nn.Linear on the last axis

    def forward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, training: bool,
                ema: bool) -> None:
        p = layer.p
        ins = [xs[0], e.weight(layer, "weight", ema)] + ([e.weight(layer, "bias", ema)] if p["bias"] else [])
        e.emit(g, gid, "fc_fwd", ins, [y], layer.name, act=p["act"], slope=p["slope"])

    def backward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, dy: int,
                 dxs: list[int | None]) -> None:
        ids, p, dx, n = e.ids, layer.p, dxs[0], layer.name
        outs = [ids[f"{n}.weight@grad"]] + ([ids[f"{n}.bias@grad"]] if p["bias"] else [])
        outs += [dx] if dx is not None else []
        scratch = e.scratch(n, ("bias_partials",) if p["bias"] else ())
        e.emit(g, gid, "fc_bwd", [dy, xs[0], ids[f"{n}.weight"], y, ids["ones"]],
               outs + [ids[f"{n}.{r}"] for r in scratch], n, act=p["act"], slope=p["slope"], bias=p["bias"],
               need_dx=dx is not None, scratch=scratch)

    def decode(self, d: Any, layer: Any, xs: list[str], y: str) -> None:
        p, n = layer.p, layer.name
        d.add(y, (*d.shapes[xs[0]][:-1], p["out"]))
        ins = [xs[0], f"{n}.weight"] + ([f"{n}.bias"] if p["bias"] else [])
        d.emit("fc_fwd", ins, [y], n, act=p["act"], slope=p["slope"])

    def onnx(self, g: Any, layer: Any, xs: list[str], out: str) -> str:
        if g.positions:  # (N, T, d): a MatMul on the last axis (Gemm is 2-D only)
            return linear_onnx(g, xs[0], layer.name, layer.p["bias"], out)
        ins = [xs[0], g.weight(layer.name, "weight")] + ([g.weight(layer.name, "bias")] if layer.p["bias"] else [])
        return g.node("Gemm", ins, out, transB=1)

    def from_torch(self, m: Any) -> dict[str, Any]:
        return {"layer": "fc", "params": {"out": m.out_features, "bias": m.bias is not None}}

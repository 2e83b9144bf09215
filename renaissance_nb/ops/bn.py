"""bn: batch normalisation over channels (nn.BatchNorm2d / BatchNorm1d semantics).

Training normalises by the batch's statistics and updates the running ones; inference uses
``eq_scale``/``eq_bias``, folded from the weights and running statistics once per evaluation
(UPDATE_BN_INF_PARAMS), so an inference batch norm is one multiply-add per value.
"""
from __future__ import annotations

from typing import Any

from ..blueprint_nodes import Layer, layer_args
from ..checks import as_float
from ..errors import BluePrintError, bad_argument
from ..kernels.operands import PAR_CHUNKS
from ..memory.region import Region
from .common import with_act_slot
from . import pool as pool_ops
from .pool import backward_act, pool_grad_inputs, relu_through_pool
from .registry import Op, Refused, register

BN_SCRATCH = (("stat_sums", (PAR_CHUNKS + 1, 2), "float64"), ("affine", (2,), "float32"),
              ("grad_sums", (PAR_CHUNKS + 1, 2), "float64"), ("grad_coef", (3,), "float64"))
"""A batch norm's scratch, (role, leading shape, dtype), C channels last: the forward's shifted
sums (row 0 the total, then one row per block) and affine scale/shift; the backward's gradient
sums and dx coefficients."""
BN_FWD_SCRATCH = ("stat_sums", "affine")
BN_BWD_SCRATCH = ("grad_sums", "grad_coef")


@layer_args
def bn(momentum: float = 0.1, eps: float = 1e-5) -> Layer:
    """Batch normalisation over channels (nn.BatchNorm2d / BatchNorm1d semantics)."""
    m, e = as_float(momentum), as_float(eps)
    if m is None or not 0 <= m <= 1:
        raise bad_argument(BluePrintError, "bn", "momentum", momentum, "a float in [0, 1]", "use e.g. 0.1")
    if e is None or e <= 0:
        raise bad_argument(BluePrintError, "bn", "eps", eps, "a float > 0", "use e.g. 1e-5")
    return Layer("bn", (("eps", e), ("momentum", m)))


@register
class BatchNorm(Op):
    kind = "bn"
    builders = (bn,)
    torch_modules = ("BatchNorm2d", "BatchNorm1d")
    parametrized = True
    fuses = ("relu",)
    batch_statistics = True
    first_layer_dx = True
    relu_grad_movable = True
    grad_from_pool = True

    def arch(self, layer: Layer) -> tuple[str, tuple[tuple[str, Any], ...]]:
        return "bn", with_act_slot(layer.params)

    def describe(self, p: dict[str, Any]) -> str:
        return "bn"

    def tensors(self, ctx: Any, idx: int, layer: Any, ins: list[tuple[int, ...]]) -> tuple[int, ...]:
        t, f32, n, x = ctx.t, "float32", layer.name, ins[0]
        c = x[-1]
        ctx.param(n, "bias", (c,), "BN_BIAS", c, "zeros")
        ctx.param(n, "weight", (c,), "BN_WEIGHT", c, "ones")
        t.add(f"{n}.running_mean", (c,), f32, Region.B_PREV_MEAN)
        t.add(f"{n}.running_var", (c,), f32, Region.B_PREV_VAR)
        ctx.buffer(n, "running_mean", (c,), c, "zeros")
        ctx.buffer(n, "running_var", (c,), c, "ones")
        t.add(f"{n}.mean", (c,), f32, Region.T_TEMP_FP32)
        t.add(f"{n}.invstd", (c,), f32, Region.T_TEMP_FP32)
        for role, shape, dtype in BN_SCRATCH:  # the kernels' sums and coefficients
            t.add(f"{n}.{role}", (*shape, c), dtype, Region.T_TEMP_FP32)
        t.add(f"{n}.eq_scale", (c,), f32, Region.W_EQ_SCALE)
        t.add(f"{n}.eq_bias", (c,), f32, Region.W_EQ_BIAS)
        if ctx.ema:  # the EMA model's own running statistics (an EMA of the model's), folded separately
            t.add(f"{n}.running_mean@ema", (c,), f32, Region.B_NEXT_MEAN)
            t.add(f"{n}.running_var@ema", (c,), f32, Region.B_NEXT_VAR)
            t.add(f"{n}.eq_scale@ema", (c,), f32, Region.W_EQ_SCALE)
            t.add(f"{n}.eq_bias@ema", (c,), f32, Region.W_EQ_BIAS)
        if idx == 0:
            t.add("input@grad", (ctx.batch, *x), f32, Region.F_GRAD_SLOT_FP32)
        return x

    def forward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, training: bool,
                ema: bool) -> None:
        ids, p, n, x = e.ids, layer.p, layer.name, xs[0]
        if training:
            pool = relu_through_pool(e, layer) if self.pooled_from(e, layer) else None  # y made by the pool
            e.emit(g, gid, "bn_fwd", [x, ids[f"{n}.weight"], ids[f"{n}.bias"]],
                   ([] if pool else [y]) + [ids[f"{n}.{r}"] for r in ("mean", "invstd", "running_mean", "running_var")]
                   + [ids[f"{n}.{r}"] for r in BN_FWD_SCRATCH],
                   n, momentum=p["momentum"], eps=p["eps"], act=p["act"], scratch=BN_FWD_SCRATCH,
                   **({"y_by": pool} if pool else {}))
        else:
            sfx = "@ema" if ema else ""
            e.emit(g, gid, "bn_inf", [x, ids[f"{n}.eq_scale{sfx}"], ids[f"{n}.eq_bias{sfx}"]], [y], n, act=p["act"])

    def pooled_from(self, e: Any, layer: Any) -> tuple[int, int] | None:
        """Its input and its affine (scratch ``affine``, written by bn_fwd) where a max pool alone reads its relu
        output; not for a batch norm of the data itself (the data's buffer changes with the step), nor where the
        emitter keeps every output (``elide_outputs`` off: mixed precision, which rounds the output to 16 bits
        before the pool, and liveness=False, which keeps every temporary to read)."""
        if not e.elide_outputs or layer.inputs[0] == "input" or relu_through_pool(e, layer) is None:
            return None
        return e.ids[layer.inputs[0]], e.ids[f"{layer.name}.affine"]

    def backward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, dy: int,
                 dxs: list[int | None]) -> None:
        ids, n = e.ids, layer.name
        reads_y, act = backward_act(e, layer)
        stats = [ids[f"{n}.{r}"] for r in ("weight", "mean", "invstd")]
        outs = [dxs[0], ids[f"{n}.weight@grad"], ids[f"{n}.bias@grad"]] + [ids[f"{n}.{r}"] for r in BN_BWD_SCRATCH]
        pool = pool_ops.grad_from_pool(e.arch, e.elide_outputs, layer, e.recompute)
        if pool is not None:  # dy made from the pool's gradient, argmax and output: no maxpool_bwd, no dy
            e.emit(g, gid, "bn_bwd", pool_grad_inputs(e, pool) + [xs[0]] + stats, outs, n, **act,
                   dy_pool=pool.p["k"], scratch=BN_BWD_SCRATCH)
            return
        e.emit(g, gid, "bn_bwd", [dy, xs[0]] + ([y] if reads_y else []) + stats, outs, n, **act, scratch=BN_BWD_SCRATCH)

    def inference_fold(self, e: Any, g: Any, layer: Any, ema: bool) -> None:
        ids, n = e.ids, layer.name
        for sfx in ("", "@ema") if ema else ("",):
            e.emit(g, e.gid("UPDATE_BN_INF_PARAMS"), "bn_fold",
                   [ids[f"{n}.weight{sfx}"], ids[f"{n}.bias{sfx}"], ids[f"{n}.running_mean{sfx}"],
                    ids[f"{n}.running_var{sfx}"]], [ids[f"{n}.eq_scale{sfx}"], ids[f"{n}.eq_bias{sfx}"]], n,
                   eps=layer.p["eps"])

    def onnx(self, g: Any, layer: Any, xs: list[str], out: str) -> str:
        ins = [xs[0]] + [g.weight(layer.name, r) for r in ("weight", "bias", "running_mean", "running_var")]
        return g.node("BatchNormalization", ins, out, epsilon=float(layer.p["eps"]))

    def from_torch(self, m: Any) -> dict[str, Any]:
        if not (m.affine and m.track_running_stats) or m.momentum is None:
            raise Refused("affine=False, track_running_stats=False or momentum=None (a cumulative average) "
                          "has no counterpart in bn()")
        return {"layer": "bn", "params": {"momentum": float(m.momentum), "eps": float(m.eps)}}

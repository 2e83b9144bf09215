"""conv + bias + batch norm (+ relu) as one convolution at inference: ``options(fold_bn=True)``.

In inference a batch norm is a per-channel affine map, y = x * eq_scale + eq_bias (bn.py folds its
weights and running statistics into those once per evaluation), so after a convolution it folds into
that convolution's weights: W' = W * eq_scale per output channel, b' = b * eq_scale + eq_bias. The
inference graph then runs one conv_fwd reading W', b' and writing the batch norm's output, with the
batch norm's fused relu in the same pass, and no bn_inf pass at all.

What it costs: W' and b' are tensors of their own (W_EQ_SCALE / W_EQ_BIAS, the original's regions for
BN-folded equivalents), one more copy of each folded convolution's weights; the plan shows them. Why
it is an option: a plan with them is another plan, so checkpoints saved without them keep loading.
Why inference only: in training the batch norm normalises by the batch's own statistics, which need
the convolution's output first; there the conv + bias + relu and bn + relu passes are fused already.
A pair folds when the batch norm is the convolution's only reader and the convolution fuses no
activation of its own; grouped convolutions (their own kernels) keep their batch norm.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..memory.region import Region
from ..kernels.fused import jit  # the package's numba options, one place
from .bn import BatchNorm
from .conv import Convolution
from .registry import Op, op_of, register

FOLD = "conv_bn_fold"


def pairs(layers: tuple[Any, ...], consumers: dict[str, int]) -> tuple[tuple[str, str], ...]:
    """(conv, bn) layer names whose inference folds into one convolution."""
    by_output = {layer.output: layer for layer in layers}
    out = []
    for norm in layers:
        conv = by_output.get(norm.inputs[0]) if len(norm.inputs) == 1 else None
        if (conv is not None and type(op_of(norm.kind)) is BatchNorm and type(op_of(conv.kind)) is Convolution
                and consumers.get(conv.output) == 1 and conv.p.get("act", "none") == "none"):
            out.append((conv.name, norm.name))
    return tuple(out)


def tensors(ctx: Any, conv: str, weight_shape: tuple[int, ...], out: int) -> None:
    """The folded weights of ``conv`` (and of its EMA copy with ema()): the inference graph's conv reads them."""
    for sfx in ("", "@ema") if ctx.ema else ("",):
        ctx.t.add(f"{conv}.weight@folded{sfx}", weight_shape, "float32", Region.W_EQ_SCALE)
        ctx.t.add(f"{conv}.bias@folded{sfx}", (out,), "float32", Region.W_EQ_BIAS)


def fold_nodes(e: Any, g: Any, conv: Any, norm: Any, ema: bool) -> None:
    """UPDATE_BN_INF_PARAMS, after the batch norm's own fold: W', b' from W, b and its eq_scale, eq_bias."""
    ids = e.ids
    for sfx in ("", "@ema") if ema else ("",):
        bias = [ids[f"{conv.name}.bias{sfx}"]] if conv.p["bias"] else []
        e.emit(g, e.gid("UPDATE_BN_INF_PARAMS"), FOLD,
               [ids[f"{conv.name}.weight{sfx}"], ids[f"{norm.name}.eq_scale{sfx}"], ids[f"{norm.name}.eq_bias{sfx}"],
                *bias], [ids[f"{conv.name}.weight@folded{sfx}"], ids[f"{conv.name}.bias@folded{sfx}"]], conv.name,
               bias=conv.p["bias"])


def forward(e: Any, g: Any, gid: Any, conv: Any, norm: Any, xs: list[int], ema: bool) -> None:
    """The pair's inference: one convolution by the folded weights into the batch norm's output."""
    p, ids, sfx = conv.p, e.ids, "@ema" if ema else ""
    e.emit(g, gid, "conv_fwd", [xs[0], ids[f"{conv.name}.weight@folded{sfx}"], ids[f"{conv.name}.bias@folded{sfx}"]],
           [ids[norm.output], ids[f"{conv.name}.cols"]], f"{conv.name}+{norm.name}", k=p["k"], s=p["s"], p=p["p"],
           bias=True, act=norm.p["act"])


@jit
def fold_(w, scale, shift, b, wf, bf):
    """wf[o] = w[o] * scale[o] (all of output channel o's weights); bf[o] = b[o] * scale[o] + shift[o]
    (b empty: no conv bias), each in float32 as the batch norm would apply them."""
    out = w.shape[0]
    per = w.size // out
    fw, ff = w.reshape(out, per), wf.reshape(out, per)
    for o in range(out):
        s = scale[o]
        for i in range(per):
            ff[o, i] = fw[o, i] * s
        bf[o] = (b[o] * s if b.shape[0] else np.float32(0.0)) + shift[o]


def bind_fold(outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Any:
    w, scale, shift = ins[:3]
    b = ins[3] if len(ins) > 3 else np.zeros(0, np.float32)
    wf, bf = outs
    return lambda: fold_(w, scale, shift, b, wf, bf)


CUDA = r'''
extern "C" __global__ void rnb_conv_bn_fold(const float* w, const float* scale, const float* shift, const float* b,
                                            float* wf, float* bf, rnb_i64 out, rnb_i64 per, int has_bias) {
    for (rnb_i64 k = blockIdx.x * (rnb_i64)blockDim.x + threadIdx.x; k < out * per; k += (rnb_i64)gridDim.x * blockDim.x) {
        rnb_i64 o = k / per;
        wf[k] = w[k] * scale[o];
        if (k % per == 0) bf[o] = (has_bias ? b[o] * scale[o] : 0.0f) + shift[o];
    }
}
'''


def launch_fold(outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Any:
    from ..gpu.base import launch_grid
    w, scale, shift = ins[:3]
    has_b = len(ins) > 3
    wf, bf = outs
    out = w.shape[0]
    return launch_grid(env, "rnb_conv_bn_fold", w.size, w, scale, shift, ins[3] if has_b else shift, wf, bf,
                       np.int64(out), np.int64(w.size // out), np.int32(has_b))


@register
class ConvBatchNormFold(Op):
    """Not a layer: the fold's kernels, joined into the CPU and GPU tables like any op's own."""

    kind = FOLD
    cpu_kernels = {FOLD: bind_fold}
    gpu_kernels = {FOLD: launch_fold}
    cuda_source = CUDA

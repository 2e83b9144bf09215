"""attention: causal multi-head self-attention (GPT's), in a materialised or a memory-efficient form.

On (T, d) features: qkv = x W_qkv^T + b_qkv (nn.Linear(d, 3d), minGPT's c_attn), split into H heads
of hd = d / H; each head's softmax(q k^T / sqrt(hd)) over the keys at or before the query (the causal
mask), optionally dropped out (Philox, the DROPOUT stream), times v; the heads merged and projected
by nn.Linear(d, d) (c_proj). Parameters: ``<name>.qkv.weight`` (3d, d), ``.qkv.bias``,
``<name>.proj.weight`` (d, d), ``.proj.bias``, the fc regions.

``form="materialized"`` plans the scores: P, (B, H, T, T) per layer, in F_FEATURE_FP32 (saved for the
backward) and its gradient in T_TEMP_FP32: the inspector shows them growing as T squared.
``form="flash"`` plans only each row's log-sum-exp (B, H, T) and block scratch: the forward runs the
online softmax over key blocks, the backward recomputes each block's probabilities
(attention_kernels.py). Attention dropout needs the probabilities the forward drew, so it is
materialised only (``flash`` with ``dropout`` > 0 is refused at the builder).

The projections run as fc nodes (the fc kernels, CPU and GPU); the parts in between are this op's.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..blueprint_nodes import Layer, layer_args, positive_int, probability
from ..errors import BluePrintError, ShapeError, bad_argument
from ..kernels import attention_native as an
from ..kernels.operands import PAR_CHUNKS
from ..memory.region import Region
from . import attention_kernels as ak
from .registry import Op, register

FORMS = ("materialized", "flash")


@layer_args
def attention(heads: int, form: str = "materialized", dropout: float = 0.0, block: int = 64) -> Layer:
    """Causal multi-head self-attention over (T, d) features with ``heads`` heads (d % heads == 0).
    ``form``: "materialized" (the T x T scores in the arena) or "flash" (blocked online softmax, no
    T x T tensor; ``block`` queries and keys per block). ``dropout``: on the attention probabilities."""
    h = positive_int("attention", "heads", heads, "attention(4)")
    if form not in FORMS:
        raise bad_argument(BluePrintError, "attention", "form", form, "'materialized' or 'flash'",
                           "pass form='materialized' (scores in the arena) or form='flash' (memory-efficient)")
    p = probability("attention", "dropout", dropout)
    if form == "flash" and p > 0:
        raise bad_argument(BluePrintError, "attention", "dropout", dropout, "0 with form='flash'",
                           "the flash form recomputes the probabilities and keeps no dropout mask: use "
                           "form='materialized' for attention dropout, or dropout=0.0")
    b = positive_int("attention", "block", block, "attention(4, form='flash', block=64)")
    return Layer("attention", (("block", b), ("dropout", p), ("form", form), ("heads", h)))


def _fc(e: Any, g: Any, gid: Any, name: str, x: int, w: int, b: int, y: int) -> None:
    e.emit(g, gid, "fc_fwd", [x, w, b], [y], name, act="none", slope=0.0)


def _fc_bwd(e: Any, g: Any, gid: Any, layer: str, part: str, dy: int, x: int, dx: int | None) -> None:
    """A projection's backward through fc_bwd: dy stands in for fc's output (read only for a fused
    activation, which a projection has none of), so the output's lifetime is not stretched to here."""
    ids = e.ids
    outs = [ids[f"{layer}.{part}.weight@grad"], ids[f"{layer}.{part}.bias@grad"]] + ([dx] if dx is not None else [])
    e.emit(g, gid, "fc_bwd", [dy, x, ids[f"{layer}.{part}.weight"], dy, ids["ones"]],
           outs + [ids[f"{layer}.{part}.bias_partials"]], layer, act="none", slope=0.0, bias=True,
           need_dx=dx is not None, scratch=("bias_partials",))


Kernel = Callable[[], None]


def _either(c_kernel: Kernel | None, fallback: Callable[..., Kernel], outs: Any, ins: Any, p: dict[str, Any],
            env: Any) -> Kernel:
    """The C kernel (kernels/attention_native.py) where its binder took the operands, else the NumPy and
    numba one of attention_kernels.py: the same bytes either way."""
    return c_kernel if c_kernel is not None else fallback(outs, ins, p, env)


def _scores(outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Kernel:
    """attn_scores: qkv -> q, k, v and the causal softmax P."""
    (qkv,), (q, k, v, probs) = ins, outs
    return _either(an.bind_scores(qkv, q, k, v, probs), ak.bind_scores, outs, ins, p, env)


def _mix(outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Kernel:
    """attn_mix: y = merge(P v)."""
    (probs, v), (y, o) = ins, outs
    return _either(an.bind_mix(probs, v, y, o), ak.bind_mix, outs, ins, p, env)


def _mix_bwd(outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Kernel:
    """attn_mix_bwd: dP and dv from dy."""
    (dy, probs, v), (dprobs, dv, do) = ins, outs
    return _either(an.bind_mix_bwd(dy, probs, v, dprobs, dv, do), ak.bind_mix_bwd, outs, ins, p, env)


def _scores_bwd(outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Kernel:
    """attn_scores_bwd: dS in dP's buffer, dq, dk, and dqkv."""
    (dprobs, probs, q, k, dv), (dqkv, dq, dk, _) = ins, outs
    return _either(an.bind_scores_bwd(dprobs, probs, q, k, dv, dqkv, dq, dk), ak.bind_scores_bwd, outs, ins, p, env)


def _flash_fwd(outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Kernel:
    """flash_attn_fwd: y and each row's log-sum-exp, block by block."""
    return _either(an.bind_flash_fwd(*ins, *outs, int(p["block"])), ak.bind_flash_fwd, outs, ins, p, env)


def _flash_bwd(outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Kernel:
    """flash_attn_bwd: dqkv, the blocks' probabilities recomputed."""
    return _either(an.bind_flash_bwd(*ins, *outs, int(p["block"])), ak.bind_flash_bwd, outs, ins, p, env)


@register
class Attention(Op):
    autocast = "lowp"
    kind = "attention"
    builders = (attention,)
    parametrized = True
    layout = "flat"
    tensor_kinds = {**{r: "attention scores" for r in ("probs", "probs_dropped", "mask", "dprobs", "dprobs_dropped",
                                                       "sblk", "dpblk", "scores")},
                    "k_cache": "KV cache", "v_cache": "KV cache"}
    forward_scratch = ("sblk", "mrow", "lrow", "acc", "pq", "o")
    BWD_SCRATCH = ("sblk", "pq", "o")
    """The flash backward's scratch roles the forward works in too: the backward has its own (``<role>@bwd``), so
    no block-sized scratch lives from a layer's forward to its backward (liveness runs first touch to last)."""
    cpu_kernels = {"attn_scores": _scores, "attn_mix": _mix, "attn_mix_bwd": _mix_bwd,
                   "attn_scores_bwd": _scores_bwd, "flash_attn_fwd": _flash_fwd,
                   "flash_attn_bwd": _flash_bwd, "attn_decode": ak.bind_decode}

    def describe(self, p: dict[str, Any]) -> str:
        extra = (f", dropout={p['dropout']}" if p["dropout"] else "") + (
            f", block={p['block']}" if p["form"] == "flash" else "")
        return f"attention({p['heads']}, form={p['form']!r}{extra})"

    def tensors(self, ctx: Any, idx: int, layer: Any, ins: list[tuple[int, ...]]) -> tuple[int, ...]:
        x, p, n, t = ins[0], layer.p, layer.name, ctx.t
        if len(x) != 2:
            raise ShapeError(f"plan: {layer.name} (attention) needs (T, d) sequence features, got {x}. Fix: start "
                             "the model with embedding(vocab, d) on token data.")
        (T, d), h = x, p["heads"]
        if d % h:
            raise ShapeError(f"plan: {layer.name} splits d={d} features into {h} heads, which does not divide. "
                             f"Fix: attention(heads) with heads dividing {d}, e.g. {_divisor(d, h)}.")
        B, hd = ctx.batch, d // h
        for part, out in (("qkv", 3 * d), ("proj", d)):
            ctx.param(f"{n}.{part}", "bias", (out,), "FC_BIAS", d, "uniform")
            ctx.param(f"{n}.{part}", "weight", (out, d), "FC_WEIGHT", d, "uniform")
            t.add(f"{n}.{part}.bias_partials", (PAR_CHUNKS, out), "float64", Region.T_TEMP_FP32)
        f32, heads = "float32", (B, h, T, hd)
        t.add(f"{n}.qkv", (B, T, 3 * d), f32, Region.F_FEATURE_FP32)
        for role in ("q", "k", "v"):
            t.add(f"{n}.{role}", heads, f32, Region.F_FEATURE_FP32)
        t.add(f"{n}.heads_out", (B, T, d), f32, Region.F_FEATURE_FP32)  # the merged heads: proj's input
        t.add(f"{n}.o", heads, f32, Region.T_TEMP_FP32)
        for role in ("dqkv", "dheads_out"):
            t.add(f"{n}.{role}", (B, T, (3 if role == "dqkv" else 1) * d), f32, Region.T_TEMP_FP32)
        for role in ("dq", "dk", "dv", "do"):
            t.add(f"{n}.{role}", heads, f32, Region.T_TEMP_FP32)
        if p["form"] == "materialized":
            scores = (B, h, T, T)
            t.add(f"{n}.probs", scores, f32, Region.F_FEATURE_FP32)
            if p["dropout"] > 0:
                t.add(f"{n}.probs_dropped", scores, f32, Region.F_FEATURE_FP32)
                t.add(f"{n}.mask", scores, f32, Region.S_MASK)
                t.add(f"{n}.dprobs_dropped", scores, f32, Region.T_TEMP_FP32)
            t.add(f"{n}.dprobs", scores, f32, Region.T_TEMP_FP32)
        else:
            bh, blk = B * h, min(p["block"], T)
            t.add(f"{n}.lse", (B, h, T), f32, Region.F_FEATURE_FP32)
            t.add(f"{n}.dsum", (B, h, T), f32, Region.T_TEMP_FP32)
            for role, shape, dtype in (("sblk", (bh, blk, blk), f32), ("dpblk", (bh, blk, blk), f32),
                                       ("mrow", (bh, blk), "float64"), ("lrow", (bh, blk), "float64"),
                                       ("acc", (bh, blk, hd), "float64"), ("pq", (bh, blk, hd), f32),
                                       ("pk", (bh, blk, hd), f32)):
                t.add(f"{n}.{role}", shape, dtype, Region.T_TEMP_FP32)
            for role in self.BWD_SCRATCH:
                spec = t.specs[t.ids[f"{n}.{role}"]]
                t.add(f"{n}.{role}@bwd", spec.shape, spec.dtype, Region.T_TEMP_FP32)
        return x

    def forward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, training: bool,
                ema: bool) -> None:
        n, ids, p = layer.name, e.ids, layer.p
        w = {r: e.weight(layer, r, ema) for r in ("qkv.weight", "qkv.bias", "proj.weight", "proj.bias")}
        _fc(e, g, gid, n, xs[0], w["qkv.weight"], w["qkv.bias"], ids[f"{n}.qkv"])
        qkv = [ids[f"{n}.{r}"] for r in ("q", "k", "v")]
        heads_out = ids[f"{n}.heads_out"]
        if p["form"] == "flash":
            scratch = ("sblk", "mrow", "lrow", "acc", "pq", "o")
            e.emit(g, gid, "flash_attn_fwd", [ids[f"{n}.qkv"]],
                   qkv + [heads_out, ids[f"{n}.lse"]] + [ids[f"{n}.{r}"] for r in scratch], n, block=p["block"],
                   scratch=scratch)
        else:
            probs = ids[f"{n}.probs"]
            e.emit(g, gid, "attn_scores", [ids[f"{n}.qkv"]], qkv + [probs], n)
            if training and p["dropout"] > 0:
                dropped = ids[f"{n}.probs_dropped"]
                e.dropout(g, gid, probs, dropped, ids[f"{n}.mask"], n, p["dropout"])
                probs = dropped
            e.emit(g, gid, "attn_mix", [probs, qkv[2]], [heads_out, ids[f"{n}.o"]], n, scratch=("o",))
        _fc(e, g, gid, n, heads_out, w["proj.weight"], w["proj.bias"], y)

    def decode(self, d: Any, layer: Any, xs: list[str], y: str) -> None:
        _decode(d, layer, xs, y)

    def onnx(self, g: Any, layer: Any, xs: list[str], out: str) -> str:
        return _onnx(g, layer, xs[0], out)

    def backward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, dy: int,
                 dxs: list[int | None]) -> None:
        n, ids, p = layer.name, e.ids, layer.p
        r = {k: ids[f"{n}.{k}"] for k in ("q", "k", "v", "heads_out", "dheads_out", "dqkv", "dq", "dk", "dv", "do",
                                          "o")}
        _fc_bwd(e, g, gid, n, "proj", dy, r["heads_out"], r["dheads_out"])
        if p["form"] == "flash":
            scratch = ("sblk", "dpblk", "pq", "pk", "do", "o", "dsum")
            e.emit(g, gid, "flash_attn_bwd", [r["dheads_out"], r["heads_out"], r["q"], r["k"], r["v"], ids[f"{n}.lse"]],
                   [r["dqkv"], r["dq"], r["dk"], r["dv"]]
                   + [ids[f"{n}.{s}" + ("@bwd" if s in self.BWD_SCRATCH else "")] for s in scratch], n,
                   block=p["block"], scratch=scratch)
        else:
            dropped = p["dropout"] > 0
            probs, dprobs = ids[f"{n}.probs"], ids[f"{n}.dprobs"]
            read = ids[f"{n}.probs_dropped"] if dropped else probs
            dread = ids[f"{n}.dprobs_dropped"] if dropped else dprobs
            e.emit(g, gid, "attn_mix_bwd", [r["dheads_out"], read, r["v"]], [dread, r["dv"], r["do"]], n,
                   scratch=("do",))
            if dropped:
                e.emit(g, gid, "mul", [dread, ids[f"{n}.mask"]], [dprobs], n)
            e.emit(g, gid, "attn_scores_bwd", [dprobs, probs, r["q"], r["k"], r["dv"]],
                   [r["dqkv"], r["dq"], r["dk"], dprobs], n)
        _fc_bwd(e, g, gid, n, "qkv", r["dqkv"], xs[0], dxs[0])


def _onnx(g: Any, layer: Any, x: str, out: str) -> str:
    """The materialised form in ONNX ops (both forms compute the same function): qkv, heads, masked
    softmax of the scaled scores, the heads merged, the projection."""
    from .fc import linear_onnx
    n, h = layer.name, layer.p["heads"]
    d = g.state[f"{n}.proj.weight"].shape[0]
    t, hd = g.positions, d // h
    qkv = linear_onnx(g, x, f"{n}.qkv", True, f"{out}.qkv")
    split = g.node("Reshape", [qkv, g.ints(f"{out}.split", [0, 0, 3, h, hd])], f"{out}.split5")
    heads = g.node("Transpose", [split], f"{out}.heads", perm=[2, 0, 3, 1, 4])  # (3, N, H, T, hd)
    q, k, v = (g.node("Gather", [heads, g.ints(f"{out}.i{i}", i)], f"{out}.{r}", axis=0) for i, r in enumerate("qkv"))
    kt = g.node("Transpose", [k], f"{out}.kt", perm=[0, 1, 3, 2])
    s = g.node("Mul", [g.node("MatMul", [q, kt], f"{out}.qk"),
                       g.const(f"{out}.scale", np.array(1.0 / np.sqrt(hd), np.float32))], f"{out}.scores")
    mask = np.where(np.triu(np.ones((t, t), bool), 1), -np.inf, 0.0).astype(np.float32)
    p = g.node("Softmax", [g.node("Add", [s, g.const(f"{out}.mask", mask)], f"{out}.masked")], f"{out}.probs", axis=-1)
    o = g.node("Transpose", [g.node("MatMul", [p, v], f"{out}.o")], f"{out}.ot", perm=[0, 2, 1, 3])
    merged = g.node("Reshape", [o, g.ints(f"{out}.merge", [0, 0, d])], f"{out}.merged")
    return linear_onnx(g, merged, f"{n}.proj", True, out)


def _decode(d: Any, layer: Any, xs: list[str], y: str) -> None:
    """One position: qkv by the fc kernel, then the step's own kernel writes the position's key and value
    into the layer's KV cache (1, H, context, hd each, in the decode arena) and attends over positions
    0..p; the scores cover the whole context (float64, the unused tail left alone), so shapes never change."""
    n, (dim,), h, ctx = layer.name, d.shapes[xs[0]][-1:], layer.p["heads"], d.context
    qkv, heads_out = d.add(f"{n}.qkv", (1, 1, 3 * dim)), d.add(f"{n}.heads_out", (1, 1, dim))
    caches = [d.add(f"{n}.{r}_cache", (1, h, ctx, dim // h)) for r in ("k", "v")]
    scores = d.add(f"{n}.scores", (1, h, ctx), Region.T_TEMP_FP32, "float64")
    d.add(y, (1, 1, dim))
    d.emit("fc_fwd", [xs[0], f"{n}.qkv.weight", f"{n}.qkv.bias"], [qkv], n, act="none", slope=0.0)
    d.emit("attn_decode", [qkv, "position"], [heads_out, *caches, scores], n)
    d.emit("fc_fwd", [heads_out, f"{n}.proj.weight", f"{n}.proj.bias"], [y], n, act="none", slope=0.0)


def _divisor(d: int, h: int) -> int:
    """The head count nearest ``h`` that divides ``d``."""
    return min((c for c in range(1, d + 1) if d % c == 0), key=lambda c: (abs(c - h), c))

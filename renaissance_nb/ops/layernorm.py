"""layernorm: y = (x - mean) / sqrt(var + eps) * weight + bias over the last axis (nn.LayerNorm(d)).

Every row (a sample, or a position of a sequence) is normalised on its own, in training and inference
alike (no running statistics, unlike batch norm). Sums are float64 in index order, rounded once.
Saved for the backward: each row's mean and 1/std (F_FEATURE_FP32). The parameter gradients are
sums over the rows: per block of rows (PAR_CHUNKS fixed blocks, one thread each) into float64
partials, then added block by block, so the bytes do not depend on the thread count. The kernels bind
their C twins first (kernels/gpt_native.c, the same bytes), these numba loops where those decline.

Its weight and bias live in the batch-norm parameter regions (W_BN_WEIGHT, W_BN_BIAS): the
original's regions for a normalisation's affine parameters, kept out of weight decay's way by
AdamW's parameter groups (optim/adam.py).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numba
import numpy as np

from ..blueprint_nodes import Layer, layer_args
from ..checks import as_float
from ..errors import BluePrintError, ShapeError, bad_argument
from ..kernels import gpt_native
from ..kernels.fused import chunk, jit, par
from ..kernels.operands import PAR_CHUNKS
from ..memory.region import Region
from .common import threaded
from .registry import Op, register


@layer_args
def layernorm(eps: float = 1e-5) -> Layer:
    """Layer normalisation over the features of each row, with a learned scale and shift, as
    nn.LayerNorm(d, eps) (d is read from the input)."""
    e = as_float(eps)
    if e is None or not math.isfinite(e) or e <= 0:
        raise bad_argument(BluePrintError, "layernorm", "eps", eps, "a finite float > 0", "use e.g. eps=1e-5")
    return Layer("layernorm", (("eps", e),))


@jit
def ln_fwd_rows_(x, w, b, y, mean, rstd, eps, lo, hi):
    d = x.shape[1]
    for r in range(lo, hi):
        s = 0.0
        for k in range(d):
            s += x[r, k]
        m = s / d
        v = 0.0
        for k in range(d):
            z = x[r, k] - m
            v += z * z
        inv = 1.0 / math.sqrt(v / d + eps)
        mean[r] = np.float32(m)
        rstd[r] = np.float32(inv)
        for k in range(d):
            y[r, k] = np.float32((x[r, k] - m) * inv * w[k] + b[k])


@par
def ln_fwd_(x, w, b, y, mean, rstd, eps):
    for c in numba.prange(PAR_CHUNKS):
        lo, hi = chunk(x.shape[0], c)
        ln_fwd_rows_(x, w, b, y, mean, rstd, eps, lo, hi)


@jit
def ln_bwd_rows_(dy, x, w, mean, rstd, dx, part, c, lo, hi):
    """dx for rows lo..hi, and this block's float64 partial sums of dweight (part[0, c]) and dbias (part[1, c])."""
    d = x.shape[1]
    for k in range(d):
        part[0, c, k] = 0.0
        part[1, c, k] = 0.0
    for r in range(lo, hi):
        m, inv = np.float64(mean[r]), np.float64(rstd[r])
        a = 0.0  # sum of g
        bsum = 0.0  # sum of g * xhat
        for k in range(d):
            xh = (x[r, k] - m) * inv
            g = np.float64(dy[r, k]) * w[k]
            a += g
            bsum += g * xh
            part[0, c, k] += dy[r, k] * xh
            part[1, c, k] += dy[r, k]
        if dx.shape[0]:
            a /= d
            bsum /= d
            for k in range(d):
                xh = (x[r, k] - m) * inv
                dx[r, k] = np.float32(inv * (np.float64(dy[r, k]) * w[k] - a - xh * bsum))


@par
def ln_bwd_(dy, x, w, mean, rstd, dx, part):
    for c in numba.prange(PAR_CHUNKS):
        lo, hi = chunk(x.shape[0], c)
        ln_bwd_rows_(dy, x, w, mean, rstd, dx, part, c, lo, hi)


@jit
def ln_bwd_serial_(dy, x, w, mean, rstd, dx, part):
    """ln_bwd_'s blocks one after the other on the calling thread (the same partial sums, the same bytes)."""
    for c in range(PAR_CHUNKS):
        lo, hi = chunk(x.shape[0], c)
        ln_bwd_rows_(dy, x, w, mean, rstd, dx, part, c, lo, hi)


@jit
def ln_param_grads_(part, dw, db):
    for k in range(dw.shape[0]):
        sw = 0.0
        sb = 0.0
        for c in range(part.shape[1]):
            sw += part[0, c, k]
            sb += part[1, c, k]
        dw[k] = np.float32(sw)
        db[k] = np.float32(sb)


def _rows(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1, a.shape[-1])


def bind_fwd(outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Callable[[], None]:
    (x, w, b), (y, mean, rstd) = ins, outs
    x2, y2, m1, r1, eps = _rows(x), _rows(y), mean.reshape(-1), rstd.reshape(-1), float(p["eps"])
    bound = gpt_native.bind_ln_fwd(x2, w, b, y2, m1, r1, eps, gpt_native.threads_for(x.size))
    if bound is not None:
        return bound
    if threaded(x.size):
        return lambda: ln_fwd_(x2, w, b, y2, m1, r1, eps)
    rows = x2.shape[0]
    return lambda: ln_fwd_rows_(x2, w, b, y2, m1, r1, eps, 0, rows)


def bind_bwd(outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Callable[[], None]:
    (dy, x, w, mean, rstd), (dw, db, *rest) = ins, outs
    part = rest[-1]
    dx = _rows(rest[0]) if p["need_dx"] else np.empty((0, x.shape[-1]), np.float32)
    dy2, x2, m1, r1 = _rows(dy), _rows(x), mean.reshape(-1), rstd.reshape(-1)
    bound = gpt_native.bind_ln_bwd(dy2, x2, w, m1, r1, dx, part, dw, db, gpt_native.threads_for(x.size))
    if bound is not None:
        return bound
    rows = ln_bwd_ if threaded(x.size) else ln_bwd_serial_

    def run() -> None:
        rows(dy2, x2, w, m1, r1, dx, part)
        ln_param_grads_(part, dw, db)
    return run


@register
class LayerNorm(Op):
    autocast = "fp32"
    kind = "layernorm"
    builders = (layernorm,)
    torch_modules = ("LayerNorm",)
    parametrized = True
    layout = "flat"
    cpu_kernels = {"layernorm_fwd": bind_fwd, "layernorm_bwd": bind_bwd}

    def describe(self, p: dict[str, Any]) -> str:
        return "layernorm" if p["eps"] == 1e-5 else f"layernorm(eps={p['eps']})"

    def tensors(self, ctx: Any, idx: int, layer: Any, ins: list[tuple[int, ...]]) -> tuple[int, ...]:
        x = ins[0]
        if len(x) not in (1, 2):
            raise ShapeError(f"plan: {layer.name} (layernorm) normalises features (d,) or (T, d), got {x}. "
                             "Fix: put flatten() or gap() before it.")
        n, d, rows = layer.name, x[-1], x[0] if len(x) == 2 else 1
        ctx.param(n, "weight", (d,), "BN_WEIGHT", d, "ones")
        ctx.param(n, "bias", (d,), "BN_BIAS", d, "zeros")
        ctx.t.add(f"{n}.mean", (ctx.batch, rows), "float32", Region.F_FEATURE_FP32)
        ctx.t.add(f"{n}.rstd", (ctx.batch, rows), "float32", Region.F_FEATURE_FP32)
        ctx.t.add(f"{n}.partials", (2, PAR_CHUNKS, d), "float64", Region.T_TEMP_FP32)
        return x

    def forward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, training: bool,
                ema: bool) -> None:
        n, ids = layer.name, e.ids
        ins = [xs[0], e.weight(layer, "weight", ema), e.weight(layer, "bias", ema)]
        e.emit(g, gid, "layernorm_fwd", ins, [y, ids[f"{n}.mean"], ids[f"{n}.rstd"]], n, eps=layer.p["eps"])

    def backward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, dy: int,
                 dxs: list[int | None]) -> None:
        n, ids, dx = layer.name, e.ids, dxs[0]
        ins = [dy, xs[0], ids[f"{n}.weight"], ids[f"{n}.mean"], ids[f"{n}.rstd"]]
        outs = [ids[f"{n}.weight@grad"], ids[f"{n}.bias@grad"]] + ([dx] if dx is not None else [])
        e.emit(g, gid, "layernorm_bwd", ins, outs + [ids[f"{n}.partials"]], n, need_dx=dx is not None,
               scratch=("partials",))

    def decode(self, d: Any, layer: Any, xs: list[str], y: str) -> None:
        n, shape = layer.name, d.shapes[xs[0]]
        d.add(y, shape)
        stats = [d.add(f"{n}.{r}", shape[:-1], Region.T_TEMP_FP32) for r in ("mean", "rstd")]
        d.emit("layernorm_fwd", [xs[0], f"{n}.weight", f"{n}.bias"], [y, *stats], n, eps=layer.p["eps"])

    def onnx(self, g: Any, layer: Any, xs: list[str], out: str) -> str:
        ins = [xs[0], g.weight(layer.name, "weight"), g.weight(layer.name, "bias")]
        return g.node("LayerNormalization", ins, out, axis=-1, epsilon=float(layer.p["eps"]))

    def from_torch(self, m: Any) -> dict[str, Any]:
        from .registry import Refused
        if len(m.normalized_shape) != 1 or not m.elementwise_affine or getattr(m, "bias", None) is None:
            raise Refused(f"normalized_shape={tuple(m.normalized_shape)}, elementwise_affine={m.elementwise_affine}"
                          " (only LayerNorm(d) over the last axis, with weight and bias, is what layernorm() computes)")
        return {"layer": "layernorm", "params": {"eps": float(m.eps)}}

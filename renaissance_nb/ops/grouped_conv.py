"""grouped_conv: a convolution whose channels split into ``groups`` independent groups, as
nn.Conv2d(in, out, k, s, p, groups=g) (MobileNet's depthwise conv: groups == in == out).

Declared as ``conv(out, k, s, p, groups=g)`` (ops/conv.py's builder; a plain conv stays groups=1):
output channel o reads only the in/groups input channels of its group, o // (out/groups). The
weight is stored (out, k, k, in/groups), channels-last like conv's, and leaves as PyTorch's
(out, in/groups, k, k) through the state dict (memory/dtensor.py's torch_layout of a 4-D weight).

Why direct loops and not conv's im2col + GEMM: a depthwise conv's product has one column per
group, so a GEMM per group would be mostly call overhead. Every output is one float64 sum of
float32 products (exact in float64) in a fixed order, rounded once to float32; the CPU (numba,
prange over independent outputs) and the GPU (one thread per output, no atomics) add the same
terms in the same order, so both give the same bytes on every run:

- forward: y[n,i,j,o] = (sum over ky, kx, c of x * w) + b[o], then the fused ReLU;
- dW[o,ky,kx,c]: sum over n, i, j of dz * x, where dz = dy (masked by y > 0 under a fused ReLU);
- db[o]: sum over n, i, j of dz;
- dx[n,h,w,c]: sum over ky, kx and the group's output channels of dz * w.
"""
from __future__ import annotations

from typing import Any, Callable

import numba
import numpy as np

from ..errors import PlanError, ShapeError
from ..kernels.base import EMPTY_F32
from ..kernels.operands import check_shape, out_size, relu_code
from ..kernels.fused import par  # the package's numba options, one place
from .common import with_act_slot, window_out
from .registry import Op, register

GROUPED_CONV = "grouped_conv"
"""The op's kind: conv's builder makes it for groups > 1 (ops/conv.py hands such a layer to this op)."""



@par
def gconv_fwd_(x, w, b, y, s, p, groups, has_b, relu):
    """y = act(grouped conv(x, w) + b), by (image, output row) on numba's threads."""
    n, h, wd, c = x.shape
    o, k, cg = w.shape[0], w.shape[1], w.shape[3]
    ho, wo = y.shape[1], y.shape[2]
    og = o // groups
    for r in numba.prange(n * ho):
        ni, i = r // ho, r % ho
        for j in range(wo):
            for oc in range(o):
                c0 = (oc // og) * cg
                acc = 0.0
                for ky in range(k):
                    iy = i * s - p + ky
                    if iy < 0 or iy >= h:
                        continue
                    for kx in range(k):
                        ix = j * s - p + kx
                        if ix < 0 or ix >= wd:
                            continue
                        for ci in range(cg):
                            acc += np.float64(x[ni, iy, ix, c0 + ci]) * np.float64(w[oc, ky, kx, ci])
                if has_b:
                    acc += np.float64(b[oc])
                v = np.float32(acc)
                if relu and v < 0:
                    v = np.float32(0.0)
                y[ni, i, j, oc] = v


@par
def gconv_dw_(dy, x, y, dw, s, p, groups, relu):
    """dW, one output (o, ky, kx, c) per iteration on numba's threads: the sum over images and positions."""
    n, h, wd, c = x.shape
    o, k, cg = dw.shape[0], dw.shape[1], dw.shape[3]
    ho, wo = dy.shape[1], dy.shape[2]
    og = o // groups
    for e in numba.prange(o * k * k * cg):
        ci, r = e % cg, e // cg
        kx, r = r % k, r // k
        ky, oc = r % k, r // k
        cc = (oc // og) * cg + ci
        acc = 0.0
        for ni in range(n):
            for i in range(ho):
                iy = i * s - p + ky
                if iy < 0 or iy >= h:
                    continue
                for j in range(wo):
                    ix = j * s - p + kx
                    if ix < 0 or ix >= wd:
                        continue
                    if relu and not y[ni, i, j, oc] > 0:
                        continue
                    acc += np.float64(dy[ni, i, j, oc]) * np.float64(x[ni, iy, ix, cc])
        dw[oc, ky, kx, ci] = np.float32(acc)


@par
def gconv_db_(dy, y, db, relu):
    """db, one output channel per iteration: the sum of dz over images and positions."""
    n, ho, wo, o = dy.shape
    for oc in numba.prange(o):
        acc = 0.0
        for ni in range(n):
            for i in range(ho):
                for j in range(wo):
                    if relu and not y[ni, i, j, oc] > 0:
                        continue
                    acc += np.float64(dy[ni, i, j, oc])
        db[oc] = np.float32(acc)


@par
def gconv_dx_(dy, w, y, dx, s, p, groups, relu):
    """dx, by (image, input row): each input value gathers the outputs whose windows read it."""
    n, h, wd, c = dx.shape
    o, k, cg = w.shape[0], w.shape[1], w.shape[3]
    ho, wo = dy.shape[1], dy.shape[2]
    og = o // groups
    for r in numba.prange(n * h):
        ni, iy = r // h, r % h
        for ix in range(wd):
            for cc in range(c):
                g, ci = cc // cg, cc % cg
                acc = 0.0
                for ky in range(k):
                    t = iy + p - ky
                    if t < 0 or t % s != 0 or t // s >= ho:
                        continue
                    i = t // s
                    for kx in range(k):
                        u = ix + p - kx
                        if u < 0 or u % s != 0 or u // s >= wo:
                            continue
                        j = u // s
                        for oc in range(g * og, (g + 1) * og):
                            if relu and not y[ni, i, j, oc] > 0:
                                continue
                            acc += np.float64(dy[ni, i, j, oc]) * np.float64(w[oc, ky, kx, ci])
                dx[ni, iy, ix, cc] = np.float32(acc)


CUDA = r'''
// grouped_conv (ops/grouped_conv.py): one thread per output value, the CPU loops' sums in their order.
#define RNB_GCONV_LOOP(total) \
    for (rnb_i64 e = blockIdx.x * (rnb_i64)blockDim.x + threadIdx.x; e < (total); e += (rnb_i64)gridDim.x * blockDim.x)

extern "C" __global__ void rnb_grouped_conv_fwd(const float* x, const float* w, const float* b, float* y,
                                                rnb_i64 n, rnb_i64 h, rnb_i64 wd, rnb_i64 c, rnb_i64 o, rnb_i64 k,
                                                rnb_i64 ho, rnb_i64 wo, rnb_i64 s, rnb_i64 p, rnb_i64 groups,
                                                int relu, int has_b) {
    rnb_i64 cg = c / groups, og = o / groups;
    RNB_GCONV_LOOP(n * ho * wo * o) {
        rnb_i64 oc = e % o, r = e / o, j = r % wo;
        r /= wo;
        rnb_i64 i = r % ho, ni = r / ho, c0 = (oc / og) * cg;
        double acc = 0.0;
        for (rnb_i64 ky = 0; ky < k; ++ky) {
            rnb_i64 iy = i * s - p + ky;
            if (iy < 0 || iy >= h) continue;
            for (rnb_i64 kx = 0; kx < k; ++kx) {
                rnb_i64 ix = j * s - p + kx;
                if (ix < 0 || ix >= wd) continue;
                const float* xp = x + ((ni * h + iy) * wd + ix) * c + c0;
                const float* wp = w + ((oc * k + ky) * k + kx) * cg;
                for (rnb_i64 ci = 0; ci < cg; ++ci) acc += (double)xp[ci] * (double)wp[ci];
            }
        }
        if (has_b) acc += (double)b[oc];
        float v = (float)acc;
        if (relu && v < 0.0f) v = 0.0f;
        y[e] = v;
    }
}

extern "C" __global__ void rnb_grouped_conv_dw(const float* dy, const float* x, const float* y, float* dw,
                                               rnb_i64 n, rnb_i64 h, rnb_i64 wd, rnb_i64 c, rnb_i64 o, rnb_i64 k,
                                               rnb_i64 ho, rnb_i64 wo, rnb_i64 s, rnb_i64 p, rnb_i64 groups,
                                               int relu) {
    rnb_i64 cg = c / groups, og = o / groups;
    RNB_GCONV_LOOP(o * k * k * cg) {
        rnb_i64 ci = e % cg, r = e / cg, kx = r % k;
        r /= k;
        rnb_i64 ky = r % k, oc = r / k, cc = (oc / og) * cg + ci;
        double acc = 0.0;
        for (rnb_i64 ni = 0; ni < n; ++ni)
            for (rnb_i64 i = 0; i < ho; ++i) {
                rnb_i64 iy = i * s - p + ky;
                if (iy < 0 || iy >= h) continue;
                for (rnb_i64 j = 0; j < wo; ++j) {
                    rnb_i64 ix = j * s - p + kx;
                    if (ix < 0 || ix >= wd) continue;
                    rnb_i64 at = ((ni * ho + i) * wo + j) * o + oc;
                    if (relu && !(y[at] > 0.0f)) continue;
                    acc += (double)dy[at] * (double)x[((ni * h + iy) * wd + ix) * c + cc];
                }
            }
        dw[e] = (float)acc;
    }
}

extern "C" __global__ void rnb_grouped_conv_db(const float* dy, const float* y, float* db, rnb_i64 m, rnb_i64 o,
                                               int relu) {
    RNB_GCONV_LOOP(o) {
        double acc = 0.0;
        for (rnb_i64 q = 0; q < m; ++q) {
            rnb_i64 at = q * o + e;
            if (relu && !(y[at] > 0.0f)) continue;
            acc += (double)dy[at];
        }
        db[e] = (float)acc;
    }
}

extern "C" __global__ void rnb_grouped_conv_dx(const float* dy, const float* w, const float* y, float* dx,
                                               rnb_i64 n, rnb_i64 h, rnb_i64 wd, rnb_i64 c, rnb_i64 o, rnb_i64 k,
                                               rnb_i64 ho, rnb_i64 wo, rnb_i64 s, rnb_i64 p, rnb_i64 groups,
                                               int relu) {
    rnb_i64 cg = c / groups, og = o / groups;
    RNB_GCONV_LOOP(n * h * wd * c) {
        rnb_i64 cc = e % c, r = e / c, ix = r % wd;
        r /= wd;
        rnb_i64 iy = r % h, ni = r / h, g = cc / cg, ci = cc % cg;
        double acc = 0.0;
        for (rnb_i64 ky = 0; ky < k; ++ky) {
            rnb_i64 t = iy + p - ky;
            if (t < 0 || t % s != 0 || t / s >= ho) continue;
            rnb_i64 i = t / s;
            for (rnb_i64 kx = 0; kx < k; ++kx) {
                rnb_i64 u = ix + p - kx;
                if (u < 0 || u % s != 0 || u / s >= wo) continue;
                rnb_i64 j = u / s;
                for (rnb_i64 oc = g * og; oc < (g + 1) * og; ++oc) {
                    rnb_i64 at = ((ni * ho + i) * wo + j) * o + oc;
                    if (relu && !(y[at] > 0.0f)) continue;
                    acc += (double)dy[at] * (double)w[((oc * k + ky) * k + kx) * cg + ci];
                }
            }
        }
        dx[e] = (float)acc;
    }
}
'''


# ---- binding: the operands of a node, checked once -------------------------------------------------
class Geometry:
    """A grouped conv node's sizes, checked: x (N, H, W, C), w (O, k, k, C/groups), y (N, Ho, Wo, O)."""

    def __init__(self, op: str, x: Any, w: Any, p: dict[str, Any]) -> None:
        self.k, self.s, self.p, self.groups = int(p["k"]), int(p.get("s", 1)), int(p.get("p", 0)), int(p["groups"])
        if x.ndim != 4 or w.ndim != 4:
            raise PlanError(f"{op}: x must be (N, H, W, C) and w (O, k, k, C/groups); got {x.shape} and {w.shape}.")
        self.n, self.h, self.wd, self.c = (int(v) for v in x.shape)
        self.o = int(w.shape[0])
        if self.groups < 1 or self.c % self.groups or self.o % self.groups:
            raise PlanError(f"{op}: groups={self.groups} must divide the {self.c} input and {self.o} output channels.")
        check_shape(op, "w", w.shape, (self.o, self.k, self.k, self.c // self.groups))
        self.ho, self.wo = out_size(self.h, self.k, self.s, self.p), out_size(self.wd, self.k, self.s, self.p)
        if self.ho < 1 or self.wo < 1:
            raise PlanError(f"{op}: a {self.k}x{self.k} kernel (stride {self.s}, padding {self.p}) does not fit a "
                            f"{self.h}x{self.wd} input.")
        self.relu = relu_code(op, p) == 1

    @property
    def y_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.ho, self.wo, self.o)

    def cuda_args(self) -> tuple[Any, ...]:
        """The sizes fwd, dw and dx take, in their CUDA parameter order (n ... groups, relu)."""
        return (*(np.int64(v) for v in (self.n, self.h, self.wd, self.c, self.o, self.k, self.ho, self.wo, self.s,
                                        self.p, self.groups)), np.int32(self.relu))


class BwdOperands:
    """A grouped_conv_bwd node's views: ins [dy, x, w] (+ y under a fused ReLU), outs [dw] (+ db) (+ dx)."""

    def __init__(self, outs: Any, ins: Any, p: dict[str, Any]) -> None:
        op = "grouped_conv_bwd"
        self.dy, self.x, self.w = ins[0], ins[1], ins[2]
        self.geo = Geometry(op, self.x, self.w, p)
        if self.geo.relu and len(ins) < 4:
            raise PlanError(f"{op}: act='relu' needs the forward output y as the fourth input.")
        self.y = ins[3] if self.geo.relu else self.dy  # read only under the ReLU
        check_shape(op, "dy", self.dy.shape, self.geo.y_shape)
        check_shape(op, "y", self.y.shape, self.geo.y_shape)
        has_b, need_dx = bool(p.get("bias", False)), bool(p.get("need_dx", False))
        if len(outs) != 1 + has_b + need_dx:
            raise PlanError(f"{op}: expected outputs dw{', db' if has_b else ''}{', dx' if need_dx else ''}, got "
                            f"{len(outs)}.")
        self.dw = outs[0]
        self.db = outs[1] if has_b else None
        self.dx = outs[1 + has_b] if need_dx else None
        check_shape(op, "dw", self.dw.shape, self.w.shape)
        if self.db is not None:
            check_shape(op, "db", self.db.shape, (self.geo.o,))
        if self.dx is not None:
            check_shape(op, "dx", self.dx.shape, self.x.shape)


def _fwd_operands(outs: Any, ins: Any, p: dict[str, Any]) -> tuple[Geometry, Any, Any, Any, Any, bool]:
    op = "grouped_conv_fwd"
    x, w = ins[0], ins[1]
    geo = Geometry(op, x, w, p)
    has_b = bool(p.get("bias", False))
    b = ins[2] if has_b else None
    if b is not None:
        check_shape(op, "b", b.shape, (geo.o,))
    check_shape(op, "y", outs[0].shape, geo.y_shape)
    return geo, x, w, b, outs[0], has_b


def cpu_fwd(outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Callable[[], None]:
    geo, x, w, b, y, has_b = _fwd_operands(outs, ins, p)
    b = b if b is not None else EMPTY_F32
    f, s, pad, groups, relu = gconv_fwd_, geo.s, geo.p, geo.groups, geo.relu
    return lambda: f(x, w, b, y, s, pad, groups, has_b, relu)


def cpu_bwd(outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Callable[[], None]:
    o = BwdOperands(outs, ins, p)
    g = o.geo
    dy, x, w, y, dw, db, dx, s, pad, groups, relu = o.dy, o.x, o.w, o.y, o.dw, o.db, o.dx, g.s, g.p, g.groups, g.relu

    def run() -> None:
        if db is not None:
            gconv_db_(dy, y, db, relu)
        gconv_dw_(dy, x, y, dw, s, pad, groups, relu)
        if dx is not None:
            gconv_dx_(dy, w, y, dx, s, pad, groups, relu)
    return run


def _contiguous(op: str, **views: Any) -> None:
    """The CUDA kernels index flat arrays: every view must be one dense block."""
    for name, v in views.items():
        if v is not None and not v.flags.c_contiguous:
            raise PlanError(f"{op}: {name} must be contiguous on the GPU (shape {tuple(v.shape)}).")


def gpu_fwd(outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Any:
    from ..gpu.base import launch_grid
    geo, x, w, b, y, has_b = _fwd_operands(outs, ins, p)
    _contiguous("grouped_conv_fwd", x=x, w=w, b=b, y=y)
    return launch_grid(env, "rnb_grouped_conv_fwd", y.size, x, w, b if b is not None else w, y, *geo.cuda_args(),
                       np.int32(has_b))


def gpu_bwd(outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Any:
    from ..gpu.base import launch_grid, sequence
    o = BwdOperands(outs, ins, p)
    _contiguous("grouped_conv_bwd", dy=o.dy, x=o.x, w=o.w, y=o.y, dw=o.dw, db=o.db, dx=o.dx)
    args, g = o.geo.cuda_args(), o.geo
    steps = []
    if o.db is not None:
        steps.append(launch_grid(env, "rnb_grouped_conv_db", g.o, o.dy, o.y, o.db, np.int64(g.n * g.ho * g.wo),
                                 np.int64(g.o), np.int32(g.relu)))
    steps.append(launch_grid(env, "rnb_grouped_conv_dw", o.dw.size, o.dy, o.x, o.y, o.dw, *args))
    if o.dx is not None:
        steps.append(launch_grid(env, "rnb_grouped_conv_dx", o.dx.size, o.dy, o.w, o.y, o.dx, *args))
    return sequence(*steps)


# ---- the op ---------------------------------------------------------------------------------------
def signature(p: dict[str, Any]) -> str:
    """A grouped conv as its builder call reads: ``conv(32, k=3, s=1, p=1, groups=32)``."""
    return (f"conv({p['out']}, k={p['k']}, s={p['s']}, p={p['p']}, groups={p['groups']}"
            + ("" if p["bias"] else ", bias=False") + ")")


@register
class GroupedConvolution(Op):
    autocast = "lowp"
    kind = GROUPED_CONV
    parametrized = True
    fuses = ("relu",)
    cpu_kernels = {"grouped_conv_fwd": cpu_fwd, "grouped_conv_bwd": cpu_bwd}
    gpu_kernels = {"grouped_conv_fwd": gpu_fwd, "grouped_conv_bwd": gpu_bwd}
    cuda_source = CUDA

    def arch(self, layer: Any) -> tuple[str, tuple[tuple[str, Any], ...]]:
        """Labelled "conv": conv<n> in one count with the ungrouped ones, as from_torch counts Conv2d."""
        return "conv", with_act_slot(layer.params)

    def describe(self, p: dict[str, Any]) -> str:
        return signature(p)

    def tensors(self, ctx: Any, idx: int, layer: Any, ins: list[tuple[int, ...]]) -> tuple[int, ...]:
        x, p = ins[0], layer.p
        if len(x) != 3:
            raise ShapeError(f"plan: {layer.name} ({signature(p)}) gets input of shape {x}; conv needs images. "
                             "Fix: load the data with layout='image' (N, C, H, W).")
        h, w, c = x
        k, s, pad, out, groups = p["k"], p["s"], p["p"], p["out"], p["groups"]
        if c % groups:
            fits = ", ".join(str(g) for g in range(1, c + 1) if c % g == 0 and out % g == 0)
            raise ShapeError(f"plan: {layer.name} ({signature(p)}) gets {c} input channels, which groups={groups} does "
                             f"not divide (each group reads in/groups channels). Fix: use a groups that divides both "
                             f"in={c} and out={out} (one of {fits}), or make the layer before it give a multiple of "
                             f"{groups} channels.")
        ho, wo = window_out(layer.name, h, k, s, pad), window_out(layer.name, w, k, s, pad)
        family = "FIRST_CONV" if layer.inputs == ("input",) else "DEEP_CONV"
        fan_in = (c // groups) * k * k
        if p["bias"]:
            ctx.param(layer.name, "bias", (out,), "FC_BIAS", fan_in, "uniform")
        ctx.param(layer.name, "weight", (out, k, k, c // groups), family, fan_in, "uniform")
        return (ho, wo, out)

    def forward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, training: bool,
                ema: bool) -> None:
        p = layer.p
        ins = [xs[0], e.weight(layer, "weight", ema)] + ([e.weight(layer, "bias", ema)] if p["bias"] else [])
        e.emit(g, gid, "grouped_conv_fwd", ins, [y], layer.name, k=p["k"], s=p["s"], p=p["p"], groups=p["groups"],
               bias=p["bias"], act=p["act"])

    def backward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, dy: int,
                 dxs: list[int | None]) -> None:
        ids, p, dx, n = e.ids, layer.p, dxs[0], layer.name
        relu = p["act"] != "none"  # only relu fuses (``fuses``): its mask reads y
        ins = [dy, xs[0], ids[f"{n}.weight"]] + ([y] if relu else [])
        outs = [ids[f"{n}.weight@grad"]] + ([ids[f"{n}.bias@grad"]] if p["bias"] else []) + (
            [dx] if dx is not None else [])
        e.emit(g, gid, "grouped_conv_bwd", ins, outs, n, k=p["k"], s=p["s"], p=p["p"], groups=p["groups"],
               bias=p["bias"], act=p["act"], need_dx=dx is not None)

    def onnx(self, g: Any, layer: Any, xs: list[str], out: str) -> str:
        p, name = layer.p, layer.name
        ins = [xs[0], g.weight(name, "weight")] + ([g.weight(name, "bias")] if p["bias"] else [])
        return g.node("Conv", ins, out, kernel_shape=[p["k"]] * 2, strides=[p["s"]] * 2, pads=[p["p"]] * 4,
                      group=p["groups"])

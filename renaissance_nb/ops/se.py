"""se: squeeze-and-excitation (Hu et al. 2018) as one op, torchvision.ops.SqueezeExcitation with its
default ReLU and Sigmoid. On a feature map x (N, H, W, C): s = sigmoid(W2 relu(W1 mean_hw(x) + b1) + b2),
y = x * s, one gate per sample and channel.

Squeeze channels: ``se(reduction=4)`` gives C_sq = max(1, C // reduction) (Hu et al.'s ratio r);
``se(squeeze=n)`` gives C_sq = n directly, which is how torchvision's callers choose it and what
from_torch reads: MobileNetV3 passes _make_divisible(C // 4, 8), EfficientNet max(1, block input
channels // 4). Those two also swap the activations (MobileNetV3's gate is Hardsigmoid, EfficientNet's
hidden activation SiLU): only the default ReLU/Sigmoid module is read here, the others are refused.

Parameters, as torchvision names them under the layer: ``se1.fc1.weight`` (C_sq, C, 1, 1) and
``se1.fc1.bias`` (C_sq), ``se1.fc2.weight`` (C, C_sq, 1, 1), ``se1.fc2.bias`` (C), in the FC_WEIGHT
and FC_BIAS regions. The weights are torchvision's 1x1 convolutions: the arena holds them as a 1x1
conv is held here, (out, 1, 1, in), so state_dict, load_state_dict, the initialisers' fans and the ONNX
export see torchvision's (out, in, 1, 1) through the same conversion as every conv weight, and the
kernels read the same bytes as an (out, in) matrix.

Numbers: every sum is a float64 sum in a fixed order (spatial positions, channels or samples
ascending), rounded once to float32, and every CUDA thread computes one output by the same sum in the
same order, so the CPU and the GPU give the same bytes (no atomics; the products are plain loops:
at C_sq x C they are too small for a GEMM to pay, and a BLAS would sum in its own order).

Saved for the backward: ``pooled`` (N, C), ``hidden`` (N, C_sq, after the ReLU) and ``scale`` (N, C),
in F_FEATURE_FP32 like the layers' outputs. se_fwd writes them and se_bwd reads them, so liveness (a
tensor lives from the first to the last node of a step that touches it) keeps them from the forward to
the backward. Scratch in T_TEMP_FP32: the forward's float64 channel sums, the backward's gate and
hidden gradients (float64).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numba
import numpy as np

from ..blueprint_nodes import NOT_HERE, Layer, positive_int
from ..checks import arguments_checked
from ..errors import BluePrintError, PlanError, bad_argument
from ..kernels.fused import chunk, jit, par  # the package's numba options, one place
from ..kernels.operands import PAR_CHUNKS
from ..memory.region import Region
from .common import needs_image, square, threaded
from .registry import Op, Refused, register

"""Samples (or parameter rows) by chunks on numba's threads: each output is one thread's, same bytes."""

WEIGHTS = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")
"""The parameters' roles under the layer, in torchvision's state-dict order."""
SAVED = ("pooled", "hidden", "scale")
se_args = arguments_checked(BluePrintError, aliases={
    **NOT_HERE, "squeeze_channels": "squeeze",
    "input_channels": "drop input_channels=: the channels are read from the input at plan()"})


@se_args
def se(reduction: int | None = None, squeeze: int | None = None) -> Layer:
    """Squeeze-and-excitation: y = x * sigmoid(fc2(relu(fc1(mean_hw(x))))) per channel, as
    torchvision.ops.SqueezeExcitation(C, C_sq). C_sq = max(1, C // reduction) (reduction 4 unless
    given), or ``squeeze`` exactly (torchvision's squeeze_channels); give one of the two."""
    if squeeze is not None:
        if reduction is not None:
            raise bad_argument(BluePrintError, "se", "reduction", reduction, "reduction= or squeeze=, not both",
                               f"drop reduction= (squeeze={squeeze!r} gives the squeeze channels exactly)")
        return Layer("se", (("squeeze", positive_int("se", "squeeze", squeeze, "se(squeeze=16)")),))
    r = 4 if reduction is None else positive_int("se", "reduction", reduction, "se(reduction=4)")
    return Layer("se", (("reduction", r),))


def squeeze_channels(p: dict[str, Any], c: int) -> int:
    """C_sq of a layer with params ``p`` on C input channels."""
    return int(p["squeeze"]) if "squeeze" in p else max(1, c // int(p["reduction"]))


# ---- CPU: numba loops, one pass per sample (or per parameter row) --------------------------------
@jit
def se_fwd_rows_(x, w1, b1, w2, b2, y, pooled, hidden, scale, sums, lo, hi):
    """Samples lo <= n < hi of x (N, HW, C): the channel means (summed in ``sums``), the hidden ReLU
    units, the sigmoid gates, and y = x * gate."""
    hw, c, cs = x.shape[1], x.shape[2], w1.shape[0]
    for n in range(lo, hi):
        acc = sums[n]
        for k in range(c):
            acc[k] = 0.0
        for i in range(hw):
            for k in range(c):
                acc[k] += np.float64(x[n, i, k])
        for k in range(c):
            pooled[n, k] = np.float32(acc[k] / hw)
        for j in range(cs):
            z = 0.0
            for k in range(c):
                z += np.float64(w1[j, k]) * np.float64(pooled[n, k])
            z += np.float64(b1[j])
            hidden[n, j] = np.float32(0.0 if z <= 0.0 else z)  # a NaN stays NaN, as torch's relu
        for k in range(c):
            z = 0.0
            for j in range(cs):
                z += np.float64(w2[k, j]) * np.float64(hidden[n, j])
            z += np.float64(b2[k])
            scale[n, k] = np.float32(1.0 / (1.0 + math.exp(-z)))
        for i in range(hw):
            for k in range(c):
                y[n, i, k] = x[n, i, k] * scale[n, k]


@jit
def se_gate_grads_rows_(dy, x, w2, hidden, scale, dz, dh, lo, hi):
    """Samples lo <= n < hi: dz = (sum_hw dy x) s (1 - s), the gates' pre-activation gradient, and
    dh = relu'(hidden) (dz W2), the hidden units' (both float64)."""
    hw, c, cs = x.shape[1], x.shape[2], w2.shape[1]
    for n in range(lo, hi):
        acc = dz[n]
        for k in range(c):
            acc[k] = 0.0
        for i in range(hw):
            for k in range(c):
                acc[k] += np.float64(dy[n, i, k]) * np.float64(x[n, i, k])
        for k in range(c):
            s = np.float64(scale[n, k])
            acc[k] = acc[k] * s * (1.0 - s)
        for j in range(cs):
            z = 0.0
            if hidden[n, j] > 0:
                for k in range(c):
                    z += acc[k] * np.float64(w2[k, j])
            dh[n, j] = z


@jit
def se_weight_grads_rows_(d, a, dw, db, lo, hi):
    """Rows lo <= r < hi of one 1x1 layer's gradients: dw[r, k] = sum_n d[n, r] a[n, k] and
    db[r] = sum_n d[n, r], summed over the samples in order."""
    m, cols = a.shape
    for r in range(lo, hi):
        zb = 0.0
        for n in range(m):
            zb += d[n, r]
        db[r] = np.float32(zb)
        for k in range(cols):
            z = 0.0
            for n in range(m):
                z += d[n, r] * np.float64(a[n, k])
            dw[r, k] = np.float32(z)


@jit
def se_dx_rows_(dy, w1, scale, dh, dz, dx, lo, hi):
    """Samples lo <= n < hi: dz = (dh W1) / HW, each position's share of the mean's gradient (it
    overwrites the gates' gradient, read by then), and dx = dy s + dz."""
    hw, c, cs = dy.shape[1], dy.shape[2], w1.shape[0]
    for n in range(lo, hi):
        for k in range(c):
            z = 0.0
            for j in range(cs):
                z += dh[n, j] * np.float64(w1[j, k])
            dz[n, k] = z / hw
        for i in range(hw):
            for k in range(c):
                dx[n, i, k] = np.float32(np.float64(dy[n, i, k]) * np.float64(scale[n, k]) + dz[n, k])


@par
def se_fwd_par_(x, w1, b1, w2, b2, y, pooled, hidden, scale, sums):
    for t in numba.prange(PAR_CHUNKS):
        lo, hi = chunk(x.shape[0], t)
        se_fwd_rows_(x, w1, b1, w2, b2, y, pooled, hidden, scale, sums, lo, hi)


@par
def se_gate_grads_par_(dy, x, w2, hidden, scale, dz, dh):
    for t in numba.prange(PAR_CHUNKS):
        lo, hi = chunk(x.shape[0], t)
        se_gate_grads_rows_(dy, x, w2, hidden, scale, dz, dh, lo, hi)


@par
def se_weight_grads_par_(d, a, dw, db):
    for t in numba.prange(PAR_CHUNKS):
        lo, hi = chunk(dw.shape[0], t)
        se_weight_grads_rows_(d, a, dw, db, lo, hi)


@par
def se_dx_par_(dy, w1, scale, dh, dz, dx):
    for t in numba.prange(PAR_CHUNKS):
        lo, hi = chunk(dy.shape[0], t)
        se_dx_rows_(dy, w1, scale, dh, dz, dx, lo, hi)


def _maps(*arrays: np.ndarray) -> list[np.ndarray]:
    """Feature maps (N, H, W, C) as (N, HW, C) views of the same bytes (a copy would lose the writes)."""
    out = []
    for a in arrays:
        if not a.flags.c_contiguous:
            raise PlanError(f"se: a feature map of shape {a.shape} is not contiguous. Fix: plan it with the layer's "
                            "tensors (the arena's feature maps are).")
        out.append(a.reshape(a.shape[0], -1, a.shape[-1]))
    return out


def _matrix(w: np.ndarray) -> np.ndarray:
    """A 1x1 weight (out, 1, 1, in) as the (out, in) matrix of its bytes."""
    return w.reshape(w.shape[0], -1)


def bind_fwd(outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Callable[[], None]:
    (x, w1, b1, w2, b2), (y, pooled, hidden, scale, sums) = ins, outs
    x3, y3 = _maps(x, y)
    w1m, w2m = _matrix(w1), _matrix(w2)
    if threaded(x.size):
        f = se_fwd_par_
        return lambda: f(x3, w1m, b1, w2m, b2, y3, pooled, hidden, scale, sums)
    g, n = se_fwd_rows_, x.shape[0]
    return lambda: g(x3, w1m, b1, w2m, b2, y3, pooled, hidden, scale, sums, 0, n)


def _rows(serial: Any, parallel: Any, work: int, rows: int, *args: Any) -> Callable[[], None]:
    """One of the backward's passes over ``rows`` rows, bound: threaded or on the calling thread."""
    if threaded(work):
        return lambda: parallel(*args)
    return lambda: serial(*args, 0, rows)


def bind_bwd(outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Callable[[], None]:
    (dy, x, w1, w2, pooled, hidden, scale), dx = ins, None
    dw1, db1, dw2, db2 = outs[:4]
    if p["need_dx"]:
        dx = outs[4]
    dz, dh = outs[-2:]
    dy3, x3 = _maps(dy, x)
    w1m, w2m, dw1m, dw2m = _matrix(w1), _matrix(w2), _matrix(dw1), _matrix(dw2)
    n, c, cs = dz.shape[0], dz.shape[1], dh.shape[1]
    passes = [_rows(se_gate_grads_rows_, se_gate_grads_par_, x.size, n, dy3, x3, w2m, hidden, scale, dz, dh),
              _rows(se_weight_grads_rows_, se_weight_grads_par_, n * c * cs, c, dz, hidden, dw2m, db2),
              _rows(se_weight_grads_rows_, se_weight_grads_par_, n * c * cs, cs, dh, pooled, dw1m, db1)]
    if dx is not None:
        passes.append(_rows(se_dx_rows_, se_dx_par_, x.size, n, dy3, w1m, scale, dh, dz, _maps(dx)[0]))

    def run() -> None:
        for f in passes:
            f()
    return run


# ---- GPU: one thread per output, the CPU's sums in the CPU's order ------------------------------------
CUDA = r'''
#define RNB_SE_LOOP(k, n) for (rnb_i64 k = blockIdx.x * (rnb_i64)blockDim.x + threadIdx.x; k < (n); \
                               k += (rnb_i64)gridDim.x * blockDim.x)

extern "C" __global__ void rnb_se_pool(const float* x, float* pooled, rnb_i64 n, rnb_i64 hw, rnb_i64 c) {
    RNB_SE_LOOP(t, n * c) {
        rnb_i64 s = t / c, k = t % c;
        double acc = 0.0;
        for (rnb_i64 i = 0; i < hw; ++i) acc += (double)x[(s * hw + i) * c + k];
        pooled[t] = (float)(acc / (double)hw);
    }
}

extern "C" __global__ void rnb_se_hidden(const float* pooled, const float* w1, const float* b1, float* hidden,
                                         rnb_i64 n, rnb_i64 c, rnb_i64 cs) {
    RNB_SE_LOOP(t, n * cs) {
        rnb_i64 s = t / cs, j = t % cs;
        double z = 0.0;
        for (rnb_i64 k = 0; k < c; ++k) z += (double)w1[j * c + k] * (double)pooled[s * c + k];
        z += (double)b1[j];
        hidden[t] = (float)(z <= 0.0 ? 0.0 : z);
    }
}

extern "C" __global__ void rnb_se_scale(const float* hidden, const float* w2, const float* b2, float* scale,
                                        rnb_i64 n, rnb_i64 c, rnb_i64 cs) {
    RNB_SE_LOOP(t, n * c) {
        rnb_i64 s = t / c, k = t % c;
        double z = 0.0;
        for (rnb_i64 j = 0; j < cs; ++j) z += (double)w2[k * cs + j] * (double)hidden[s * cs + j];
        z += (double)b2[k];
        scale[t] = (float)(1.0 / (1.0 + exp(-z)));
    }
}

extern "C" __global__ void rnb_se_mul(const float* x, const float* scale, float* y, rnb_i64 total, rnb_i64 hwc,
                                      rnb_i64 c) {
    RNB_SE_LOOP(t, total) y[t] = x[t] * scale[(t / hwc) * c + t % c];
}

extern "C" __global__ void rnb_se_gate_grad(const float* dy, const float* x, const float* scale, double* dz,
                                            rnb_i64 n, rnb_i64 hw, rnb_i64 c) {
    RNB_SE_LOOP(t, n * c) {
        rnb_i64 s = t / c, k = t % c;
        double acc = 0.0;
        for (rnb_i64 i = 0; i < hw; ++i) {
            rnb_i64 e = (s * hw + i) * c + k;
            acc += (double)dy[e] * (double)x[e];
        }
        double g = (double)scale[t];
        dz[t] = acc * g * (1.0 - g);
    }
}

extern "C" __global__ void rnb_se_hidden_grad(const double* dz, const float* w2, const float* hidden, double* dh,
                                              rnb_i64 n, rnb_i64 c, rnb_i64 cs) {
    RNB_SE_LOOP(t, n * cs) {
        rnb_i64 s = t / cs, j = t % cs;
        double z = 0.0;
        if (hidden[t] > 0.0f)
            for (rnb_i64 k = 0; k < c; ++k) z += dz[s * c + k] * (double)w2[k * cs + j];
        dh[t] = z;
    }
}

extern "C" __global__ void rnb_se_weight_grad(const double* d, const float* a, float* dw, float* db, rnb_i64 m,
                                              rnb_i64 rows, rnb_i64 cols) {
    RNB_SE_LOOP(t, rows * (cols + 1)) {
        double z = 0.0;
        if (t < rows * cols) {
            rnb_i64 r = t / cols, k = t % cols;
            for (rnb_i64 s = 0; s < m; ++s) z += d[s * rows + r] * (double)a[s * cols + k];
            dw[t] = (float)z;
        } else {
            rnb_i64 r = t - rows * cols;
            for (rnb_i64 s = 0; s < m; ++s) z += d[s * rows + r];
            db[r] = (float)z;
        }
    }
}

extern "C" __global__ void rnb_se_pool_grad(const double* dh, const float* w1, double* dz, rnb_i64 n, rnb_i64 hw,
                                            rnb_i64 c, rnb_i64 cs) {
    RNB_SE_LOOP(t, n * c) {
        rnb_i64 s = t / c, k = t % c;
        double z = 0.0;
        for (rnb_i64 j = 0; j < cs; ++j) z += dh[s * cs + j] * (double)w1[j * c + k];
        dz[t] = z / (double)hw;
    }
}

extern "C" __global__ void rnb_se_dx(const float* dy, const float* scale, const double* dz, float* dx, rnb_i64 total,
                                     rnb_i64 hwc, rnb_i64 c) {
    RNB_SE_LOOP(t, total) {
        rnb_i64 g = (t / hwc) * c + t % c;
        dx[t] = (float)((double)dy[t] * (double)scale[g] + dz[g]);
    }
}
'''


def _i64(*values: int) -> list[np.int64]:
    return [np.int64(v) for v in values]


def launch_fwd(outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Any:
    from ..gpu.base import launch_grid, sequence
    (x, w1, b1, w2, b2), (y, pooled, hidden, scale, _sums) = ins, outs  # the sums stay in registers
    (n, c), cs = pooled.shape, hidden.shape[1]
    hw = x.size // (n * c)
    return sequence(launch_grid(env, "rnb_se_pool", n * c, x, pooled, *_i64(n, hw, c)),
                    launch_grid(env, "rnb_se_hidden", n * cs, pooled, w1, b1, hidden, *_i64(n, c, cs)),
                    launch_grid(env, "rnb_se_scale", n * c, hidden, w2, b2, scale, *_i64(n, c, cs)),
                    launch_grid(env, "rnb_se_mul", x.size, x, scale, y, *_i64(x.size, hw * c, c)))


def launch_bwd(outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Any:
    from ..gpu.base import launch_grid, sequence
    (dy, x, w1, w2, pooled, hidden, scale) = ins
    dw1, db1, dw2, db2 = outs[:4]
    dz, dh = outs[-2:]
    (n, c), cs = dz.shape, dh.shape[1]
    hw = x.size // (n * c)
    parts = [launch_grid(env, "rnb_se_gate_grad", n * c, dy, x, scale, dz, *_i64(n, hw, c)),
             launch_grid(env, "rnb_se_hidden_grad", n * cs, dz, w2, hidden, dh, *_i64(n, c, cs)),
             launch_grid(env, "rnb_se_weight_grad", c * (cs + 1), dz, hidden, dw2, db2, *_i64(n, c, cs)),
             launch_grid(env, "rnb_se_weight_grad", cs * (c + 1), dh, pooled, dw1, db1, *_i64(n, cs, c))]
    if p["need_dx"]:
        parts += [launch_grid(env, "rnb_se_pool_grad", n * c, dh, w1, dz, *_i64(n, hw, c, cs)),
                  launch_grid(env, "rnb_se_dx", x.size, dy, scale, dz, outs[4], *_i64(x.size, hw * c, c))]
    return sequence(*parts)


# ---- the op ---------------------------------------------------------------------------------------------
@register
class SqueezeExcitation(Op):
    kind = "se"
    builders = (se,)
    torch_modules = ("SqueezeExcitation",)
    parametrized = True
    cpu_kernels = {"se_fwd": bind_fwd, "se_bwd": bind_bwd}
    gpu_kernels = {"se_fwd": launch_fwd, "se_bwd": launch_bwd}
    cuda_source = CUDA

    def tensors(self, ctx: Any, idx: int, layer: Any, ins: list[tuple[int, ...]]) -> tuple[int, ...]:
        x = ins[0]
        needs_image(layer, x, "put se() on convolution features (N, C, H, W), before gap() or flatten()")
        t, n, b, c = ctx.t, layer.name, ctx.batch, x[-1]
        cs = squeeze_channels(layer.p, c)
        # parameter layer "se1.fc1", role "weight": named se1.fc1.weight, and initialised as a weight
        ctx.param(f"{n}.fc1", "weight", (cs, 1, 1, c), "FC_WEIGHT", c, "uniform")
        ctx.param(f"{n}.fc1", "bias", (cs,), "FC_BIAS", c, "uniform")
        ctx.param(f"{n}.fc2", "weight", (c, 1, 1, cs), "FC_WEIGHT", cs, "uniform")
        ctx.param(f"{n}.fc2", "bias", (c,), "FC_BIAS", cs, "uniform")
        for role, width in zip(SAVED, (c, cs, c)):
            t.add(f"{n}.{role}", (b, width), "float32", Region.F_FEATURE_FP32)
        t.add(f"{n}.sums", (b, c), "float64", Region.T_TEMP_FP32)
        t.add(f"{n}.dz", (b, c), "float64", Region.T_TEMP_FP32)
        t.add(f"{n}.dh", (b, cs), "float64", Region.T_TEMP_FP32)
        return x

    def forward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, training: bool,
                ema: bool) -> None:
        n, ids = layer.name, e.ids
        ins = [xs[0]] + [e.weight(layer, r, ema) for r in WEIGHTS]
        e.emit(g, gid, "se_fwd", ins, [y] + [ids[f"{n}.{r}"] for r in (*SAVED, "sums")], n, scratch=("sums",))

    def backward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, dy: int,
                 dxs: list[int | None]) -> None:
        n, ids, dx = layer.name, e.ids, dxs[0]
        ins = [dy, xs[0], ids[f"{n}.fc1.weight"], ids[f"{n}.fc2.weight"]] + [ids[f"{n}.{r}"] for r in SAVED]
        grads = [ids[f"{n}.{r}@grad"] for r in WEIGHTS]
        e.emit(g, gid, "se_bwd", ins, grads + ([dx] if dx is not None else []) + [ids[f"{n}.dz"], ids[f"{n}.dh"]], n,
               need_dx=dx is not None, scratch=("dz", "dh"))

    def onnx(self, g: Any, layer: Any, xs: list[str], out: str) -> str:
        """torchvision's own graph: the input is NCHW, so the 1x1 convolutions' weights go as they are."""
        n = layer.name
        h = g.node("GlobalAveragePool", [xs[0]], f"{out}.pooled")
        h = g.node("Conv", [h, g.weight(f"{n}.fc1", "weight"), g.weight(f"{n}.fc1", "bias")], f"{out}.fc1")
        h = g.node("Relu", [h], f"{out}.hidden")
        h = g.node("Conv", [h, g.weight(f"{n}.fc2", "weight"), g.weight(f"{n}.fc2", "bias")], f"{out}.fc2")
        return g.node("Mul", [xs[0], g.node("Sigmoid", [h], f"{out}.scale")], out)

    def from_torch(self, m: Any) -> dict[str, Any]:
        acts = (type(m.activation).__name__, type(m.scale_activation).__name__)
        if acts != ("ReLU", "Sigmoid"):
            raise Refused(f"activation={acts[0]}, scale_activation={acts[1]} (only ReLU and Sigmoid, "
                          "torchvision's defaults, are what se() computes)")
        for fc in (m.fc1, m.fc2):
            if (square(fc.kernel_size, "kernel_size"), square(fc.stride, "stride"), square(fc.padding, "padding"),
                    fc.groups, fc.bias is None) != (1, 1, 0, 1, False):
                raise Refused("its fc1/fc2 are not 1x1 convolutions with a bias (torchvision's are)")
        if square(m.avgpool.output_size, "output_size") != 1:
            raise Refused(f"avgpool output_size={m.avgpool.output_size!r} (only a global average pool is)")
        return {"layer": "se", "params": {"squeeze": m.fc1.out_channels}}

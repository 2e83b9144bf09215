"""Mixed precision's GPU kernels (compiler/autocast.py): the CUDA twins of kernels/amp.py and kernels/fc_lowp.py.

``cast``, ``amp_unscale`` and ``amp_update_scale`` are kernels of gpu/src/rnb_amp.cu, whose conversions
are integer bit operations giving kernels/lowp.c's bytes (round to nearest even, lowp.c's NaN rule).
``fc_fwd_lowp`` / ``fc_bwd_lowp`` multiply the 16-bit operands with cublasGemmEx (CUDA_R_16BF or
CUDA_R_16F, CUBLAS_COMPUTE_32F) into the fp32 scratch the graph plans (``sums``, ``grads``, ``work``),
apply the fp32 bias and activation there and round once, as the CPU kernels do. On the device a bf16
tensor is viewed as uint16 (its bytes: CuPy has no bfloat16 arrays); float16 is itself.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..errors import DeviceError, PlanError
from ..kernels.base import registrar
from ..kernels.operands import ACT_CODES, split_scratch
from .base import Launch, launch_grid, launch_single, sequence

AMP_GPU_KERNELS: dict[str, Callable[..., Launch]] = {}
gpu_kernel = registrar(AMP_GPU_KERNELS)
FORMAT = {"float32": 0, "bfloat16": 1, "uint16": 1, "float16": 2}
"""rnb_amp.cu's formats by dtype name (lowp.py's CODE): the arena holds no other uint16 tensor."""
VIA = {None: 0, "bfloat16": 1, "float16": 2}


def format_of(a: Any) -> int:
    name = str(a.dtype)
    if name not in FORMAT:
        raise DeviceError(f"cast: a {name} tensor of shape {a.shape}; the GPU casts float32, bf16 (uint16 bytes) "
                          "and float16. Fix: cast only the tensors compiler/autocast.py plans.")
    return FORMAT[name]


def block(a: Any) -> tuple[int, int, int]:
    """(rows, cols, row stride in elements) of a tensor read as rows: a contiguous one by its last axis, a
    2-D one with padded rows (W, G, A) by its row pitch."""
    if a.flags.c_contiguous:
        cols = a.shape[-1] if a.ndim else 1
        return (a.size // cols if cols else 0), cols, cols
    if a.ndim == 2 and (a.shape[1] <= 1 or a.strides[1] == a.itemsize) and a.strides[0] % a.itemsize == 0:
        return a.shape[0], a.shape[1], a.strides[0] // a.itemsize
    raise DeviceError(f"cast: a view of shape {a.shape} with strides {a.strides} is neither contiguous nor rows "
                      "of a padded matrix. Fix: cast arena tensors (tensor_view), not other slices.")


def cast_launch(env: Any, src: Any, dst: Any, via: str | None = None, scale: Any = None) -> Launch:
    """dst = src converted (times scale[0] first, through ``via`` and back when given)."""
    (rows, cols, lds), (r2, c2, ldd) = block(src), block(dst)
    if (rows, cols) != (r2, c2):
        raise DeviceError(f"cast: {src.shape} -> {dst.shape}: the shapes differ. Fix: cast a tensor into its copy.")
    if rows * cols == 0:
        return lambda stream: None
    return launch_grid(env, "rnb_cast", rows * cols, src, np.int32(format_of(src)), np.int64(lds), dst,
                       np.int32(format_of(dst)), np.int64(ldd), np.int64(rows), np.int64(cols),
                       np.int32(VIA[via]), src if scale is None else scale, np.int32(scale is not None))


@gpu_kernel("cast")
def cast(outs, ins, p, env):  # type: ignore[no-untyped-def]
    """kernels/amp.py's cast: y = x in y's dtype, rounded to nearest even; ``via``; a scale input."""
    return cast_launch(env, ins[0], outs[0], p.get("via"), ins[1] if len(ins) > 1 else None)


@gpu_kernel("amp_unscale")
def amp_unscale(outs, ins, p, env):  # type: ignore[no-untyped-def]
    """GradScaler.unscale_: the fp32 G range times 1/scale (the NaN check after it finds what overflowed)."""
    (scale,) = ins
    grads = env.range_view(p["first"], p["last"], "float32")
    return launch_grid(env, "rnb_amp_unscale", grads.size, grads, np.int64(grads.size), scale)


@gpu_kernel("amp_update_scale")
def amp_update_scale(outs, ins, p, env):  # type: ignore[no-untyped-def]
    """GradScaler.update from the NaN check's flag: backoff on an overflow, growth after ``interval`` clean steps."""
    (flag,), (scale, count) = ins, outs
    return launch_single(env, "rnb_amp_update_scale", flag, scale, count, np.float32(p["growth"]),
                         np.float32(p["backoff"]), np.int64(p["interval"]))


def _act(p: dict, op: str) -> int:
    act = ACT_CODES[p.get("act", "none")]
    if act > 4:
        raise PlanError(f"{op}: activation {p['act']!r} is not fused into fc (the compiler keeps it separate).")
    return act


@gpu_kernel("fc_fwd_lowp")
def fc_fwd_lowp(outs, ins, p, env):  # type: ignore[no-untyped-def]
    """sums = x W^T by GemmEx (16-bit operands, fp32 sums), then y = round(act(sums + b)) in one kernel."""
    (y,), scratch = split_scratch(outs, p)
    w = ins[1]
    out, fan_in = w.shape
    x, y2, sums = ins[0].reshape(-1, fan_in), y.reshape(-1, out), scratch["sums"].reshape(-1, out)
    b = ins[2] if len(ins) > 2 else None
    rows, cols, lds = block(sums)
    _, _, ldy = block(y2)
    return sequence(env.gemm.bind(sums, x, w.T),
                    launch_grid(env, "rnb_lowp_bias_act", rows * cols, sums, np.int64(lds),
                                sums if b is None else b, np.int32(b is not None), np.int32(_act(p, "fc_fwd_lowp")),
                                np.float64(p.get("slope", 0.0)), y2, np.int32(format_of(y2)), np.int64(ldy),
                                np.int64(rows), np.int64(cols)))


@gpu_kernel("fc_bwd_lowp")
def fc_bwd_lowp(outs, ins, p, env):  # type: ignore[no-untyped-def]
    """dz = dy * act'(y) in fp32 (``grads``), rounded back into dy; db = 1^T dz (SGEMM); dW = round(dy^T x) and
    dx = round(dy W) by GemmEx into the fp32 ``work`` scratch, each rounded by a cast."""
    dy, x, w, y, ones = ins[:5]
    rest, scratch = split_scratch(outs, p)
    dw = rest.pop(0)
    db = rest.pop(0) if p["bias"] else None
    out, fan_in = w.shape
    dx = rest.pop(0).reshape(-1, fan_in) if p["need_dx"] else None
    dy2, x2, y2 = dy.reshape(-1, out), x.reshape(-1, fan_in), y.reshape(-1, out)
    act = _act(p, "fc_bwd_lowp")
    work = scratch["work"].reshape(-1)
    parts: list[Launch] = []
    if act or db is not None:
        dz = scratch["grads"].reshape(-1, out)
        (rows, cols, ld_dy), ld_y, ld_dz = block(dy2), block(y2)[2], block(dz)[2]
        parts.append(launch_grid(env, "rnb_lowp_act_grad", rows * cols, dy2, np.int32(format_of(dy2)),
                                 np.int64(ld_dy), y2, np.int64(ld_y), dz, np.int64(ld_dz), np.int64(rows),
                                 np.int64(cols), np.int32(act), np.float64(p["slope"])))
        if db is not None:
            parts.append(env.gemm.bind(db.reshape(1, -1), ones.reshape(1, -1), dz))
    for c, a, b in ((dw, dy2.T, x2), (dx, dy2, w)):
        if c is None:
            continue
        sums = work[: c.shape[0] * c.shape[1]].reshape(c.shape)
        parts += [env.gemm.bind(sums, a, b), cast_launch(env, sums, c)]
    return sequence(*parts)

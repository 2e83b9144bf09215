"""GPU kernels of image models: conv, batch norm, max and average pooling, global average pooling,
flatten, and image batch transfers: IMAGE_GPU_KERNELS, joined into GPU_KERNELS by kernels.py.

The factories check shapes with the CPU table's own helpers (kernels/operands.py), so a plan the
CPU backend rejects is rejected here with the same message. Convolutions are im2col + one
cuBLAS product (the CPU's formulation); the CUDA side is gpu/src/rnb_image.cu.

Image batches are gathered, resized, cropped and flipped on the host by the CPU backend's own
numba kernel (the same Philox draws), into page-locked staging, before the graph that copies
them up is launched; the copy and the cursor advance run inside the graph.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..errors import PlanError
from ..kernels.base import registrar
from ..kernels.operands import (bn_bwd_operands, bn_fwd_operands, check_shape, conv_bwd_operands, conv_columns,
                                conv_geometry, pool_geometry, pool_grad_operands, pool_operands, relu_code,
                                remakes_columns, rows, split_scratch)
from ..kernels.transfer import transfer_image as cpu_transfer_image
from .base import GpuBindEnv, Launch, launch_grid, launch_single, sequence

IMAGE_GPU_KERNELS: dict[str, Callable[..., Launch]] = {}
"""This module's kernels: conv, batch norm, pooling, flatten's layout and image batch transfers."""
gpu_kernel = registrar(IMAGE_GPU_KERNELS)

REDUCE_SLICES = 256
"""Per-channel sums over all rows run as (slice, channel) partial sums, then an in-order sum of the
slices: enough threads to fill the GPU at batch 128 without float atomics (deterministic)."""


def _i32(*xs: int) -> tuple[np.int32, ...]:
    return tuple(np.int32(x) for x in xs)


def _slices(m: int) -> int:
    return max(1, min(REDUCE_SLICES, m))


def _scratch(env: GpuBindEnv, shape: tuple, dtype: Any) -> Any:
    if env.scratch is None:
        raise PlanError("GPU image kernels need bind-time scratch memory (GpuBindEnv.scratch).")
    return env.scratch(shape, dtype)


# ---- convolution -------------------------------------------------------------------------------
@gpu_kernel("conv_fwd")
def conv_fwd(outs, ins, p, env):
    """im2col, one cuBLAS product into y, then bias+ReLU (the fc kernel's epilogue); im2col and product
    a scratch-full of images at a time where cols holds the tiles the plan gives, not every image."""
    k, s, pad = int(p["k"]), int(p.get("s", 1)), int(p.get("p", 0))
    x, w = ins[0], ins[1]
    has_b = bool(p.get("bias", False))
    act = relu_code("conv_fwd", p)
    n, h, wd, cin, cout, ho, wo = conv_geometry("conv_fwd", x, w, k, s, pad)
    y = outs[0]
    check_shape("conv_fwd", "y", y.shape, (n, ho, wo, cout))
    m = n * ho * wo
    y2, wt = y.reshape(m, cout), w.reshape(cout, -1).T
    if k == 1 and s == 1 and pad == 0:
        parts = [env.gemm.bind(y2, x.reshape(m, cin), wt)]
    else:
        if len(outs) < 2:
            raise PlanError(f"conv_fwd: a {k}x{k} convolution needs the im2col buffer 'cols' as its second output.")
        cols, tile = conv_columns("conv_fwd", "cols", outs[1], n, ho * wo, k * k * cin)
        parts = []
        for b0, b1, c in _tiles(cols, n, tile, ho * wo):
            parts += [_im2col(env, x[b0:b1], c, k, s, pad, ho, wo), env.gemm.bind(y2[b0 * ho * wo:b1 * ho * wo], c, wt)]
    if has_b or act:
        b = ins[2] if has_b else y2
        parts.append(launch_grid(env, "rnb_bias_act", m * cout, y2, b, *_i32(m, cout, has_b, act), np.float64(0.0)))
    return sequence(*parts)


def _tiles(cols: Any, n: int, tile: int, per: int) -> list[tuple[int, int, Any]]:
    """(first image, end image, its columns' rows of cols) for each scratch-full of ``tile`` images."""
    return [(b0, min(n, b0 + tile), cols[:(min(n, b0 + tile) - b0) * per]) for b0 in range(0, n, tile)]


def _im2col(env: GpuBindEnv, x: Any, cols: Any, k: int, s: int, pad: int, ho: int, wo: int) -> Launch:
    n, h, wd, cin = x.shape
    return launch_grid(env, "rnb_im2col", cols.size, x, cols, *_i32(n, h, wd, cin, k, s, pad, ho, wo))


@gpu_kernel("conv_bwd")
def conv_bwd(outs, ins, p, env):
    """dy *= (y > 0) and db = column sums (two deterministic passes); dW = dy^T cols; dcols = dy W;
    dx = col2im(dcols) as a gather. Where the columns are made again (remakes_columns: the plan's tiles),
    a scratch-full of images at a time, each one's dW product added to the first's; dcols may be the
    same buffer (bwd_cols): dy W overwrites a tile's columns after its dW product read them."""
    o = conv_bwd_operands(outs, ins, p)
    n, h, wd, cin, cout, ho, wo = o.geometry
    m, per = o.dy2.shape[0], ho * wo
    parts: list[Launch] = []
    if o.act or o.db is not None:
        sl = _slices(m)
        part = _scratch(env, (sl, cout), np.float64)
        parts.append(launch_grid(env, "rnb_colsum_part", sl * cout, o.dy2, o.y2, np.int64(m), *_i32(cout, sl, o.act),
                                 part))
        if o.db is not None:
            parts.append(launch_grid(env, "rnb_colsum_final", cout, part, *_i32(cout, sl), o.db))
    if not remakes_columns(o, cin):  # the forward's whole matrix (or x itself, 1x1): one product each
        parts.append(env.gemm.bind(o.dw2, o.dy2.T, o.cols))
        if o.dx2 is not None:
            parts.append(env.gemm.bind(o.dx2, o.dy2, o.wmat))
        elif o.dcols is not None:
            parts += [env.gemm.bind(o.dcols, o.dy2, o.wmat),
                      launch_grid(env, "rnb_col2im", o.dx.size, o.dcols, o.dx,
                                  *_i32(n, h, wd, cin, o.k, o.s, o.pad, ho, wo))]
        return sequence(*parts)
    x, tiles = ins[1], _tiles(o.cols, n, o.tile, per)
    dw_part = split_scratch(outs, p)[1].get("dw_partials")
    acc = (None if len(tiles) == 1 else dw_part.reshape(-1)[:o.dw2.size].reshape(o.dw2.shape) if dw_part is not None
           else _scratch(env, o.dw2.shape, np.float32))
    for i, (b0, b1, c) in enumerate(tiles):
        dyt = o.dy2[b0 * per:b1 * per]
        parts += [_im2col(env, x[b0:b1], c, o.k, o.s, o.pad, ho, wo), env.gemm.bind(o.dw2 if i == 0 else acc, dyt.T, c)]
        if i > 0:
            parts.append(env.ops.add(o.dw2, acc, o.dw2))
        if o.dcols is not None:
            dc = o.dcols[:c.shape[0]]
            parts += [env.gemm.bind(dc, dyt, o.wmat),
                      launch_grid(env, "rnb_col2im", (b1 - b0) * h * wd * cin, dc, o.dx[b0:b1],
                                  *_i32(b1 - b0, h, wd, cin, o.k, o.s, o.pad, ho, wo))]
    return sequence(*parts)


# ---- batch norm --------------------------------------------------------------------------------
@gpu_kernel("bn_fwd")
def bn_fwd(outs, ins, p, env):
    """Statistics (two passes, float64), running stats and the per-channel affine, then y = act(x*a + b)."""
    x2, gamma, beta, y2, mean, invstd, rmean, rvar, momentum, eps, act = bn_fwd_operands(outs, ins, p)
    m, c = x2.shape
    sl = _slices(m)
    planned = split_scratch(outs, p)[1].get("affine")  # the plan's, which a max pool may read (no y: bn_fwd_operands)
    aff = planned if planned is not None else _scratch(env, (2, c), np.float32)
    part = _scratch(env, (sl, 2, c), np.float64)
    stats = (launch_grid(env, "rnb_bn_stats_part", sl * c, x2, np.int64(m), *_i32(c, sl), part),
             launch_grid(env, "rnb_bn_stats_final", c, part, x2, gamma, beta, np.int64(m), *_i32(c, sl),
                         np.float64(momentum), np.float64(eps), mean, invstd, rmean, rvar, aff))
    if y2 is None:
        return sequence(*stats)
    return sequence(*stats, launch_grid(env, "rnb_channel_affine", m * c, x2, y2, aff[0], aff[1], np.int64(m),
                                        *_i32(c, act)))


@gpu_kernel("bn_bwd")
def bn_bwd(outs, ins, p, env):
    """The gradient sums (float64 per slice), dgamma, dbeta, dx; with dy_pool (operands.PooledGrad) dy is first
    written into dx by the pool's backward (relu=True) and the passes read and overwrite it in place."""
    dy2, x2, y2, gamma, mean, invstd, dx2, dgamma, dbeta, act, pooled = bn_bwd_operands(outs, ins, p)
    m, c = x2.shape
    sl = _slices(m)
    part, aff = _scratch(env, (sl, 2, c), np.float64), _scratch(env, (3, c), np.float64)
    first = []
    if pooled is not None:
        first = [maxpool_bwd([outs[0]], *pooled.pool_backward(), env)]
        dy2 = y2 = dx2
    return sequence(
        *first,
        launch_grid(env, "rnb_bn_grad_part", sl * c, dy2, x2, y2, mean, np.int64(m), *_i32(c, sl, act), part),
        launch_grid(env, "rnb_bn_grad_final", c, part, gamma, invstd, np.int64(m), *_i32(c, sl), dgamma, dbeta, aff),
        launch_grid(env, "rnb_bn_dx", m * c, dy2, x2, mean, aff, dx2, np.int64(m), np.int32(c)))


@gpu_kernel("bn_fold")
def bn_fold(outs, ins, p, env):
    gamma, beta, rmean, rvar = ins
    scale, bias = outs
    c = gamma.shape[0]
    return launch_grid(env, "rnb_bn_fold", c, gamma, beta, rmean, rvar, np.float64(p.get("eps", 1e-5)), np.int32(c),
                       scale, bias)


@gpu_kernel("bn_inf")
def bn_inf(outs, ins, p, env):
    x, scale, bias = ins
    (y,) = outs
    check_shape("bn_inf", "y", y.shape, x.shape)
    x2, y2 = rows(x), rows(y)
    m, c = x2.shape
    return launch_grid(env, "rnb_channel_affine", m * c, x2, y2, scale, bias, np.int64(m),
                       *_i32(c, relu_code("bn_inf", p)))


# ---- pooling -----------------------------------------------------------------------------------
def _pool_args(op: str, image: Any, pooled: Any, p: dict) -> tuple[tuple[np.int32, ...], int]:
    """(n, h, w, c, k, s, pad, ho, wo) as kernel arguments, checked as the CPU checks them; and k."""
    k, s, pad = pool_geometry(op, image, pooled, p)
    n, h, w, c = image.shape
    return _i32(n, h, w, c, k, s, pad, pooled.shape[1], pooled.shape[2]), k


@gpu_kernel("maxpool_fwd")
def maxpool_fwd(outs, ins, p, env):
    x, aff = pool_operands("maxpool_fwd", ins, p)
    y, am = outs
    geo, _ = _pool_args("maxpool_fwd", x, y, p)
    check_shape("maxpool_fwd", "argmax", am.shape, y.shape)
    return launch_grid(env, "rnb_maxpool_fwd", y.size, x, x if aff is None else aff, y, am, *geo,
                       *_i32(aff is not None))


@gpu_kernel("maxpool_bwd")
def maxpool_bwd(outs, ins, p, env):
    dy, am, py = pool_grad_operands("maxpool_bwd", ins, p)
    (dx,) = outs
    geo, _ = _pool_args("maxpool_bwd", dx, dy, p)
    relu = int(bool(p.get("relu", False)))  # py is dy itself, unread, without
    return launch_grid(env, "rnb_maxpool_bwd", dx.size, dy, am, py, dx, *geo, *_i32(relu))


@gpu_kernel("avgpool_fwd")
def avgpool_fwd(outs, ins, p, env):
    (x,), (y,) = ins, outs
    geo, k = _pool_args("avgpool_fwd", x, y, p)
    return launch_grid(env, "rnb_avgpool_fwd", y.size, x, y, *geo, np.float32(k * k))


@gpu_kernel("avgpool_bwd")
def avgpool_bwd(outs, ins, p, env):
    (dy,), (dx,) = ins, outs
    geo, k = _pool_args("avgpool_bwd", dx, dy, p)
    return launch_grid(env, "rnb_avgpool_bwd", dx.size, dy, dx, *geo, np.float32(k * k))


@gpu_kernel("gap_fwd")
def gap_fwd(outs, ins, p, env):
    (x,), (y,) = ins, outs
    n, h, w, c = x.shape
    check_shape("gap_fwd", "y", y.shape, (n, c))
    return launch_grid(env, "rnb_gap_fwd", y.size, x, y, *_i32(n, h * w, c), np.float32(h * w))


@gpu_kernel("gap_bwd")
def gap_bwd(outs, ins, p, env):
    (dy,), (dx,) = ins, outs
    n, h, w, c = dx.shape
    check_shape("gap_bwd", "dy", dy.shape, (n, c))
    return launch_grid(env, "rnb_gap_bwd", dx.size, dy, dx, *_i32(n, h * w, c), np.float32(h * w))


def flatten_copy(env: GpuBindEnv, src: Any, dst: Any) -> Launch:
    """flatten of (N, H, W, C) features in PyTorch's (C, H, W) order, or its gradient back."""
    if src.ndim == 4 and dst.ndim == 2:
        n, h, w, c = src.shape
        return launch_grid(env, "rnb_nhwc_to_nchw", src.size, src, dst, *_i32(n, h, w, c, 1))
    n, h, w, c = dst.shape
    return launch_grid(env, "rnb_nhwc_to_nchw", dst.size, src, dst, *_i32(n, h, w, c, 0))


# ---- image batches -----------------------------------------------------------------------------
@gpu_kernel("transfer_image")
def transfer_image(outs, ins, p, env):
    """The CPU backend's transfer_image into pinned staging (``prepare``, on the host, before the
    graph launch: same rows, same resize, same Philox crops and flips), then in the graph the
    copies up and the device cursor's advance."""
    cursor = ins[0]
    x_out, y_out = split_scratch(outs, p)[0]  # the CPU's prefetch claim tensor is not used here
    if env.cpu_env is None or p.get("source") not in env.cpu_env.sources:
        def missing(stream: Any) -> None:
            raise PlanError(f"transfer_image: no {p.get('source')!r} data was given to the task. Fix: pass "
                            f"{p.get('source')} data to .data().")
        missing.unavailable = True  # type: ignore[attr-defined]
        return missing
    sx, sy = env.pinned(x_out.shape, np.float32), env.pinned(y_out.shape, np.int32)
    host_ins = [env.host_twin(v) for v in ins]
    host_p = {k: v for k, v in p.items() if k != "scratch"}  # the staging buffers carry no claim tensor
    gather = cpu_transfer_image([sx, sy], host_ins, host_p, env.cpu_env)
    launch = sequence(env.ops.h2d(x_out, sx), env.ops.h2d(y_out, sy),
                      launch_single(env, "rnb_advance", cursor, np.int64(y_out.shape[0])))
    launch.prepare = gather  # type: ignore[attr-defined]
    return launch


@gpu_kernel("transfer_image_async")
def transfer_image_async(outs, ins, p, env):
    """The CPU backend's background gather is the same transfer here: the host gathers before the
    graph launch and the copy overlaps the step on the TRANS stream."""
    return transfer_image(outs, ins, p, env)


@gpu_kernel("transfer_wait")
def transfer_wait(outs, ins, p, env):
    """Nothing to wait for inside a graph: the stream order already puts the copy first."""
    return lambda stream: None

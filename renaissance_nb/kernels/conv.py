"""Convolution, batch-norm and pooling CPU kernels: the factories of CONV_KERNELS (joined into
``cpu.KERNELS``); their numba loops are in conv_loops.py.

Layout decision
---------------
Feature maps are channels-last NHWC: ``(N, H, W, C)``, float32 in training (every
kernel also runs on float64 arrays: the numba loops take the arrays' dtype, which
the finite-difference tests rely on). Why channels-last on this CPU:

* Every convolution is ONE GEMM. ``im2col`` writes, for every output pixel of every
  image, the row ``x[n, ih0:ih0+k, iw0:iw0+k, :]`` flattened in (kh, kw, Cin) order
  into a preallocated ``cols`` view of shape ``(N*Ho*Wo, k*k*Cin)``: the batch folds
  into the GEMM's M dimension, so OpenBLAS sees one big well-shaped product per layer
  instead of N small ones. (The plan gives a convolution of Cin > 1 the rows of a few
  images' tiles only, operands.conv_scratch_shape; the kernels walk the batch through them.) With NHWC each kernel row of a patch (``k`` neighbouring
  pixels times all channels) is ONE contiguous run in ``x`` and in ``cols``, so
  im2col / col2im are ``k`` straight memcpy-like loops per output pixel.
* The weight is stored ``(Cout, kh, kw, Cin)``, so ``Wmat = w.reshape(Cout, -1)``
  matches the column order, and the GEMM ``y.reshape(N*Ho*Wo, Cout) = cols @ Wmat.T``
  writes the NHWC output directly: no transposes anywhere, forward or backward.
* Backward: ``dW = dy2d.T @ cols`` (one GEMM whose inner dimension is the whole
  batch), ``db`` = column sums, ``dcols = dy2d @ Wmat`` (one GEMM) and
  ``dx = col2im(dcols)`` (zero, then scatter-add of contiguous runs).
* 1x1 / stride-1 / unpadded convolutions skip im2col: ``x.reshape(N*H*W, Cin)`` is
  already the column matrix (and ``dx`` comes straight out of the dcols GEMM).
* 3x3, stride-1, padding-1 convolutions of at least 16 channels in and out (32 at some odd sizes:
  winograd.min_channels) run by Winograd's F(4x4, 3x3) from 7x7 maps up, else F(2x2, 3x3) instead
  (winograd.py: 36 multiplications for 16 outputs, or 16 for 4, instead of 9 each), forward, weight
  and input gradient, in the same column scratch; where F(4x4, 3x3) does not fit, F(2x2, 3x3), and
  where that does not, im2col.
* One input channel (a grayscale first layer) makes a patch row k scalars, too short for
  the per-pixel loops: there im2col is k*k strided copies, one per tap (4x faster).
* Batch norm, ReLU and pooling run over contiguous channel vectors (the inner loop
  is over C with per-channel constants), which vectorises.

Zero padding ``p``, stride ``s``, square kernel ``k``: ``Ho = (H + 2p - k)//s + 1``.
Max pooling pads with -inf; 2x2/stride-2 windows (the common case) have their own forward
and a one-pass backward (they do not overlap, so no zeroing and no scatter). Average
pooling counts the padding (PyTorch's default ``count_include_pad=True``).
The max-pool ``argmax`` stores, per output element,
the spatial index ``ih*W + iw`` of the max inside its sample (its channel is the
output's own), first max in row-major window order, NaN propagating, as PyTorch.

Closures allocate nothing: GEMMs write into arena views (kernels/blas.py),
the rest are numba loops. Batch-norm statistics and bias/BN reductions accumulate
in float64; the per-channel accumulators they need (the sums, PAR_CHUNKS + 1 rows of 2*C, and the
coefficients) are the layer's scratch tensors in the arena (compiler/layers.py BN_SCRATCH),
never allocated per step; a hand-built node without them gets buffers the bind environment
lists. Where the products run on numba's threads (kernels/blas.py), im2col, col2im, pooling and batch norm are bound to their conv_par.py variants, which split the
same loops by images or rows.
"""
from __future__ import annotations

import numpy as np

from ..errors import PlanError
from . import conv_native, conv_par, conv_tiled, fused, program, winograd
from .base import EMPTY_F32, BindEnv, Factory, Kernel, registrar
from .blas import THREADED, gemm, pass_threads
from .conv_loops import (avgpool_bwd_, avgpool_fwd_, bn_fold_, bn_inf_, bn_train_bwd_, bn_train_fwd_, bn_train_stats_,
                         col2im_, gap_bwd_, gap_fwd_, im2col_, im2col_taps_, maxpool2_bwd_, maxpool2_fwd_,
                         maxpool_bwd_, maxpool_fwd_)
from .conv_loops import bn_grad_sums_, bn_shifted_sums_  # noqa: F401 - tests reach every loop through conv
from .operands import (ConvBwd, bn_bwd_operands, bn_fwd_operands, check_shape, conv_bwd_operands, conv_columns,
                       conv_geometry, pool_geometry, pool_grad_operands, pool_operands, relu_code, remakes_columns,
                       rows, split_scratch)
from .passes import act_grad_colsum_pass, bias_act_pass, bias_partials

CONV_KERNELS: dict[str, Factory] = {}
"""This module's kernels: conv, batch norm, pooling, global average pooling."""
kernel = registrar(CONV_KERNELS)


# ---- convolution -------------------------------------------------------------------------------
def _tap_span(i: int, size: int, out: int, s: int, p: int) -> tuple[int, int]:
    """Outputs o whose tap i lands inside the input: 0 <= o*s - p + i < size, as [lo, hi)."""
    lo = min(out, max(0, -(-(p - i) // s)))
    return lo, max(lo, min(out, (size - 1 + p - i) // s + 1))


def tap_major(cols: np.ndarray) -> np.ndarray:
    """The (M, k*k) columns of a one-channel convolution as the products read them: the cols
    region holds them tap-major, (k*k, M) (im2col_one_channel), so this is a transposed view."""
    m, kk = cols.shape
    if not cols.flags.c_contiguous:
        raise PlanError(f"conv: the im2col buffer of a one-channel convolution must be one contiguous block, got "
                        f"strides {cols.strides} for shape {cols.shape}. Fix: give it a region of its own.")
    return cols.reshape(-1).reshape(kk, m).T


def im2col_one_channel(x: np.ndarray, cols: np.ndarray, k: int, s: int, p: int, ho: int, wo: int) -> Kernel:
    """im2col for Cin = 1 (grayscale first layers), written tap-major into cols' memory (read it
    through tap_major(cols)). With one channel a patch row is k scalars, too short for im2col_'s
    per-pixel loops; tap-major, each tap of an output row is one contiguous copy. For the conv
    net's 128x28x28 batch (3x3, padding 1) it took 0.85 ms against 2.66 ms for the k*k strided
    NumPy copies into (M, k*k) it replaced, caches evicted before each; the products read the
    transposed operand as fast (forward 1.07 against 1.05 ms, weight gradient 2.3 against 2.0)."""
    n, h, w, _ = x.shape
    x3, cols_t = x.reshape(n, h, w), tap_major(cols).T
    spans = np.array([_tap_span(i, h, ho, s, p) + _tap_span(j, w, wo, s, p) for i in range(k) for j in range(k)],
                     np.int64)
    bound = conv_native.bind_im2col_taps(x3, cols_t, spans, k, s, p, ho, wo, pass_threads(THREADED))
    if bound is not None:
        return bound
    if THREADED:
        fp = conv_par.im2col_taps_par_
        return lambda: fp(x3, cols_t, spans, k, s, p, ho, wo)
    f = im2col_taps_
    return lambda: f(x3, cols_t, spans, k, s, p, ho, wo, 0, n)


def patch_pass(x3: np.ndarray, cols: np.ndarray, c: int, k: int, s: int, p: int, ho: int, wo: int,
               to_cols: bool) -> Kernel:
    """im2col (x3 -> cols) or, with to_cols=False, col2im (cols -> x3) as a bound kernel; by
    blocks of images on numba's threads when the products use that pool (conv_par.py); C where the plan
    binds C (conv_native.py)."""
    bound = conv_native.bind_patches(x3, cols, c, k, s, p, ho, wo, to_cols, pass_threads(THREADED))
    if bound is not None:
        return bound
    if THREADED:
        fp = conv_par.patches_par_
        return lambda: fp(x3, cols, c, k, s, p, ho, wo, to_cols)
    if to_cols:
        f = im2col_
        return lambda: f(x3, cols, c, k, s, p, ho, wo)
    g = col2im_
    return lambda: g(cols, x3, c, k, s, p, ho, wo)


@kernel("conv_fwd")
def conv_fwd(outs, ins, p, env):
    """y = act(im2col(x) @ Wmat^T + b): im2col, one GEMM, one fused bias+ReLU pass; by tiles of images
    on the CPU's threads (conv_tiled.py), else a scratch-full of images at a time."""
    k, s, pad = int(p["k"]), int(p.get("s", 1)), int(p.get("p", 0))
    x, w = ins[0], ins[1]
    has_b = bool(p.get("bias", False))
    b = ins[2] if has_b else EMPTY_F32.astype(x.dtype)
    act = relu_code("conv_fwd", p)
    n, h, wd, cin, cout, ho, wo = conv_geometry("conv_fwd", x, w, k, s, pad)
    y = outs[0]
    check_shape("conv_fwd", "y", y.shape, (n, ho, wo, cout))
    m = n * ho * wo
    y2 = y.reshape(m, cout)
    wt = w.reshape(cout, -1).T
    post = has_b or act
    bias_act = bias_act_pass(y2, b, act, 0.0) if post else program.chain()  # chain(): nothing, native
    if k == 1 and s == 1 and pad == 0:
        product1 = gemm(x.reshape(m, cin), wt, y2)
        return program.chain(product1, bias_act) if post else product1
    if len(outs) < 2:
        raise PlanError(f"conv_fwd: a {k}x{k} convolution (stride {s}, padding {pad}) needs the im2col buffer "
                        f"'cols' ({m}, {k * k * cin}) as its second output.")
    cols, tile = conv_columns("conv_fwd", "cols", outs[1], n, ho * wo, k * k * cin)
    fast = winograd.bind(x, w, y, cols, b, act) if winograd.applies(k, s, pad, cin, cout, x, w, y, b, cols) else None
    if fast is not None:
        return winograd.tagged(fast, ("forward",))
    if conv_tiled.applies(x, w, cols, k, s, pad) and y.flags.c_contiguous and b.flags.c_contiguous:
        return conv_tiled.bind_fwd(x, w, y, cols, b, act, k, s, pad, ho, wo)
    steps = []
    for b0, b1, c in _column_tiles(cols, n, tile, ho * wo):
        steps += [_im2col(x[b0:b1], c, k, s, pad, ho, wo),
                  gemm(tap_major(c) if cin == 1 else c, wt, y2[b0 * ho * wo:b1 * ho * wo])]
    return program.chain(*steps, bias_act)  # one native op list where every step is a C call


def _column_tiles(cols: np.ndarray, n: int, tile: int, per: int) -> list[tuple[int, int, np.ndarray]]:
    """(first image, end image, its columns' rows of cols) for each scratch-full of ``tile`` images:
    one entry, the whole matrix, where cols holds all n images."""
    return [(b0, min(n, b0 + tile), cols[:(min(n, b0 + tile) - b0) * per]) for b0 in range(0, n, tile)]


def _im2col(x: np.ndarray, cols: np.ndarray, k: int, s: int, p: int, ho: int, wo: int) -> Kernel:
    """The im2col of images x into cols (tap-major for one channel) as a bound kernel."""
    n, h, wd, cin = x.shape
    if cin == 1:
        return im2col_one_channel(x, cols, k, s, p, ho, wo)
    return patch_pass(x.reshape(n, h, wd * cin), cols, cin, k, s, p, ho, wo, to_cols=True)


@kernel("conv_bwd")
def conv_bwd(outs, ins, p, env):
    """dy *= (y > 0) if relu; dW = dy2d^T cols; db = 1^T dy2d; dcols = dy2d Wmat; dx = col2im(dcols)."""
    o = conv_bwd_operands(outs, ins, p)
    n, h, wd, cin, cout, ho, wo = o.geometry
    k, s, pad, act, dy2, y2, cols, db, dcols = o.k, o.s, o.pad, o.act, o.dy2, o.y2, o.cols, o.db, o.dcols
    scratch = split_scratch(outs, p)[1]
    parts = bias_partials(scratch, db, env, "conv_bwd")
    pre = act_grad_colsum_pass(dy2, y2, act, 0.0, db, parts) if (act or db is not None) else program.chain()
    x, w = ins[1], ins[2]
    if conv_tiled.applies(x, w, cols, k, s, pad) and all(a is None or a.flags.c_contiguous for a in (dy2, o.dx, dcols)):
        grads, passes = _tiled_grads(o, ins[0], x, w, scratch, env)
        run_tiled = program.chain(pre, *grads)
        return winograd.tagged(run_tiled, passes, *(g for g in grads if hasattr(g, "tile"))) if passes else run_tiled
    return program.chain(pre, *_conv_grads(o, x, remakes_columns(o, cin), scratch, env))


def _tiled_grads(o: ConvBwd, dy: np.ndarray, x: np.ndarray, w: np.ndarray, scratch: dict[str, np.ndarray],
                 env: BindEnv) -> tuple[list[Kernel], tuple[str, ...]]:
    """A conv backward's dW and dx passes on the CPU's threads, and which of them run by Winograd
    (F(4x4, 3x3) or F(2x2, 3x3)): dx by Winograd where it applies and fits, else dx and dW together by
    im2col tiles; with dx by Winograd (or no dx), dW by Winograd where its partials fit too, else by tiles. The
    passes run one after the other, each in the whole backward scratch."""
    n, h, wd, cin, cout, ho, wo = o.geometry
    k, s, pad, cols, dcols = o.k, o.s, o.pad, o.cols, o.dcols
    wino = winograd.applies(k, s, pad, cin, cout, dy, x, w, cols, o.dw2, *([o.dx] if o.dx is not None else []))
    dx_w = (winograd.bind(dy, w, o.dx, dcols, EMPTY_F32, 0, flip=True)
            if wino and o.dx is not None and dcols is not None else None)
    dw_w = winograd.bind_dw(x, dy, o.dw2.reshape(w.shape), cols) if wino and (o.dx is None or dx_w) else None
    if dw_w is None:  # so also wherever dx runs by tiles
        parts = scratch.get("dw_partials")
        if parts is None:  # a hand-built graph: one partial per other thread, outside the arena
            parts = env.scratch("conv_bwd: tiled weight-gradient partials",
                                (conv_tiled.max_threads(n) - 1, cout, k * k * cin), np.float32)
        dx_t, dcols_t = (None, None) if dx_w else (o.dx, dcols)  # dx by tiles too where Winograd's does not run
        dw_t = conv_tiled.bind_bwd(x, o.dy2, w, o.dw2, cols, dx_t, dcols_t, k, s, pad, ho, wo, parts)
    passes = (("weight gradient",) if dw_w else ()) + (("input gradient",) if dx_w else ())
    return [dw_w or dw_t] + ([dx_w] if dx_w else []), passes


def _conv_grads(o: ConvBwd, x: np.ndarray, remake: bool, scratch: dict[str, np.ndarray], env: BindEnv) -> list[Kernel]:
    """conv_bwd's products and scatter a scratch-full of images at a time (one pass over the whole
    matrix when cols holds every image). ``remake``: cols does not hold the forward's columns
    (remakes_columns), so each tile's are made again from x; dcols may be the same buffer (the plan's
    bwd_cols): a tile's dW product has read its columns before dy W overwrites them. The weight
    gradient of the first tile is written, each later one's added through a partial."""
    n, h, wd, cin, cout, ho, wo = o.geometry
    per, direct = ho * wo, o.k == 1 and o.s == 1 and o.pad == 0
    into = o.dx2 if o.dx2 is not None else o.dcols  # dx itself for a 1x1 conv, else the columns col2im scatters
    dx3 = o.dx.reshape(n, h, wd * cin) if o.dcols is not None else None
    tiles = _column_tiles(o.cols, n, o.tile, per)
    part = None
    if len(tiles) > 1:
        part = scratch.get("dw_partials")
        part = (part.reshape(-1)[:o.dw2.size].reshape(o.dw2.shape) if part is not None and part.dtype == o.dw2.dtype
                else env.scratch("conv_bwd: weight-gradient partial", o.dw2.shape, o.dw2.dtype))
    steps: list[Kernel] = []
    for i, (b0, b1, c) in enumerate(tiles):
        r0, r1 = b0 * per, b1 * per
        if remake:
            steps.append(_im2col(x[b0:b1], c, o.k, o.s, o.pad, ho, wo))
        one_channel = cin == 1 and not direct  # cols tap-major (im2col_one_channel)
        # banded one after the other: side by side (gemm_pair, as fc_bwd) was no faster at these tall shapes
        steps.append(gemm(o.dy2[r0:r1].T, tap_major(c) if one_channel else c, o.dw2 if i == 0 else part))
        if i > 0:
            steps.append(_add_into(o.dw2, part))
        if into is not None:
            steps.append(gemm(o.dy2[r0:r1], o.wmat, into if o.dx2 is not None else o.dcols[:r1 - r0]))
        if dx3 is not None:
            steps.append(patch_pass(dx3[b0:b1], o.dcols[:r1 - r0], cin, o.k, o.s, o.pad, ho, wo, to_cols=False))
    return steps


def _add_into(out: np.ndarray, part: np.ndarray) -> Kernel:
    """out += part as a bound kernel (no allocation)."""
    return lambda: np.add(out, part, out=out)


# ---- batch norm ------------------------------------------------------------------------------
def _bn_sums(scratch: dict[str, np.ndarray], role: str, c: int, env: BindEnv) -> tuple[np.ndarray, np.ndarray]:
    """(totals (2, C), block partials (PAR_CHUNKS, 2, C)) of a batch norm's float64 sums: rows 0 and
    1.. of its planned (PAR_CHUNKS + 1, 2, C) scratch tensor (a buffer outside the arena for a
    hand-built node that has none)."""
    shape = (fused.PAR_CHUNKS + 1, 2, c)
    buf = scratch.get(role)
    if buf is None:
        buf = env.scratch(f"batch norm {role}", shape, np.float64)
    if buf.shape != shape or buf.dtype != np.float64:
        raise PlanError(f"batch norm: scratch {role!r} has shape {buf.shape} ({buf.dtype}), expected {shape} float64.")
    return buf[0], buf[1:]


def _bn_coef(scratch: dict[str, np.ndarray], role: str, shape: tuple[int, int], dtype: np.dtype,
             env: BindEnv) -> np.ndarray:
    """A batch norm's per-channel coefficients (scale and shift forward, dx's three backward)."""
    buf = scratch.get(role)
    if buf is None:
        buf = env.scratch(f"batch norm {role}", shape, dtype)
    if buf.shape != shape or buf.dtype != dtype:
        raise PlanError(f"batch norm: scratch {role!r} has shape {buf.shape} ({buf.dtype}), expected {shape} {dtype}.")
    return buf


@kernel("bn_fwd")
def bn_fwd(outs, ins, p, env):
    """Training batch norm: batch statistics (float64), running stats as PyTorch, y = act(xhat*g + b)."""
    x2, gamma, beta, y2, mean, invstd, rmean, rvar, momentum, eps, act = bn_fwd_operands(outs, ins, p)
    acc, parts = _bn_sums(split_scratch(outs, p)[1], "stat_sums", x2.shape[1], env)
    aff = _bn_coef(split_scratch(outs, p)[1], "affine", (2, x2.shape[1]), x2.dtype, env)
    bound = conv_native.bind_bn_fwd(x2, gamma, beta, y2, mean, invstd, rmean, rvar, momentum, eps, act, acc, aff,
                                    parts if THREADED else parts[:1], pass_threads(THREADED))
    if bound is not None:
        return bound
    if y2 is None:  # y_by: the statistics and the affine only
        if THREADED:
            sp = conv_par.bn_train_stats_par_
            return lambda: sp(x2, gamma, beta, mean, invstd, rmean, rvar, momentum, eps, acc, aff, parts)
        st = bn_train_stats_
        return lambda: st(x2, gamma, beta, mean, invstd, rmean, rvar, momentum, eps, acc, aff)
    if THREADED:
        fp = conv_par.bn_train_fwd_par_
        return lambda: fp(x2, gamma, beta, y2, mean, invstd, rmean, rvar, momentum, eps, act, acc, aff, parts)
    f = bn_train_fwd_
    return lambda: f(x2, gamma, beta, y2, mean, invstd, rmean, rvar, momentum, eps, act, acc, aff)


@kernel("bn_bwd")
def bn_bwd(outs, ins, p, env):
    """The gradient sums (float64), dgamma, dbeta, then dx; with dy_pool, dy made from a max pool's gradient,
    argmax and output (operands.PooledGrad): in C value by value as the passes read it, on numba as
    maxpool_bwd writes it, into dx, which the passes then read and overwrite in place (the same values)."""
    dy2, x2, y2, gamma, mean, invstd, dx2, dgamma, dbeta, act, pooled = bn_bwd_operands(outs, ins, p)
    acc, parts = _bn_sums(split_scratch(outs, p)[1], "grad_sums", x2.shape[1], env)
    aff = _bn_coef(split_scratch(outs, p)[1], "grad_coef", (3, x2.shape[1]), np.dtype(np.float64), env)
    bound = conv_native.bind_bn_bwd(dy2, x2, y2, gamma, mean, invstd, dx2, dgamma, dbeta, act, acc, aff,
                                    parts if THREADED else parts[:1], pass_threads(THREADED), pooled)
    if bound is not None:
        return bound
    if pooled is not None:
        dx = outs[0]
        to_dx = maxpool_bwd([dx], *pooled.pool_backward(), env)
        return program.chain(to_dx, _bn_bwd_numba(dx2, x2, dx2, gamma, mean, invstd, dx2, dgamma, dbeta, 0, acc, aff, parts))
    return _bn_bwd_numba(dy2, x2, y2, gamma, mean, invstd, dx2, dgamma, dbeta, act, acc, aff, parts)


def _bn_bwd_numba(dy2, x2, y2, gamma, mean, invstd, dx2, dgamma, dbeta, act, acc, aff, parts):  # type: ignore[no-untyped-def]
    """bn_bwd's numba kernel: on the library's threads (conv_par) or one."""
    if THREADED:
        fp = conv_par.bn_train_bwd_par_
        return lambda: fp(dy2, x2, y2, gamma, mean, invstd, dx2, dgamma, dbeta, act, acc, aff, parts)
    f = bn_train_bwd_
    return lambda: f(dy2, x2, y2, gamma, mean, invstd, dx2, dgamma, dbeta, act, acc, aff)


@kernel("bn_fold")
def bn_fold(outs, ins, p, env):
    """Inference batch norm as a per-channel affine: scale = g/sqrt(rv+eps), bias = b - rm*scale."""
    gamma, beta, rmean, rvar = ins
    scale, bias = outs
    eps, f = float(p.get("eps", 1e-5)), bn_fold_
    return (conv_native.bind_bn_fold(gamma, beta, rmean, rvar, eps, scale, bias)
            or (lambda: f(gamma, beta, rmean, rvar, eps, scale, bias)))


@kernel("bn_inf")
def bn_inf(outs, ins, p, env):
    x, scale, bias = ins
    (y,) = outs
    check_shape("bn_inf", "y", y.shape, x.shape)
    x2, y2 = rows(x), rows(y)
    act, f = relu_code("bn_inf", p), bn_inf_
    return (conv_native.bind_channel_affine(x2, scale, bias, y2, act, pass_threads(THREADED))
            or (lambda: f(x2, scale, bias, y2, act)))


# ---- pooling -----------------------------------------------------------------------------------
@kernel("maxpool_fwd")
def maxpool_fwd(outs, ins, p, env):
    """y = the window's max and its argmax; with bn_relu, of a batch norm's relu output made from its input and
    affine (operands.pool_operands), which the batch norm then does not write."""
    x, aff = pool_operands("maxpool_fwd", ins, p)
    y, am = outs
    k, s, pad = pool_geometry("maxpool_fwd", x, y, p)
    check_shape("maxpool_fwd", "argmax", am.shape, y.shape)
    two_by_two = (k, s, pad) == (2, 2, 0) and all(a.flags.c_contiguous for a in (x, y, am))
    bound = conv_native.bind_maxpool_fwd(x, y, am, k, s, pad, two_by_two, pass_threads(THREADED), aff)
    if bound is not None:
        return bound
    bn_relu = aff is not None
    aa = aff if bn_relu else np.zeros((2, x.shape[-1]), x.dtype)  # unread: numba types both branches
    if THREADED:
        fp = conv_par.maxpool_fwd_par_
        return lambda: fp(x, y, am, k, s, pad, two_by_two, aa, bn_relu)
    if two_by_two:
        f2 = maxpool2_fwd_
        return lambda: f2(x, y, am, aa, bn_relu)
    f = maxpool_fwd_
    return lambda: f(x, y, am, k, s, pad, aa, bn_relu)


@kernel("maxpool_bwd")
def maxpool_bwd(outs, ins, p, env):
    """dx from dy and the argmax; with relu=True (a third input, the forward's output y) also the
    gradient of the ReLU fused into the layer before the pool (ops/pool.py relu_through_pool)."""
    dy, am, py, relu = *pool_grad_operands("maxpool_bwd", ins, p), bool(p.get("relu", False))
    (dx,) = outs
    n, h, w, c = dx.shape
    k = p.get("k")
    two_by_two = (k, p.get("s", k), p.get("p", 0)) == (2, 2, 0) and all(a.flags.c_contiguous for a in (dy, am, dx, py))
    bound = conv_native.bind_maxpool_bwd(dy, am, dx, two_by_two, pass_threads(THREADED), py if relu else None)
    if bound is not None:
        return bound
    if THREADED:
        fp = conv_par.maxpool_bwd_par_
        return lambda: fp(dy, am, dx, two_by_two, py, relu)
    if two_by_two:
        f2 = maxpool2_bwd_
        return lambda: f2(dy, am, dx, py, relu)
    dx3 = dx.reshape(n, h * w, c)
    f = maxpool_bwd_
    return lambda: f(dy, am, dx3, py, relu)


@kernel("avgpool_fwd")
def avgpool_fwd(outs, ins, p, env):
    (x,), (y,) = ins, outs
    k, s, pad = pool_geometry("avgpool_fwd", x, y, p)
    f, kk = avgpool_fwd_, x.dtype.type(k * k)
    return (conv_native.bind_avgpool(x, y, k, s, pad, False, pass_threads(THREADED))
            or (lambda: f(x, y, k, s, pad, kk)))


@kernel("avgpool_bwd")
def avgpool_bwd(outs, ins, p, env):
    (dy,), (dx,) = ins, outs
    k, s, pad = pool_geometry("avgpool_bwd", dx, dy, p)
    f, kk = avgpool_bwd_, dx.dtype.type(k * k)
    return (conv_native.bind_avgpool(dx, dy, k, s, pad, True, pass_threads(THREADED))
            or (lambda: f(dy, dx, k, s, pad, kk)))


@kernel("gap_fwd")
def gap_fwd(outs, ins, p, env):
    (x,), (y,) = ins, outs
    n, h, w, c = x.shape
    check_shape("gap_fwd", "y", y.shape, (n, c))
    x3 = x.reshape(n, h * w, c)
    f, div = gap_fwd_, x.dtype.type(h * w)
    return conv_native.bind_gap(x, y, False, pass_threads(THREADED)) or (lambda: f(x3, y, div))


@kernel("gap_bwd")
def gap_bwd(outs, ins, p, env):
    (dy,), (dx,) = ins, outs
    n, h, w, c = dx.shape
    check_shape("gap_bwd", "dy", dy.shape, (n, c))
    dx3 = dx.reshape(n, h * w, c)
    f, div = gap_bwd_, dx.dtype.type(h * w)
    return conv_native.bind_gap(dx, dy, True, pass_threads(THREADED)) or (lambda: f(dy, dx3, div))

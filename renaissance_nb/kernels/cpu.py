"""The CPU kernel table: op name -> factory(outs, ins, params, env) -> zero-argument kernel.

Binding a node calls its factory once with the node's pre-resolved arena views;
the returned closure is what a replayed step calls. Everything the closure needs
(views, transposes, activation codes, batch sizes) is resolved at bind time, so a
step does no lookups and allocates nothing: matrix products write straight into
arena views (bands of single-threaded sgemm calls on one pool of threads, kernels/blas.py),
everything else is a fused pass: C (kernels/native.c) in a plan whose every op it covers,
else numba (the same bytes either way; kernels/native.py chooses per plan).

This module holds the dense kernels (DENSE_KERNELS) and, at its end, joins them with those of
conv.py (convolution, batch norm, pooling) and transfer.py (image batches) into KERNELS. The
kernel modules import only base.py, passes.py and operands.py, never this module; ``BindEnv``
(base.py) is imported here so ``from renaissance_nb.kernels.cpu import KERNELS, BindEnv`` holds.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import NumericalError, PlanError
from ..train.rng import StreamId
from . import blas, conv_native, fused, gelu_native, gpt_native, native, philox, program
from .amp import AMP_KERNELS
from .fc_lowp import FC_LOWP_KERNELS
from .gelu_native import GELU_PAR_MIN
from .base import EMPTY_F32, EMPTY_F32_2D, Factory, Kernel, join_tables, registrar
from .base import BindEnv  # noqa: F401 - the runtime imports it from here
from .comm import COMM_KERNELS, shard_table
from .conv import CONV_KERNELS
from .operands import ACT_CODES, ema_ranges, fc_bwd_operands, flat2d, relu_code, rows, split_scratch
from .passes import PASS_PAR_MIN, act_grad_colsum_pass, bias_act_pass, bias_partials
from .status import status_error
from .transfer import TRANSFER_KERNELS

DENSE_KERNELS: dict[str, Factory] = {}
"""This module's kernels: dense layers, element-wise ops, losses, batch transfer, the update."""
kernel = registrar(DENSE_KERNELS)
LEAKY_SLOPE = 0.01
"""leaky_relu's slope when a hand-built node gives none (nn.LeakyReLU's default); the compiler always does."""


# ---- linear algebra -----------------------------------------------------------------------
@kernel("fc_fwd")
def fc_fwd(outs, ins, p, env):
    """y = act(x W^T + b): one GEMM into the output view, then one fused bias+activation pass."""
    w = ins[1]
    x, y = ins[0].reshape(-1, w.shape[1]), outs[0].reshape(-1, w.shape[0])  # (B, in) or (B*T, in): per row
    b = ins[2] if len(ins) > 2 else EMPTY_F32
    act = ACT_CODES[p.get("act", "none")]
    slope = float(p.get("slope", LEAKY_SLOPE))
    product = blas.gemm(x, w.T, y)
    if act == 0 and b.size == 0:
        return product
    return program.chain(product, bias_act_pass(y, b, act, slope))


@kernel("fc_bwd")
def fc_bwd(outs, ins, p, env):
    """dz = dy * act'(y) in place and db = 1^T dz in one pass; dW = dz^T x; dx = dz W.
    (The graph's ones vector is the GPU's GEMV operand; the CPU sums in the pass instead.)"""
    dy, x, w, y, ones, dw, db, dx = fc_bwd_operands(outs, ins, p)
    act = ACT_CODES[p["act"]]
    parts = bias_partials(split_scratch(outs, p)[1], db, env, "fc_bwd")
    pre = act_grad_colsum_pass(dy, y, act, float(p["slope"]), db, parts) if (act or db is not None) else None
    # dW and dx are equal work: side by side, one whole sgemm per thread (7% faster at batch 32)
    grads = blas.gemm_pair((dy.T, x, dw), (dy, w, dx)) if dx is not None else blas.gemm(dy.T, x, dw)
    return grads if pre is None else program.chain(pre, grads)


@kernel("matmul")
def matmul_k(outs, ins, p, env):
    """c = op(a) @ op(b), op = transpose when trans_a / trans_b."""
    a, b = ins
    (c,) = outs
    a = a.T if p.get("trans_a") else a
    b = b.T if p.get("trans_b") else b
    return blas.gemm(a, b, c)


def _threaded_elementwise(out: np.ndarray, *ins: np.ndarray) -> bool:
    """Whether out = a + b (or a copy) over these arrays can run as fused.add_chunks_par_: large, all
    contiguous float32 of one size (no broadcasting), and in a plan on numba's threads (a plan bound to
    the C kernels keeps NumPy here: kernels/native.py chosen_for, one thread pool per plan)."""
    return (blas.THREADED and native.active() is None and out.size >= PASS_PAR_MIN and all(
        x.dtype == np.float32 and x.flags.c_contiguous and x.size == out.size for x in (out, *ins)))


def _c_elementwise(out: np.ndarray, a: np.ndarray, b: np.ndarray | None, relu: bool = False) -> Kernel | None:
    """out = a + b (with ``relu``, relu(a + b); a copy of a where b is None) as one C pass (conv_native.bind_add),
    on the pool's threads when large; None where the arrays are not contiguous float32 of one shape or the plan
    binds no C."""
    arrays = (out, a) + (() if b is None else (b,))
    if not all(x.shape == out.shape and x.dtype == np.float32 and x.flags.c_contiguous for x in arrays):
        return None  # not asked of the C binder: its decline would count against the plan (native.covers)
    return conv_native.bind_add(out, a, b, blas.pass_threads(blas.THREADED and out.size >= PASS_PAR_MIN), relu)


@kernel("add")
def add_k(outs, ins, p, env):
    """c = a + b with NumPy broadcasting (a bias row over a batch, say); by chunks on numba's threads
    when large and of one shape (a residual add). With a fused ReLU (act="relu", ops/add.py) c = relu(a + b):
    one C pass, else the sum and then the ReLU kernel on c in place (act_fwd), the same bytes either way."""
    a, b = ins
    (c,) = outs
    relu = bool(relu_code("add", p))  # ops/add.py fuses ReLU alone
    threaded = _threaded_elementwise(c, a, b)
    bound = None if threaded else _c_elementwise(c, a, b, relu)
    if bound is not None:
        return bound
    if threaded:
        f = fused.add_chunks_par_
        total: Kernel = lambda: f(a, b, c)  # noqa: E731
    else:
        add = np.add
        total = lambda: add(a, b, out=c)  # noqa: E731
    return program.chain(total, act_fwd([c], [c], {"act": "relu", "slope": 0.0}, env)) if relu else total


@kernel("relu")
def relu_k(outs, ins, p, env):
    (x,), (y,) = ins, outs
    mx = np.maximum
    return lambda: mx(x, 0, out=y)


# ---- element-wise ------------------------------------------------------------------------
def _relu_pass(x: np.ndarray, y: np.ndarray, dy: np.ndarray) -> Kernel | None:
    """ReLU forward (dy empty) or backward as one vectorised pass, threaded when large; None where the
    arrays are not contiguous float32 of one size (act_forward/act_backward serve)."""
    arrays = (x, y) + ((dy,) if dy.size else ())
    if not all(a.dtype == np.float32 and a.flags.c_contiguous and a.size == x.size for a in arrays):
        return None
    bound = conv_native.bind_relu(x, y, dy, blas.pass_threads(blas.THREADED and x.size >= PASS_PAR_MIN))
    if bound is not None:
        return bound
    if blas.THREADED and x.size >= PASS_PAR_MIN:
        f = fused.relu_chunks_par_
        return lambda: f(x, y, dy)
    g, n = fused.relu_chunks_, fused.PAR_CHUNKS
    return lambda: g(x, y, dy, 0, n)


def _c_act(code: int, x: np.ndarray, dy: np.ndarray | None, out: np.ndarray) -> Kernel | None:
    """The activation's C or vectorised pass (ReLU, GELU's erf form) forward (dy None) or backward; None
    where there is none for this code or these arrays (the numba loop serves)."""
    if code == ACT_CODES["relu"]:
        return _relu_pass(x, out, EMPTY_F32 if dy is None else dy)
    if code == ACT_CODES["gelu"]:
        return gelu_native.bind_gelu(x, dy, out, "erf", blas.pass_threads(blas.THREADED and x.size >= GELU_PAR_MIN))
    return None


def _numba_act(code: int, run: Kernel) -> Kernel:
    """An activation bound to its numba loop: in a plan bound to C (whose C passes cover ReLU and GELU only,
    _c_act) that is a decline, so native.covers does not call the plan numba-free."""
    return conv_native.bind_activation(code) or run


@kernel("act_fwd")
def act_fwd(outs, ins, p, env):
    (x,), (y,) = ins, outs
    code, slope = ACT_CODES[p["act"]], float(p.get("slope", LEAKY_SLOPE))
    f = fused.act_forward_par if _threaded_elementwise(y, x) else fused.act_forward
    return _c_act(code, x, None, y) or _numba_act(code, lambda: f(x, y, code, slope))


@kernel("act_bwd")
def act_bwd(outs, ins, p, env):
    (dy, x), (dx,) = ins, outs
    code, slope = ACT_CODES[p["act"]], float(p.get("slope", LEAKY_SLOPE))
    f = fused.act_backward_par if _threaded_elementwise(dx, dy, x) else fused.act_backward
    return _c_act(code, x, dy, dx) or _numba_act(code, lambda: f(dy, x, dx, code, slope))


@kernel("copy")
def copy_k(outs, ins, p, env):
    (src,), (dst,) = ins, outs
    if _threaded_elementwise(dst, src):
        f = fused.add_chunks_par_
        return lambda: f(src, EMPTY_F32, dst)
    bound = _c_elementwise(dst, src, None) if dst.size >= PASS_PAR_MIN else None
    bound = bound or program.bind_copy(dst, src)
    if bound is not None:
        return bound
    cp = np.copyto
    return lambda: cp(dst, src)


@kernel("reshape_copy")
def reshape_copy(outs, ins, p, env):
    """Flatten and its gradient. Image features are channels-last in the arena, but
    flatten keeps PyTorch's (C, H, W) order so an fc after it has PyTorch's weight layout."""
    (src,), (dst,) = ins, outs
    cp = np.copyto
    if src.ndim == 4 and dst.ndim == 2:  # (N, H, W, C) -> (N, C*H*W)
        n, h, w, c = src.shape
        d4, s4 = dst.reshape(n, c, h, w), src.transpose(0, 3, 1, 2)
        return lambda: cp(d4, s4)
    if src.ndim == 2 and dst.ndim == 4:  # gradient: (N, C*H*W) -> (N, H, W, C)
        n, h, w, c = dst.shape
        s4 = src.reshape(n, c, h, w).transpose(0, 2, 3, 1)
        return lambda: cp(dst, s4)
    src = src.reshape(dst.shape)
    return lambda: cp(dst, src)


@kernel("mul")
def mul_k(outs, ins, p, env):
    """out = a * b: one flat loop for equal shapes, else NumPy's broadcasting (like add)."""
    (a, b), (out,) = ins, outs
    if a.shape == b.shape == out.shape:
        f = fused.mul_
        flat = [v.reshape(-1) if v.flags.c_contiguous else v for v in (out, a, b)]  # never a copy to write into
        return conv_native.bind_mul(*flat, blas.pass_threads(blas.THREADED)) or (lambda: f(out, a, b))
    mul = np.multiply
    return lambda: mul(a, b, out=out)


@kernel("fill")
def fill_k(outs, ins, p, env):
    value = p.get("value", 0.0)
    targets = list(outs)
    zeroed = program.bind_zero(*targets) if value == 0 and not math.copysign(1.0, value) < 0 else None
    if zeroed is not None:
        return zeroed

    def run() -> None:
        for t in targets:
            t.fill(value)
    return run


@kernel("dropout_fwd")
def dropout_fwd(outs, ins, p, env):
    """mask = Philox(seed, DROPOUT stream, offset) < keep, scaled by 1/keep; y = x * mask.

    The offset lives in the arena and advances inside the step, so every replay
    draws a new, reproducible mask (the original keeps it in device memory).
    """
    (x, offset), (y, mask) = ins, outs
    keep = 1.0 - float(p["p"])
    flat_mask = mask.reshape(-1)
    blocks = (flat_mask.size + 3) // 4
    # train.rng.dropout_mask_into's checks and derivations, done here at bind time (dropout() checked p,
    # the config the seed): a step only draws
    k0, k1, stream = env.seed & 0xFFFFFFFF, env.seed >> 32, int(StreamId.DROPOUT)
    threshold, scale = np.float32(keep), np.float32(1.0 / keep)
    draw, mul = philox.dropout_kernel, fused.mul_
    bound = conv_native.bind_dropout(x, y, mask, offset, k0, k1, stream, threshold, scale,
                                     blas.pass_threads(blas.THREADED))
    if bound is not None:
        return bound

    def run() -> None:
        off = int(offset[0])
        draw(flat_mask, k0, k1, stream, off & 0xFFFFFFFF, off >> 32, threshold, scale)
        offset[0] += blocks
        mul(y, x, mask)
    return run


# ---- loss and metrics -------------------------------------------------------------------------
@kernel("softmax_xent")
def softmax_xent_k(outs, ins, p, env):
    if ins[1].ndim == 2:  # a language model: one row per position, top-1/top-5 as per-sequence fractions
        return _per_position(softmax_xent_k, outs, ins, p, env)
    logits, labels = flat2d(ins[0]), ins[1]
    result = outs[0]
    grad = bool(p["grad"])
    dlogits = flat2d(outs[1]) if grad else EMPTY_F32_2D
    weight = ins[2] if len(ins) > 2 else EMPTY_F32  # CrossEntropyLoss(weight=...)
    smoothing, f = float(p["smoothing"]), fused.softmax_xent
    bound = native.bind_softmax_xent(logits, labels, smoothing, weight, result, dlogits, grad)
    return bound or (lambda: f(logits, labels, smoothing, weight, result, dlogits, grad))


def _per_position(loss: Any, outs: Any, ins: Any, p: dict, env: Any) -> Kernel:
    """The loss over (B, T) targets as over B x T rows (the mean over every position, as
    ``F.cross_entropy(logits.view(-1, V), y.view(-1))``); the correct counts then divided by T, so the
    metrics' per-sample sums still add up to one per sequence and accuracy reads as a token accuracy."""
    positions = np.float32(ins[1].shape[1])
    flat = [rows(ins[0]), ins[1].reshape(-1), *ins[2:]]
    bound = loss([outs[0], *(rows(o) for o in outs[1:])], flat, p, env)
    result = outs[0]
    divide = gpt_native.bind_divide(result[1:3], positions)
    if divide is not None:
        return program.chain(bound, divide)

    def run() -> None:
        bound()
        result[1:3] /= positions
    return run


@kernel("accum_metrics")
def accum_metrics(outs, ins, p, env):
    """Weighted by the bound batch size, so a partial last batch counts exactly its rows."""
    result, step = ins
    acc = outs[0]
    loss_log = outs[1] if p.get("log") else EMPTY_F32
    batch, f = float(env.batch), fused.accumulate_metrics
    bound = native.bind_accumulate_metrics(result, acc, batch, loss_log, step)
    return bound or (lambda: f(result, acc, batch, loss_log, step))


@kernel("transfer")
def transfer(outs, ins, p, env):
    """Copy the next batch, rows perm[cursor:cursor+B] of the source, into an input buffer."""
    (cursor,) = ins
    x_out, y_out = outs
    source = p["source"]
    if source not in env.sources:  # bound but never run: e.g. the val transfer of a task without val data
        def missing() -> None:
            raise PlanError(f"transfer: no {source!r} data was given to the task. Fix: pass {source} data to .data().")
        return missing
    xs, ys = env.sources[source]
    perm = env.perms[source]
    if ys.ndim == 2:  # token sequences: a target per position
        return _token_transfer(xs, ys, perm, cursor, x_out, y_out, source)
    x2 = flat2d(x_out)
    xs2 = xs.reshape(xs.shape[0], -1)
    f = fused.gather_batch_par if blas.THREADED else fused.gather_batch
    gather = native.bind_gather(xs2, ys, perm, cursor, x2, y_out, blas.pass_threads(blas.THREADED))
    if gather is None:
        def gather() -> int:
            return f(xs2, ys, perm, cursor, x2, y_out)

    def run() -> None:
        status = gather()
        if status:
            raise status_error(status, "transfer", source, len(y_out), perm, int(cursor[0]))
    return program.mark(run, program.guarded(gather, program.STATUS, None, run))


def _token_transfer(xs: np.ndarray, ys: np.ndarray, perm: np.ndarray, cursor: np.ndarray, x_out: np.ndarray,
                    y_out: np.ndarray, source: str) -> Kernel:
    """Rows perm[cursor:cursor+B] of token windows (N, T) and their targets (N, T), their first T' ids where the
    plan's context is shorter, after the same bounds check as the image gathers: gpt_native.c's C pass in a C
    plan (a native op behind a STATUS guard), else numba's loop or np.take (no copy is made: ``out=``)."""
    n = x_out.shape[0]
    if x_out.shape[1] > xs.shape[1] or ys.shape[1:] != xs.shape[1:] or y_out.shape != x_out.shape:
        raise PlanError(f"transfer: {source} token windows are {xs.shape[1:]} long, the plan's buffers "
                        f"{x_out.shape[1:]}. Fix: plan the task again with this data.")
    gather = gpt_native.bind_gather_windows(xs, ys, perm, cursor, x_out, y_out)
    if gather is None:  # no C library in this plan: numba's loop (a shorter context) or np.take
        def gather() -> int:
            if x_out.shape[1] < xs.shape[1]:  # a shorter training context (train_resolution): each window's start
                return fused.gather_token_windows(xs, ys, perm, cursor, x_out, y_out)
            start = int(cursor[0])
            status = fused.batch_status(perm, start, n, xs.shape[0])
            if status == 0:
                rows = perm[start:start + n]
                np.take(xs, rows, axis=0, out=x_out)
                np.take(ys, rows, axis=0, out=y_out)
                cursor[0] = start + n
            return status

    def run() -> None:
        status = gather()
        if status:
            raise status_error(status, "transfer", source, n, perm, int(cursor[0]))
    return program.mark(run, program.guarded(gather, program.STATUS, None, run))


# ---- region-wide operations ---------------------------------------------------------------------
@kernel("zero_range")
def zero_range(outs, ins, p, env):
    """Zero every gradient with one fill over the whole G range."""
    view = env.range_view(p["first"], p["last"], "uint8")
    return program.bind_zero(view) or (lambda: view.fill(0))


@kernel("nan_check")
def nan_check(outs, ins, p, env):
    """One pass over all gradients after backward, before the update.

    policy "raise": stop with an error naming the step, the first non-finite
    tensor (layer and region) and the loss; the update is not applied. policy
    "skip": raise the flag so the optimizer skips this update, and count it.
    """
    result, step = ins
    (flag, skipped), scratch = split_scratch(outs, p)
    grads = env.range_view(p["first"], p["last"], "float32")
    base_first, policy = p["first"], p.get("policy", "raise")
    find = fused.all_finite
    parts = scratch.get("partials")
    if parts is None:  # a hand-built node without its partials tensor
        parts = env.scratch("nan_check: probe partials", (fused.PAR_CHUNKS,), np.float32)
    par, serial = fused.nonfinite_probe_par, fused.nonfinite_probe
    probe = native.bind_probe(grads, parts, blas.pass_threads(blas.THREADED))
    if probe is None:
        probe = (lambda: par(grads, parts)) if blas.THREADED else (lambda: serial(grads))
    locate = env.locate

    def run() -> None:
        loss = result[0]
        if probe() == 0.0 and loss - loss == 0.0:
            return
        if policy == "skip":
            flag[0] = 1
            skipped[0] += 1
            return
        k = find(grads)
        where = locate(base_first, k * 4) if (k >= 0 and locate) else "the loss (gradients are finite)"
        raise NumericalError(f"step {int(step[0]) + 1}: non-finite value in {where}; loss={float(loss)}. "
                             "The update was not applied, the weights are those before this step. Fix: lower the "
                             "learning rate, check the data for extreme values, or use options(nan_policy='skip').")
    loss_ok = result.dtype == np.float32 and result.flags.c_contiguous  # the guard reads result[0] as a float
    return program.mark(run, program.guarded(probe, program.FINITE, result, run) if loss_ok else None)


@kernel("clip_grad_norm")
def clip_grad_norm(outs, ins, p, env):
    """torch.nn.utils.clip_grad_norm_ over the whole G range, after the NaN check: the total
    2-norm of every gradient (float64 sums, rounded to float32 as torch's norm is), then every
    gradient times max_norm / (norm + 1e-6) in float32 when that factor is below 1 or NaN (a
    non-finite norm, which only nan_check=False lets through: every gradient NaN, as in torch).
    A step the NaN check skips is left alone. clip.norm keeps [norm, factor applied] of the last step."""
    (flag,) = ins
    out = outs[0]  # outs[1], the partial sums of the CUDA kernels, is not used here
    grads = env.range_view(p["first"], p["last"], "float32")
    max_norm, tiny, one = np.float32(p["max_norm"]), np.float32(1e-6), np.float32(1.0)
    total_of = fused.sq_sum_par if blas.THREADED else fused.sq_sum_chunked
    scale_by = fused.scale_par if blas.THREADED else fused.scale_
    threads = blas.pass_threads(blas.THREADED)
    c_pair = native.bind_clip(grads, threads)
    total, scale = c_pair or ((lambda: total_of(grads)), (lambda factor: scale_by(grads, factor)))
    one_call = program.bind_clip_norm(grads, out, max_norm, threads) if c_pair else None  # a native program's

    def run() -> None:
        if flag[0]:
            return
        norm = np.float32(math.sqrt(total()))
        factor = max_norm / (norm + tiny)
        if factor >= one:  # a NaN norm (nan_check off) scales every gradient to NaN, as torch's does
            out[0], out[1] = norm, one
            return
        out[0], out[1] = norm, factor
        scale(factor)
    return program.mark(run, program.skipped_if(flag, False, program.ops_of(one_call)))


@kernel("optimizer")
def optimizer_k(outs, ins, p, env):
    """The update of the optimizer the node's ``kind`` names, as its definition binds it (renaissance_nb/optim/:
    SGD and Adam/AdamW one pass over the W/G/M/V ranges, LARS per weight tensor); skipped on a flagged step."""
    from ..optim import definition  # the definitions bind this package's kernels: imported when a node is bound
    flag = ins[1]
    update = definition(p["kind"], "optimizer").bind_cpu(outs, ins, p, env)

    clear = not p.get("keep_flag", False)  # an EMA update after it skips the step too, and clears the flag

    def run() -> None:
        if flag[0]:  # the NaN check asked to skip this update (a skipped update is not a step)
            if clear:
                flag[0] = 0
            return
        update()
    return program.mark(run, program.skipped_if(flag, clear, program.ops_of(update)))


@kernel("optimizer_norms")
def optimizer_norms(outs, ins, p, env):
    """Per-tensor norms an optimizer needs before its update (LARS_NORMS: LARS's [||w||, ||g||]), bound by
    the definition the node's ``kind`` names; they skip a flagged step themselves."""
    from ..optim import definition
    return definition(p["kind"], "optimizer_norms").bind_cpu_norms(outs, ins, p, env)


@kernel("ema_update")
def ema_update(outs, ins, p, env):
    """E = d * E + (1 - d) * W over the whole E and W parameter ranges, and the same for the
    EMA's BN running statistics (B_NEXT from B_PREV), in one pass each. d warms up as
    min(decay, (1 + t) / (10 + t)) with t the finished steps, so early averages are useful. A step the
    NaN check skipped is not averaged in (the flag, ins[1] where the graph gives it, is cleared here)."""
    step = ins[0]
    flag = ins[1] if len(ins) > 1 else np.zeros(1, np.int64)
    e, w, be, bw = ema_ranges(env.range_view)
    decay, f = float(p["decay"]), fused.ema_
    weights = native.bind_ema(e, w) or (lambda d: f(e, w, d))
    stats = (native.bind_ema(be, bw) or (lambda d: f(be, bw, d))) if be.size else None
    warm = [program.bind_ema_warm(e, w, step, decay)] + ([program.bind_ema_warm(be, bw, step, decay)] if be.size else [])
    one_call = program.chain(*warm) if all(warm) else None  # type: ignore[arg-type]  # a native program's

    def run() -> None:
        if flag[0]:
            flag[0] = 0
            return
        t = float(step[0])
        d = min(decay, (1.0 + t) / (10.0 + t))
        weights(d)
        if stats is not None:
            stats(d)
    return program.mark(run, program.skipped_if(flag, True, program.ops_of(one_call)))


KERNELS: dict[str, Factory] = shard_table(join_tables(DENSE_KERNELS, CONV_KERNELS, TRANSFER_KERNELS, COMM_KERNELS,
                                                     AMP_KERNELS, FC_LOWP_KERNELS))
"""The complete CPU table, op name -> factory: the one place the kernel modules' tables are joined."""

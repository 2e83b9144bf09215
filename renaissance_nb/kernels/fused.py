"""Fused one-pass CPU kernels (numba): what NumPy would do in several passes.

Each kernel writes into arrays it is given and allocates nothing, so a replayed
training step touches only arena memory. numba is worth its weight here: the
optimizer over all weights, the loss with its metrics, and bias+activation would
each take 5 to 12 NumPy passes over memory; here they take one. fastmath is off
so results are reproducible bit for bit and match the reference formulas.
"""
from __future__ import annotations

import math

import numba
import numpy as np

from .operands import ACT_CODES  # noqa: F401 - the codes the activation switches below take
from .gelu_math import gelu_slope, gelu_value
from .operands import PAR_CHUNKS

jit = numba.njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
par = numba.njit(cache=True, nogil=True, parallel=True, fastmath=False, error_model="numpy")
"""jit with ``numba.prange`` loops run on numba's threads (the pool the products use, kernels/blas.py)."""



@numba.njit(cache=True, nogil=True)
def chunk(n, c):
    """The bounds (lo, hi) of chunk ``c`` of ``range(n)`` cut into PAR_CHUNKS (the last ones may be short
    or empty): every threaded pass and its serial twin cut a range the same way."""
    ch = (n + PAR_CHUNKS - 1) // PAR_CHUNKS
    lo = min(n, c * ch)
    return lo, min(n, lo + ch)




@jit
def bias_act_(y, b, act, slope):
    """y = act(y + b) in place, row-wise bias (b may have length 0: no bias)."""
    n, m = y.shape
    has_b = b.shape[0] > 0
    for i in range(n):
        for j in range(m):
            z = y[i, j]
            if has_b:
                z += b[j]
            if act == 1:
                if z < 0:
                    z = 0.0
            elif act == 2:
                z = math.tanh(z)
            elif act == 3:
                z = 1.0 / (1.0 + math.exp(-z))
            elif act == 4:
                if z < 0:
                    z = z * slope
            y[i, j] = z


@jit
def act_grad_from_output_(dy, y, act, slope):
    """dy *= act'(z) in place, with the derivative written in terms of the output y (any shape)."""
    act_grad_rows_(dy.reshape(1, -1), y.reshape(1, -1), act, slope, dy.reshape(-1)[0:0], 0, 1)


@jit
def _act_grad_row(row, yr, act, slope):
    """row *= act'(z) in place, the derivative from the output row yr. One loop per activation,
    each storing every element (a select, not a conditional store), so LLVM vectorises it;
    the same values as a branchy scan."""
    zero = np.float32(0.0)
    one = np.float32(1.0)
    if act == 1:
        for j in range(row.shape[0]):
            row[j] = row[j] if yr[j] > 0 else zero
    elif act == 2:
        for j in range(row.shape[0]):
            row[j] = row[j] * (one - yr[j] * yr[j])
    elif act == 3:
        for j in range(row.shape[0]):
            row[j] = row[j] * (yr[j] * (one - yr[j]))
    elif act == 4:
        for j in range(row.shape[0]):  # d * slope is formed in double (slope is a float64), then rounded once
            dj = row[j]
            row[j] = dj if yr[j] > 0 else dj * slope


@jit
def _add_eight_rows(d, i, acc):
    """acc[j] += d[i, j] + ... + d[i + 7, j], the eight added pairwise in float64: one pass over
    acc per eight rows (a pass per row made the sums cost twice the derivative pass)."""
    r0, r1, r2, r3, r4, r5, r6, r7 = d[i], d[i + 1], d[i + 2], d[i + 3], d[i + 4], d[i + 5], d[i + 6], d[i + 7]
    f = np.float64
    for j in range(acc.shape[0]):
        acc[j] += (((f(r0[j]) + f(r1[j])) + (f(r2[j]) + f(r3[j])))
                   + ((f(r4[j]) + f(r5[j])) + (f(r6[j]) + f(r7[j]))))


@jit
def act_grad_rows_(d, y, act, slope, acc, r0, r1):
    """Rows r0 <= i < r1 of d (M, C): d *= act'(z) in place, the derivative from the output y;
    then, if acc has length C, acc[j] += d[i, j] (float64), eight rows at a time while they
    are in L1."""
    want_sum = acc.shape[0] > 0
    i = r0
    while i < r1:
        n = min(8, r1 - i)
        if act != 0:
            for k in range(i, i + n):
                _act_grad_row(d[k], y[k], act, slope)
        if want_sum:
            if n == 8:
                _add_eight_rows(d, i, acc)
            else:
                for k in range(i, i + n):
                    row = d[k]
                    for j in range(acc.shape[0]):
                        acc[j] += row[j]
        i += n


@jit
def cut(size, parts, t):
    """Start of part t of ``size`` items cut into ``parts`` (t == parts gives size)."""
    return size * t // parts


@jit
def _act_grad_block(d, y, act, slope, parts, t):
    """Block t of parts.shape[0] row blocks: act_grad_rows_ into its own zeroed partial parts[t]."""
    acc = parts[t]
    for j in range(acc.shape[0]):
        acc[j] = 0.0
    m, blocks = d.shape[0], parts.shape[0]
    act_grad_rows_(d, y, act, slope, acc, cut(m, blocks, t), cut(m, blocks, t + 1))


@jit
def fold_blocks(parts, out):
    """out[j] = sum over t of parts[t, j], t in order (a fixed order: the same bytes every step)."""
    for j in range(out.shape[0]):
        s = 0.0
        for t in range(parts.shape[0]):
            s += parts[t, j]
        out[j] = s


@jit
def act_grad_colsum_(d, y, act, slope, parts, out):
    """The backward pre-pass of a layer with bias and activation, d (M, C) in place:
    d *= act'(z) (from the output y); then, if out has length C, out[j] = sum_i d[i, j], the
    bias gradient. The sums are float64, one partial per block of rows (parts is (blocks, C),
    or (blocks, 0) for no sums), added in block order: the bytes of act_grad_colsum_par_."""
    for t in range(parts.shape[0]):
        _act_grad_block(d, y, act, slope, parts, t)
    fold_blocks(parts, out)


@par
def act_grad_colsum_par_(d, y, act, slope, parts, out):
    """act_grad_colsum_ with its row blocks on numba's threads (the same bytes)."""
    for t in numba.prange(parts.shape[0]):
        _act_grad_block(d, y, act, slope, parts, t)
    fold_blocks(parts, out)


@par
def bias_act_par_(y, b, act, slope):
    """bias_act_ by blocks of rows on numba's threads (element-wise: the same bytes)."""
    m = y.shape[0]
    for t in numba.prange(PAR_CHUNKS):
        r0, r1 = cut(m, PAR_CHUNKS, t), cut(m, PAR_CHUNKS, t + 1)
        bias_act_(y[r0:r1], b, act, slope)


@jit
def relu_chunks_(x, y, dy, c0, c1):
    """ReLU over chunks c0 <= c < c1 of a flat range, in float32 and branch-free so it vectorises:
    forward (dy empty) y = x if x > 0 else 0; backward y = dy * (1 if x > 0 else 0), the gradient
    from the input x. The bytes of act_forward's and act_backward's relu (dy * 1 and dy * 0 round the
    same in float32 as in float64; a NaN input gives 0 forward, as there). The ResNet's relu after a
    residual add, 4.2M values: backward 22 ms in act_backward (float64, not vectorised), 1.5 ms here."""
    fx, fy, fd = x.reshape(-1), y.reshape(-1), dy.reshape(-1)
    one, zero = np.float32(1.0), np.float32(0.0)
    backward = fd.shape[0] > 0
    for c in range(c0, c1):
        lo, hi = chunk(fx.shape[0], c)
        a, b = fx[lo:hi], fy[lo:hi]  # slices walked from 0: indices numba knows are not negative vectorise
        if backward:
            d = fd[lo:hi]
            for k in range(hi - lo):
                b[k] = d[k] * (one if a[k] > 0 else zero)
        else:
            for k in range(hi - lo):
                b[k] = a[k] if a[k] > 0 else zero


@par
def relu_chunks_par_(x, y, dy):
    """relu_chunks_ over all chunks on numba's threads (the same bytes)."""
    for c in numba.prange(PAR_CHUNKS):
        relu_chunks_(x, y, dy, c, c + 1)


@jit
def add_chunks_(a, b, out, c0, c1):
    """out = a + b (b empty: out = a, a copy) over chunks c0 <= c < c1 of flat float32 ranges of one size:
    the residual adds and the copies of their gradients, threaded (np.add and np.copyto take one thread)."""
    fa, fb, fo = a.reshape(-1), b.reshape(-1), out.reshape(-1)
    add = fb.shape[0] > 0
    for c in range(c0, c1):
        lo, hi = chunk(fo.shape[0], c)
        x, y = fa[lo:hi], fo[lo:hi]
        if add:
            z = fb[lo:hi]
            for k in range(hi - lo):
                y[k] = x[k] + z[k]
        else:
            for k in range(hi - lo):
                y[k] = x[k]


@par
def add_chunks_par_(a, b, out):
    """add_chunks_ over all chunks on numba's threads."""
    for c in numba.prange(PAR_CHUNKS):
        add_chunks_(a, b, out, c, c + 1)


@jit
def act_forward_range(fx, fy, act, slope, lo, hi):
    """y = act(x) over flat elements lo <= k < hi (silu and gelu need x for their gradient)."""
    if act == 6:  # a loop of its own: GELU's arithmetic vectorises where the switch below would not
        for k in range(lo, hi):
            fy[k] = gelu_value(np.float64(fx[k]))
        return
    for k in range(lo, hi):
        z = fx[k]
        if act == 1:
            r = z if z > 0 else np.float32(0.0)
        elif act == 2:
            r = math.tanh(z)
        elif act == 3:
            r = 1.0 / (1.0 + math.exp(-z))
        elif act == 4:
            r = z if z > 0 else z * slope
        elif act == 5:
            r = z / (1.0 + math.exp(-z))
        else:
            r = z
        fy[k] = r


@jit
def act_forward(x, y, act, slope):
    """y = act(x) for any activation."""
    fx = x.reshape(-1)
    act_forward_range(fx, y.reshape(-1), act, slope, 0, fx.shape[0])


@par
def act_forward_par(x, y, act, slope):
    """act_forward in PAR_CHUNKS blocks on numba's threads (element-wise: the same bytes)."""
    fx, fy = x.reshape(-1), y.reshape(-1)
    for c in numba.prange(PAR_CHUNKS):
        lo, hi = chunk(fx.shape[0], c)
        act_forward_range(fx, fy, act, slope, lo, hi)


@jit
def act_backward_range(fd, fx, fo, act, slope, lo, hi):
    """dx = dy * act'(x) over flat elements lo <= k < hi."""
    if act == 6:  # as act_forward_range
        for k in range(lo, hi):
            fo[k] = fd[k] * gelu_slope(np.float64(fx[k]))
        return
    for k in range(lo, hi):
        z = np.float64(fx[k])
        if act == 1:
            g = 1.0 if z > 0 else 0.0
        elif act == 2:
            t = math.tanh(z)
            g = 1.0 - t * t
        elif act == 3:
            s = 1.0 / (1.0 + math.exp(-z))
            g = s * (1.0 - s)
        elif act == 4:
            g = 1.0 if z > 0 else slope
        elif act == 5:
            s = 1.0 / (1.0 + math.exp(-z))
            g = s * (1.0 + z * (1.0 - s))
        else:
            g = 1.0
        fo[k] = fd[k] * g


@jit
def act_backward(dy, x, dx, act, slope):
    """dx = dy * act'(x)."""
    fx = x.reshape(-1)
    act_backward_range(dy.reshape(-1), fx, dx.reshape(-1), act, slope, 0, fx.shape[0])


@par
def act_backward_par(dy, x, dx, act, slope):
    """act_backward in PAR_CHUNKS blocks on numba's threads (element-wise: the same bytes)."""
    fd, fx, fo = dy.reshape(-1), x.reshape(-1), dx.reshape(-1)
    for c in numba.prange(PAR_CHUNKS):
        lo, hi = chunk(fx.shape[0], c)
        act_backward_range(fd, fx, fo, act, slope, lo, hi)


@jit
def ranks_ahead(z, j, zy, y):
    """Whether logit ``z`` of class ``j`` comes before the true class's ``zy`` (class ``y``) in the
    order argmax and top-k use: NaN above every number (NumPy's and PyTorch's argmax return the
    first NaN's index, so a diverged row is not a hit), equal values by lower index."""
    if z != z:
        return zy == zy or j < y
    return z > zy or (z == zy and j < y)


@jit
def softmax_xent(logits, labels, smoothing, weight, result, dlogits, want_grad):
    """Softmax cross-entropy with label smoothing and class weights, fused with top-1/top-5.

    result[0] = mean loss, result[1] = top-1 correct count, result[2] = top-5 correct
    count. With want_grad, dlogits = the mean's gradient. Target = (1 - smoothing) * onehot
    + smoothing / classes, as in PyTorch. ``weight`` (float32, one per class; empty for none) is
    torch's ``weight=``: loss = [(1 - s) sum_i w[y_i] nll_i + s/C sum_i sum_j w_j (lse_i - z_ij)]
    / sum_i w[y_i], and dz_ij = [(1 - s) w[y_i] (p_ij - [j = y_i]) + s/C (p_ij sum_k w_k - w_j)]
    / sum_i w[y_i]. A batch whose targets all weigh 0 has loss 0 and no gradient: torch's 0/0 would
    be NaN, which would stop training (or poison an epoch's mean) for a batch that carries nothing to
    learn, as a class weighted 0 can fill a small last batch. Without weights the formulas (and bytes)
    are the unweighted ones.
    """
    n, c = logits.shape
    weighted = weight.shape[0] > 0
    total = 0.0
    top1 = 0.0
    top5 = 0.0
    inv_n = 1.0 / n
    wsum = 0.0  # sum over classes of w_j
    if weighted:
        norm = 0.0
        for i in range(n):
            norm += np.float64(weight[labels[i]])
        inv_n = 1.0 / norm if norm != 0.0 else 0.0  # nothing to weigh: loss 0, no gradient (torch: 0/0)
        for j in range(c):
            wsum += np.float64(weight[j])
    off = smoothing / c
    on = 1.0 - smoothing
    for i in range(n):
        row = logits[i]
        y = labels[i]
        mx = row[0]
        for j in range(1, c):
            if row[j] > mx:
                mx = row[j]
        s = 0.0
        for j in range(c):
            s += math.exp(np.float64(row[j]) - mx)
        lse = mx + math.log(s)
        wy = 0.0
        if weighted:
            wy = np.float64(weight[y])
            wz = 0.0
            for j in range(c):
                wz += np.float64(weight[j]) * row[j]
            total += on * wy * (lse - row[y]) + off * (wsum * lse - wz)
        else:
            # loss = sum_j target_j * (lse - z_j)
            zsum = 0.0
            for j in range(c):
                zsum += row[j]
            total += on * (lse - row[y]) + off * (c * lse - zsum)
        # rank of the true class: how many logits come before it
        zy = row[y]
        better = 0
        for j in range(c):
            if ranks_ahead(row[j], j, zy, y):
                better += 1
        if better == 0:
            top1 += 1.0
        if better < 5:
            top5 += 1.0
        if want_grad:
            for j in range(c):
                p = math.exp(np.float64(row[j]) - lse)
                if weighted:
                    d = on * wy * (p - (1.0 if j == y else 0.0)) + off * (p * wsum - np.float64(weight[j]))
                else:
                    d = p - (off + (on if j == y else 0.0))
                dlogits[i, j] = d * inv_n
    result[0] = total * inv_n
    result[1] = top1
    result[2] = top5


@jit
def accumulate_metrics(result, acc, batch, loss_log, step):
    """acc += (loss * batch, top1, top5, batch); loss_log[step] = loss (training only)."""
    acc[0] += np.float64(result[0]) * batch
    acc[1] += result[1]
    acc[2] += result[2]
    acc[3] += batch
    if loss_log.shape[0] > 0:
        s = step[0]
        if s < loss_log.shape[0]:
            loss_log[s] = result[0]


TINY32 = np.float32(np.finfo(np.float32).tiny)
"""The smallest normal float32 (1.2e-38). Optimizer state below it is stored as 0: a
subnormal operand takes a slow microcode path on x86 CPUs. For a weight whose gradient
stays 0 (an always-black MNIST pixel, a dead ReLU unit), m decays by beta1 every step and
is subnormal after about 800 steps; with 20% of M subnormal the AdamW pass took 0.9 ms
against 0.5 ms. Such an m moves its weight by less than lr * 1e-30, which leaves any
float32 weight above about 1e-20 unchanged, so the weights keep PyTorch's bits.
The same holds for v wherever eps dominates the denominator sqrt(v) / sqrt(1 - beta2^t) + eps:
a subnormal v adds less than 1e-19 / sqrt(1 - beta2^t) to it. With the default eps = 1e-8 that is
far below eps's rounding; an eps below about 1e-15, with gradients below about 1e-18, can see
updates differ from PyTorch's (eps = 1e-16: 1.3% at g = 1e-18; eps = 1e-20: by orders of
magnitude), since PyTorch divides by the subnormal's square root there."""


@jit
def _flush(x):
    """x, or 0 where |x| is subnormal (a select: the loops stay vectorised). NaN and inf are
    kept: with the NaN check off they must reach the weights, as in PyTorch."""
    return np.float32(0.0) if abs(x) < TINY32 else x


@jit
def _adam_core(w, g, m, v, lr, t, beta1, beta2, eps, weight_decay, decoupled, maximize):
    """Adam/AdamW over one contiguous chunk, for finished-step count t (1-based).

    The chunk is walked as two halves side by side: eight streams of loads instead of four keep
    more cache lines in flight when W/G/M/V come from memory, as they do in a step (the MLP's pass
    took 1.00-1.04 against 1.16-1.28 ms in the step, in alternating profiles). Each element gets the
    same operations in the same order, so finite values give the same bytes (a NaN's sign bit may
    differ, as vector and scalar code propagate NaNs differently). LLVM inlines
    _adam_at into this loop (a test checks it: called out of line, a pass is ten times slower);
    writing the body in the loop with a bounds test instead gained half as much."""
    bc1 = 1.0 - beta1 ** t
    bc2_sqrt = math.sqrt(1.0 - beta2 ** t)
    step_size = np.float32(lr / bc1)
    bc2_32 = np.float32(bc2_sqrt)
    decay = np.float32(1.0 - lr * weight_decay)
    wd32 = np.float32(weight_decay)
    b2 = np.float32(beta2)
    one_b1 = np.float32(1.0 - beta1)
    b1_32 = np.float32(1.0) - one_b1  # torch's lerp at weights >= 0.5 (beta1 <= 0.5) uses 1 - weight, in float32
    one_b2 = np.float32(1.0 - beta2)
    eps32 = np.float32(eps)
    n = w.shape[0]
    half = n // 2
    # torch's lerp_ takes one of two formulas by its weight: one loop per formula, each with its
    # formula fixed (one loop given the choice as an argument measured 3% slower: 1.23 against 1.19 ms
    # on 1.47M floats, medians of 7 alternating processes)
    if abs(one_b1) < 0.5:
        for k in range(half):
            for j in (k, k + half):
                _adam_at(w, g, m, v, j, step_size, bc2_32, decay, wd32, b2, one_b1, one_b2, eps32, weight_decay,
                         decoupled, maximize, False)
        if n % 2:
            _adam_at(w, g, m, v, n - 1, step_size, bc2_32, decay, wd32, b2, one_b1, one_b2, eps32, weight_decay,
                     decoupled, maximize, False)
    else:
        for k in range(half):
            for j in (k, k + half):
                _adam_at(w, g, m, v, j, step_size, bc2_32, decay, wd32, b2, b1_32, one_b2, eps32, weight_decay,
                         decoupled, maximize, True)
        if n % 2:
            _adam_at(w, g, m, v, n - 1, step_size, bc2_32, decay, wd32, b2, b1_32, one_b2, eps32, weight_decay,
                     decoupled, maximize, True)


@jit
def _adam_at(w, g, m, v, j, step_size, bc2_32, decay, wd32, b2, lerp_w, one_b2, eps32, weight_decay, decoupled,
             maximize, from_end):
    """Adam/AdamW at element j, PyTorch's order of operations; the new m and v are flushed to 0
    below TINY32. m is torch's ``exp_avg.lerp_(grad, 1 - beta1)``: ``m + (g - m) * (1 - beta1)``, or,
    when 1 - beta1 >= 0.5 (``from_end``; lerp_w is then beta1 as float32 1 - (1 - beta1)),
    ``g - (g - m) * lerp_w``: the two formulas ATen's lerp picks between. ATen's vectorised CPU code
    fuses each into a multiply-add, so m can differ from torch's by an ulp; the formula's choice is
    what matters (at beta1 = 0 torch's m is the gradient exactly, and so is this one)."""
    gk = g[j]
    if maximize:
        gk = -gk
    wk = w[j]
    if decoupled:
        wk = wk * decay
    elif weight_decay != 0.0:
        gk = gk + wd32 * wk
    mk = _flush(gk - (gk - m[j]) * lerp_w if from_end else m[j] + (gk - m[j]) * lerp_w)
    vk = _flush(v[j] * b2 + one_b2 * gk * gk)
    m[j] = mk
    v[j] = vk
    denom = np.float32(math.sqrt(vk)) / bc2_32 + eps32
    w[j] = wk - step_size * (mk / denom)


@jit
def _adam_chunks(w, g, m, v, lr_table, step, beta1, beta2, eps, weight_decay, decoupled, maximize, c0, c1):
    t = step[0]
    lr = np.float64(lr_table[min(t, lr_table.shape[0] - 1)])
    for c in range(c0, c1):
        lo, hi = chunk(w.shape[0], c)
        _adam_core(w[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi], lr, t + 1, beta1, beta2, eps, weight_decay,
                   decoupled, maximize)


@jit
def adam_update(w, g, m, v, lr_table, step, beta1, beta2, eps, weight_decay, decoupled, maximize):
    """One Adam/AdamW step over whole W/G/M/V ranges, PyTorch's formulas exactly (state below
    the smallest normal float32 is stored as 0, see TINY32).

    step[0] counts finished steps; lr_table[step[0]] is this step's learning rate.
    AdamW (decoupled): w *= 1 - lr*wd. Adam: g += wd*w. Then
    m = b1*m + (1-b1)*g, v = b2*v + (1-b2)*g*g,
    w -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps).
    """
    _adam_chunks(w, g, m, v, lr_table, step, beta1, beta2, eps, weight_decay, decoupled, maximize, 0, PAR_CHUNKS)
    step[0] += 1


@par
def adam_update_par(w, g, m, v, lr_table, step, beta1, beta2, eps, weight_decay, decoupled, maximize):
    """adam_update with its chunks on numba's threads (the same bytes)."""
    for c in numba.prange(PAR_CHUNKS):
        _adam_chunks(w, g, m, v, lr_table, step, beta1, beta2, eps, weight_decay, decoupled, maximize, c, c + 1)
    step[0] += 1


@jit
def _sgd_core(w, g, m, lr, first, momentum, dampening, weight_decay, nesterov, maximize):
    mom = np.float32(momentum)
    damp = np.float32(1.0 - dampening)
    wd = np.float32(weight_decay)
    lr32 = np.float32(lr)
    use_m = m.shape[0] > 0
    for k in range(w.shape[0]):
        gk = g[k]
        if maximize:
            gk = -gk
        if weight_decay != 0.0:
            gk = gk + wd * w[k]
        if use_m:
            if first:
                buf = _flush(gk)
            else:
                buf = _flush(mom * m[k] + damp * gk)  # a decaying buffer goes subnormal too (see TINY32)
            m[k] = buf
            if nesterov:
                gk = gk + mom * buf
            else:
                gk = buf
        w[k] = w[k] - lr32 * gk


@jit
def _sgd_chunks(w, g, m, lr_table, step, momentum, dampening, weight_decay, nesterov, maximize, c0, c1):
    t = step[0]
    lr = lr_table[min(t, lr_table.shape[0] - 1)]
    use_m = m.shape[0] > 0
    for c in range(c0, c1):
        lo, hi = chunk(w.shape[0], c)
        mm = m[lo:hi] if use_m else m[0:0]
        _sgd_core(w[lo:hi], g[lo:hi], mm, lr, t == 0, momentum, dampening, weight_decay, nesterov, maximize)


@jit
def sgd_update(w, g, m, lr_table, step, momentum, dampening, weight_decay, nesterov, maximize):
    """One SGD step over whole ranges, PyTorch's formulas (first step: buf = g)."""
    _sgd_chunks(w, g, m, lr_table, step, momentum, dampening, weight_decay, nesterov, maximize, 0, PAR_CHUNKS)
    step[0] += 1


@par
def sgd_update_par(w, g, m, lr_table, step, momentum, dampening, weight_decay, nesterov, maximize):
    """sgd_update with its chunks on numba's threads (the same bytes)."""
    for c in numba.prange(PAR_CHUNKS):
        _sgd_chunks(w, g, m, lr_table, step, momentum, dampening, weight_decay, nesterov, maximize, c, c + 1)
    step[0] += 1


@jit
def gather_batch(x_src, y_src, perm, cursor, x_out, y_out):
    """Copy the next batch (rows perm[cursor:cursor+B]) into an input buffer and advance the
    cursor; returns batch_status's code (0 ok; otherwise nothing is copied or advanced).

    Rows are copied by an explicit element loop: a slice assignment per row
    (``x_out[i] = x_src[r]``) went through numba's generic array-copy path and took
    1.6x as long for MNIST rows of 784 floats.
    """
    start = cursor[0]
    n = y_out.shape[0]
    status = batch_status(perm, start, n, x_src.shape[0])
    if status:
        return status
    _gather_rows(x_src, y_src, perm, start, x_out, y_out, 0, n)
    cursor[0] = start + n
    return 0


@jit
def batch_status(perm, start, n, rows):
    """0 when the batch perm[start:start+n] lies inside the data order and names rows of the
    source; else data.augment's codes: 1 the cursor runs past the order, 2 an entry is not a row.
    Checked before anything is copied: numba does not check indices, so a stray cursor would
    read outside the source."""
    if start < 0 or start + n > perm.shape[0]:
        return 1
    for i in range(n):
        r = perm[start + i]
        if r < 0 or r >= rows:
            return 2
    return 0


@jit
def _gather_rows(x_src, y_src, perm, start, x_out, y_out, i0, i1):
    """Rows i0 <= i < i1 of a batch: x_out[i] = x_src[perm[start + i]], and the label."""
    d = x_out.shape[1]
    for i in range(i0, i1):
        r = perm[start + i]
        src = x_src[r]
        dst = x_out[i]
        for j in range(d):
            dst[j] = src[j]
        y_out[i] = y_src[r]


@par
def gather_batch_par(x_src, y_src, perm, cursor, x_out, y_out):
    """gather_batch with the rows in PAR_CHUNKS blocks on numba's threads (the same bytes; the
    source rows are random reads, so two threads keep twice the cache misses in flight)."""
    start = cursor[0]
    n = y_out.shape[0]
    status = batch_status(perm, start, n, x_src.shape[0])
    if status:
        return status
    for t in numba.prange(PAR_CHUNKS):
        _gather_rows(x_src, y_src, perm, start, x_out, y_out, n * t // PAR_CHUNKS, n * (t + 1) // PAR_CHUNKS)
    cursor[0] = start + n
    return 0


@jit
def gather_token_windows(x_src, y_src, perm, cursor, x_out, y_out):
    """gather_batch for token windows cut to the buffers' shorter context: the first T' ids and targets of
    rows perm[cursor:cursor+B]; batch_status's code (0 ok, nothing copied otherwise)."""
    start = cursor[0]
    n, t = x_out.shape
    status = batch_status(perm, start, n, x_src.shape[0])
    if status:
        return status
    for i in range(n):
        r = perm[start + i]
        for k in range(t):
            x_out[i, k] = x_src[r, k]
            y_out[i, k] = y_src[r, k]
    cursor[0] = start + n
    return 0


@jit
def mul_(out, a, b):
    """out = a * b elementwise (flat views)."""
    fo = out.reshape(-1)
    fa = a.reshape(-1)
    fb = b.reshape(-1)
    for k in range(fo.shape[0]):
        fo[k] = fa[k] * fb[k]


@jit
def all_finite(x):
    """Index of the first non-finite element of a flat range, or -1."""
    for k in range(x.shape[0]):
        if not math.isfinite(x[k]):
            return k
    return -1


@numba.njit(cache=True, nogil=True, fastmath={"reassoc"}, error_model="numpy")
def nonfinite_probe(x):
    """Sum of (x - x): 0 when every element is finite, NaN otherwise.

    Reassociation lets the sum vectorise (8x faster than a branchy scan); it
    cannot change the answer, since every term is exactly 0 or NaN. The range is
    read as four interleaved streams: one stream from memory is latency-bound on
    this CPU, four keep more cache-line fetches in flight (0.29 against 0.38 ms
    for the MLP's gradients after eviction).
    """
    n = x.shape[0]
    q = n // 4
    a = x[0:q]
    b = x[q:2 * q]
    c = x[2 * q:3 * q]
    d = x[3 * q:4 * q]
    s0 = np.float32(0.0)
    s1 = np.float32(0.0)
    s2 = np.float32(0.0)
    s3 = np.float32(0.0)
    for k in range(q):
        s0 += a[k] - a[k]
        s1 += b[k] - b[k]
        s2 += c[k] - c[k]
        s3 += d[k] - d[k]
    for k in range(4 * q, n):
        s0 += x[k] - x[k]
    return s0 + s1 + s2 + s3


@par
def nonfinite_probe_par(x, parts):
    """nonfinite_probe over PAR_CHUNKS chunks on numba's threads (the same answer: 0 or NaN), each
    chunk's into parts[c] (PAR_CHUNKS float32): a prange reduction would allocate its per-thread
    array on every call."""
    for c in numba.prange(PAR_CHUNKS):
        lo, hi = chunk(x.shape[0], c)
        parts[c] = nonfinite_probe(x[lo:hi])
    s = np.float32(0.0)
    for c in range(PAR_CHUNKS):
        s += parts[c]
    return s


@jit
def sq_sum(x):
    """Sum of squares of a float32 range, accumulated in float64 in an order written out here: eight
    accumulators, element i into accumulator i % 8, then ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)).
    Eight independent chains keep the adds from waiting on each other without letting the compiler
    reorder (reassociation made the order the compiler's choice), so kernels/native.c's twin gives the
    same float64 and the clip norm the same float32 bytes on either path. The price is on this path:
    numba does not vectorise the chains, 0.22 ms for the MLP's 1.47M gradients on two threads against
    0.11 ms reassociated (the C twin, which gcc vectorises, 0.11 ms): a clipped conv net's 50 ms step
    pays 0.1 ms for bytes that do not depend on the backend."""
    n = x.shape[0]
    q = n - n % 8
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
    for i in range(0, q, 8):
        v0, v1, v2, v3 = np.float64(x[i]), np.float64(x[i + 1]), np.float64(x[i + 2]), np.float64(x[i + 3])
        v4, v5, v6, v7 = np.float64(x[i + 4]), np.float64(x[i + 5]), np.float64(x[i + 6]), np.float64(x[i + 7])
        a0 += v0 * v0
        a1 += v1 * v1
        a2 += v2 * v2
        a3 += v3 * v3
        a4 += v4 * v4
        a5 += v5 * v5
        a6 += v6 * v6
        a7 += v7 * v7
    for i in range(q, n):
        v = np.float64(x[i])
        a0 += v * v
    return ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))


@par
def sq_sum_par(x):
    """sq_sum over PAR_CHUNKS chunks on numba's threads, the chunk sums added in chunk order
    (the same float64 on every thread count; sq_sum_chunked is its serial twin)."""
    part = np.zeros(PAR_CHUNKS, np.float64)
    for c in numba.prange(PAR_CHUNKS):
        lo, hi = chunk(x.shape[0], c)
        part[c] = sq_sum(x[lo:hi])
    total = 0.0
    for c in range(PAR_CHUNKS):
        total += part[c]
    return total


@jit
def sq_sum_chunked(x):
    """sq_sum_par's chunks and order on one thread (the same float64)."""
    total = 0.0
    for c in range(PAR_CHUNKS):
        lo, hi = chunk(x.shape[0], c)
        total += sq_sum(x[lo:hi])
    return total


@jit
def scale_(x, factor):
    """x *= factor in float32, element by element (torch's grad.mul_(clip_coef))."""
    for i in range(x.shape[0]):
        x[i] = x[i] * factor


@par
def scale_par(x, factor):
    for c in numba.prange(PAR_CHUNKS):
        lo, hi = chunk(x.shape[0], c)
        scale_(x[lo:hi], factor)


@jit
def ema_(e, w, decay):
    """e = decay * e + (1 - decay) * w, element-wise, as two halves side by side (see _adam_core); the
    caller warms ``decay`` up (kernels/cpu.py ema_update)."""
    d = np.float32(decay)
    one_d = np.float32(1.0 - decay)
    n = e.shape[0]
    half = n // 2
    for k in range(half):
        for j in (k, k + half):
            e[j] = d * e[j] + one_d * w[j]
    if n % 2:
        e[n - 1] = d * e[n - 1] + one_d * w[n - 1]


# ---- LARS (renaissance_nb/optim/lars.py binds these; kernels/native.c has their C twins) ----------------------
@jit
def lars_norms(w, g, n, seg):
    """[||w||, ||g||] of each LARS weight tensor into the N range: ``seg[i] = (offset in the W and G ranges,
    size, offset of its pair in the N range)``. Each norm is a float64 sum of squares in sq_sum_chunked's
    order (one order on every thread count and in C), its square root rounded to float32 as the clip norm is."""
    for i in range(seg.shape[0]):
        lo, hi, at = seg[i, 0], seg[i, 0] + seg[i, 1], seg[i, 2]
        n[at] = np.float32(math.sqrt(sq_sum_chunked(w[lo:hi])))
        n[at + 1] = np.float32(math.sqrt(sq_sum_chunked(g[lo:hi])))


@par
def lars_norms_par(w, g, n, seg):
    """lars_norms with its 2 * k norms on numba's threads (each one sum in the serial order: the same bytes)."""
    for q in numba.prange(2 * seg.shape[0]):
        i, which = q // 2, q % 2
        lo, hi = seg[i, 0], seg[i, 0] + seg[i, 1]
        x = w[lo:hi] if which == 0 else g[lo:hi]
        n[seg[i, 2] + which] = np.float32(math.sqrt(sq_sum_chunked(x)))


@jit
def lars_trust(n, at, trust_coefficient, weight_decay, eps):
    """eta * ||w|| / (||g|| + wd * ||w|| + eps) from the pair n[at], n[at + 1] in float64, rounded to
    float32; 1 where either norm is 0 (torchlars' rule: a zero tensor or gradient keeps the plain step)."""
    wn, gn = np.float64(n[at]), np.float64(n[at + 1])
    if wn > 0.0 and gn > 0.0:
        return np.float32(trust_coefficient * wn / (gn + weight_decay * wn + eps))
    return np.float32(1.0)


@jit
def _lars_span(w, g, m, lo, hi, lr32, mom, scale, wd32, adapt):
    """Elements lo..hi of one piece: momentum SGD, on scale * (g + wd * w) where the piece is adapted."""
    for j in range(lo, hi):
        gk = g[j]
        if adapt:
            gk = scale * (gk + wd32 * w[j])
        buf = _flush(mom * m[j] + gk)  # a decaying buffer goes subnormal too (see TINY32)
        m[j] = buf
        w[j] = w[j] - lr32 * buf


@jit
def _lars_chunks(w, g, m, n, pieces, lr32, momentum, weight_decay, trust_coefficient, eps, c0, c1):
    mom, wd32 = np.float32(momentum), np.float32(weight_decay)
    for c in range(c0, c1):
        lo, hi = chunk(w.shape[0], c)
        for k in range(pieces.shape[0]):
            a, b, at = max(pieces[k, 0], lo), min(pieces[k, 1], hi), pieces[k, 2]
            if a >= b:
                continue
            if at >= 0:
                scale = lars_trust(n, at, trust_coefficient, weight_decay, eps)
                _lars_span(w, g, m, a, b, lr32, mom, scale, wd32, True)
            else:
                _lars_span(w, g, m, a, b, lr32, mom, np.float32(1.0), wd32, False)


@jit
def lars_update(w, g, m, n, pieces, lr_table, step, momentum, weight_decay, trust_coefficient, eps):
    """One LARS step over the whole W/G/M ranges (optim/lars.py has the formula). ``pieces[k] = (start, end,
    N offset or -1)`` cut the range in order: an adapted weight tensor with its norms' pair, or a run of
    excluded values (biases, batch-norm parameters, padding) updated by plain momentum SGD."""
    t = step[0]
    lr32 = lr_table[min(t, lr_table.shape[0] - 1)]
    _lars_chunks(w, g, m, n, pieces, lr32, momentum, weight_decay, trust_coefficient, eps, 0, PAR_CHUNKS)
    step[0] += 1


@par
def lars_update_par(w, g, m, n, pieces, lr_table, step, momentum, weight_decay, trust_coefficient, eps):
    """lars_update with its chunks on numba's threads (the same bytes)."""
    t = step[0]
    lr32 = lr_table[min(t, lr_table.shape[0] - 1)]
    for c in numba.prange(PAR_CHUNKS):
        _lars_chunks(w, g, m, n, pieces, lr32, momentum, weight_decay, trust_coefficient, eps, c, c + 1)
    step[0] += 1

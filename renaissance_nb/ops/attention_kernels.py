"""The CPU kernels of causal self-attention (ops/attention.py), on (B, H, T, hd) head-major tensors.

Two forms of the same function:

- materialised: the scores S = q k^T / sqrt(hd) of every head, masked above the diagonal, and their
  softmax P, (B, H, T, T) in the arena; the backward reads P.
- memory-efficient (flash): query blocks against key blocks with the online softmax (running max m,
  running sum l, the output rescaled as the max grows), keeping only each row's log-sum-exp
  L = m + log l; the backward recomputes every block's P = exp(S - L). No T x T tensor exists: the
  largest scratch is one block of scores per head, (B, H, block, block).

Products are np.matmul into planned buffers (``out=``), those summing over keys by blocks of queries or keys
that skip the masked blocks (CAUSAL_BLOCK); the row-wise passes (softmax, its gradient,
the online update) are numba loops in float64, with exp_math.neg_exp for exp and sums in a fixed order of 8
lanes (see "the row passes' arithmetic" below); kernels/attention_native.c is their C twin, the same bytes.
The same shapes give the same bytes on every run. The two forms round differently (the online softmax
rescales as it goes): the tests compare each with a float64 reference.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numba
import numpy as np

from ..kernels import gpt_native
from ..kernels.exp_math import jit as inline
from ..kernels.exp_math import neg_exp
from ..kernels.fused import chunk, jit, par
from ..kernels.operands import PAR_CHUNKS
from .common import threaded


def split_heads(qkv: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    """qkv (B, T, 3d) as nn.Linear(d, 3d) gives it (q | k | v, each head's hd features together) into
    q, k, v (B, H, T, hd)."""
    b, h, t, hd = q.shape
    parts = qkv.reshape(b, t, 3, h, hd)
    for i, dst in enumerate((q, k, v)):
        np.copyto(dst, parts[:, :, i].transpose(0, 2, 1, 3))


def merge_heads(o: np.ndarray, y: np.ndarray) -> None:
    """o (B, H, T, hd) into y (B, T, H*hd)."""
    b, h, t, hd = o.shape
    np.copyto(y.reshape(b, t, h, hd), o.transpose(0, 2, 1, 3))


def merge_qkv(dq: np.ndarray, dk: np.ndarray, dv: np.ndarray, dqkv: np.ndarray) -> None:
    """dq, dk, dv (B, H, T, hd) into dqkv (B, T, 3d), the layout nn.Linear(d, 3d) gave qkv."""
    b, h, t, hd = dq.shape
    parts = dqkv.reshape(b, t, 3, h, hd)
    for i, src in enumerate((dq, dk, dv)):
        np.copyto(parts[:, :, i], src.transpose(0, 2, 1, 3))


def block_view(buf: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The first prod(shape) elements of a planned buffer as a contiguous array of ``shape``."""
    return buf.reshape(-1)[:math.prod(shape)].reshape(shape)


# ---- the row passes' arithmetic (attention_native.c: the same operations in the same order) ---------------
# exp is softmax_exp (exp_math.neg_exp, NaN kept), not libm's: it vectorises and gives the same bits on every
# machine. Sums and maxima over a row run in 8 interleaved lanes: element j goes to lane j % 8, each lane in
# index order from 0.0 (a max from -inf), and the lanes combine in one fixed tree, ((l0 + l1) + (l2 + l3)) +
# ((l4 + l5) + (l6 + l7)). Why: one running sum is a chain of dependent adds (about 4 cycles an element);
# eight independent chains pipeline. The order is written out here and in C, never a compiler's (no
# fastmath, no simd reduction), so both twins give the same bits.
@inline
def softmax_exp(a):
    """exp(a) of a softmax argument (score - max <= 0; recompute_probs' may be a rounding above 0, which
    neg_exp takes as well): neg_exp, but a NaN stays NaN (neg_exp takes it as -708), so a diverged score still
    turns its row into NaN for the trainer's check."""
    e = neg_exp(a)
    return e if a == a else a


@inline
def padded(n, w):
    """n rounded up to 8 within a row's width w: where a row's exp loops may stop. The columns past n are
    computed and dropped (or overwritten with 0), so the vector loop ends without a scalar tail (up to 7
    scalar exps, each about six of the vector loop's); they are in the row, and exp of any float is harmless."""
    return min((n + 7) // 8 * 8, w)


@inline
def max2(a, b):
    """b if b > a else a: a running max's update (a NaN b never wins)."""
    return b if b > a else a


@inline
def lane_tree(s):
    """The lanes' fixed combining tree."""
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))


@inline
def lane_max(x, n, scale, m):
    """max over j < n of x[j] * scale (float64) in 8 lanes (m: their scratch); NaN never counts, an empty row
    gives -inf."""
    m[:] = -np.inf
    j = 0
    while j + 8 <= n:
        for q in range(8):
            m[q] = max2(m[q], np.float64(x[j + q]) * scale)
        j += 8
    for q in range(n - j):
        m[q] = max2(m[q], np.float64(x[j + q]) * scale)
    return max2(max2(max2(m[0], m[1]), max2(m[2], m[3])), max2(max2(m[4], m[5]), max2(m[6], m[7])))


@inline
def lane_dot(x, y, n, s):
    """sum over j < n of float64(x[j]) * y[j] in 8 lanes (s: their scratch; y float32 or float64, the product
    float64)."""
    s[:] = 0.0
    j = 0
    while j + 8 <= n:
        for q in range(8):
            s[q] += np.float64(x[j + q]) * y[j + q]
        j += 8
    for q in range(n - j):
        s[q] += np.float64(x[j + q]) * y[j + q]
    return lane_tree(s)


@inline
def lane_sum(x, n, s):
    """sum over j < n of float64(x[j]) in 8 lanes (s: their scratch)."""
    s[:] = 0.0
    j = 0
    while j + 8 <= n:
        for q in range(8):
            s[q] += np.float64(x[j + q])
        j += 8
    for q in range(n - j):
        s[q] += np.float64(x[j + q])
    return lane_tree(s)


# ---- row-wise passes (numba): each over heads g0 <= g < g1, and its twin over PAR_CHUNKS blocks of heads ------
@jit
def causal_softmax_rows(s, scale, g0, g1):
    """s (BH, T, T) = softmax over keys of scale * s, keys after the query masked (probability 0). Each row:
    its max m, e = exp(scale s - m) in float64 (scratch), their lane sum, then e * (1 / sum) rounded once to
    float32 (within 0.5 ulp and 1e-15 relative of the exact quotient)."""
    e, lanes = np.empty(s.shape[2]), np.empty(8)
    for g in range(g0, g1):
        for i in range(s.shape[1]):
            row, n = s[g, i], i + 1
            w = padded(n, row.shape[0])
            m = lane_max(row, n, scale, lanes)
            for j in range(w):
                e[j] = softmax_exp(np.float64(row[j]) * scale - m)
            inv = 1.0 / lane_sum(e, n, lanes)
            for j in range(w):
                row[j] = np.float32(e[j] * inv)
            for j in range(n, row.shape[0]):
                row[j] = 0.0


@jit
def softmax_grad_rows(dp, p, scale, g0, g1):
    """dp (BH, T, T) = scale * P (dP - sum_j dP P), in place, each row in float64 (the sum in lanes)."""
    lanes = np.empty(8)
    for g in range(g0, g1):
        for i in range(dp.shape[1]):
            d, pr = dp[g, i], p[g, i]
            s = lane_dot(d, pr, d.shape[0], lanes)
            for j in range(d.shape[0]):
                d[j] = np.float32(scale * pr[j] * (np.float64(d[j]) - s))


@jit
def online_step_rows(s, m, l, acc, scale, i0, j0, g0, g1):
    """One key block of the online softmax for a query block: s (BH, nq, nk) raw scores in, their
    float32(exp(scale s - m_new)) out (masked keys 0); m, l (BH, nq) and acc (BH, nq, hd) rescaled to m_new,
    l plus the lane sum of the float32 values (what the product with v sums)."""
    lanes = np.empty(8)
    for g in range(g0, g1):
        for r in range(s.shape[1]):
            row = s[g, r]
            last = min(row.shape[0], i0 + r - j0 + 1)  # keys j0 + c <= query i0 + r
            mo = m[g, r]
            mn = max2(mo, lane_max(row, last, scale, lanes))
            corr = softmax_exp(mo - mn) if mo > -np.inf else 0.0
            for c in range(padded(last, row.shape[0])):
                row[c] = np.float32(softmax_exp(np.float64(row[c]) * scale - mn))
            for c in range(last, row.shape[0]):
                row[c] = 0.0
            l[g, r] = l[g, r] * corr + lane_sum(row, last, lanes)
            m[g, r] = mn
            for k in range(acc.shape[2]):
                acc[g, r, k] = acc[g, r, k] * corr


@jit
def finish_rows(acc, m, l, o, lse, i0, g0, g1):
    """o[i0 + r] = acc[r] / l[r]; lse = m + log l."""
    for g in range(g0, g1):
        for r in range(acc.shape[1]):
            inv = 1.0 / l[g, r]
            for k in range(acc.shape[2]):
                o[g, i0 + r, k] = np.float32(acc[g, r, k] * inv)
            lse[g, i0 + r] = np.float32(m[g, r] + math.log(l[g, r]))


@jit
def recompute_probs_rows(s, lse, scale, i0, j0, g0, g1):
    """s (BH, nq, nk) raw scores -> P = exp(scale s - L) of the forward (masked keys 0)."""
    for g in range(g0, g1):
        for r in range(s.shape[1]):
            row = s[g, r]
            last = min(row.shape[0], i0 + r - j0 + 1)
            big = np.float64(lse[g, i0 + r])
            for c in range(padded(last, row.shape[0])):
                row[c] = np.float32(softmax_exp(np.float64(row[c]) * scale - big))
            for c in range(last, row.shape[0]):
                row[c] = 0.0


@jit
def block_softmax_grad_rows(dp, p, dsum, scale, i0, g0, g1):
    """dS = scale * P (dP - D) for a block, in dp; D = rowsum(dO * O) of the forward output."""
    for g in range(g0, g1):
        for r in range(dp.shape[1]):
            d = np.float64(dsum[g, i0 + r])
            for c in range(dp.shape[2]):
                dp[g, r, c] = np.float32(scale * p[g, r, c] * (np.float64(dp[g, r, c]) - d))


@jit
def row_dots_rows(a, b, out, g0, g1):
    """out[g, i] = sum_k a[g, i, k] b[g, i, k] in float64 (in lanes)."""
    lanes = np.empty(8)
    for g in range(g0, g1):
        for i in range(a.shape[1]):
            out[g, i] = np.float32(lane_dot(a[g, i], b[g, i], a.shape[2], lanes))


@par
def causal_softmax_par(s, scale):
    for c in numba.prange(PAR_CHUNKS):
        g0, g1 = chunk(s.shape[0], c)
        causal_softmax_rows(s, scale, g0, g1)


@par
def softmax_grad_par(dp, p, scale):
    for c in numba.prange(PAR_CHUNKS):
        g0, g1 = chunk(dp.shape[0], c)
        softmax_grad_rows(dp, p, scale, g0, g1)


@par
def online_step_par(s, m, l, acc, scale, i0, j0):
    for c in numba.prange(PAR_CHUNKS):
        g0, g1 = chunk(s.shape[0], c)
        online_step_rows(s, m, l, acc, scale, i0, j0, g0, g1)


@par
def finish_par(acc, m, l, o, lse, i0):
    for c in numba.prange(PAR_CHUNKS):
        g0, g1 = chunk(acc.shape[0], c)
        finish_rows(acc, m, l, o, lse, i0, g0, g1)


@par
def recompute_probs_par(s, lse, scale, i0, j0):
    for c in numba.prange(PAR_CHUNKS):
        g0, g1 = chunk(s.shape[0], c)
        recompute_probs_rows(s, lse, scale, i0, j0, g0, g1)


@par
def block_softmax_grad_par(dp, p, dsum, scale, i0):
    for c in numba.prange(PAR_CHUNKS):
        g0, g1 = chunk(dp.shape[0], c)
        block_softmax_grad_rows(dp, p, dsum, scale, i0, g0, g1)


@par
def row_dots_par(a, b, out):
    for c in numba.prange(PAR_CHUNKS):
        g0, g1 = chunk(a.shape[0], c)
        row_dots_rows(a, b, out, g0, g1)


def pick(serial: Callable[..., None], parallel: Callable[..., None], heads: int, work: int) -> Callable[..., None]:
    """The pass to bind: the parallel twin for large work (ops/common.py ``threaded``), else the serial
    one over every head. Both give the same bytes (each head's rows are one thread's)."""
    if threaded(work):
        return parallel
    return lambda *args: serial(*args, 0, heads)


def _heads(a: np.ndarray) -> np.ndarray:
    """(B, H, T, x) as (B*H, T, x), the same bytes."""
    return a.reshape(-1, *a.shape[2:])


CAUSAL_BLOCK = 32
"""Rows (or keys) per product block where a product sums over keys (P v, P^T dO, dS k, dS^T q): each block
takes only the keys (queries) on its side of the diagonal, [0, block end) ([block start, T)), so the fully
masked blocks above it (zeros of P and dS) are never multiplied: about 40% fewer flops at T = 128, 0.4 ms
of the 1.2 of each product here. attention_native.c's CAUSAL_BLOCK, its per-head twin: the same BLAS
calls, so the same bytes. (S = q k^T and dP = dO v^T stay whole: by blocks they took as long.)"""


def causal_blocks(t: int) -> list[tuple[int, int]]:
    """[(b0, b1)]: range(t) cut into CAUSAL_BLOCK pieces (the last one short)."""
    return [(b0, min(t, b0 + CAUSAL_BLOCK)) for b0 in range(0, t, CAUSAL_BLOCK)]


def keys_before(a: np.ndarray, x: np.ndarray, out: np.ndarray) -> list[tuple[np.ndarray, ...]]:
    """out = a x for causal a (B, H, T, T), by query blocks: out[b0:b1] = a[b0:b1, :b1] x[:b1]."""
    return [(a[:, :, b0:b1, :b1], x[:, :, :b1], out[:, :, b0:b1]) for b0, b1 in causal_blocks(a.shape[-1])]


def queries_after(a: np.ndarray, x: np.ndarray, out: np.ndarray) -> list[tuple[np.ndarray, ...]]:
    """out = a^T x for causal a (B, H, T, T), by key blocks: out[b0:b1] = a[b0:, b0:b1]^T x[b0:]."""
    return [(a[:, :, b0:, b0:b1].swapaxes(-1, -2), x[:, :, b0:], out[:, :, b0:b1])
            for b0, b1 in causal_blocks(a.shape[-1])]


def products(calls: list[tuple[np.ndarray, ...]]) -> None:
    """np.matmul(a, b, out=c) for each (a, b, c)."""
    for a, b, c in calls:
        np.matmul(a, b, out=c)


# ---- the materialised form -----------------------------------------------------------------------------
def bind_scores(outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Callable[[], None]:
    """qkv -> q, k, v (saved) and P = softmax(mask(q k^T / sqrt(hd))) (saved)."""
    (qkv,), (q, k, v, probs) = ins, outs
    scale = 1.0 / math.sqrt(q.shape[-1])
    kt, p3 = k.swapaxes(-1, -2), _heads(probs)
    softmax = pick(causal_softmax_rows, causal_softmax_par, p3.shape[0], probs.size)

    def run() -> None:
        split_heads(qkv, q, k, v)
        np.matmul(q, kt, out=probs)
        softmax(p3, scale)
    return run


def bind_mix(outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Callable[[], None]:
    """y (B, T, d) = merge(P v); ``o`` (B, H, T, hd) is scratch."""
    (probs, v), (y, o) = ins, outs
    pv = keys_before(probs, v, o)

    def run() -> None:
        products(pv)
        merge_heads(o, y)
    return run


def bind_mix_bwd(outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Callable[[], None]:
    """From dy (B, T, d): dP = dO v^T and dv = P^T dO (dO: dy by heads, in scratch ``do``)."""
    (dy, probs, v), (dprobs, dv, do) = ins, outs
    b, h, t, hd = do.shape
    vt, ptdo = v.swapaxes(-1, -2), queries_after(probs, do, dv)

    def run() -> None:
        np.copyto(do, dy.reshape(b, t, h, hd).transpose(0, 2, 1, 3))
        products(ptdo)
        np.matmul(do, vt, out=dprobs)
    return run


def bind_scores_bwd(outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Callable[[], None]:
    """dS = P (dP - rowsum(dP P)) / sqrt(hd), in dP's own buffer (this node is its last reader, and
    lists it among its outputs); dq = dS k, dk = dS^T q; with dv, the gradient of qkv (B, T, 3d)."""
    (dprobs, probs, q, k, dv), (dqkv, dq, dk, dprobs_again) = ins, outs
    assert dprobs_again.shape == dprobs.shape
    scale = 1.0 / math.sqrt(q.shape[-1])
    d3, p3 = _heads(dprobs), _heads(probs)
    grad = pick(softmax_grad_rows, softmax_grad_par, d3.shape[0], dprobs.size)
    dsk, dstq = keys_before(dprobs, k, dq), queries_after(dprobs, q, dk)

    def run() -> None:
        grad(d3, p3, scale)
        products(dsk)
        products(dstq)
        merge_qkv(dq, dk, dv, dqkv)
    return run


# ---- the memory-efficient form ---------------------------------------------------------------------------
def bind_flash_fwd(outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Callable[[], None]:
    """qkv -> q, k, v (saved), y = merge(softmax(q k^T / sqrt hd) v) block by block, and each row's
    log-sum-exp (saved). Scratch: a score block, the running max, sum and accumulator (float64), a
    product block, and o (B, H, T, hd)."""
    (qkv,), (q, k, v, y, lse, sblk, mrow, lrow, acc, prod, o) = ins, outs
    b, h, t, hd = q.shape
    bh, blk, scale = b * h, int(p["block"]), 1.0 / math.sqrt(hd)
    q3, k3, v3, o3, lse2 = _heads(q), _heads(k), _heads(v), _heads(o), lse.reshape(bh, t)
    plan = []
    for i0 in range(0, t, blk):
        nq = min(blk, t - i0)
        keys = [(j0, min(blk, i0 + nq - j0)) for j0 in range(0, i0 + nq, blk)]
        plan.append((i0, nq, [(j0, nk, block_view(sblk, (bh, nq, nk)), block_view(prod, (bh, nq, hd)),
                                k3[:, j0:j0 + nk].swapaxes(-1, -2), v3[:, j0:j0 + nk]) for j0, nk in keys],
                     block_view(mrow, (bh, nq)), block_view(lrow, (bh, nq)), block_view(acc, (bh, nq, hd)),
                     q3[:, i0:i0 + nq]))
    work = bh * blk * blk
    online, finish = pick(online_step_rows, online_step_par, bh, work), pick(finish_rows, finish_par, bh, work)

    def run() -> None:
        split_heads(qkv, q, k, v)
        for i0, nq, blocks, m, l, a, qi in plan:
            m.fill(-np.inf)
            l.fill(0.0)
            a.fill(0.0)
            for j0, nk, s, pv, kj_t, vj in blocks:
                np.matmul(qi, kj_t, out=s)
                online(s, m, l, a, scale, i0, j0)
                np.matmul(s, vj, out=pv)
                np.add(a, pv, out=a)
            finish(a, m, l, o3, lse2, i0)
        merge_heads(o, y)
    return run


def bind_flash_bwd(outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Callable[[], None]:
    """From dy: D = rowsum(dO O), then per (query block, key block) P = exp(S - L) recomputed,
    dv_j += P^T dO_i, dS = P (dO_i v_j^T - D) / sqrt hd, dq_i += dS k_j, dk_j += dS^T q_i; the
    gradient of qkv from dq, dk, dv. Scratch: the score and dP blocks, two product blocks, dO, O, D."""
    (dy, y, q, k, v, lse), (dqkv, dq, dk, dv, sblk, dpblk, pq, pk, do, o, dsum) = ins, outs
    b, h, t, hd = q.shape
    bh, blk, scale = b * h, int(p["block"]), 1.0 / math.sqrt(hd)
    q3, k3, v3, do3, o3 = _heads(q), _heads(k), _heads(v), _heads(do), _heads(o)
    dq3, dk3, dv3, lse2, d2 = _heads(dq), _heads(dk), _heads(dv), lse.reshape(bh, t), dsum.reshape(bh, t)
    plan = []
    for i0 in range(0, t, blk):
        nq = min(blk, t - i0)
        for j0 in range(0, i0 + nq, blk):
            nk = min(blk, i0 + nq - j0)
            plan.append((i0, j0, block_view(sblk, (bh, nq, nk)), block_view(dpblk, (bh, nq, nk)),
                         block_view(pq, (bh, nq, hd)), block_view(pk, (bh, nk, hd)), q3[:, i0:i0 + nq],
                         k3[:, j0:j0 + nk], v3[:, j0:j0 + nk], do3[:, i0:i0 + nq], dq3[:, i0:i0 + nq],
                         dk3[:, j0:j0 + nk], dv3[:, j0:j0 + nk]))
    work = bh * blk * blk
    probs_of = pick(recompute_probs_rows, recompute_probs_par, bh, work)
    grad_of = pick(block_softmax_grad_rows, block_softmax_grad_par, bh, work)
    dots = pick(row_dots_rows, row_dots_par, bh, do.size)

    def run() -> None:
        np.copyto(do, dy.reshape(b, t, h, hd).transpose(0, 2, 1, 3))
        np.copyto(o, y.reshape(b, t, h, hd).transpose(0, 2, 1, 3))
        dots(do3, o3, d2)
        for a in (dq, dk, dv):
            a.fill(0.0)
        for i0, j0, s, dp, tq, tk, qi, kj, vj, doi, dqi, dkj, dvj in plan:
            np.matmul(qi, kj.swapaxes(-1, -2), out=s)
            probs_of(s, lse2, scale, i0, j0)
            np.matmul(s.swapaxes(-1, -2), doi, out=tk)
            np.add(dvj, tk, out=dvj)
            np.matmul(doi, vj.swapaxes(-1, -2), out=dp)
            grad_of(dp, s, d2, scale, i0)
            np.matmul(dp, kj, out=tq)
            np.add(dqi, tq, out=dqi)
            np.matmul(dp.swapaxes(-1, -2), qi, out=tk)
            np.add(dkj, tk, out=dkj)
        merge_qkv(dq, dk, dv, dqkv)
    return run


# ---- one token (runtime/decode.py) ----------------------------------------------------------------------
@jit
def attn_decode_(qkv, position, kc, vc, scores, y, scale):
    """One position p of causal attention for batch 1: its key and value into the caches (1, H, ctx, hd),
    then each head's softmax over the scores of keys 0..p (float64) times the cached values."""
    h, hd = kc.shape[1], kc.shape[3]
    d = h * hd
    p = position[0]
    for g in range(h):
        for k in range(hd):
            kc[0, g, p, k] = qkv[0, 0, d + g * hd + k]
            vc[0, g, p, k] = qkv[0, 0, 2 * d + g * hd + k]
    for g in range(h):
        m = -np.inf
        for j in range(p + 1):
            s = 0.0
            for k in range(hd):
                s += np.float64(qkv[0, 0, g * hd + k]) * kc[0, g, j, k]
            s *= scale
            scores[0, g, j] = s
            if s > m:
                m = s
        tot = 0.0
        for j in range(p + 1):
            e = math.exp(scores[0, g, j] - m)
            scores[0, g, j] = e
            tot += e
        for k in range(hd):
            acc = 0.0
            for j in range(p + 1):
                acc += scores[0, g, j] * vc[0, g, j, k]
            y[0, 0, g * hd + k] = np.float32(acc / tot)


def bind_decode(outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Callable[[], None]:
    (qkv, position), (y, kc, vc, scores) = ins, outs
    scale = 1.0 / math.sqrt(kc.shape[3])
    bound = gpt_native.bind_attn_decode(qkv, position, kc, vc, scores, y, scale)
    return bound or (lambda: attn_decode_(qkv, position, kc, vc, scores, y, scale))

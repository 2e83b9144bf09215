"""Binders of the GPT's C kernels (gpt_native.c): layer norm (forward; backward with its parameter
gradients), the token and position embeddings (forward and backward), the batch of token windows, the
per-position loss's count division, and generate()'s one-token kernels (the position's row add, attention
over the KV cache).

Why: a plan runs on one thread pool (native.chosen_for), so while a GPT's layer norms and embeddings
were numba's only, its whole CPU step stayed on numba (and out of a native program, kernels/program.py).
Each binder returns the C kernel as a zero-argument kernel (native.py's ``call``) giving the bytes of its
numba twin in ops/layernorm.py or ops/embedding.py (tests/test_gpt_native.py), or None where the library
is not in use for this plan or the operands are not the contiguous float32 (int32 ids, float64 sums)
ones the C loops take: the caller then binds the numba kernel, as before.
"""
from __future__ import annotations

import numpy as np

from .blas import THREADED, pass_threads
from .native import Kernel, active, address, binder, call, with_part
from .operands import PAR_CHUNKS
from .passes import PASS_PAR_MIN

F32, F64, I32 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32)


def threads_for(work: int) -> int:
    """The pool threads a pass over ``work`` values runs on: all of them where it pays for waking them
    (the element-wise passes' threshold, kernels/passes.py), else the calling thread only."""
    return pass_threads(THREADED and work >= PASS_PAR_MIN)


def _contig(dtype: np.dtype, *arrays: np.ndarray) -> bool:
    """Every array a C-contiguous ndarray of ``dtype``."""
    return all(isinstance(a, np.ndarray) and a.dtype == dtype and a.flags.c_contiguous for a in arrays)


@binder
def bind_ln_fwd(x2: np.ndarray, w: np.ndarray, b: np.ndarray, y2: np.ndarray, mean: np.ndarray, rstd: np.ndarray,
                eps: float, threads: int) -> Kernel | None:
    """layernorm.ln_fwd_ (or ln_fwd_rows_ over every row): x2, y2 (rows, d), mean and rstd (rows,)."""
    L = with_part(active())
    ok = (L is not None and _contig(F32, x2, w, b, y2, mean, rstd) and x2.ndim == 2 and y2.shape == x2.shape
          and w.shape == b.shape == (x2.shape[1],) and mean.shape == rstd.shape == (x2.shape[0],))
    if not ok:
        return None
    rows, d = x2.shape
    args = (address(x2), rows, d, address(w), address(b), address(y2), address(mean), address(rstd), float(eps),
            threads)
    return call(L.rnb_ln_fwd, args, (x2, w, b, y2, mean, rstd))


@binder
def bind_ln_bwd(dy2: np.ndarray, x2: np.ndarray, w: np.ndarray, mean: np.ndarray, rstd: np.ndarray, dx2: np.ndarray,
                part: np.ndarray, dw: np.ndarray, db: np.ndarray, threads: int) -> Kernel | None:
    """layernorm.ln_bwd_ (or ln_bwd_serial_: the same blocks) then ln_param_grads_, as one call; dx2 with no
    rows: no input gradient. part (2, PAR_CHUNKS, d) float64."""
    L = with_part(active())
    need_dx = dx2.shape[0] > 0
    ok = (L is not None and _contig(F32, dy2, x2, w, mean, rstd, dw, db) and (not need_dx or _contig(F32, dx2))
          and x2.ndim == 2 and dy2.shape == x2.shape and (not need_dx or dx2.shape == x2.shape)
          and w.shape == dw.shape == db.shape == (x2.shape[1],) and mean.shape == rstd.shape == (x2.shape[0],)
          and _contig(F64, part) and part.shape == (2, PAR_CHUNKS, x2.shape[1]))
    if not ok:
        return None
    rows, d = x2.shape
    args = (address(dy2), address(x2), rows, d, address(w), address(mean), address(rstd),
            address(dx2) if need_dx else None, address(part), PAR_CHUNKS, address(dw), address(db), threads)
    return call(L.rnb_ln_bwd, args, (dy2, x2, w, mean, rstd, dx2, part, dw, db))


@binder
def bind_embed_fwd(ids: np.ndarray, w: np.ndarray, y: np.ndarray, threads: int) -> Kernel | None:
    """embedding.gather_par_ (or gather_rows_): y (N, T, d) = rows ids (N, T) of w (vocab, d)."""
    L = with_part(active())
    ok = (L is not None and _contig(I32, ids) and _contig(F32, w, y) and ids.ndim == 2 and w.ndim == 2
          and y.shape == (*ids.shape, w.shape[1]))
    if not ok:
        return None
    return call(L.rnb_embed_fwd, (address(ids), ids.size, address(w), w.shape[1], address(y), threads), (ids, w, y))


@binder
def bind_embed_bwd(ids: np.ndarray, dy: np.ndarray, dw: np.ndarray, acc: np.ndarray, threads: int) -> Kernel | None:
    """embedding.scatter_add_: dw (vocab, d) = the float64 sums (acc) of dy (N, T, d)'s rows into rows ids."""
    L = with_part(active())
    ok = (L is not None and _contig(I32, ids) and _contig(F32, dy, dw) and _contig(F64, acc) and ids.ndim == 2
          and dw.ndim == 2 and dy.shape == (*ids.shape, dw.shape[1]) and acc.shape == dw.shape)
    if not ok:
        return None
    args = (address(ids), ids.size, address(dy), dw.shape[1], address(dw), dw.shape[0], address(acc), threads)
    return call(L.rnb_embed_bwd, args, (ids, dy, dw, acc))


@binder
def bind_pos_fwd(x: np.ndarray, table: np.ndarray, y: np.ndarray, threads: int) -> Kernel | None:
    """embedding.add_rows_: y (N, T, d) = x + the table's first T rows."""
    L = with_part(active())
    ok = (L is not None and _contig(F32, x, table, y) and x.ndim == 3 and y.shape == x.shape and table.ndim == 2
          and table.shape[0] >= x.shape[1] and table.shape[1] == x.shape[2])
    if not ok:
        return None
    n, t, d = x.shape
    return call(L.rnb_pos_fwd, (address(x), n, t, d, address(table), address(y), threads), (x, table, y))


@binder
def bind_pos_bwd(dy: np.ndarray, dtable: np.ndarray, dx: np.ndarray, threads: int) -> Kernel | None:
    """embedding.batch_sum_ and the zero rows past T: dtable (context, d) = the sum over samples of dy
    (N, T, d); dx = dy (dx empty: no input gradient)."""
    L = with_part(active())
    ok = (L is not None and _contig(F32, dy, dtable) and dy.ndim == 3 and dtable.ndim == 2
          and dtable.shape[0] >= dy.shape[1] and dtable.shape[1] == dy.shape[2]
          and (dx.size == 0 or (_contig(F32, dx) and dx.shape == dy.shape)))
    if not ok:
        return None
    n, t, d = dy.shape
    args = (address(dy), n, t, d, address(dtable), dtable.shape[0], address(dx) if dx.size else None, threads)
    return call(L.rnb_pos_bwd, args, (dy, dtable, dx))


@binder
def bind_gather_windows(xs: np.ndarray, ys: np.ndarray, perm: np.ndarray, cursor: np.ndarray, x_out: np.ndarray,
                        y_out: np.ndarray) -> Kernel | None:
    """cpu._token_transfer: rows perm[cursor:cursor+B] of token windows and their targets (N, T), the first T' <= T
    of each (a shorter training context), after fused.batch_status's check, whose code it returns (0: copied and
    the cursor moved on): gpt_native.c's rnb_gather_windows, the twin of fused.gather_token_windows."""
    L = with_part(active())
    ok = (L is not None and all(isinstance(a, np.ndarray) and a.flags.c_contiguous for a in (xs, ys, x_out, y_out))
          and xs.ndim == ys.ndim == x_out.ndim == 2 and xs.shape == ys.shape and x_out.shape == y_out.shape
          and x_out.shape[1] <= xs.shape[1] and xs.dtype == x_out.dtype and ys.dtype == y_out.dtype
          and _contig(np.dtype(np.int64), perm, cursor) and perm.ndim == cursor.ndim == 1)
    if not ok:
        return None
    args = (address(xs), address(ys), xs.shape[0], xs.shape[1], xs.itemsize, ys.itemsize, address(perm), perm.size,
            address(cursor), address(x_out), address(y_out), x_out.shape[0], x_out.shape[1])
    return call(L.rnb_gather_windows, args, (xs, ys, perm, cursor, x_out, y_out))


@binder
def bind_divide(a: np.ndarray, d: np.float32) -> Kernel | None:
    """a /= d in place over a contiguous float32 array (cpu._per_position's counts over the positions)."""
    L = with_part(active())
    if L is None or not _contig(F32, a):
        return None
    return call(L.rnb_div_f32, (address(a), a.size, float(d)), (a,))


def _decode_ok(position: np.ndarray, *arrays: np.ndarray) -> bool:
    """The decode step's arrays: C-contiguous, batch 1, the position one int64."""
    return (_contig(np.dtype(np.int64), position) and position.size == 1
            and all(isinstance(a, np.ndarray) and a.flags.c_contiguous for a in arrays))


@binder
def bind_add_row_at(x: np.ndarray, table: np.ndarray, position: np.ndarray, y: np.ndarray) -> Kernel | None:
    """embedding.add_row_at_: one token's features (1, 1, d) plus row ``position`` of the table (context, d)."""
    L = with_part(active())
    d = table.shape[-1]
    if L is None or not (_decode_ok(position, x, table, y) and _contig(F32, x, table, y) and x.size == y.size == d):
        return None
    return call(L.rnb_add_row_at, (address(x), address(table), address(position), address(y), d),
                (x, table, position, y))


@binder
def bind_attn_decode(qkv: np.ndarray, position: np.ndarray, kc: np.ndarray, vc: np.ndarray, scores: np.ndarray,
                     y: np.ndarray, scale: float) -> Kernel | None:
    """attention_kernels.attn_decode_: qkv (1, 1, 3d), caches (1, H, ctx, hd), float64 scores (1, H, ctx)."""
    L = with_part(active())
    ok = (L is not None and _decode_ok(position, qkv, kc, vc, scores, y) and _contig(F32, qkv, kc, vc, y)
          and _contig(F64, scores) and kc.ndim == 4 and kc.shape == vc.shape and kc.shape[0] == 1
          and scores.shape == kc.shape[:3] and qkv.size == 3 * kc.shape[1] * kc.shape[3] and y.size * 3 == qkv.size)
    if not ok:
        return None
    h, ctx, hd = kc.shape[1:]
    args = (address(qkv), address(position), address(kc), address(vc), address(scores), address(y), h, ctx, hd,
            float(scale))
    return call(L.rnb_attn_decode, args, (qkv, position, kc, vc, scores, y))


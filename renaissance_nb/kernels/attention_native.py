"""Binders of causal self-attention's C kernels (attention_native.c): the materialised form's attn_scores,
attn_mix, attn_mix_bwd and attn_scores_bwd, and the flash form's forward and backward.

Why: a plan runs on one thread pool (native.chosen_for), so while attention's kernels were NumPy products
and numba row loops, a GPT's whole step stayed on numba and could not be one native program. Each binder
returns the C kernel as a zero-argument kernel (native.py's ``call``, inside blas.on_own_cores: its
products call sgemm from the pool's threads, so OpenBLAS must run one thread per call) giving the bytes of
the path it replaces (tests/test_attention_native.py), or None where the library is not in use for this
plan, NumPy's OpenBLAS cannot be called by address, or the operands are not the C-contiguous float32
tensors the C loops take: the caller then binds ops/attention_kernels.py's kernel, as before.

The products must round as np.matmul's do, so the C code calls the BLAS NumPy's matmul calls (NumPy's
OpenBLAS, found as blas.py finds it) with NumPy's arguments; a oneMKL that blas.py prefers for the fc
layers' bands is not it.
"""
from __future__ import annotations

import ctypes
import functools
import math
from typing import Any

import numpy as np

from . import blas
from .native import Kernel, active, address, binder, call, with_part
from .passes import PASS_PAR_MIN

F32 = np.dtype(np.float32)


@functools.lru_cache(maxsize=1)
def numpy_blas() -> np.ndarray | None:
    """[cblas_sgemm, cblas_sgemv, cblas_sdot, 1 if 64-bit integers] of NumPy's OpenBLAS (blas.numpy_openblas: the
    library the products pin too), as int64 addresses (the array the C kernels read); None where there is no
    OpenBLAS with the three."""
    path = blas.numpy_openblas()
    if path is None:
        return None
    lib = ctypes.CDLL(path)
    for prefix in ("scipy_", ""):
        for suffix in ("64_", ""):
            names = [f"{prefix}cblas_{f}{suffix}" for f in ("sgemm", "sgemv", "sdot")]
            if all(hasattr(lib, n) for n in names):
                addrs = [ctypes.cast(getattr(lib, n), ctypes.c_void_p).value or 0 for n in names]
                return np.array([*addrs, int(suffix == "64_")], np.int64)
    return None


def _ready(*arrays: Any) -> tuple[Any, np.ndarray] | None:
    """(the library, NumPy's BLAS table) when the plan binds C and every array is C-contiguous float32."""
    L = with_part(active())
    fns = numpy_blas() if L is not None else None
    ok = fns is not None and all(isinstance(a, np.ndarray) and a.dtype == F32 and a.flags.c_contiguous
                                 for a in arrays)
    return (L, fns) if ok else None


def _threads(b: int, h: int, t: int, given: int | None) -> int:
    """The pool's threads for a kernel over b*h heads of t x t scores: ``given`` (tests), else one below
    PASS_PAR_MIN scores (as ops/common.py's ``threaded`` decides for the numba twins) or where OpenBLAS is
    not held to one thread per call (blas.THREADED: own_cores does that), else numba's thread count."""
    if given is not None:
        return given
    return blas.pass_threads(blas.THREADED and b * h > 1 and b * h * t * t >= PASS_PAR_MIN)


def _kernel(f: Any, args: tuple, keep: tuple) -> Kernel:
    return blas.on_own_cores(call(f, args, keep))


def _heads_ok(q: np.ndarray, *others: np.ndarray) -> bool:
    """q (B, H, T, hd) and every other array of its shape."""
    return q.ndim == 4 and all(a.shape == q.shape for a in others)


@binder
def bind_scores(qkv: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, probs: np.ndarray,
                threads: int | None = None) -> Kernel | None:
    """attention_kernels.bind_scores: q, k, v from qkv, and P."""
    got = _ready(qkv, q, k, v, probs)
    if got is None or not _heads_ok(q, k, v):
        return None
    b, h, t, hd = q.shape
    if qkv.shape != (b, t, 3 * h * hd) or probs.shape != (b, h, t, t):
        return None
    L, fns = got
    args = (address(fns), address(qkv), address(q), address(k), address(v), address(probs), b, h, t, hd,
            1.0 / math.sqrt(hd), _threads(b, h, t, threads))
    return _kernel(L.rnb_attn_scores, args, (fns, qkv, q, k, v, probs))


@binder
def bind_mix(probs: np.ndarray, v: np.ndarray, y: np.ndarray, o: np.ndarray, threads: int | None = None) -> Kernel | None:
    """attention_kernels.bind_mix: o = P v (scratch), y = merge(o)."""
    got = _ready(probs, v, y, o)
    if got is None or not _heads_ok(v, o):
        return None
    b, h, t, hd = v.shape
    if probs.shape != (b, h, t, t) or y.shape != (b, t, h * hd):
        return None
    L, fns = got
    args = (address(fns), address(probs), address(v), address(y), address(o), b, h, t, hd, _threads(b, h, t, threads))
    return _kernel(L.rnb_attn_mix, args, (fns, probs, v, y, o))


@binder
def bind_mix_bwd(dy: np.ndarray, probs: np.ndarray, v: np.ndarray, dprobs: np.ndarray, dv: np.ndarray,
                 do: np.ndarray, threads: int | None = None) -> Kernel | None:
    """attention_kernels.bind_mix_bwd: dO (scratch) from dy, dv = P^T dO, dP = dO v^T."""
    got = _ready(dy, probs, v, dprobs, dv, do)
    if got is None or not _heads_ok(v, dv, do):
        return None
    b, h, t, hd = v.shape
    if probs.shape != (b, h, t, t) or dprobs.shape != probs.shape or dy.shape != (b, t, h * hd):
        return None
    L, fns = got
    args = (address(fns), address(dy), address(probs), address(v), address(dprobs), address(dv), address(do), b, h, t,
            hd, _threads(b, h, t, threads))
    return _kernel(L.rnb_attn_mix_bwd, args, (fns, dy, probs, v, dprobs, dv, do))


@binder
def bind_scores_bwd(dprobs: np.ndarray, probs: np.ndarray, q: np.ndarray, k: np.ndarray, dv: np.ndarray,
                    dqkv: np.ndarray, dq: np.ndarray, dk: np.ndarray, threads: int | None = None) -> Kernel | None:
    """attention_kernels.bind_scores_bwd: dS in dP's buffer, dq, dk, and dqkv from dq, dk, dv."""
    got = _ready(dprobs, probs, q, k, dv, dqkv, dq, dk)
    if got is None or not _heads_ok(q, k, dv, dq, dk):
        return None
    b, h, t, hd = q.shape
    if probs.shape != (b, h, t, t) or dprobs.shape != probs.shape or dqkv.shape != (b, t, 3 * h * hd):
        return None
    L, fns = got
    args = (address(fns), address(dprobs), address(probs), address(q), address(k), address(dv), address(dqkv),
            address(dq), address(dk), b, h, t, hd, 1.0 / math.sqrt(hd), _threads(b, h, t, threads))
    return _kernel(L.rnb_attn_scores_bwd, args, (fns, dprobs, probs, q, k, dv, dqkv, dq, dk))


def _scratch_ok(bh: int, t: int, hd: int, blk: int, f32: dict[str, np.ndarray],
                f64: dict[str, np.ndarray]) -> bool:
    """The flash form's block scratch holds what block_view cuts from it: (BH, blk, blk) score blocks,
    (BH, blk, hd) product blocks (float32), (BH, blk) rows and (BH, blk, hd) accumulators (float64)."""
    nb = min(blk, t)
    need = {"sblk": nb * nb, "dpblk": nb * nb, "pq": nb * hd, "pk": nb * hd, "mrow": nb, "lrow": nb, "acc": nb * hd}
    return (all(a.size >= bh * need[n] for n, a in f32.items())
            and all(a.dtype == np.float64 and a.flags.c_contiguous and a.size >= bh * need[n] for n, a in f64.items()))


@binder
def bind_flash_fwd(qkv: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, y: np.ndarray, lse: np.ndarray,
                   sblk: np.ndarray, mrow: np.ndarray, lrow: np.ndarray, acc: np.ndarray, prod: np.ndarray, o: np.ndarray,
                   block: int, threads: int | None = None) -> Kernel | None:
    """attention_kernels.bind_flash_fwd: q, k, v from qkv, y and each row's log-sum-exp, block by block."""
    got = _ready(qkv, q, k, v, y, lse, sblk, prod, o)
    if got is None or not _heads_ok(q, k, v, o) or block < 1:
        return None
    b, h, t, hd = q.shape
    ok = (qkv.shape == (b, t, 3 * h * hd) and y.shape == (b, t, h * hd) and lse.shape == (b, h, t)
          and _scratch_ok(b * h, t, hd, block, {"sblk": sblk, "pq": prod}, {"mrow": mrow, "lrow": lrow, "acc": acc}))
    if not ok:
        return None
    L, fns = got
    arrays = (fns, qkv, q, k, v, y, lse, sblk, mrow, lrow, acc, prod, o)
    args = (*(address(a) for a in arrays), b, h, t, hd, block, 1.0 / math.sqrt(hd), _threads(b, h, t, threads))
    return _kernel(L.rnb_flash_fwd, args, arrays)


@binder
def bind_flash_bwd(dy: np.ndarray, y: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, lse: np.ndarray,
                   dqkv: np.ndarray, dq: np.ndarray, dk: np.ndarray, dv: np.ndarray, sblk: np.ndarray,
                   dpblk: np.ndarray, pq: np.ndarray, pk: np.ndarray, do: np.ndarray, o: np.ndarray, dsum: np.ndarray,
                   block: int, threads: int | None = None) -> Kernel | None:
    """attention_kernels.bind_flash_bwd: D = rowsum(dO O), the blocks' P recomputed, dq, dk, dv, dqkv."""
    got = _ready(dy, y, q, k, v, lse, dqkv, dq, dk, dv, sblk, dpblk, pq, pk, do, o, dsum)
    if got is None or not _heads_ok(q, k, v, dq, dk, dv, do, o) or block < 1:
        return None
    b, h, t, hd = q.shape
    ok = (dy.shape == y.shape == (b, t, h * hd) and lse.shape == dsum.shape == (b, h, t)
          and dqkv.shape == (b, t, 3 * h * hd)
          and _scratch_ok(b * h, t, hd, block, {"sblk": sblk, "dpblk": dpblk, "pq": pq, "pk": pk}, {}))
    if not ok:
        return None
    L, fns = got
    arrays = (fns, dy, y, q, k, v, lse, dqkv, dq, dk, dv, sblk, dpblk, pq, pk, do, o, dsum)
    args = (*(address(a) for a in arrays), b, h, t, hd, block, 1.0 / math.sqrt(hd), _threads(b, h, t, threads))
    return _kernel(L.rnb_flash_bwd, args, arrays)

"""Low-precision CPU kernels for mixed precision: bf16/fp16 storage, GradScaler's unscale, and GEMMs
with bf16/fp16 operands and float32 sums (the C loops of lowp.c, with NumPy fallbacks).

Storage: a bf16 tensor is a ``np.uint16`` array holding the high half of each float32; an fp16 tensor
is ``np.float16``; the format of an array is read from its dtype (``format_of``). float32 -> bf16 or
fp16 rounds to nearest even, keeps subnormals and overflows to inf, the bytes of torch's
``x.to(torch.bfloat16)`` and ``x.half()`` / NumPy's ``astype(np.float16)``. Only NaNs have a rule of
their own (torch's bytes for a NaN depend on its code path): a NaN stays NaN, quiet, with its sign and
top payload bits, as the x86 instructions write it. The NumPy fallbacks (``round_to``, ``widen``) give
the C loops' bytes exactly.

Why C: the GEMMs are where the time goes. bf16 runs on AVX-512 BF16's ``vdpbf16ps`` where the compiler
targets it (products of two bf16 values are exact in float32, summed in float32); elsewhere, and for
fp16, the operands are widened to float32 in caller-given scratch and multiplied by the OpenBLAS sgemm
the package already calls (kernels/blas.py). Both sum in float32, in different orders; vdpbf16ps also
reads a subnormal bf16 operand (below 2^-126, about 1.2e-38) as zero and flushes subnormal sums, as
the instruction is defined (the sgemm path keeps them). No path splits
the k sum across threads, and the cut into tiles or bands depends on the shape alone, so the thread
count never changes a byte.

The ``bind_*`` functions follow kernels/native.py: a zero-argument kernel over fixed arrays (built by
``native.call``), or None where the library is absent or the layout is one the C loops do not take;
``convert``, ``unscale`` and ``gemm`` then serve the NumPy fallback.

An fc layer's three products in bf16 (x, w, dy uint16 arrays; sums in float32)::

    s = np.empty(lowp.scratch_elems(batch, n_out, n_in, "bf16", "bf16"), np.float32)
    forward = lowp.gemm(x, w.T, y, s, threads)        # y (batch, n_out) bf16: NT
    input_grad = lowp.gemm(dy, w, dx, s2, threads)     # dx (batch, n_in): NN
    weight_grad = lowp.gemm(dy.T, x, dw, s3, threads)  # dw (n_out, n_in) float32 or bf16: TN
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..errors import ConfigError, bad_argument
from . import blas, native
from .native import call as native_call  # the binders' kernel maker: one form for every C kernel

FORMATS = ("fp32", "bf16", "fp16")
CODE = {"fp32": 0, "bf16": 1, "fp16": 2}
"""lowp.c's RNB_F32, RNB_BF16, RNB_F16."""
STORAGE: dict[str, Any] = {"fp32": np.float32, "bf16": np.uint16, "fp16": np.float16}
PATHS = {"auto": 0, "dpbf16": 1, "sgemm": 2, "loops": 3}
"""The GEMM's paths (lowp.c's PATH_*): vdpbf16ps tiles, widen + OpenBLAS sgemm bands, plain C loops."""
PATH_NAMES = {v: k for k, v in PATHS.items()}
Kernel = Callable[[], Any]


def bits(a: np.ndarray) -> np.ndarray:
    """An arena's bfloat16 view (ml_dtypes, memory/dtensor.py) as this module's bf16 storage: uint16, the
    same bytes; other dtypes as they are."""
    return a.view(np.uint16) if a.dtype.name == "bfloat16" else a


def format_of(dtype: Any) -> str:
    """The format an array of this dtype stores: float32 -> fp32, uint16 -> bf16, float16 -> fp16."""
    for fmt, dt in STORAGE.items():
        if np.dtype(dtype) == np.dtype(dt):
            return fmt
    raise bad_argument(ConfigError, "lowp", "dtype", str(np.dtype(dtype)), "float32 (fp32), uint16 (bf16 storage) "
                       "or float16 (fp16)", "store bf16 tensors as uint16 arrays and fp16 ones as float16")


def storage_dtype(fmt: str) -> np.dtype:
    """The NumPy dtype that stores ``fmt``."""
    if fmt not in STORAGE:
        raise bad_argument(ConfigError, "lowp", "fmt", fmt, f"one of {FORMATS}", "pass 'bf16', 'fp16' or 'fp32'")
    return np.dtype(STORAGE[fmt])


# ---- NumPy references and fallbacks: lowp.c's bytes ------------------------------------------------
def round_to(x: np.ndarray, fmt: str, out: np.ndarray | None = None) -> np.ndarray:
    """float32 ``x`` rounded to ``fmt``'s storage (a new array, or written into ``out``)."""
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    if fmt == "bf16":
        r = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)
        r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    elif fmt == "fp16":
        with np.errstate(over="ignore"):
            r = x.astype(np.float16).view(np.uint16)
        r[nan] = (((u[nan] >> 16) & 0x8000) | 0x7E00 | ((u[nan] >> 13) & 0x3FF)).astype(np.uint16)
        r = r.view(np.float16)
    else:
        raise bad_argument(ConfigError, "lowp.round_to", "fmt", fmt, "'bf16' or 'fp16'", "round to a low precision")
    if out is None:
        return r
    out[...] = r
    return out


def widen(h: np.ndarray, fmt: str | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """``h`` (bf16 or fp16 storage) as float32, exactly (a NaN comes back quiet, as vcvtph2ps makes it)."""
    fmt = fmt or format_of(h.dtype)
    if fmt == "bf16":
        r = (np.asarray(h).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    elif fmt == "fp16":
        r = np.asarray(h).view(np.float16).astype(np.float32)
        u = r.view(np.uint32)
        u[np.isnan(r)] |= 0x400000
    else:
        raise bad_argument(ConfigError, "lowp.widen", "fmt", fmt, "'bf16' or 'fp16'", "widen a low-precision array")
    if out is None:
        return r
    out[...] = r
    return out


# ---- what the library was built with --------------------------------------------------------------
def features() -> set[str]:
    """The vector instruction sets lowp.c was compiled for ('avx512bf16', 'avx512f', 'f16c'); empty
    without the library."""
    L = native.with_part(native.lib())
    if L is None:
        return set()
    bits = L.rnb_lowp_built()
    return {name for bit, name in ((1, "avx512bf16"), (2, "avx512f"), (4, "f16c")) if bits & bit}


def gemm_path(fmt: str, want: str = "auto") -> str:
    """The path a ``fmt`` GEMM takes here: 'dpbf16', 'sgemm', 'loops', or 'numpy' without the library.
    Raises if ``want`` is a path this build cannot take."""
    if fmt not in ("bf16", "fp16"):
        raise bad_argument(ConfigError, "lowp.gemm_path", "fmt", fmt, "'bf16' or 'fp16'", "name the operands' format")
    if want not in PATHS:
        raise bad_argument(ConfigError, "lowp.gemm_path", "path", want, f"one of {tuple(PATHS)}", "pass 'auto'")
    L = native.with_part(native.lib())
    if L is None:
        return "numpy"
    got = L.rnb_lowp_gemm_path(CODE[fmt], PATHS[want], int(bool(blas.SGEMM.address)))
    if got < 0:
        raise bad_argument(ConfigError, "lowp.gemm_path", "path", want, f"a path this build has for {fmt} "
                           f"(features: {sorted(features()) or 'none'}, sgemm: {bool(blas.SGEMM.address)})",
                           "pass path='auto'")
    return PATH_NAMES[got]


_PATH_TEXT = {"dpbf16": "AVX-512 BF16 (vdpbf16ps)", "loops": "float32 C loops (no BLAS to call)",
              "numpy": "NumPy fallback (no C library)"}


def path() -> str:
    """One line for the compile notes: which GEMM path each format takes and the conversions' form."""
    def gemm_text(fmt: str) -> str:
        p = gemm_path(fmt)
        if p == "sgemm":
            return f"widened to float32, {blas.SGEMM.name} sgemm"
        return _PATH_TEXT[p]
    f = features()
    conv = ("AVX-512 BF16 / AVX-512F" if "avx512bf16" in f else "AVX-512F" if "avx512f" in f
            else "F16C" if "f16c" in f else "scalar C" if native.with_part(native.lib()) is not None else "NumPy")
    return f"bf16 GEMM: {gemm_text('bf16')}; fp16 GEMM: {gemm_text('fp16')}; conversions: {conv}"


# ---- conversions -----------------------------------------------------------------------------------
def _rows(x: np.ndarray) -> int | None:
    """The row stride in elements of a 2-D view with contiguous rows (1-D: one row), else None."""
    if x.ndim == 1:
        return x.shape[0] if (x.shape[0] <= 1 or x.strides[0] == x.itemsize) else None
    if x.ndim != 2 or (x.shape[1] > 1 and x.strides[1] != x.itemsize) or x.strides[0] % x.itemsize:
        return None
    return x.strides[0] // x.itemsize if x.shape[0] > 1 else max(x.shape[1], 1)


def _pair(src: np.ndarray, dst: np.ndarray, where: str) -> tuple[str, str]:
    a, b = format_of(src.dtype), format_of(dst.dtype)
    if (a == "fp32") == (b == "fp32") or src.shape != dst.shape:
        raise bad_argument(ConfigError, where, "dst", f"{dst.dtype}{dst.shape}", f"the shape {src.shape} with "
                           f"float32 on exactly one side (src is {src.dtype})",
                           "convert float32 <-> uint16 (bf16) or float16 (fp16)")
    return a, b


def bind_convert(src: np.ndarray, dst: np.ndarray, threads: int, portable: bool = False) -> Kernel | None:
    """dst = src converted (float32 -> bf16/fp16 rounded, or back exactly), 1-D or 2-D with contiguous
    rows; ``portable``: the scalar C forms only (the vector forms give the same bytes)."""
    L = native.with_part(native.active())
    a, b = _pair(src, dst, "lowp.bind_convert")
    ls, ld = _rows(src), _rows(dst)
    if L is None or ls is None or ld is None:
        return None
    rows, cols = (1, src.shape[0]) if src.ndim == 1 else src.shape
    args = (CODE[a], CODE[b], src.ctypes.data, rows, cols, ls, dst.ctypes.data, ld, int(portable), threads)
    return native_call(L.rnb_lowp_convert, args, (src, dst))


def convert(src: np.ndarray, dst: np.ndarray, threads: int = 1) -> Kernel:
    """``bind_convert``'s kernel, else NumPy's (the same bytes)."""
    bound = bind_convert(src, dst, threads)
    if bound is not None:
        return bound
    a, b = _pair(src, dst, "lowp.convert")
    if a == "fp32":
        return lambda: round_to(src, b, out=dst)
    return lambda: widen(src, a, out=dst)


# ---- GradScaler's unscale --------------------------------------------------------------------------
def _unscale_ok(g: np.ndarray, out: np.ndarray, inv_scale: np.ndarray, found: np.ndarray | None) -> None:
    ok = (g.ndim == out.ndim == 1 and g.shape == out.shape and out.dtype == np.float32
          and inv_scale.dtype == np.float32 and inv_scale.size >= 1
          and (found is None or (found.dtype == np.float32 and found.size >= 1)))
    if not ok:
        raise bad_argument(ConfigError, "lowp.unscale", "operands",
                           f"g {g.dtype}{g.shape}, out {out.dtype}{out.shape}, inv_scale {inv_scale.dtype}",
                           "1-D g (float32, uint16 bf16 or float16) and float32 out of its size, float32 inv_scale "
                           "and found", "pass flat views of the gradient regions")
    format_of(g.dtype)


def bind_unscale(g: np.ndarray, out: np.ndarray, inv_scale: np.ndarray, found: np.ndarray | None, threads: int,
                 portable: bool = False) -> Callable[[], int] | None:
    """out = float(g) * inv_scale[0] in float32, as torch._amp_foreach_non_finite_check_and_unscale_;
    the kernel returns 1 (and sets found[0] = 1) when any g is inf or NaN, else 0. ``out`` may be ``g``
    when g is float32. inv_scale and found are read and written at every call (the scaler's state)."""
    L = native.with_part(native.active())
    _unscale_ok(g, out, inv_scale, found)
    flat = (g, out, inv_scale) + (() if found is None else (found,))
    if L is None or not all(x.ndim == 1 and x.flags.c_contiguous for x in flat):
        return None
    args = (g.ctypes.data, CODE[format_of(g.dtype)], g.size, inv_scale.ctypes.data, out.ctypes.data,
            found.ctypes.data if found is not None else None, int(portable), threads)
    return native_call(L.rnb_lowp_unscale, args, (g, out, inv_scale, found))


def unscale(g: np.ndarray, out: np.ndarray, inv_scale: np.ndarray, found: np.ndarray | None,
            threads: int = 1) -> Callable[[], int]:
    """``bind_unscale``'s kernel, else NumPy's (the same bytes and flag)."""
    bound = bind_unscale(g, out, inv_scale, found, threads)
    if bound is not None:
        return bound
    fmt = format_of(g.dtype)

    def run() -> int:
        v = g if fmt == "fp32" else widen(g, fmt)
        bad = int(not np.isfinite(v).all())
        s = np.float32(inv_scale.reshape(-1)[0])
        if s == np.float32(1.0):
            out[...] = v
        else:
            np.multiply(v, s, out=out)
        if bad and found is not None:
            found.reshape(-1)[0] = 1.0
        return bad
    return run


# ---- GEMM ------------------------------------------------------------------------------------------
def scratch_elems(m: int, n: int, k: int, fmt: str, out: str = "fp32", path: str = "auto") -> int:
    """float32 elements of scratch that ``gemm``/``bind_gemm`` need for c(m, n) = a(m, k) @ b(k, n) with
    ``fmt`` operands and an ``out`` result, on the path ``gemm_path(fmt, path)`` takes here:
    dpbf16: (ceil(m/6)*6 + ceil(n/64)*64) * ceil(k/2) (the operands packed in pairs of k);
    sgemm and loops: m*k + k*n (+ m*n when out is not fp32) (the operands and sums in float32);
    the NumPy fallback: m*k + k*n + m*n."""
    p = gemm_path(fmt, path)
    if out not in ("fp32", fmt):
        raise bad_argument(ConfigError, "lowp.scratch_elems", "out", out, f"'fp32' or {fmt!r}",
                           "pick the result format")
    L = native.with_part(native.lib())
    if L is None or p == "numpy":
        return m * k + k * n + m * n
    return int(L.rnb_lowp_gemm_scratch(CODE[out], m, n, k, PATHS[p]))


def _orient(x: np.ndarray) -> tuple[int, int] | None:
    """(transposed, leading dimension in elements) of a 2-D view as lowp.c reads it, or None."""
    r, c = x.shape
    s0, s1 = x.strides
    it = x.itemsize
    if x.size == 0:  # nothing is read (NumPy gives empty arrays zero strides)
        return 0, max(c, 1)
    if (s1 == it or c == 1) and (r == 1 or (s0 % it == 0 and s0 // it >= c)):
        return 0, (s0 // it if r > 1 else max(c, 1))
    if (s0 == it or r == 1) and (c == 1 or (s1 % it == 0 and s1 // it >= r)):
        return 1, (s1 // it if c > 1 else max(r, 1))
    return None


def _gemm_checked(a: np.ndarray, b: np.ndarray, c: np.ndarray, scratch: np.ndarray, path: str) -> tuple[str, str, int]:
    """(operand format, result format, scratch needed); raises naming what does not fit."""
    shapes_ok = a.ndim == b.ndim == c.ndim == 2 and a.shape[1] == b.shape[0] and c.shape == (a.shape[0], b.shape[1])
    fmt = format_of(a.dtype) if a.dtype == b.dtype else "mixed"
    if not shapes_ok or fmt not in ("bf16", "fp16") or c.dtype not in (np.float32, a.dtype):
        raise bad_argument(ConfigError, "lowp.gemm", "operands", f"a {a.dtype}{a.shape}, b {b.dtype}{b.shape}, "
                           f"c {c.dtype}{c.shape}", "a (m, k) and b (k, n) both uint16 (bf16) or both float16, "
                           "c (m, n) float32 or the operands' dtype", "pass 2-D views such as x, w.T and y")
    out = format_of(c.dtype)
    need = scratch_elems(a.shape[0], b.shape[1], a.shape[1], fmt, out, path)
    if scratch.dtype != np.float32 or scratch.ndim != 1 or not scratch.flags.c_contiguous or scratch.size < need:
        raise bad_argument(ConfigError, "lowp.gemm", "scratch", f"{scratch.dtype}{scratch.shape}",
                           f"a contiguous 1-D float32 array of at least {need} elements",
                           "size it with lowp.scratch_elems(m, n, k, fmt, out, path)")
    return fmt, out, need


def bind_gemm(a: np.ndarray, b: np.ndarray, c: np.ndarray, scratch: np.ndarray, threads: int, beta: bool = False,
              path: str = "auto", portable: bool = False) -> Callable[[], int] | None:
    """c = a @ b (+ c with ``beta``), a and b bf16 (uint16) or fp16 views, either of them transposed
    (x @ w.T: forward, dy @ w: dx, dy.T @ x: dW), c float32 or the operands' format (rounded once,
    from the float32 sums). The kernel returns lowp.c's path number (PATHS). On the sgemm path it calls
    BLAS from the pool's threads: run it inside blas.own_cores() (a replay holds it; ``gemm`` wraps it)."""
    fmt, out, need = _gemm_checked(a, b, c, scratch, path)
    L = native.with_part(native.active())
    oa, ob, oc = _orient(a), _orient(b), _orient(c)
    if L is None or oa is None or ob is None or oc is None or oc[0]:
        return None
    p = PATHS[gemm_path(fmt, path)]
    (m, k), n = a.shape, b.shape[1]
    f = blas.SGEMM.address or None
    args = (CODE[fmt], oa[0], ob[0], m, n, k, a.ctypes.data, oa[1], b.ctypes.data, ob[1], int(beta), c.ctypes.data,
            oc[1], CODE[out], f, int(blas.SGEMM.int_bits == 64), scratch.ctypes.data, need, p, int(portable), threads)
    return native_call(L.rnb_lowp_gemm, args, (a, b, c, scratch))


def gemm(a: np.ndarray, b: np.ndarray, c: np.ndarray, scratch: np.ndarray, threads: int = 1, beta: bool = False,
         path: str = "auto") -> Kernel:
    """``bind_gemm``'s kernel (inside blas.own_cores() where it calls sgemm), else NumPy's: the operands
    widened into ``scratch``, np.matmul's float32 sums (another order), rounded once."""
    bound = bind_gemm(a, b, c, scratch, threads, beta, path)
    if bound is not None:
        if gemm_path(format_of(a.dtype), path) != "sgemm":
            return bound
        run = blas.on_own_cores(bound)
        run.keep = bound.keep  # type: ignore[attr-defined]
        return run
    fmt, out, _ = _gemm_checked(a, b, c, scratch, path)
    (m, k), n = a.shape, b.shape[1]
    own = scratch.size >= m * k + k * n + m * n  # a C path's scratch can be smaller: then temporaries

    def run() -> None:
        buf = scratch if own else np.empty(m * k + k * n + m * n, np.float32)
        a32, b32 = buf[:m * k].reshape(m, k), buf[m * k:m * k + k * n].reshape(k, n)
        c32 = buf[m * k + k * n:m * k + k * n + m * n].reshape(m, n)
        widen(a, fmt, out=a32)
        widen(b, fmt, out=b32)
        np.matmul(a32, b32, out=c32)
        if beta:
            np.add(c if out == "fp32" else widen(c, fmt), c32, out=c32)
        if out == "fp32":
            c[...] = c32
        else:
            round_to(c32, fmt, out=c)
    return run

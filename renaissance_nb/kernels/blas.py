"""Matrix products on the library's own threads: one single-threaded sgemm per thread.

Why: a CPU training step is GEMMs with element-wise passes between them (the optimizer
update, the NaN probe). Both want both cores. With NumPy's threaded OpenBLAS for the GEMMs
and numba's pool for the passes, two thread pools share two cores, and OpenBLAS's idle
worker spins for about 0.1 s after every product: a numba worker started between two
products shares its core with that spinner (a 1 ms update took 8 ms), so the passes had
to stay on one thread. Here one pool does everything. While a task replays its step
(``own_cores()``), OpenBLAS runs one thread per call, and each bound product is cut into
one band of rows or columns per numba thread, every band one single-threaded ``sgemm``
called from inside a numba ``prange``; a layer's two equal backward products (dW and dx)
run side by side instead (``gemm_pair``). The passes then use the same pool.

Which sgemm (``SGEMM``): NumPy's bundled OpenBLAS, found through threadpoolctl (any symbol
prefix, 32- or 64-bit integers), or Intel's oneMKL when its runtime is installed (the
``[mkl]`` extra) and the CPU is Intel's: there its single-threaded sgemm is faster at these
small-M shapes (an epoch of the MNIST MLP took 0.72-0.85x the time in paired runs on an
Emerald Rapids Xeon VM), while on AMD Zen 3 it was slower. ``RNB_BLAS=openblas|mkl``
overrides the choice. MKL runs with its sequential threading layer, so the bands stay the only
parallelism. Either is called through a function pointer, so the numba code caches.
Without either, or with ``RNB_OWN_THREADS=0``, ``THREADED`` is False and ``gemm`` binds
``np.matmul`` as before.

Values: a BLAS's result for an element can depend on the shape of the call it is in, so a
band differs from the whole product in float32 rounding, as it does from ``np.matmul``'s
threaded result (a test trains a task both ways), and MKL's bytes differ from OpenBLAS's.
The bands are fixed when a kernel is bound, from numba's thread count then; the arena's
tensors sit at fixed 256-byte-aligned offsets, so MKL sees the same alignment every run:
the same machine and setting give the same bytes.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import os
import sys
import warnings
from contextlib import contextmanager
from typing import Any, Callable, Iterator, NamedTuple

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..errors import ConfigError
from . import native
from .fused import jit, par

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112
PARALLEL_MIN_MACS = 1 << 18
"""Products below this many multiply-adds run as one call on the calling thread: waking the
other thread costs more than it saves (about 10 us of work)."""
BAND_ALIGN = 16
"""Band edges fall on multiples of this many rows or columns (whole micro-kernel tiles)."""


class _OpenBLAS:
    """The loaded OpenBLAS of NumPy: its sgemm address, integer width and thread-count calls."""

    def __init__(self) -> None:
        self.sgemm = 0
        self.int_bits = 32
        self.get_threads: Callable[[], int] | None = None
        self.set_threads: Callable[[int], None] | None = None
        self.why_not = ""
        if os.environ.get("RNB_OWN_THREADS", "1") == "0":
            self.why_not = "RNB_OWN_THREADS=0"
            return
        if numba.config.NUMBA_NUM_THREADS < 2:
            self.why_not = "numba has one thread (NUMBA_NUM_THREADS)"
            return
        try:
            import threadpoolctl  # noqa: F401 - whether it is installed (numpy_openblas asks it)
        except ImportError:
            self.why_not = "threadpoolctl is not installed"
            return
        path = numpy_openblas()
        if path is None:
            self.why_not = "NumPy's BLAS is not OpenBLAS"
            return
        lib = ctypes.CDLL(path)
        for prefix in ("scipy_", ""):
            for suffix in ("64_", ""):
                if hasattr(lib, f"{prefix}cblas_sgemm{suffix}"):
                    fn = getattr(lib, f"{prefix}cblas_sgemm{suffix}")
                    get_n = getattr(lib, f"{prefix}openblas_get_num_threads{suffix}", None)
                    set_n = getattr(lib, f"{prefix}openblas_set_num_threads{suffix}", None)
                    if get_n is None or set_n is None:
                        continue
                    get_n.restype = ctypes.c_int
                    set_n.argtypes = [ctypes.c_int]
                    set_n.restype = None
                    self.sgemm = ctypes.cast(fn, ctypes.c_void_p).value or 0
                    self.int_bits = 64 if suffix == "64_" else 32
                    self.get_threads, self.set_threads = get_n, set_n
                    return
        self.why_not = f"no cblas_sgemm symbol in {path}"


@functools.lru_cache(maxsize=1)
def numpy_openblas() -> str | None:
    """The file of the OpenBLAS NumPy's matmul calls: a wheel's own (under numpy.libs/), else the first OpenBLAS
    loaded; None without threadpoolctl or an OpenBLAS. One answer for every caller (the products' sgemm here,
    the attention kernels' sgemm/sgemv/sdot in attention_native.py), so all pin and call the same library."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    np.ones((2, 2), np.float32) @ np.ones((2, 2), np.float32)  # make sure NumPy's BLAS is loaded
    libs = [i["filepath"] for i in threadpool_info() if i.get("internal_api") == "openblas"]
    own = [f for f in libs if os.path.basename(os.path.dirname(f)).startswith("numpy")]
    return (own or libs or [None])[0]


class Sgemm(NamedTuple):
    """A CBLAS ``sgemm`` to call from numba: its address (0 if none), integer width, and name."""
    name: str
    address: int
    int_bits: int
    why_not: str = ""


MKL_SEQUENTIAL = 1
"""``MKL_THREADING_SEQUENTIAL`` for ``MKL_Set_Threading_Layer``."""


def _mkl_paths() -> list[str]:
    """Where this environment's ``mkl`` wheel (or conda package) puts its single dynamic runtime,
    then a system MKL on the loader's path. A venv does not look in its base Python's prefix:
    an MKL there was not installed with this environment."""
    found = sorted(glob.glob(os.path.join(sys.prefix, "lib", "libmkl_rt.so*")), reverse=True)
    name = ctypes.util.find_library("mkl_rt")
    return found + ([name] if name else [])


def load_mkl() -> Sgemm:
    """oneMKL's ``cblas_sgemm`` (LP64) with the sequential threading layer, or why not."""
    mode = os.environ.get("MKL_BLAS_COMPUTE_MODE", "STANDARD")
    if mode.strip().upper() != "STANDARD":  # e.g. FLOAT_TO_BF16: sgemm on bfloat16 inputs
        return Sgemm("mkl", 0, 32, f"MKL_BLAS_COMPUTE_MODE={mode} would round the products' "
                                   "inputs below float32; unset it to use oneMKL")
    paths = _mkl_paths()
    if not paths:
        return Sgemm("mkl", 0, 32, "oneMKL is not installed (pip install 'renaissance_nb[mkl]')")
    try:
        lib = ctypes.CDLL(paths[0])
        set_layer = lib.MKL_Set_Threading_Layer
    except (OSError, AttributeError) as exc:
        return Sgemm("mkl", 0, 32, f"cannot load {paths[0]}: {exc}")
    set_layer.argtypes, set_layer.restype = [ctypes.c_int], ctypes.c_int
    layer = set_layer(MKL_SEQUENTIAL)
    if layer != MKL_SEQUENTIAL:  # MKL was already in use in this process with threads of its own
        return Sgemm("mkl", 0, 32, f"oneMKL runs threading layer {layer} in this process, not sequential")
    return Sgemm("mkl", ctypes.cast(lib.cblas_sgemm, ctypes.c_void_p).value or 0, 32)


def _cpu_vendor() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _as_sgemm(openblas: _OpenBLAS) -> Sgemm:
    return Sgemm("openblas", openblas.sgemm, openblas.int_bits, openblas.why_not)


def choose_sgemm(openblas: _OpenBLAS, want: str | None = None, vendor: str | None = None) -> Sgemm:
    """The sgemm the bands call: ``want`` (default ``RNB_BLAS``, "auto") names "openblas" or
    "mkl"; "auto" takes MKL on an Intel CPU when it loads, NumPy's OpenBLAS otherwise."""
    ob = _as_sgemm(openblas)
    if os.environ.get("RNB_OWN_THREADS", "1") == "0":
        return ob
    raw = want if want is not None else os.environ.get("RNB_BLAS", "auto")
    want = raw.strip().lower()
    if want not in ("auto", "openblas", "mkl"):
        raise ConfigError(f"RNB_BLAS={raw!r}: expected 'auto', 'openblas' or 'mkl'; unset it to let "
                          "renaissance_nb choose (MKL on Intel CPUs when installed, OpenBLAS otherwise)")
    intel = (vendor if vendor is not None else _cpu_vendor()) == "GenuineIntel"
    if want == "openblas" or (want == "auto" and not intel) or numba.config.NUMBA_NUM_THREADS < 2:
        return ob
    mkl = load_mkl()
    if mkl.address:
        return mkl
    if want == "mkl":
        warnings.warn(f"RNB_BLAS=mkl: {mkl.why_not}; the products use NumPy's OpenBLAS", stacklevel=2)
    return ob


def _sgemm_at_import(openblas: _OpenBLAS) -> Sgemm:
    """choose_sgemm for this process. A bad RNB_BLAS is a warning here, not an error: raised at
    import it made ``import renaissance_nb`` (and the CLI's --help) fail with a traceback."""
    try:
        return choose_sgemm(openblas)
    except ConfigError as exc:
        warnings.warn(f"{exc}; using the automatic choice", stacklevel=2)
        return choose_sgemm(openblas, "auto")


OPENBLAS = _OpenBLAS()
SGEMM = _sgemm_at_import(OPENBLAS)
THREADED = bool(SGEMM.address)


def describe() -> str:
    """One line for the compile notes: what the CPU's matrix products run on, and why."""
    if not THREADED:
        why = SGEMM.why_not or OPENBLAS.why_not or "no sgemm to call"
        return f"matrix products on np.matmul, passes on one thread ({why})"
    name = {"mkl": "oneMKL's", "openblas": "NumPy's OpenBLAS"}.get(SGEMM.name, SGEMM.name)
    return (f"matrix products as bands of {name} sgemm on {numba.get_num_threads()} threads "
            "(RNB_BLAS=openblas|mkl chooses the BLAS)")


def loaded_sgemms() -> dict[str, Sgemm]:
    """Every sgemm this process can call by address, by name (tests and benchmarks compare them)."""
    out = {"openblas": _as_sgemm(OPENBLAS)} if OPENBLAS.sgemm else {}
    mkl = SGEMM if SGEMM.name == "mkl" else load_mkl()
    if mkl.address:
        out["mkl"] = mkl
    return out


_depth = [0]  # how many own_cores() blocks are open (bound products check it: one list read)


@contextmanager
def own_cores() -> Iterator[None]:
    """OpenBLAS at one thread per call while a task replays (the bands are the parallelism);
    the caller's setting is restored afterwards. A bound product called outside such a block
    opens one around itself, so it is never OpenBLAS threads inside numba threads."""
    if not THREADED or OPENBLAS.get_threads is None or OPENBLAS.set_threads is None:
        yield
        return
    old = OPENBLAS.get_threads() if _depth[0] == 0 else 1
    OPENBLAS.set_threads(1)
    _depth[0] += 1
    try:
        yield
    finally:
        _depth[0] -= 1
        OPENBLAS.set_threads(old)


def _sgemm_intrinsic(int_bits: int, beta: float = 0.0):  # type: ignore[no-untyped-def]
    """cblas_sgemm(RowMajor, ta, tb, m, n, k, 1, a, lda, b, ldb, beta, c, ldc) through an address
    (beta 0: c is overwritten; 1: the product is added to c)."""
    i64 = types.int64

    @intrinsic
    def call(typingctx, fptr, ta, tb, m, n, k, a, lda, b, ldb, c, ldc):  # type: ignore[no-untyped-def]
        sig = types.void(i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64)

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            i32, iw, f32 = ir.IntType(32), ir.IntType(int_bits), ir.FloatType()
            ptr = ir.IntType(8).as_pointer()
            fnty = ir.FunctionType(ir.VoidType(), [i32, i32, i32, iw, iw, iw, f32, ptr, iw, ptr, iw, f32, ptr, iw])
            fn = builder.inttoptr(args[0], fnty.as_pointer())

            def n_(v):  # type: ignore[no-untyped-def]
                return builder.trunc(v, iw) if int_bits < 64 else v

            def p_(v):  # type: ignore[no-untyped-def]
                return builder.inttoptr(v, ptr)
            _, ta_, tb_, m_, nn, k_, a_, lda_, b_, ldb_, c_, ldc_ = args
            builder.call(fn, [ir.Constant(i32, ROW_MAJOR), builder.trunc(ta_, i32), builder.trunc(tb_, i32),
                              n_(m_), n_(nn), n_(k_), ir.Constant(f32, 1.0), p_(a_), n_(lda_), p_(b_), n_(ldb_),
                              ir.Constant(f32, beta), p_(c_), n_(ldc_)])
            return context.get_dummy_value()
        return sig, codegen
    return call


_call64 = _sgemm_intrinsic(64)
_call32 = _sgemm_intrinsic(32)
_add64 = _sgemm_intrinsic(64, 1.0)
_add32 = _sgemm_intrinsic(32, 1.0)


@jit
def sgemm_at(fptr, wide, ta, tb, m, n, k, a, lda, b, ldb, c, ldc, add):
    """One row-major sgemm through ``fptr`` (addresses in bytes) from numba code: c = op(a) op(b),
    or c += op(a) op(b) with ``add``; ``wide``: the BLAS takes 64-bit integers (SGEMM.int_bits).
    A runtime branch, not a compile-time choice, so a cached caller works with either BLAS."""
    if wide:
        if add:
            _add64(fptr, ta, tb, m, n, k, a, lda, b, ldb, c, ldc)
        else:
            _call64(fptr, ta, tb, m, n, k, a, lda, b, ldb, c, ldc)
    elif add:
        _add32(fptr, ta, tb, m, n, k, a, lda, b, ldb, c, ldc)
    else:
        _call32(fptr, ta, tb, m, n, k, a, lda, b, ldb, c, ldc)


@par
def _bands64(fptr, bands):
    """One sgemm per row of ``bands`` (ta, tb, m, n, k, a, lda, b, ldb, c, ldc), in parallel."""
    for t in numba.prange(bands.shape[0]):
        r = bands[t]
        _call64(fptr, r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10])


@par
def _bands32(fptr, bands):
    """As _bands64, for an OpenBLAS with 32-bit integers."""
    for t in numba.prange(bands.shape[0]):
        r = bands[t]
        _call32(fptr, r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10])


@jit
def _one64(fptr, bands):
    """A small product: one sgemm on the calling thread."""
    r = bands[0]
    _call64(fptr, r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10])


@jit
def _one32(fptr, bands):
    """As _one64, for an OpenBLAS with 32-bit integers."""
    r = bands[0]
    _call32(fptr, r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10])


def _operand(x: np.ndarray) -> tuple[int, int] | None:
    """(trans, ld) describing a 2-D float32 view to row-major BLAS, or None if BLAS cannot read it."""
    r, c = x.shape
    s0, s1 = x.strides
    if (s1 == 4 or c == 1) and (r == 1 or (s0 % 4 == 0 and s0 // 4 >= c)):
        return NO_TRANS, (s0 // 4 if r > 1 else max(c, 1))
    if (s0 == 4 or r == 1) and (c == 1 or (s1 % 4 == 0 and s1 // 4 >= r)):
        return TRANS, (s1 // 4 if c > 1 else max(r, 1))
    return None


def band_edges(size: int, parts: int, align: int = BAND_ALIGN) -> list[int]:
    """Edges that cut ``size`` rows into at most ``parts`` bands, inner edges on multiples of ``align``."""
    edges = [0]
    for t in range(1, parts):
        e = min(size, -(-(size * t // parts) // align) * align)
        if edges[-1] < e < size:
            edges.append(e)
    edges.append(size)
    return edges


def plan_bands(a: np.ndarray, b: np.ndarray, c: np.ndarray, parts: int) -> np.ndarray | None:
    """The sgemm calls that compute c = a @ b as ``parts`` bands, one row each:
    (ta, tb, m, n, k, a, lda, b, ldb, c, ldc), addresses in bytes; None if BLAS cannot do it."""
    if not all(isinstance(x, np.ndarray) and x.ndim == 2 and x.dtype == np.float32 for x in (a, b, c)):
        return None
    m, k = a.shape
    k2, n = b.shape
    if k2 != k or c.shape != (m, n) or 0 in (m, n, k):
        return None
    if np.shares_memory(c, a) or np.shares_memory(c, b):
        return None
    oc = _operand(c)
    if oc is None:
        return None
    if oc[0] == TRANS:  # a column-major result: compute c^T = b^T a^T into it
        return plan_bands(b.T, a.T, c.T, parts)
    oa, ob = _operand(a), _operand(b)
    if oa is None or ob is None:
        return None
    (ta, lda), (tb, ldb), ldc = oa, ob, oc[1]
    pa, pb, pc = a.ctypes.data, b.ctypes.data, c.ctypes.data
    rows = []
    if m >= n:  # bands of rows of c (and of op(a))
        edges = band_edges(m, parts)
        for i0, i1 in zip(edges[:-1], edges[1:]):
            off_a = i0 * lda * 4 if ta == NO_TRANS else i0 * 4
            rows.append((ta, tb, i1 - i0, n, k, pa + off_a, lda, pb, ldb, pc + i0 * ldc * 4, ldc))
    else:  # bands of columns of c (and of op(b))
        edges = band_edges(n, parts)
        for j0, j1 in zip(edges[:-1], edges[1:]):
            off_b = j0 * 4 if tb == NO_TRANS else j0 * ldb * 4
            rows.append((ta, tb, m, j1 - j0, k, pa, lda, pb + off_b, ldb, pc + j0 * 4, ldc))
    return np.array(rows, dtype=np.int64)


def on_own_cores(call: Callable[[], None]) -> Callable[[], None]:
    """``call`` as a kernel that calls sgemm from numba's threads: inside own_cores(), which
    costs one list read when a replay already holds it. A C call stays one (its ``native`` ops and
    ``keep`` carried over): a native program runs inside own_cores() already (kernels/program.py)."""
    depth = _depth

    def run() -> None:
        if depth[0]:
            call()
        else:
            with own_cores():
                call()
    for name in ("native", "keep"):
        if hasattr(call, name):
            setattr(run, name, getattr(call, name))
    return run


def pass_threads(threaded: bool) -> int:
    """The threads a pass runs on: numba's count when it is threaded (the products' pool size), else 1."""
    return numba.get_num_threads() if threaded else 1


def _bound(bands: np.ndarray, keep: tuple, sgemm: Sgemm | None = None) -> Callable[[], None]:
    """The kernel that runs planned sgemm calls: in parallel when there are several (on the C kernels'
    pool threads where they are built, kernels/native.py, else on numba's)."""
    sg = sgemm or SGEMM
    fptr = sg.address
    bound = native.bind_gemm_bands(fptr, sg.int_bits == 64, bands, pass_threads(True))
    if bound is not None:
        run = on_own_cores(bound)  # its C call, for a native program (program.py)
        run.keep = keep  # type: ignore[attr-defined]
        return run
    if bands.shape[0] == 1:
        f = _one64 if sg.int_bits == 64 else _one32
    else:
        f = _bands64 if sg.int_bits == 64 else _bands32
    run = on_own_cores(lambda: f(fptr, bands))
    run.keep = keep  # type: ignore[attr-defined]
    return run


def gemm_pair(first: tuple[np.ndarray, np.ndarray, np.ndarray], second: tuple[np.ndarray, np.ndarray, np.ndarray],
              threaded: bool | None = None) -> Callable[[], Any]:
    """Bind two independent products of equal work (a layer's dW and dx) to run side by side,
    each one whole sgemm on its own thread; bands of each, one after the other, otherwise."""
    use = THREADED if threaded is None else (threaded and THREADED)
    if use and numba.get_num_threads() == 2 and all(x.ndim == 2 for t in (first, second) for x in t):
        p1, p2 = plan_bands(*first, 1), plan_bands(*second, 1)
        if p1 is not None and p2 is not None:
            return _bound(np.concatenate([p1, p2]), (*first, *second))
    g1, g2 = gemm(*first, threaded=threaded), gemm(*second, threaded=threaded)

    def run() -> None:
        g1()
        g2()
    if hasattr(g1, "native") and hasattr(g2, "native"):  # both C calls: so is the pair (program.py)
        run.native = g1.native + g2.native  # type: ignore[attr-defined]
    return run


def gemm(a: np.ndarray, b: np.ndarray, c: np.ndarray, threaded: bool | None = None,
         sgemm: Sgemm | None = None) -> Callable[[], Any]:
    """Bind ``c = a @ b`` (2-D float32 views, any of them transposed) into a zero-argument kernel.

    With ``THREADED`` the product is cut into one band per numba thread (one band when it is
    small); otherwise, or when BLAS cannot address the views, it is ``np.matmul(a, b, out=c)``.
    ``sgemm`` picks another loaded BLAS than ``SGEMM`` (tests compare them). The kernel keeps
    a, b and c alive: it holds their addresses.
    """
    use = THREADED if threaded is None else (threaded and THREADED)
    if sgemm is not None:
        use = use and bool(sgemm.address)
    bands = None
    if use and a.ndim == b.ndim == c.ndim == 2:
        macs = a.shape[0] * a.shape[1] * b.shape[1]
        bands = plan_bands(a, b, c, numba.get_num_threads() if macs >= PARALLEL_MIN_MACS else 1)
    if bands is None:
        mm = np.matmul
        return lambda: mm(a, b, out=c)
    return _bound(bands, (a, b, c), sgemm)

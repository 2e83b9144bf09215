"""The fused CPU passes as C: the library of this process, and the binders that hand its kernels over.

kernels/native_build.py compiles the C sources once per machine with the system C compiler and caches them;
the build of its core part starts in a background thread when this module is imported (the task plans
meanwhile), and the first bind waits for it. The C functions give their numba twins' bytes
(tests/test_native.py), so which one a kernel binds never changes a result (the clip norm's float64 sum
included: both write its order out). The numba path stays whole: where there is no C compiler, with
``RNB_NATIVE=0``, for an operand layout the C loops do not take (``bind_*`` return None), or in a plan with
numba kernels of its own (chosen_for: one thread pool per plan), the caller binds the numba kernel as before.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np

from .native_build import FLAGS, PARTS, TEMP_PREFIX, Build, build, compiler  # noqa: F401 - the tests read them here
from .signatures import SIGNATURES  # noqa: F401 - program.py and the tests read the entries here

Kernel = Callable[[], Any]


_result: list[Build] = []
_thread: threading.Thread | None = None
_lock = threading.Lock()


def prepare() -> None:
    """Start building (or loading) the library in a background thread, once per process."""
    global _thread
    with _lock:
        if _thread is None:
            _thread = threading.Thread(target=lambda: _result.append(build()), name="rnb-native-build", daemon=True)
            _thread.start()


def status() -> Build:
    """The build, waiting for it if it is still running."""
    prepare()
    assert _thread is not None
    _thread.join()
    if not _result:  # a child forked while the parent's build thread ran: that thread is not here
        _result.append(build())
    return _result[0]


def lib() -> Any:
    """The loaded library, or None (the numba kernels serve)."""
    return status().lib


# ---- binders: a zero-argument kernel over fixed arrays, or None where the C loops do not apply -----
DECLINED: list[str] = []
"""The binders that declined operands while the library was loaded (the caller bound numba instead):
the warm-up helper is then still worth starting (runtime/warmup.py)."""


class _Choice(threading.local):
    """chosen_for's decisions, innermost last, per thread (two threads may compile tasks at once)."""
    def __init__(self) -> None:
        self.stack: list[bool] = []


_choice = _Choice()


@contextmanager
def chosen_for(ops: set[str]) -> Iterator[bool]:
    """Bind inside this block with the C kernels only if they cover every op (NUMBA_FREE_OPS); yields
    the choice. Why not always: the C kernels run on their own pool (pool_native.c), numba's parallel kernels on
    numba's, and two pools on the same cores spin against each other (the conv net's step, when its conv,
    batch norm and pooling kernels were numba's only, took 1.40x as long with its fc, loss and optimizer
    in C, benchmarks/native_vs_numba.py). So a plan runs on one pool: C for all of it, or numba for all. A plan
    with GPT_LOWP_OPS loads the library's gpt_lowp part here, before its binders (built first where needed), and
    runs on numba where that part cannot be built."""
    _choice.stack.append(lib() is not None and ops <= NUMBA_FREE_OPS
                         and (not ops & GPT_LOWP_OPS or with_part(lib()) is not None))
    try:
        yield _choice.stack[-1]
    finally:
        _choice.stack.pop()


def plan_note(ops: set[str]) -> str:
    """What a plan of these ops binds its fused passes to, for the compile notes."""
    built = status()
    if built.lib is not None and ops & GPT_LOWP_OPS and with_part(built.lib) is None:
        return f"fused passes in numba: {built.lib.parts[GPT_LOWP].why_not} (the C kernels' {GPT_LOWP} part)"
    if built.lib is None or ops <= NUMBA_FREE_OPS:
        return built.describe()
    others = ", ".join(sorted(ops - NUMBA_FREE_OPS))
    return f"fused passes in numba: the plan's {others} kernels are numba's, and one thread pool serves a plan"


def active() -> Any:
    """The library the binders use here: lib(), unless chosen_for decided against it."""
    stack = _choice.stack
    return lib() if (not stack or stack[-1]) else None


GPT_LOWP = PARTS[1].name
"""The library's part with the GPT's, GELU's and mixed precision's kernels (native_build.PARTS)."""


def with_part(L: Any) -> Any:
    """L where its gpt_lowp part loads (built first where needed), else None: the binders of that part's entries
    then decline and the numba kernels or NumPy serve, as without a compiler (a part this user cannot build or
    write anywhere, say: Build.describe says why)."""
    return L if L is not None and L.has(GPT_LOWP) else None


def binder(f: Callable[..., Any]) -> Callable[..., Any]:
    """Record in DECLINED when ``f`` returns None with the library in use while a plan binds (a direct
    call outside chosen_for, as evaluate() makes per batch, is not a plan's choice)."""
    def bind(*args: Any) -> Any:
        out = f(*args)
        if out is None and _choice.stack and active() is not None:
            DECLINED.append(f.__name__)
        return out
    bind.__name__ = bind.__qualname__ = f.__name__
    bind.__doc__ = f.__doc__
    return bind


def covers(ops: set[str], declined_before: int) -> bool:
    """Whether binding these ops bound no numba kernel: the library is loaded, every op is one of
    NUMBA_FREE_OPS (so chosen_for chose C) and no binder declined its operands since DECLINED had
    ``declined_before`` entries."""
    return lib() is not None and len(DECLINED) == declined_before and ops <= NUMBA_FREE_OPS


NUMBA_FREE_OPS = frozenset({"fc_fwd", "fc_bwd", "matmul", "add", "relu", "copy", "fill", "softmax_xent", "accum_metrics",
                            "transfer", "zero_range", "nan_check", "clip_grad_norm", "optimizer", "optimizer_norms",
                            "ema_update", "cast", "amp_unscale", "amp_update_scale", "fc_fwd_lowp", "fc_bwd_lowp",
                            # conv nets (conv_native.c, winograd_native.c; kernels/conv_native.py binds them)
                            "conv_fwd", "conv_bwd", "bn_fwd", "bn_bwd", "bn_fold", "bn_inf", "maxpool_fwd",
                            "maxpool_bwd", "avgpool_fwd", "avgpool_bwd", "gap_fwd", "gap_bwd", "transfer_image",
                            "transfer_image_async", "transfer_wait",
                            "act_fwd", "act_bwd", "dropout_fwd", "mul", "reshape_copy",
                            # GELU's tanh form (gelu_native.c; the erf form is act_fwd/act_bwd's)
                            "gelu_tanh_fwd", "gelu_tanh_bwd",
                            # the GPT (gpt_native.c, attention_native.c)
                            "layernorm_fwd", "layernorm_bwd", "embedding_fwd", "embedding_bwd", "pos_embedding_fwd",
                            "pos_embedding_bwd", "attn_scores", "attn_scores_bwd", "attn_mix", "attn_mix_bwd",
                            "flash_attn_fwd", "flash_attn_bwd"})
"""Ops whose CPU kernels (kernels/cpu.py, conv.py, transfer.py, and the ops' own in ops/) call C or NumPy
only when the library is loaded and no binder declines (tests/test_native.py runs the MLP and the GPT from
an empty numba cache and counts compiles, tests/test_conv_native.py the conv net); act_fwd and act_bwd bind
C for ReLU and GELU only, and
record a decline for the other activations (their numba loops serve)."""
GPT_LOWP_OPS = frozenset({"cast", "amp_unscale", "fc_fwd_lowp", "fc_bwd_lowp", "gelu_tanh_fwd", "gelu_tanh_bwd",
                          "layernorm_fwd", "layernorm_bwd", "embedding_fwd", "embedding_bwd", "pos_embedding_fwd",
                          "pos_embedding_bwd", "attn_scores", "attn_scores_bwd", "attn_mix", "attn_mix_bwd",
                          "flash_attn_fwd", "flash_attn_bwd"})
"""Ops whose C kernels are the gpt_lowp part's (native_build.PARTS: lowp.c, gelu_native.c, gpt_native.c,
attention_native.c); GELU's erf form (act_fwd, act_bwd) too, whose binder declines where the part is missing."""



def address(a: np.ndarray) -> int:
    """The array's data address, as a binder passes it to C."""
    return a.ctypes.data


def row_stride(a: np.ndarray) -> int | None:
    """The row stride in elements of a 2-D array whose rows are contiguous, else None."""
    if a.ndim != 2 or (a.shape[1] > 1 and a.strides[1] != a.itemsize) or a.strides[0] % a.itemsize:
        return None
    return a.strides[0] // a.itemsize


def all_flat(*arrays: np.ndarray) -> bool:
    """Every array 1-D and contiguous."""
    return all(a.ndim == 1 and a.flags.c_contiguous for a in arrays)


def call(f: Any, args: tuple, keep: tuple) -> Kernel:
    """f(*args) as a kernel; ``keep`` holds the arrays whose addresses args carries. ``native`` says
    the same call to a native program (kernels/program.py): (entry name, args)."""
    def run() -> Any:
        return f(*args)
    run.keep = keep  # type: ignore[attr-defined]
    run.native = ((f.__name__, args),)  # type: ignore[attr-defined]
    return run


@binder
def bind_bias_act(y2: np.ndarray, b: np.ndarray, act: int, slope: float, threads: int) -> Kernel | None:
    L = active()
    ld = row_stride(y2)
    if L is None or ld is None or y2.dtype != np.float32 or b.dtype != np.float32 or not all_flat(b) or act not in range(5):
        return None
    n, m = y2.shape
    return call(L.rnb_bias_act, (address(y2), n, m, ld, address(b), b.shape[0], act, float(slope), threads), (y2, b))


@binder
def bind_act_grad_colsum(d2: np.ndarray, y2: np.ndarray, act: int, slope: float, parts: np.ndarray, out: np.ndarray,
                         threads: int) -> Kernel | None:
    L = active()
    ldd, ldy = row_stride(d2), row_stride(y2)
    ok = (L is not None and ldd is not None and ldy is not None and d2.dtype == y2.dtype == out.dtype == np.float32
          and parts.dtype == np.float64 and parts.flags.c_contiguous and all_flat(out) and act in range(5)
          and y2.shape == d2.shape and parts.ndim == 2 and parts.shape[1] == out.size and out.size in (0, d2.shape[1]))
    if not ok:
        return None
    n, m = d2.shape
    args = (address(d2), n, m, ldd, address(y2), ldy, act, float(slope), address(parts), parts.shape[0], address(out), out.shape[0],
            threads)
    return call(L.rnb_act_grad_colsum, args, (d2, y2, parts, out))


def _optimizer_ok(w: np.ndarray, lr_table: np.ndarray, step: np.ndarray, *state: np.ndarray) -> bool:
    arrays = (w, *state)
    return (all(a.dtype == np.float32 and all_flat(a) for a in arrays) and lr_table.dtype == np.float32
            and all_flat(lr_table) and lr_table.size > 0 and step.dtype == np.int64 and step.size >= 1)


@binder
def bind_adam(w, g, m, v, lr_table, step, beta1, beta2, eps, wd, decoupled, maximize, threads) -> Kernel | None:  # type: ignore[no-untyped-def]
    L = active()
    if L is None or not _optimizer_ok(w, lr_table, step, g, m, v) or not (w.size == g.size == m.size == v.size):
        return None
    args = (address(w), address(g), address(m), address(v), w.size, address(lr_table), lr_table.size, address(step), float(beta1),
            float(beta2), float(eps), float(wd), int(decoupled), int(maximize), threads)
    return call(L.rnb_adam, args, (w, g, m, v, lr_table, step))


def bind_count_back(step: np.ndarray) -> Kernel | None:
    """step[0] -= 1 (int64): undoes the count of the first of two update passes of one step (optim/adam.py)."""
    L = active()
    if L is None or step.dtype != np.int64 or not step.flags.c_contiguous:
        return None
    return call(L.rnb_count_back, (address(step),), (step,))


@binder
def bind_sgd(w, g, m, lr_table, step, momentum, dampening, wd, nesterov, maximize, threads) -> Kernel | None:  # type: ignore[no-untyped-def]
    L = active()
    if L is None or not _optimizer_ok(w, lr_table, step, g, m) or w.size != g.size or m.size not in (0, w.size):
        return None
    args = (address(w), address(g), address(m), w.size, m.size, address(lr_table), lr_table.size, address(step), float(momentum),
            float(dampening), float(wd), int(nesterov), int(maximize), threads)
    return call(L.rnb_sgd, args, (w, g, m, lr_table, step))


@binder
def bind_lars_norms(w: np.ndarray, g: np.ndarray, n: np.ndarray, seg: np.ndarray, threads: int) -> Kernel | None:
    """fused.lars_norms: [||w||, ||g||] per segment (offset, size, norm offset) of the W/G ranges."""
    L = active()
    ok = (L is not None and all_flat(w, g, n, seg.reshape(-1)) and w.dtype == g.dtype == n.dtype == np.float32
          and seg.dtype == np.int64 and seg.ndim == 2 and seg.shape[1] == 3 and seg.flags.c_contiguous
          and w.size == g.size)
    if not ok:
        return None
    return call(L.rnb_lars_norms, (address(w), address(g), address(n), address(seg), seg.shape[0], threads), (w, g, n, seg))


@binder
def bind_lars(w, g, m, n, pieces, lr_table, step, momentum, wd, eta, eps, threads) -> Kernel | None:  # type: ignore[no-untyped-def]
    """fused.lars_update over the W/G/M ranges cut into pieces (start, end, norm offset or -1)."""
    L = active()
    ok = (L is not None and _optimizer_ok(w, lr_table, step, g, m, n) and w.size == g.size == m.size
          and pieces.dtype == np.int64 and pieces.ndim == 2 and pieces.shape[1] == 3 and pieces.flags.c_contiguous)
    if not ok:
        return None
    args = (address(w), address(g), address(m), w.size, address(n), address(pieces), pieces.shape[0], address(lr_table), lr_table.size,
            address(step), float(momentum), float(wd), float(eta), float(eps), threads)
    return call(L.rnb_lars, args, (w, g, m, n, pieces, lr_table, step))


@binder
def bind_ema(e: np.ndarray, w: np.ndarray) -> Callable[[float], None] | None:
    """ema_(e, w, decay) over fixed ranges, the decay given per call."""
    L = active()
    if L is None or not all_flat(e, w) or e.dtype != np.float32 or w.dtype != np.float32 or e.size != w.size:
        return None
    f, pe, pw, n = L.rnb_ema, address(e), address(w), e.size

    def update(decay: float) -> None:
        f(pe, pw, n, decay)
    update.keep = (e, w)  # type: ignore[attr-defined]  # the arrays whose addresses it holds
    return update


@binder
def bind_probe(x: np.ndarray, parts: np.ndarray, threads: int) -> Callable[[], float] | None:
    L = active()
    if L is None or not all_flat(x, parts) or x.dtype != np.float32 or parts.dtype != np.float32 or parts.size < 8:
        return None
    return call(L.rnb_nonfinite_probe, (address(x), x.size, address(parts), threads), (x, parts))


@binder
def bind_clip(x: np.ndarray, threads: int) -> tuple[Callable[[], float], Callable[[Any], None]] | None:
    """(sum of squares, scale by a factor) over one fixed float32 range."""
    L = active()
    if L is None or not all_flat(x) or x.dtype != np.float32:
        return None
    sq, sc, p, n = L.rnb_sq_sum, L.rnb_scale, address(x), x.size

    def total() -> float:
        return sq(p, n, threads)

    def scale(factor: Any) -> None:
        sc(p, n, float(factor), threads)
    total.keep = scale.keep = (x,)  # type: ignore[attr-defined]  # the array whose address they hold
    return total, scale


@binder
def bind_gather(xs2: np.ndarray, ys: np.ndarray, perm: np.ndarray, cursor: np.ndarray, x2: np.ndarray,
                y_out: np.ndarray, threads: int) -> Callable[[], int] | None:
    L = active()
    ok = (L is not None and xs2.ndim == x2.ndim == 2 and xs2.flags.c_contiguous and x2.flags.c_contiguous
          and xs2.dtype == x2.dtype and xs2.shape[1] == x2.shape[1] and all_flat(ys, y_out, perm, cursor)
          and ys.dtype == y_out.dtype and perm.dtype == np.int64 and cursor.dtype == np.int64
          and x2.shape[0] == y_out.shape[0] and ys.shape[0] == xs2.shape[0])
    if not ok:
        return None
    args = (address(xs2), xs2.shape[0], xs2.shape[1], xs2.itemsize, address(ys), ys.itemsize, address(perm), perm.size,
            address(cursor), address(x2), address(y_out), y_out.shape[0], threads)
    return call(L.rnb_gather, args, (xs2, ys, perm, cursor, x2, y_out))


@binder
def bind_softmax_xent(logits: np.ndarray, labels: np.ndarray, smoothing: float, weight: np.ndarray,
                      result: np.ndarray, dlogits: np.ndarray, grad: bool) -> Kernel | None:
    L = active()
    ll, ld = row_stride(logits), (row_stride(dlogits) if grad else 0)
    ok = (L is not None and ll is not None and ld is not None and logits.dtype == np.float32
          and labels.dtype in (np.int64, np.int32)
          and all_flat(labels, weight, result) and weight.dtype == np.float32 and result.dtype == np.float32
          and result.size >= 3 and labels.shape[0] == logits.shape[0] and logits.shape[0] > 0 and logits.shape[1] > 0
          and (not grad or (dlogits.dtype == np.float32 and dlogits.shape == logits.shape)))
    if not ok:
        return None
    n, c = logits.shape
    args = (address(logits), n, c, ll, address(labels), int(labels.dtype == np.int64), float(smoothing), address(weight), weight.size, address(result),
            address(dlogits) if grad else 0, ld, int(grad))
    return call(L.rnb_softmax_xent, args, (logits, labels, weight, result, dlogits))


@binder
def bind_accumulate_metrics(result: np.ndarray, acc: np.ndarray, batch: float, loss_log: np.ndarray,
                            step: np.ndarray) -> Kernel | None:
    L = active()
    ok = (L is not None and all_flat(result, acc, loss_log, step) and result.dtype == np.float32 and acc.dtype == np.float64
          and acc.size >= 4 and loss_log.dtype == np.float32 and step.dtype == np.int64 and step.size >= 1)
    if not ok:
        return None
    args = (address(result), address(acc), float(batch), address(loss_log), loss_log.size, address(step))
    return call(L.rnb_accumulate_metrics, args, (result, acc, loss_log, step))


@binder
def bind_gemm_bands(fptr: int, wide: bool, bands: np.ndarray, threads: int) -> Kernel | None:
    """The planned sgemm bands (blas.plan_bands' rows) run on the pool's threads (pool_native.c)."""
    L = active()
    if L is None or bands.dtype != np.int64 or not bands.flags.c_contiguous or bands.shape[1:] != (11,):
        return None
    return call(L.rnb_gemm_bands, (fptr, int(wide), address(bands), bands.shape[0], threads), (bands,))


def philox_keys(out: np.ndarray, k0: int, k1: int, stream: int, off_lo: int, off_hi: int) -> bool:
    """philox.keys_kernel into ``out`` (uint64); False where the C library is not there."""
    L = lib()
    if L is None or out.dtype != np.uint64 or not all_flat(out):
        return False
    L.rnb_philox_keys(address(out), out.size, k0, k1, stream, off_lo, off_hi)
    return True


prepare()

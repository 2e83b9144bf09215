"""Image batch transfer kernels: NCHW data set -> (resize, crop, flip) -> NHWC input buffer.

The kernels of TRANSFER_KERNELS (joined into ``cpu.KERNELS``); their numba loops are in
kernels/augment.py:

``transfer_image``
    ins ``[cursor (1,) int64, aug_offset (1,) int64]`` (``aug_offset`` may be left out
    when the node neither crops nor flips: then it is 0), outs ``[x_out (B, H, W, C)
    float32, y_out (B,) int32]``. Params: ``source`` ("train"/"val": key of
    ``env.sources`` and ``env.perms``), ``crop_pad`` (int >= 0, 0 = no crop),
    ``flip`` (bool), ``out_hw`` ((H, W) or None = x_out's H, W; different from the
    source's size means a bilinear resize first), ``fill`` (float, padding value,
    default 0.0). Gathers rows ``perm[cursor : cursor+B]`` and advances the cursor by
    B. Sample ``j = cursor + i`` draws from Philox block ``aug_offset[0] + j`` of
    ``StreamId.AUGMENT`` (see :mod:`renaissance_nb.data.augment`), so results do not
    depend on threads or timing. Allocates nothing per call.

``transfer_image_async``
    Same ins, outs and params. On the calling thread it only claims the batch (reads
    cursor and aug_offset, advances the cursor: all in one tiny numba call) and queues
    the gather on the env's :class:`Prefetcher`; it returns at once. The worker runs the
    numba kernel with the GIL released, so it overlaps with the main thread's work.

``transfer_wait``
    ins ``[x_out]``, outs ``[]``, no params: blocks until the pending job writing that
    buffer (found by the buffer's address, whichever BindEnv bound it) is done and
    re-raises the worker's exception, if any. Returns at once when nothing is pending.

Rules for the async pair: between ``transfer_image_async`` and ``transfer_wait`` on a
buffer, nothing may read x_out / y_out, and the node's cursor, aug_offset and source
arrays must not be replaced (they may be read). A second ``transfer_image_async`` on
a buffer whose job was never waited for first waits for it (and raises its error).
"""
from __future__ import annotations

import queue
import threading
import weakref
from typing import Any, Callable

import numpy as np

from ..data.augment import bilinear_weights, check_out_hw
from ..errors import PlanError, bad_argument
from ..train.rng import StreamId
from .augment import claim_batch, transfer_images_claimed, transfer_images_step
from . import conv_native, program
from .base import BindEnv, Factory, registrar
from .operands import split_scratch
from .status import status_error

__all__ = ["Prefetcher", "TransferSlot", "buffer_slot", "prefetcher_for"]

_EMPTY_I64 = np.zeros(0, np.int64)
_EMPTY_F32 = np.zeros(0, np.float32)
_MASK32 = 0xFFFFFFFF

TRANSFER_KERNELS: dict[str, Factory] = {}
"""This module's kernels: transfer_image, transfer_image_async, transfer_wait."""
kernel = registrar(TRANSFER_KERNELS)


# --------------------------------------------------------------------------- background worker


class TransferSlot:
    """The pending-job state of one input buffer: at most one job in flight per buffer."""

    __slots__ = ("key", "done", "pending", "error", "__weakref__")

    def __init__(self, key: int) -> None:
        self.key = key
        self.done = threading.Event()
        self.done.set()
        self.pending = False
        self.error: BaseException | None = None

    def wait(self) -> None:
        """Block until the buffer's job is done; re-raise its exception (once)."""
        if not self.pending:
            return
        self.done.wait()
        self.pending = False
        err = self.error
        if err is not None:
            self.error = None
            raise err


_SLOTS: "weakref.WeakValueDictionary[int, TransferSlot]" = weakref.WeakValueDictionary()
_SLOTS_LOCK = threading.Lock()


def buffer_slot(buf: np.ndarray) -> TransferSlot:
    """The process-wide slot of the buffer starting at ``buf``'s address (created on first use).

    Keyed by the address of the first byte, so the async kernel and the wait kernel find
    the same slot even when they were bound with different BindEnvs or views.
    """
    key = int(buf.__array_interface__["data"][0])
    with _SLOTS_LOCK:
        slot = _SLOTS.get(key)
        if slot is None:
            slot = TransferSlot(key)
            _SLOTS[key] = slot
        return slot


_STOP = None


def _worker(jobs: "queue.SimpleQueue[Any]") -> None:
    """The worker loop: run (slot, fn) jobs in order; record errors on the slot; stop at _STOP."""
    while True:
        job = jobs.get()
        if job is _STOP:
            return
        slot, fn = job
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            if hasattr(exc, "add_note"):
                exc.add_note("(raised in the background image-transfer worker; surfaced by transfer_wait)")
            slot.error = exc
        finally:
            del job, fn
            slot.done.set()
            del slot


def _shutdown(jobs: "queue.SimpleQueue[Any]", thread: threading.Thread, timeout: float) -> None:
    jobs.put(_STOP)
    if thread.is_alive() and thread is not threading.current_thread():
        thread.join(timeout)


class Prefetcher:
    """One daemon worker thread that runs queued transfer jobs in submission order.

    ``submit(slot, fn)`` marks the slot pending and queues ``fn``; ``slot.wait()`` (or
    :meth:`wait`) blocks until it has run and re-raises its exception. The thread holds
    no reference to the Prefetcher, so when the last kernel closure (or BindEnv) that
    holds it goes away, a finalizer stops the thread; the same finalizer runs at
    interpreter exit. After :meth:`close`, jobs run inline on the submitting thread.
    """

    def __init__(self, name: str = "renaissance-transfer", join_timeout: float = 5.0) -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=_worker, args=(self._jobs,), name=name, daemon=True)
        self._thread.start()
        self._finalizer = weakref.finalize(self, _shutdown, self._jobs, self._thread, join_timeout)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def submit(self, slot: TransferSlot, fn: Callable[[], Any]) -> None:
        """Queue ``fn`` as the job of ``slot`` (waiting first for the slot's previous job)."""
        if slot.pending:
            slot.wait()
        slot.error = None
        slot.pending = True
        slot.done.clear()
        if self.closed:
            _worker_inline(slot, fn)
            return
        self._jobs.put((slot, fn))

    @staticmethod
    def wait(slot: TransferSlot) -> None:
        slot.wait()

    def close(self) -> None:
        """Stop the worker after the jobs already queued (idempotent)."""
        self._finalizer()


def _worker_inline(slot: TransferSlot, fn: Callable[[], Any]) -> None:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001
        slot.error = exc
    finally:
        slot.done.set()


_ENV_ATTR = "_transfer_prefetcher"
# The executor binds every capture with its own BindEnv, all sharing one ``sources`` dict:
# keying on that dict gives one worker per task instead of one per capture.
_BY_SOURCES: "weakref.WeakValueDictionary[int, Prefetcher]" = weakref.WeakValueDictionary()


def prefetcher_for(env: BindEnv) -> Prefetcher:
    """The env's Prefetcher, created on first use.

    Precedence: a ``prefetcher`` attribute set by the engine; the one already stored on
    this env; the one of any other live env sharing this env's ``sources`` dict (the
    BindEnvs of one executor); else a new one, stored lazily on the env.
    """
    pf = getattr(env, "prefetcher", None)
    if isinstance(pf, Prefetcher) and not pf.closed:
        return pf
    d = env.__dict__
    pf = d.get(_ENV_ATTR)
    if pf is None or pf.closed:
        with _SLOTS_LOCK:
            pf = _BY_SOURCES.get(id(env.sources))
            if pf is None or pf.closed:
                pf = Prefetcher()
                _BY_SOURCES[id(env.sources)] = pf
        d[_ENV_ATTR] = pf
    return pf


# --------------------------------------------------------------------------- binding


def _param_int(p: dict, name: str, default: int, lo: int) -> int:
    v = p.get(name, default)
    if v is None:
        v = default
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < lo:
        raise bad_argument(PlanError, "transfer_image", name, v, f"an integer >= {lo}",
                           f"pass {name}={default} to turn it off" if default == 0 else f"pass {name}>={lo}")
    return int(v)


def _check_source(where: str, source: str, cursor: Any, aug_offset: Any, xs: Any, ys: Any, perm: Any) -> None:
    """The node's cursor and offset, and the source's images, labels and permutation, as the loops take them."""
    for name, arr, dt in (("cursor", cursor, np.int64), ("aug_offset", aug_offset, np.int64)):
        if arr is not None and not (isinstance(arr, np.ndarray) and arr.dtype == dt and arr.size >= 1):
            raise bad_argument(PlanError, where, name, arr, "a (1,) int64 array",
                               f"allocate {name} as an int64 scalar tensor")
    if not (isinstance(xs, np.ndarray) and xs.ndim == 4 and xs.dtype == np.float32):
        raise bad_argument(
            PlanError, where, f"{source} X", xs, "float32 images of shape (N, C, H, W)",
            "give the task image data in NCHW layout (e.g. datasets.cifar10(), or mnist(layout='image'))",
        )
    if not (isinstance(ys, np.ndarray) and ys.ndim == 1 and ys.dtype.kind in "iu" and len(ys) == len(xs)):
        raise bad_argument(PlanError, where, f"{source} y", ys, f"integer labels of shape ({len(xs)},)",
                           "pass one integer label per image")
    if not (isinstance(perm, np.ndarray) and perm.ndim == 1 and perm.dtype == np.int64):
        raise bad_argument(PlanError, where, f"perms[{source!r}]", perm, "a 1-D int64 permutation",
                           "build it with Philox.permutation or np.arange(n, dtype=np.int64)")


def _bind_args(outs, ins, p: dict, env: BindEnv) -> dict[str, Any] | str:
    """Validate a transfer_image node and precompute the kernel's arguments (or the missing source name)."""
    where = "transfer_image"
    outs, scratch = split_scratch(outs, p)
    if len(ins) not in (1, 2) or len(outs) != 2:
        raise PlanError(f"{where}: expected ins [cursor, aug_offset] and outs [x_out, y_out]; got "
                        f"{len(ins)} ins and {len(outs)} outs. Fix: emit the node with those tensors.")
    cursor = ins[0]
    aug_offset = ins[1] if len(ins) == 2 else None
    x_out, y_out = outs
    source = p.get("source")
    if source not in env.sources:
        return str(source)
    xs, ys = env.sources[source]
    if source not in env.perms:
        raise PlanError(f"{where}: no permutation for source {source!r} in env.perms. "
                        "Fix: bind with a perms entry for every source.")
    perm = env.perms[source]
    _check_source(where, source, cursor, aug_offset, xs, ys, perm)
    if not (isinstance(y_out, np.ndarray) and y_out.ndim == 1 and y_out.dtype == np.int32 and len(y_out) >= 1):
        raise bad_argument(PlanError, where, "y_out", y_out, "an int32 buffer of shape (B,) with B >= 1",
                           "allocate the label buffer as int32 (B,)")
    b = int(y_out.shape[0])
    c, hs, ws = (int(d) for d in xs.shape[1:])
    out_hw = p.get("out_hw")
    if out_hw is None:
        out_hw = tuple(x_out.shape[1:3]) if isinstance(x_out, np.ndarray) and x_out.ndim == 4 else (hs, ws)
    h, w = check_out_hw(tuple(out_hw) if isinstance(out_hw, (list, tuple)) else out_hw, where)
    if not (isinstance(x_out, np.ndarray) and x_out.dtype == np.float32 and x_out.flags.c_contiguous
            and x_out.flags.writeable and x_out.size == b * h * w * c):
        raise bad_argument(
            PlanError, where, "x_out", x_out,
            f"a writeable C-contiguous float32 buffer of {b}x{h}x{w}x{c} values (B, H, W, C)",
            "size the input buffer channels-last for out_hw and the source's channel count",
        )
    if x_out.ndim == 4 and tuple(x_out.shape) != (b, h, w, c):
        raise bad_argument(PlanError, where, "x_out", x_out, f"shape (B, H, W, C) = {(b, h, w, c)}",
                           "allocate the input buffer NHWC, or make out_hw match it")
    x4 = x_out.reshape(b, h, w, c)  # a view: x_out is C-contiguous
    pad = _param_int(p, "crop_pad", 0, 0)
    flip = p.get("flip", False)
    if not isinstance(flip, (bool, np.bool_)):
        raise bad_argument(PlanError, where, "flip", flip, "True or False", "pass flip=True for random mirroring")
    fill = p.get("fill", 0.0)
    fill = 0.0 if fill is None else fill
    if isinstance(fill, (bool, np.bool_)) or not isinstance(fill, (int, float, np.integer, np.floating)) \
            or not np.isfinite(fill):
        raise bad_argument(PlanError, where, "fill", fill, "a finite number", "pass fill=0.0")
    if aug_offset is None:
        if pad or flip:
            raise PlanError(f"{where}: crop_pad={pad}, flip={bool(flip)} draw random numbers, so the node needs "
                            "ins [cursor, aug_offset]. Fix: add the epoch's aug_offset tensor to the node's ins.")
        aug_offset = np.zeros(1, np.int64)  # owned by the closure: the offset of a node that draws nothing
    resize = (h, w) != (hs, ws)
    if resize:
        yi0, yi1, yw0, yw1 = bilinear_weights(hs, h)
        xi0, xi1, xw0, xw1 = bilinear_weights(ws, w)
    else:
        yi0 = yi1 = xi0 = xi1 = _EMPTY_I64
        yw0 = yw1 = xw0 = xw1 = _EMPTY_F32
    seed = int(env.seed)
    return dict(
        cursor=cursor, aug_offset=aug_offset, b=b, source=source,
        data=(xs, ys, perm, x4, y_out),
        rng=(seed & _MASK32, (seed >> 32) & _MASK32, int(StreamId.AUGMENT), pad, int(bool(flip)), float(fill)),
        tables=(yi0, yi1, yw0, yw1, xi0, xi1, xw0, xw1, int(resize)),
        x_out=x_out, claim=scratch.get("claim"),
    )


def _missing(source: str, name: str) -> Callable[[], None]:
    def missing() -> None:
        raise PlanError(f"{name}: no {source!r} data was given to the task. Fix: pass {source} data to .data().")
    return missing


@kernel("transfer_image")
def transfer_image(outs, ins, p, env):
    """Gather, resize, crop, flip and lay out NHWC the next batch, synchronously, allocation-free."""
    a = _bind_args(outs, ins, p, env)
    if isinstance(a, str):
        return _missing(a, "transfer_image")
    cursor, aug_offset, b, source = a["cursor"], a["aug_offset"], a["b"], a["source"]
    xs, ys, perm, x4, y_out = a["data"]
    k0, k1, stream, pad, flip, fill = a["rng"]
    yi0, yi1, yw0, yw1, xi0, xi1, xw0, xw1, resize = a["tables"]
    step = transfer_images_step
    gather = conv_native.bind_gather_images(cursor, aug_offset, xs, ys, perm, x4, y_out, a["rng"], a["tables"])
    if gather is None:
        def gather() -> int:
            return step(cursor, aug_offset, xs, ys, perm, x4, y_out, k0, k1, stream, pad, flip, fill,
                        yi0, yi1, yw0, yw1, xi0, xi1, xw0, xw1, resize)

    def run() -> None:
        rc = gather()
        if rc:
            raise status_error(rc, "transfer_image", source, b, perm, int(cursor[0]))
    return program.mark(run, program.guarded(gather, program.STATUS, None, run))  # in a native program: C


@kernel("transfer_image_async")
def transfer_image_async(outs, ins, p, env):
    """Claim the next batch now and gather it on the env's Prefetcher worker; pair with transfer_wait."""
    a = _bind_args(outs, ins, p, env)
    if isinstance(a, str):
        return _missing(a, "transfer_image_async")
    cursor, aug_offset, b, source = a["cursor"], a["aug_offset"], a["b"], a["source"]
    xs, ys, perm, x4, y_out = a["data"]
    k0, k1, stream, pad, flip, fill = a["rng"]
    yi0, yi1, yw0, yw1, xi0, xi1, xw0, xw1, resize = a["tables"]
    claim_f, gather_f = claim_batch, transfer_images_claimed
    state = a["claim"]  # (start, aug_base) of the claimed batch: the buffer's I_*.claim arena tensor
    if state is None:  # a hand-built node without one
        state = env.scratch("transfer_image_async: claimed batch", (2,), np.int64)
    elif state.shape != (2,) or state.dtype != np.int64:
        raise PlanError(f"transfer_image_async: the claim tensor has shape {state.shape} ({state.dtype}), "
                        "expected (2,) int64.")
    slot = buffer_slot(a["x_out"])
    pf = prefetcher_for(env)
    submit = pf.submit
    claim = conv_native.bind_claim(cursor, aug_offset, b, state) or (lambda: claim_f(cursor, aug_offset, b, state))
    gather = conv_native.bind_gather_images(state, aug_offset, xs, ys, perm, x4, y_out, a["rng"], a["tables"],
                                            True)  # the claimed batch
    if gather is None:
        def gather() -> int:
            return gather_f(state, xs, ys, perm, x4, y_out, k0, k1, stream, pad, flip, fill,
                            yi0, yi1, yw0, yw1, xi0, xi1, xw0, xw1, resize)

    def job() -> None:
        rc = gather()
        if rc:
            raise status_error(rc, "transfer_image_async", source, b, perm, int(state[0]))

    def run() -> None:
        if slot.pending:  # the previous job on this buffer still owns `state`
            slot.wait()
        claim()
        submit(slot, job)

    return run  # holds pf (through submit): the worker lives as long as the closure


@kernel("transfer_wait")
def transfer_wait(outs, ins, p, env):
    """Block until the background job writing ins[0] is done; re-raise its error."""
    if len(ins) != 1 or not isinstance(ins[0], np.ndarray):
        raise PlanError(f"transfer_wait: expected ins [x_out] (the buffer a transfer_image_async writes); got "
                        f"{len(ins)} ins. Fix: emit the node with the input buffer as its only input.")
    slot = buffer_slot(ins[0])
    return slot.wait

"""A CPU step as one native program: the bound kernels that call C, packed into op arrays (program.c).

Why: a replayed step is ``for kernel in program: kernel()``, and for the seed MLP at batch 32 the Python
calls between kernels cost as much as the GEMMs. A kernel that calls C says so in its ``native``
attribute: a tuple of ops, each (entry name in native.SIGNATURES, its arguments) as ``native.call``
records it, or an ``Op`` with a guard. A kernel that composes C calls (fc_fwd: the product, then bias and
activation) chains them (``chain``); one with control flow around its calls states it as guard and skip
ops (``guarded``, ``skipped_if``). A run of such kernels becomes one ``rnb_run_steps`` call; any other
kernel (numba, NumPy) breaks the run and is called as before. ``RNB_PROGRAM=0`` turns packing off
(every kernel is called from Python), so tests and benchmarks compare both: the same C functions on
the same arguments in the same order, so the same bytes.
"""
from __future__ import annotations

import ctypes
import os
import threading
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from . import blas, native
from .thunks import FLOATS, PREFIX

Kernel = Callable[[], Any]
PLAIN, STATUS, FINITE, SKIP, SKIP_CLEAR = 0, 1, 2, 3, 4
"""Op kinds (program.c): no guard; the host acts on a non-zero int result; on a non-zero float result or
a non-finite loss; jump over the next ``skip`` ops when the int64 flag is set (and clear it)."""
DONE, HOST, STOPPED = 0, 1, 2
"""rnb_run_steps' answers: all steps ran; a guard asks the host to act; SIGINT stopped at a step boundary."""
OP_FIELDS = 5
"""int64 words per op: thunk, argument block, kind, guard operand, skip count."""


class Op(NamedTuple):
    """One call of a native program: a C entry on fixed arguments, or a skip (entry "")."""
    entry: str
    args: tuple = ()
    kind: int = PLAIN
    guard: np.ndarray | None = None
    skip: int = 0
    host: Kernel | None = None  # what the host runs when the guard trips (the kernel's Python path)


def enabled() -> bool:
    """Whether steps are packed into native programs: the C library is loaded and RNB_PROGRAM is not 0."""
    return os.environ.get("RNB_PROGRAM", "1") != "0" and native.lib() is not None


def ops_of(kernel: Any) -> tuple[Op, ...] | None:
    """The kernel's native ops, or None when it runs Python (numba, NumPy) or packing is off."""
    ops = getattr(kernel, "native", None)
    return None if ops is None else tuple(o if isinstance(o, Op) else Op(*o) for o in ops)


def calls_of(kernel: Any) -> tuple[str, ...] | None:
    """What the kernel runs inside a native program, in order: its C entries ("[guard]" where the host may
    act, "skip n if flag" for a skip op); None for a Python kernel, which splits the program."""
    ops = ops_of(kernel)
    if ops is None:
        return None
    return tuple(f"skip {o.skip} if flag" if not o.entry else o.entry + (" [guard]" if o.kind in (STATUS, FINITE) else "")
                 for o in ops)


def mark(kernel: Kernel, ops: Sequence[Any] | None) -> Kernel:
    """``kernel`` with ``native`` set to ``ops`` (None: left unmarked, it stays a Python kernel)."""
    if ops is not None:
        kernel.native = tuple(ops)  # type: ignore[attr-defined]
    return kernel


def chain(*kernels: Kernel) -> Kernel:
    """The kernels called in order as one kernel; native when each of them is."""
    parts = [ops_of(k) for k in kernels]

    def run() -> None:
        for k in kernels:
            k()
    return mark(run, None if any(p is None for p in parts) else [o for p in parts for o in p])  # type: ignore[union-attr]


def guarded(call: Kernel, kind: int, guard: np.ndarray | None, host: Kernel) -> tuple[Op, ...] | None:
    """``call``'s one native op with a guard: when it trips, the program returns and the host runs ``host``
    (the whole kernel's Python path) before going on from the next op. None when ``call`` is not native."""
    ops = ops_of(call)
    if ops is None or len(ops) != 1:
        return None
    return (Op(ops[0].entry, ops[0].args, kind, guard, 0, host),)


def skipped_if(flag: np.ndarray, clear: bool, ops: Sequence[Op] | None) -> tuple[Op, ...] | None:
    """``ops`` behind a skip op: jumped over when ``flag[0]`` (int64) is set, which is then cleared if
    ``clear``."""
    if ops is None or flag.dtype != np.int64 or not flag.flags.c_contiguous:
        return None
    return (Op("", (), SKIP_CLEAR if clear else SKIP, flag, len(ops)), *ops)


def _c_call(entry: str, args: tuple, keep: tuple) -> Kernel:
    """A kernel calling the library's ``entry`` on fixed arguments, marked native."""
    f = getattr(native.active(), entry)

    def run() -> None:
        f(*args)
    run.keep = keep  # type: ignore[attr-defined]  # the arrays whose addresses args carries
    return mark(run, [Op(entry, args)])


def bind_copy(dst: np.ndarray, src: np.ndarray) -> Kernel | None:
    """np.copyto(dst, src) as one memmove where both are contiguous of one dtype and size and the plan binds
    C (native.active); else None."""
    ok = (native.active() is not None and dst.dtype == src.dtype and dst.size == src.size
          and dst.flags.c_contiguous and src.flags.c_contiguous and dst.shape == src.shape)
    return _c_call("rnb_copy_bytes", (dst.ctypes.data, src.ctypes.data, dst.nbytes), (dst, src)) if ok else None


def bind_zero(*targets: np.ndarray) -> Kernel | None:
    """Every target filled with zero bytes (``t.fill(0)``) as C calls; None unless the plan binds C and every
    target is contiguous."""
    if native.active() is None or not all(t.flags.c_contiguous for t in targets):
        return None
    return chain(*(_c_call("rnb_zero_bytes", (t.ctypes.data, t.nbytes), (t,)) for t in targets))


def bind_ema_warm(e: np.ndarray, w: np.ndarray, step: np.ndarray, decay: float) -> Kernel | None:
    """ema_update's average with its warm-up decay from the step counter, as one C call (rnb_ema_warm);
    None where native.bind_ema would decline or the counter is not an int64 array."""
    ok = (native.active() is not None and e.dtype == w.dtype == np.float32 and e.size == w.size
          and e.ndim == w.ndim == 1 and e.flags.c_contiguous and w.flags.c_contiguous and step.dtype == np.int64)
    return _c_call("rnb_ema_warm", (e.ctypes.data, w.ctypes.data, e.size, step.ctypes.data, float(decay)),
                   (e, w, step)) if ok else None


def bind_clip_norm(x: np.ndarray, out: np.ndarray, max_norm: np.float32, threads: int) -> Kernel | None:
    """clip_grad_norm's norm, factor and scaling as one C call (rnb_clip_norm); None where native.bind_clip
    would decline or ``out`` is not float32."""
    ok = (native.active() is not None and x.dtype == out.dtype == np.float32 and x.ndim == 1 and x.flags.c_contiguous
          and out.flags.c_contiguous and out.size >= 2)
    return _c_call("rnb_clip_norm", (x.ctypes.data, x.size, out.ctypes.data, float(max_norm), threads),
                   (x, out)) if ok else None


_thunks: dict[str, int] = {}
_lock = threading.Lock()


def thunk(entry: str) -> int:
    """The address of entry's thunk in the library."""
    with _lock:
        if entry not in _thunks:
            f = getattr(native.lib(), PREFIX + entry)
            _thunks[entry] = ctypes.cast(f, ctypes.c_void_p).value or 0
        return _thunks[entry]


def _arg_words(entry: str, args: tuple) -> np.ndarray:
    """The argument block of one op: int64 words, doubles stored bit for bit."""
    kinds = native.SIGNATURES[entry][1]
    if len(kinds) != len(args):
        raise ValueError(f"{entry} takes {len(kinds)} arguments, the op has {len(args)}")
    words = np.zeros(len(args), np.int64)
    for k, (t, v) in enumerate(zip(kinds, args)):
        if t in FLOATS:
            words[k:k + 1] = np.array([float(v)], np.float64).view(np.int64)
        else:  # None is a NULL pointer, as ctypes passes it
            words[k] = np.array(0 if v is None else int(v), np.uint64 if t is ctypes.c_uint64 else np.int64).astype(np.int64)
    return words


class NativeRun:
    """Consecutive native kernels packed as one program: calling it is one ``rnb_run_steps`` call (and a
    return to Python only where a guard trips). ``kernels`` is how many bound kernels it replaces."""

    def __init__(self, kernels: Sequence[Kernel]) -> None:
        ops = [o for k in kernels for o in ops_of(k) or ()]
        self.kernels, self.ops, self.keep = len(kernels), tuple(ops), tuple(kernels)
        table = np.zeros((max(len(ops), 1), OP_FIELDS), np.int64)
        self.blocks = [_arg_words(o.entry, o.args) if o.entry else np.zeros(1, np.int64) for o in ops]
        for j, (o, block) in enumerate(zip(ops, self.blocks)):
            gp = 0 if o.guard is None else o.guard.ctypes.data
            table[j] = (thunk(o.entry) if o.entry else 0, block.ctypes.data, o.kind, gp, o.skip)
        self.table = table
        self.step = np.array([table.ctypes.data, len(ops)], np.int64)  # one step: (ops, count)
        self.where = np.zeros(2, np.int64)
        self._run = native.lib().rnb_run_steps
        self._args = (self.step.ctypes.data, 0, 1, 0, self.where.ctypes.data, 0)
        self._go = blas.on_own_cores(self._direct)  # the products' bands: OpenBLAS at one thread per call

    def __call__(self) -> None:
        self._go()

    def _direct(self) -> None:
        run, (steps, first, last, op0, where, watch) = self._run, self._args
        status = run(steps, first, last, op0, where, watch)
        while status == HOST:  # a guard tripped: the host acts (raises, or sets a flag), then the rest runs
            j = int(self.where[1])
            host = self.ops[j].host
            if host is not None:
                host()
            status = run(steps, first, last, j + 1, where, watch)


def pack(kernels: Sequence[Kernel]) -> list[Kernel]:
    """The step program with each maximal run of native kernels replaced by one NativeRun."""
    out: list[Kernel] = []
    run: list[Kernel] = []
    for k in kernels:
        if ops_of(k) is not None:
            run.append(k)
            continue
        if run:
            out.append(NativeRun(run))
            run = []
        out.append(k)
    if run:
        out.append(NativeRun(run))
    return out


def python_ops(kernels: Sequence[Kernel], names: Callable[[Kernel], str]) -> list[str]:
    """The names of the kernels that stay Python (the reason a step is not one native program)."""
    return [names(k) for k in kernels if ops_of(k) is None]


class NativeSteps:
    """The whole-native step programs of an epoch (one NativeRun each), run N steps per call."""

    def __init__(self, runs: Sequence[NativeRun]) -> None:
        self.runs = tuple(runs)
        self.table = np.array([(r.table.ctypes.data, len(r.ops)) for r in runs], np.int64).reshape(-1)
        self.where = np.zeros(2, np.int64)
        self._run = native.lib().rnb_run_steps

    def run(self, first: int, last: int, watch: bool = False,
            entering: Callable[[int], None] | None = None) -> int:
        """Steps [first, last) in one call; the steps done: ``last``, or fewer when ``watch`` and a SIGINT
        stopped them at a step boundary. Where a guard trips, ``entering(step)`` is told the step the host
        now acts in (its Python path may raise: that step is then half done) before the host runs."""
        with blas.own_cores():
            return self._steps(first, last, watch, entering)

    def _steps(self, first: int, last: int, watch: bool, entering: Callable[[int], None] | None) -> int:
        run, table, where = self._run, self.table.ctypes.data, self.where
        status = run(table, first, last, 0, where.ctypes.data, int(watch))
        while status == HOST:
            s, j = int(where[0]), int(where[1])
            if entering is not None:
                entering(s)
            host = self.runs[s].ops[j].host
            if host is not None:
                host()
            status = run(table, s, last, j + 1, where.ctypes.data, int(watch))
        return int(where[0]) if status == STOPPED else last


class Captured:
    """An epoch schedule's programs packed (``pack``): per step, and for an epoch whose every step is
    one native program, ``whole``, which runs N steps in one call."""

    def __init__(self, prologue: list[Kernel], steps: list[list[Kernel]]) -> None:
        self.prologue, self.steps = prologue, steps
        runs = [s[0] for s in steps if len(s) == 1 and isinstance(s[0], NativeRun)]
        self.whole = NativeSteps(runs) if steps and len(runs) == len(steps) else None

    def replay(self) -> None:
        """The prologue, then every step (all in one call when whole)."""
        for k in self.prologue:
            k()
        if self.whole is not None:
            self.whole.run(0, len(self.steps))
            return
        for prog in self.steps:
            for k in prog:
                k()

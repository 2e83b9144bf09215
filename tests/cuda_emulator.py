"""Run the GPU backend's CUDA kernels on the CPU: a test harness, not a backend.

The CUDA source (renaissance_nb/gpu/src) is compiled by g++ with a small shim that turns
``__global__`` functions into plain functions and emulates a launch by calling the kernel
once per (block, thread), in order. That is exact for every kernel that does not talk
between threads; the one-block reduction of rnb_softmax_xent is built with a block of one
thread (RNB_THREADS=1), so its rows are summed in order, and rnb_grad_sq_partials, whose blocks
reduce within themselves, runs its grid with one thread a block. Wrappers and ctypes signatures
are generated from the kernels' own parameter lists, so a call from the GPU kernel table
with a wrong argument count fails here as it would on a GPU.

:func:`emulated_runtime` stands in for CuPy under the real GpuExecutor: NumPy arrays as device
memory, NumPy stand-ins for cuBLAS and the memory operations, and streams, events and graph
captures with CUDA's rules (work on a capturing stream is recorded, not run; forks must be joined;
no syncs, host copies or, in thread-local and global mode, allocations inside a capture).

Work runs when it is queued (one valid order), and a race detector checks that the order was
guaranteed: each stream, event and replayed graph branch carries a vector clock (an event record
snapshots its stream's clock, a wait joins it, a host synchronize joins the host's), every access
(a kernel's const pointers read, its others written; a GEMM's operands and workspace; copies,
fills, uploads, downloads) is compared with the earlier conflicting accesses of other streams, and
one not ordered after them raises :class:`RaceError` naming both entries (the executor's
``declare``). An entry's accesses to the arena must also lie inside the ranges it declared
(gpu/deps.py), which checks the dependency analysis against what the kernels really touch.
"""
from __future__ import annotations

import ctypes
import hashlib
import re
import shutil
import subprocess
import tempfile
import weakref
from pathlib import Path
from typing import Any, Callable

import numpy as np

from renaissance_nb.gpu.cublas import CUBLAS_OP_N, CUDA_R_16BF, CUDA_R_16F, CUDA_R_32F, gemm_types, sgemm_args
from renaissance_nb.gpu.kernels import MemoryOps, kernel_source
from renaissance_nb.gpu.runtime import DeviceRuntime
from renaissance_nb.kernels.lowp import round_to

SHIM = r"""
#include <math.h>
struct rnb_dim3 { unsigned int x, y, z; };
static rnb_dim3 threadIdx, blockIdx, blockDim, gridDim;
#define __global__
#define __shared__ static
#define __syncthreads()
#define RNB_THREADS 1
template <typename... P, typename... A>
static void rnb_emulate(void (*k)(P...), unsigned int grid, unsigned int block, A... args) {
    gridDim.x = grid; blockDim.x = block;
    gridDim.y = gridDim.z = blockDim.y = blockDim.z = 1;
    for (unsigned int b = 0; b < grid; ++b)
        for (unsigned int t = 0; t < block; ++t) { blockIdx.x = b; threadIdx.x = t; k(args...); }
}
"""

CTYPES = {"int": ctypes.c_int, "float": ctypes.c_float, "double": ctypes.c_double, "rnb_i64": ctypes.c_longlong,
          "unsignedlonglong": ctypes.c_ulonglong, "unsignedint": ctypes.c_uint}
ONE_BLOCK = {"rnb_softmax_xent"}  # kernels whose threads cooperate: emulated with one thread
ONE_THREAD_BLOCKS = {"rnb_grad_sq_partials"}  # each block's threads cooperate: its grid, a thread a block


def kernel_signatures(source: str) -> dict[str, list[tuple[str, str]]]:
    """name -> [(C type, parameter name)] of every extern "C" __global__ kernel."""
    sigs = {}
    for m in re.finditer(r'extern "C" __global__ void (\w+)\(([^)]*)\)', source):
        params = []
        for part in m.group(2).split(","):
            part = " ".join(part.split())
            ctype, name = part.rsplit(" ", 1)
            params.append((ctype, name))
        sigs[m.group(1)] = params
    return sigs


def _ctype(ctype: str) -> Any:
    if ctype.endswith("*"):
        return ctypes.c_void_p
    return CTYPES[ctype.replace("const", "").replace(" ", "")]


def build(workdir: Path, shim: str = SHIM, flags: tuple[str, ...] = ("-std=c++17",), stem: str = "rnb_emulator"
          ) -> tuple[ctypes.CDLL, dict[str, list[tuple[str, str]]]]:
    """Compile the package's CUDA source under ``shim`` into a CPU library (cached by the text's hash),
    with an ``emu_<kernel>(grid, block, args...)`` wrapper per kernel, and load it."""
    gxx = shutil.which("g++")
    if gxx is None:
        raise RuntimeError("g++ is not installed")
    source = kernel_source()
    sigs = kernel_signatures(source)
    wrappers = []
    for name, params in sigs.items():
        plist = ", ".join(f"{t} {n}" for t, n in params)
        names = ", ".join(n for _, n in params)
        wrappers.append(f'extern "C" void emu_{name}(unsigned int emu_grid, unsigned int emu_block, {plist}) '
                        f"{{ rnb_emulate({name}, emu_grid, emu_block, {names}); }}")
    text = shim + source + "\n" + "\n".join(wrappers) + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    lib_path = workdir / f"{stem}_{digest}.so"
    if not lib_path.exists():
        src = workdir / f"{stem}_{digest}.cpp"
        src.write_text(text)
        tmp = workdir / f"{stem}_{digest}.{np.random.randint(1 << 30)}.so"
        subprocess.run([gxx, "-O1", *flags, "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC",
                        "-o", str(tmp), str(src)], check=True, capture_output=True, text=True)
        tmp.replace(lib_path)
    lib = ctypes.CDLL(str(lib_path))
    for name, params in sigs.items():
        fn = getattr(lib, f"emu_{name}")
        fn.argtypes = [ctypes.c_uint, ctypes.c_uint] + [_ctype(t) for t, _ in params]
        fn.restype = None
    return lib, sigs


class CaptureError(RuntimeError):
    """What CUDA would refuse during a stream capture."""


CAPTURE_GLOBAL, CAPTURE_THREAD_LOCAL, CAPTURE_RELAXED = 0, 1, 2
"""cudaStreamCaptureMode's values; CuPy's begin_capture() defaults to relaxed."""
CAPTURE_MODES_SEEN: list[int] = []
"""The mode of every capture begun, in order (what a test reads to see the executor's choice)."""


Range = tuple[int, int]
Accesses = tuple[tuple[Range, ...], tuple[Range, ...]]  # (reads, writes): absolute byte ranges
NO_ACCESS: Accesses = ((), ())


def span(a: Any) -> Range:
    """The bytes an array (a NumPy stand-in for a device array, or a host buffer) spans."""
    arr = np.asarray(a)
    if arr.size == 0:
        return 0, 0
    lo = arr.ctypes.data + sum((n - 1) * st for n, st in zip(arr.shape, arr.strides) if st < 0)
    hi = arr.ctypes.data + sum((n - 1) * st for n, st in zip(arr.shape, arr.strides) if st > 0) + arr.itemsize
    return int(lo), int(hi)


def accesses(reads: tuple = (), writes: tuple = ()) -> Accesses:
    return tuple(span(a) for a in reads), tuple(span(a) for a in writes)


class RaceError(AssertionError):
    """Two accesses to the same bytes, at least one a write, with no happens-before order between them
    (what would race on a GPU), or an entry touching arena bytes outside what it declared."""


def _join(a: dict[int, int], b: dict[int, int]) -> dict[int, int]:
    out = dict(a)
    for k, v in b.items():
        if out.get(k, 0) < v:
            out[k] = v
    return out


_TIDS = iter(range(1, 1 << 62))


class Lane:
    """A sequence of work in order: a stream, or one of a replayed graph's branches (a fresh lane per
    launch). ``vc`` is its vector clock: lane id -> the last of that lane's operations ordered before."""

    def __init__(self, vc: dict[int, int] | None = None) -> None:
        self.tid = next(_TIDS)
        self.vc = dict(vc or {})
        self.label = ""  # the entry it runs (the executor's declare)
        self.declared: tuple[Range, tuple[Range, ...], tuple[Range, ...]] | None = None


class Host:
    vc: dict[int, int] = {}  # what the host thread has waited for (synchronize calls)


class RaceDetector:
    """Happens-before checking of every access the stand-in carries out (vector clocks, FastTrack-like):
    each record is (range, is_write, lane id, that lane's clock at the access, label, op)."""

    def __init__(self) -> None:
        self.enabled = True
        self.records: list[tuple[int, int, bool, int, int, str, str]] = []
        self.checked = 0

    def access(self, lane: Lane, op: str, acc: Accesses) -> None:
        if not self.enabled:
            return
        reads, writes = acc
        for write, ranges in ((False, reads), (True, writes)):
            for lo, hi in ranges:
                if hi > lo:
                    self._one(lane, op, lo, hi, write)

    def _one(self, lane: Lane, op: str, lo: int, hi: int, write: bool) -> None:
        self._check_declared(lane, op, lo, hi, write)
        vc, keep = lane.vc, []
        for rec in self.records:
            a, b, w, tid, epoch, label, rop = rec
            if a < hi and lo < b:
                ordered = epoch <= vc.get(tid, 0)
                if not ordered and (w or write):
                    self.records = []  # a fresh start for the next test
                    raise RaceError(
                        f"race: {lane.label or 'host hand-over'} ({op}) {'writes' if write else 'reads'} bytes "
                        f"[{max(a, lo) - self._base}, {min(b, hi) - self._base}) that {label or 'host hand-over'} "
                        f"({rop}) {'wrote' if w else 'read'} on another stream, with no event between "
                        f"'{label or 'host hand-over'}' and '{lane.label or 'host hand-over'}'")
                if ordered and lo <= a and b <= hi and (write or not w):
                    continue  # subsumed: whatever is ordered after this access is ordered after it
            keep.append(rec)
        keep.append((lo, hi, write, lane.tid, vc.get(lane.tid, 0), lane.label, op))
        self.records = keep
        self.checked += 1

    _base = 0

    def _check_declared(self, lane: Lane, op: str, lo: int, hi: int, write: bool) -> None:
        if lane.declared is None:
            return
        (s, e), reads, writes = lane.declared
        if hi <= s or e <= lo:
            return  # not the arena: scratch, data sets, staging
        self._base = s
        allowed = writes if write else reads + writes
        if not any(a <= lo and hi <= b for a, b in allowed):
            raise RaceError(f"{lane.label} ({op}) {'writes' if write else 'reads'} arena bytes [{lo - s}, {hi - s}) "
                            f"outside the ranges it declared")


DETECTOR = RaceDetector()


def _run_on(lane: Lane, name: str, fn: Callable[[], None], acc: Accesses) -> None:
    lane.vc = _join(lane.vc, Host.vc)  # the host queued it after what it had waited for
    lane.vc[lane.tid] = lane.vc.get(lane.tid, 0) + 1
    DETECTOR.access(lane, name, acc)
    fn()


class EmuGraph:
    """A captured graph: the recorded work and the event records and waits between its streams, in the
    order they were queued. A launch replays it with a fresh lane per captured side stream, so what the
    work may overlap is what the capture's forks and joins allow, as on a GPU."""

    def __init__(self, origin: "EmuStream") -> None:
        self.origin = origin  # the stream that began the capture: a launch puts its place on the launching stream
        self.steps: list[tuple[str, "EmuStream", Any]] = []  # (kind, stream, payload)

    @property
    def nodes(self) -> list[tuple[str, Callable[[], None]]]:
        return [(p[0], p[1]) for kind, _, p in self.steps if kind == "op"]

    def launch(self, stream: "EmuStream") -> None:
        if stream.capture is not None:
            raise CaptureError("graph.launch: a child graph inside a capture is not emulated")
        stream.vc = _join(stream.vc, Host.vc)
        lanes: dict[int, Lane] = {}
        origin = self.origin
        events: dict[int, dict[int, int]] = {}
        for kind, s, payload in self.steps:
            lane = stream if s is origin else lanes.setdefault(id(s), Lane())
            if kind == "op":
                _run_on(lane, *payload)
            elif kind == "record":
                events[id(payload)] = dict(lane.vc)
            elif kind == "wait":
                lane.vc = _join(lane.vc, events[id(payload)])  # recorded earlier in this capture (wait_event)
            else:  # declare
                lane.label, lane.declared = payload
        # every branch was joined back into the origin (end_capture checks it): the origin's clock holds them

    def debug_dot_str(self) -> str:
        """Ops as nodes; an edge from each op to the next on its stream and across each event wait."""
        lines, last, at_record = ["digraph emulated {"], {}, {}
        pending: dict[int, list[int]] = {}
        n = 0
        for kind, s, payload in self.steps:
            if kind == "op":
                lines.append(f'  n{n} [label="{payload[0]}"];')
                for src in pending.pop(id(s), []) + ([last[id(s)]] if id(s) in last else []):
                    lines.append(f"  n{src} -> n{n};")
                last[id(s)] = n
                n += 1
            elif kind == "record" and id(s) in last:
                at_record[id(payload)] = last[id(s)]
            elif kind == "wait" and id(payload) in at_record:
                pending.setdefault(id(s), []).append(at_record[id(payload)])
        return "\n".join(lines + ["}"])


class EmuStream(Lane):
    """A stream: runs work at once, or records it while it takes part in a capture."""

    _count = 0

    def __init__(self) -> None:
        super().__init__()
        EmuStream._count += 1
        self.ptr = EmuStream._count
        self.capture: EmuGraph | None = None
        self.origin = False  # began the capture it takes part in
        self.mode = CAPTURE_RELAXED  # of the capture it began
        self.joined = True   # a forked stream's work so far is joined back into the origin
        self.queued = 0      # work recorded so far (what an event records a point in)

    def __enter__(self) -> "EmuStream":
        _CURRENT.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _CURRENT.pop()

    def enqueue(self, name: str, fn: Callable[[], None], acc: Accesses = NO_ACCESS) -> None:
        if self.capture is None:
            _run_on(self, name, fn, acc)
            return
        self.capture.steps.append(("op", self, (name, fn, acc)))
        self.queued += 1
        if not self.origin:
            self.joined = False

    def declare(self, label: str, scope: Range, reads: tuple[Range, ...], writes: tuple[Range, ...]) -> None:
        payload = (label, (scope, tuple(reads), tuple(writes)))
        if self.capture is None:
            self.label, self.declared = payload
        else:
            self.capture.steps.append(("declare", self, payload))

    def begin_capture(self, mode: int | None = None) -> None:
        if self.capture is not None:
            raise CaptureError("begin_capture: the stream is already capturing")
        self.mode = CAPTURE_RELAXED if mode is None else mode  # CuPy's default
        CAPTURE_MODES_SEEN.append(self.mode)
        self.capture, self.origin = EmuGraph(self), True
        _CAPTURING.append(self)

    def end_capture(self) -> EmuGraph:
        if not self.origin:
            raise CaptureError("end_capture: this stream did not begin the capture")
        graph = self.capture
        members = [s for s in _STREAMS if s.capture is graph]
        for s in members:
            s.capture, s.origin = None, False
        _CAPTURING.remove(self)
        unjoined = [s for s in members if not s.joined]
        for s in members:
            s.joined = True
        if unjoined:
            raise CaptureError("cudaErrorStreamCaptureUnjoined: a forked stream was not joined back before "
                               "end_capture")
        return graph

    def wait_event(self, event: "EmuEvent") -> None:
        if event.capture is not None and event.capture is not self.capture:
            if self.capture is not None:
                raise CaptureError("wait_event: an event recorded in another capture")
            self.capture, self.joined = event.capture, True  # the stream joins the capture: a fork
        if self.capture is None:
            self.vc = _join(self.vc, event.vc)
            return
        if event.capture is not self.capture:
            raise CaptureError("cudaErrorStreamCaptureIsolation: a capturing stream waits on an event recorded "
                               "outside the capture")
        self.capture.steps.append(("wait", self, event))
        side = event.stream
        if self.origin and side is not None and side is not self and event.queued == side.queued:
            side.joined = True  # everything the forked stream queued is before this point: a join

    def synchronize(self) -> None:
        if self.capture is not None:
            raise CaptureError("synchronize: the stream is capturing")
        Host.vc = _join(Host.vc, self.vc)


class EmuEvent:
    def __init__(self) -> None:
        self.capture: EmuGraph | None = None
        self.stream: EmuStream | None = None
        self.queued = 0
        self.vc: dict[int, int] = {}

    def record(self, stream: EmuStream) -> None:
        self.capture, self.stream, self.queued = stream.capture, stream, stream.queued
        if stream.capture is None:
            stream.vc = _join(stream.vc, Host.vc)
            self.vc = dict(stream.vc)
        else:
            stream.capture.steps.append(("record", stream, self))

    def synchronize(self) -> None:
        if self.capture is not None and any(s.capture is self.capture for s in _CAPTURING):
            raise CaptureError("event.synchronize: the event was recorded in a capture still in progress")
        Host.vc = _join(Host.vc, self.vc)


_STREAMS: "weakref.WeakSet[EmuStream]" = weakref.WeakSet()  # every stream made, while it lives
_CAPTURING: list[EmuStream] = []
NULL_STREAM = EmuStream()
_CURRENT: list[EmuStream] = [NULL_STREAM]


def new_stream() -> EmuStream:
    s = EmuStream()
    _STREAMS.add(s)
    return s


def device_synchronize() -> None:
    """cudaDeviceSynchronize: the host waits for every stream."""
    _not_capturing("a device synchronisation")
    for s in [NULL_STREAM, *_STREAMS]:
        Host.vc = _join(Host.vc, s.vc)


def current_stream() -> EmuStream:
    return _CURRENT[-1]


def _not_capturing(what: str) -> None:
    """Calls that conflict with any capture: synchronisation, copies from pageable host memory."""
    if _CAPTURING:
        raise CaptureError(f"{what} while a stream is capturing")


def _safe_while_capturing(what: str) -> None:
    """"Potentially unsafe" calls (allocations): refused unless every capture under way is relaxed, as
    CUDA refuses them in global and thread-local mode (one thread here: the two are alike)."""
    if any(s.mode != CAPTURE_RELAXED for s in _CAPTURING):
        raise CaptureError(f"cudaErrorStreamCaptureUnsupported: {what} while a stream captures in "
                           f"{'global' if any(s.mode == CAPTURE_GLOBAL for s in _CAPTURING) else 'thread-local'} mode")


class EmulatedModule:
    """Stands in for cupy.RawModule: get_function(name)(grid, block, args) queues the kernel on the
    current stream (``with stream:``), which runs it on the CPU now or records it in a capture."""

    def __init__(self, workdir: Path | None = None) -> None:
        self.lib, self.signatures = build(Path(workdir or tempfile.gettempdir()))
        self.launches: dict[str, int] = {}

    def get_function(self, name: str) -> Any:
        if name not in self.signatures:
            raise KeyError(f"no kernel named {name!r} in the CUDA source")
        fn, params = getattr(self.lib, f"emu_{name}"), self.signatures[name]

        def launch(grid: tuple, block: tuple, args: tuple) -> None:
            if len(args) != len(params):
                raise TypeError(f"{name} takes {len(params)} arguments ({[p for _, p in params]}), got {len(args)}")
            conv, reads, writes = [], [], []
            for (ctype, pname), a in zip(params, args):
                if ctype.endswith("*"):
                    if not isinstance(a, np.ndarray):
                        raise TypeError(f"{name}: {pname} must be an array, got {type(a).__name__}")
                    conv.append(a.ctypes.data)
                    (reads if ctype.startswith("const") else writes).append(a)  # a non-const pointer may write
                else:
                    if isinstance(a, np.ndarray):
                        raise TypeError(f"{name}: {pname} must be a scalar, got an array")
                    conv.append(a.item() if isinstance(a, np.generic) else a)  # by value, as a launch copies
            g, b = (1, 1) if name in ONE_BLOCK else (int(grid[0]), 1 if name in ONE_THREAD_BLOCKS else int(block[0]))

            def run() -> None:
                fn(g, b, *conv)
                self.launches[name] = self.launches.get(name, 0) + 1
            current_stream().enqueue(name, run, accesses(reads, writes))
        return launch


STORAGE = {CUDA_R_32F: (ctypes.c_float, np.float32), CUDA_R_16F: (ctypes.c_uint16, np.float16),
           CUDA_R_16BF: (ctypes.c_uint16, np.uint16)}
"""cudaDataType -> (ctypes element, NumPy storage dtype): bf16 as its uint16 bytes."""


def _colmajor(address: int, rows: int, cols: int, ld: int, dtype: int = CUDA_R_32F) -> np.ndarray:
    """The column-major (rows, cols) matrix with leading dimension ld at a host address, in its storage dtype."""
    if ld < max(1, rows):
        raise ValueError(f"cuBLAS would refuse ld={ld} for {rows} rows (CUBLAS_STATUS_INVALID_VALUE)")
    span = (cols - 1) * ld + rows
    elem, store = STORAGE[dtype]
    flat = np.ctypeslib.as_array(ctypes.cast(address, ctypes.POINTER(elem)), shape=(span,)).view(store)
    size = flat.itemsize
    return np.lib.stride_tricks.as_strided(flat, shape=(rows, cols), strides=(size, size * ld))


def _wide(x: np.ndarray, dtype: int) -> np.ndarray:
    """A 16-bit operand widened to float32 exactly (bf16: its bits shifted into the high half)."""
    if dtype == CUDA_R_16BF:
        return (x.astype(np.uint32) << 16).view(np.float32)
    return x.astype(np.float32)


def cublas_gemm_ex(ta: int, tb: int, m: int, n: int, k: int, pa: int, lda: int, pb: int, ldb: int, pc: int,
                   ldc: int, ab_type: int, c_type: int) -> None:
    """cublasGemmEx with CUBLAS_COMPUTE_32F (alpha 1, beta 0): the 16-bit operands widened, np.matmul's
    float32 sums (cuBLAS sums in another order: results within the float32 sum bound of a GPU's), a
    16-bit result rounded once to nearest even."""
    def read(p: int, rows: int, cols: int, ld: int, op: int) -> np.ndarray:
        x = _colmajor(p, rows, cols, ld, ab_type) if op == CUBLAS_OP_N else _colmajor(p, cols, rows, ld, ab_type).T
        return _wide(x, ab_type)
    sums = np.matmul(read(pa, m, k, lda, ta), read(pb, k, n, ldb, tb))
    out = _colmajor(pc, m, n, ldc, c_type)
    if c_type == CUDA_R_32F:
        out[...] = sums
    else:
        out[...] = round_to(sums, "bf16" if c_type == CUDA_R_16BF else "fp16").view(out.dtype)


def cublas_sgemm(ta: int, tb: int, m: int, n: int, k: int, pa: int, lda: int, pb: int, ldb: int, pc: int,
                 ldc: int) -> None:
    """cublasSgemm's column-major C = op(A) op(B) (alpha 1, beta 0) over host memory, read as
    cuBLAS reads its arguments: the stand-in checks the operand mapping, not only the product."""
    a = _colmajor(pa, m, k, lda) if ta == CUBLAS_OP_N else _colmajor(pa, k, m, lda).T
    b = _colmajor(pb, k, n, ldb) if tb == CUBLAS_OP_N else _colmajor(pb, n, k, ldb).T
    np.matmul(a, b, out=_colmajor(pc, m, n, ldc))


class NumpyGemm:
    """cuBLAS's stand-in: the backend's own cublasSgemm arguments (sgemm_args), carried out on
    the host by cublas_sgemm, queued on the given stream. Its workspace is an access of every GEMM
    (cuBLAS may use it), so two GEMMs sharing one on two streams at once are a race."""

    def __init__(self, workspace: np.ndarray | None = None) -> None:
        self.workspace = workspace
        self.streams: set[int] = set()  # the streams its GEMMs were queued on
        self.calls = NumpyGemm.CALLS  # products run, by kind ("sgemm", "gemm_ex"), over every stand-in

    CALLS: dict[str, int] = {}

    def bind(self, c: np.ndarray, a: np.ndarray, b: np.ndarray) -> Any:
        args = sgemm_args(c, a, b, lambda x: x.ctypes.data)
        types = gemm_types(c, a, b)
        keep = (a, b, c)  # the addresses stay valid while the launcher lives
        acc = accesses((a, b), (c,) + (() if self.workspace is None else (self.workspace,)))
        name = "sgemm" if types is None else "gemm_ex"
        self.calls[name] = self.calls.get(name, 0)

        def run() -> None:
            self.calls[name] += 1
            if types is None:
                cublas_sgemm(*args)
            else:
                cublas_gemm_ex(*args, *types)

        def launch(stream: EmuStream) -> None:
            self.streams.add(stream.ptr)
            stream.enqueue(name, lambda: (run(), keep), acc)
        return launch

    def close(self) -> None:
        pass


def numpy_memory_ops() -> MemoryOps:
    def memcpy(dst: np.ndarray, src: np.ndarray) -> Any:
        if dst.nbytes != src.nbytes:
            raise ValueError(f"memcpy of {src.nbytes} bytes into {dst.nbytes}")
        d, s = dst.reshape(-1).view(np.uint8), src.reshape(-1).view(np.uint8)
        return lambda stream: stream.enqueue("memcpy", lambda: np.copyto(d, s), accesses((s,), (d,)))

    def memset0(views: list[np.ndarray]) -> Any:
        def launch(stream: EmuStream) -> None:
            for v in views:
                stream.enqueue("memset", lambda v=v: v.fill(0), accesses((), (v,)))
        return launch

    def fill(views: list[np.ndarray], value: float) -> Any:
        def launch(stream: EmuStream) -> None:
            for v in views:
                stream.enqueue("fill", lambda v=v: v.fill(value), accesses((), (v,)))
        return launch

    def add(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> Any:
        return lambda stream: stream.enqueue("add", lambda: np.add(a, b, out=c), accesses((a, b), (c,)))
    return MemoryOps(memcpy, memcpy, memset0, fill, add)


def emulated_runtime(module: EmulatedModule, free_bytes: int = 1 << 34,
                     capture_mode: int = CAPTURE_THREAD_LOCAL) -> DeviceRuntime:
    """CuPy's stand-in for GpuExecutor: "device" arrays are NumPy arrays of their own. Each is a fresh
    device: the race detector forgets the accesses of earlier ones (whose freed arrays NumPy may hand
    out again at the same addresses, which would read as a race between two devices' streams)."""
    DETECTOR.records = []

    def alloc(n: int) -> np.ndarray:
        _safe_while_capturing("an allocation")
        return np.zeros(n, np.uint8)

    def asarray(x: np.ndarray) -> np.ndarray:
        _safe_while_capturing("an allocation")
        return np.array(x, copy=True)

    def same_array(dev: np.ndarray, host: np.ndarray, what: str) -> None:
        # CuPy's ndarray.set / get(out=) take host arrays of the same dtype and shape only
        if not isinstance(host, np.ndarray) or host.dtype != dev.dtype:
            got = getattr(host, "dtype", type(host))
            raise TypeError(f"{what}: a {got} host array with a {dev.dtype} device array")
        if host.shape != dev.shape:
            raise ValueError(f"{what}: shape mismatch, device {dev.shape}, host {host.shape}")

    def upload(dst: np.ndarray, src: np.ndarray, stream: EmuStream) -> None:
        _not_capturing("a copy from pageable host memory")
        same_array(dst, src, "set")
        stream.enqueue("upload", lambda: np.copyto(dst, src), accesses((), (dst,)))

    def download(src: np.ndarray, dst: np.ndarray, stream: EmuStream) -> None:
        _not_capturing("a copy to pageable host memory")
        same_array(src, dst, "get(out=)")
        if not dst.flags.c_contiguous:
            raise ValueError("get(out=): the host array must be C-contiguous")
        stream.enqueue("download", lambda: np.copyto(dst, src), accesses((src,), ()))
        stream.synchronize()  # as cupy_runtime's download

    def module_of(code: str, options: tuple) -> EmulatedModule:
        assert code == kernel_source(), "the executor compiles the package's CUDA source"
        return module

    def pinned(n: int) -> bytearray:
        _safe_while_capturing("a pinned allocation")
        return bytearray(n)

    return DeviceRuntime(zeros=alloc, asarray=asarray, ptr=lambda a: a.ctypes.data, upload=upload,
                         download=download, stream=new_stream, event=EmuEvent,
                         synchronize=device_synchronize,
                         free_bytes=lambda: free_bytes, pinned=pinned, module=module_of,
                         gemm=NumpyGemm, memory_ops=numpy_memory_ops, capture_mode=capture_mode,
                         declare=lambda stream, *what: stream.declare(*what))

"""The GPU executor: one CuPy arena, every atlas entry captured once as a CUDA graph.

Compile time, in order:
1. one device allocation of the plan's size (the arena); every DTensor is a view of it at
   the offset the MemoryPlan fixed, so offsets are the CPU backend's;
2. the data sets and their orders are copied to the device once;
3. each distinct atlas entry (graph, GraphId, ShapeId) is bound with the GPU kernel table,
   run once eagerly (warm-up: NVRTC compiles, cuBLAS picks kernels) and then captured on
   its StreamKind's stream, forked from the primary stream with an event and joined back
   before the capture ends;
4. the host arena is uploaded again, undoing what the warm-ups changed.

A step is then a handful of graph launches, each on its GraphId's stream (TRANS, COMP_1..3,
UPDATE), each stream waiting only for the events its byte conflicts require (gpu/deps.py,
gpu/streams.py): the next batch's transfer, the metrics and the EMA overlap the rest.
capture="step" captures the same fork/join structure into one graph per step program.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import numpy as np

from ..errors import DeviceError
from ..compiler.ids import GraphId, StreamKind
from ..kernels.cpu import BindEnv
from ..memory.dtensor import ALIGNMENT, DTensor, span_bytes, tensor_view
from ..memory.region import Region
from ..runtime.replay import Executor, Program, StepPrograms
from .cublas import WORKSPACE_BYTES
from .deps import StepGraph, capture_accesses, program_edges, step_graph
from .kernels import NVRTC_OPTIONS, GpuBindEnv, bind_launchers, kernel_source, unsupported_ops
from .runtime import DeviceRuntime, cupy_runtime
from .streams import ALL, StreamGemms, StreamOrder


DATA_MODES = ("auto", "device", "pinned")
CAPTURE_MODES = ("entry", "step")


def device_tensor(t: DTensor) -> DTensor:
    """The tensor as the device views it: bf16 as uint16, its bytes (CuPy has no bfloat16 arrays;
    the kernels read the format from the dtype, gpu/amp_kernels.py)."""
    return replace(t, dtype="uint16") if t.dtype == "bfloat16" else t


def check_supported(compiled: Any) -> None:
    """Raise DeviceError naming the plan's ops that have no GPU kernel."""
    ops = [n.op for g in (compiled.graphs.train, compiled.graphs.inference) for gid in g.ids() for n in g.nodes(gid)]
    missing = unsupported_ops(ops)
    if missing:
        raise DeviceError(f"device('cuda'): this model needs ops with no GPU kernel yet: {missing}. The GPU backend "
                          "runs the ops the compiler emits for MLPs and conv nets. Fix: use device('cpu') for this "
                          "model, or "
                          "device('auto'), which falls back to the CPU for it.")


def choose_data_mode(data: str, sources: dict[str, tuple[np.ndarray, np.ndarray]],
                     free_bytes: Callable[[], int]) -> str:
    """"device" keeps the data sets in GPU memory (one copy at compile, gathers on the device);
    "pinned" keeps them on the host and streams batches through page-locked staging. "auto"
    picks "device" when the data take under a quarter of the free GPU memory."""
    if data not in DATA_MODES:
        raise DeviceError(f"device: data={data!r} is invalid; expected one of {DATA_MODES}. Fix: pass "
                          "data='device' (data sets in GPU memory), 'pinned' (streamed from the host) or 'auto'.")
    if data != "auto":
        return data
    need = sum(x.size * 4 + y.size * 4 for x, y in sources.values())
    return "device" if need < free_bytes() // 4 else "pinned"


class GpuExecutor(StepPrograms):
    """Device arena, captured graphs, and the host hand-over (see StepPrograms).

    ``capture="entry"`` replays one CUDA graph per atlas entry (a step is a handful of graph
    launches and events, as the atlas reads); ``"step"`` captures each distinct step program
    once more as one graph of its own (a step is one launch: less host work and no gaps
    between graphs). ``runtime`` is CuPy's (gpu/runtime.py) unless a test passes its CPU stand-in.
    ``drop_edge`` is for tests only: (GraphId name, GraphId name), one dependency edge left out.
    """

    def __init__(self, compiled: Any, host: Executor, env: BindEnv, nan_policy: str = "raise",
                 data: str = "auto", runtime: DeviceRuntime | None = None, capture: str = "entry",
                 drop_edge: tuple[str, str] | None = None) -> None:
        check_supported(compiled)
        if capture not in CAPTURE_MODES:
            raise DeviceError(f"device: capture={capture!r} is invalid; expected one of {CAPTURE_MODES}. Fix: pass "
                              "capture='entry' (one graph per atlas entry) or 'step' (one graph per step).")
        super().__init__(compiled)
        self.capture = capture
        rt = self.rt = runtime or cupy_runtime()
        self.host = host
        plan = host.arena.plan
        self._raw = rt.zeros(plan.total_bytes + ALIGNMENT)
        shift = (-rt.ptr(self._raw)) % ALIGNMENT
        self.bytes = self._raw[shift: shift + plan.total_bytes]
        self._host_bytes = host.arena.bytes
        self._host_base = host.arena.bytes.ctypes.data
        self.views = {v: [tensor_view(self.bytes, device_tensor(t)) for t in p] for v, p in compiled.plans.items()}
        self.module = rt.module(kernel_source(), NVRTC_OPTIONS)
        self.primary = rt.stream()
        self.streams = {kind: rt.stream() for kind in StreamKind}
        self.gemm = StreamGemms(rt.gemm, rt.zeros, [s for k, s in self.streams.items() if k is not StreamKind.TRANS],
                                WORKSPACE_BYTES)
        self.data = choose_data_mode(data, env.sources, rt.free_bytes)
        if not any(n.op == "transfer" for g in (compiled.graphs.train, compiled.graphs.inference)
                   for gid in g.ids() for n in g.nodes(gid)):
            self.data = "pinned"  # image batches are gathered and augmented on the host, then copied up
        self.host_sources = {k: (np.ascontiguousarray(x.reshape(len(x), -1), np.float32),
                                 np.ascontiguousarray(y, np.int32)) for k, (x, y) in env.sources.items()}
        self.host_perms = env.perms  # the task shuffles these in place each epoch
        if self.data == "device":
            self.sources = {k: (rt.asarray(x), rt.asarray(y)) for k, (x, y) in self.host_sources.items()}
            self.perms = {k: rt.asarray(v) for k, v in env.perms.items()}
        else:
            self.sources, self.perms = {}, {}
        self._pinned: list[Any] = []
        self._scratch_bufs: list[Any] = []
        self._fork, self._join = rt.event(), rt.event()
        self._staged: dict[int, Any] = {}  # step mode: per transfer entry, "its staging was last read here"
        self.accesses = capture_accesses(compiled)
        self.drop_edge = drop_edge
        self.order = StreamOrder(self.accesses, [k.gid.name for k in self.atlas.captures], rt.event, drop_edge)
        base = rt.ptr(self.bytes)
        self._scope = (base, base + plan.total_bytes)
        self._declared = [tuple(tuple((base + a, base + b) for a, b in rs) for rs in (acc.reads, acc.writes))
                          for acc in self.accesses]
        self.program_graphs: dict[tuple, Any] = {}
        self.graphs: list[Any] = []
        self._bind(compiled, env, nan_policy)
        self._capture_all()

    # ---- binding and capture -----------------------------------------------------------------
    def _range_view(self, first: str, last: str, dtype: str) -> Any:
        a, b = self.host.arena.plan.region_range(Region[first], Region[last])
        return self.bytes[a:b].view(dtype)

    def _bind(self, compiled: Any, env: BindEnv, nan_policy: str) -> None:
        ops = self.rt.memory_ops()

        def make_env(batch: int) -> GpuBindEnv:
            return GpuBindEnv(self.module, self.gemm, ops, env.seed, self.sources, self.perms, self._range_view,
                              batch, nan_policy, self.data, self.host_sources, self.host_perms, self._host_twin,
                              self._pinned_array, self._scratch, env)
        self.names, self.launchers = bind_launchers(compiled, self.views, make_env)

    def _host_twin(self, view: Any) -> np.ndarray:
        """The host arena's view of the same bytes, shape and strides as a device view."""
        a = self.rt.ptr(view) - self.rt.ptr(self.bytes)
        raw = self._host_bytes[a: a + span_bytes(view)].view(view.dtype)
        return np.lib.stride_tricks.as_strided(raw, shape=view.shape, strides=view.strides)

    def _scratch(self, shape: tuple, dtype: Any) -> Any:
        """Device scratch of a kernel (partial sums), allocated at bind time, outside every capture."""
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        buf = self.rt.zeros(max(n, 1))
        self._scratch_bufs.append(buf)
        return buf[:n].view(dtype).reshape(shape)

    def _pinned_array(self, shape: tuple, dtype: Any) -> np.ndarray:
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        mem = self.rt.pinned(max(n, 1))
        self._pinned.append(mem)  # page-locked memory lives as long as the executor
        return np.frombuffer(mem, np.uint8, n).view(dtype).reshape(shape)

    def _stream_of(self, idx: int) -> Any:
        return self.streams[self.atlas.captures[idx].gid.stream]

    def _declare(self, idx: int, stream: Any) -> None:
        """Tell the runtime which entry the work queued next on ``stream`` is (the CPU stand-in checks it)."""
        reads, writes = self._declared[idx]
        self.rt.declare(stream, self.names[idx], self._scope, reads, writes)

    def _capture_all(self) -> None:
        """Warm up each bound graph, capture it, then restore the arena the warm-ups changed."""
        # The arena, scratch and data copies above ran on CuPy's current (legacy) stream, which the
        # non-blocking streams below do not wait for: finish them first.
        self.rt.synchronize()
        for idx, launchers in enumerate(self.launchers):
            if not launchers or any(getattr(f, "unavailable", False) for f in launchers):
                self.graphs.append(None)
                continue
            stream = self._stream_of(idx)
            self.upload_all()  # every warm-up starts from the initial state (cursors at 0)
            self.primary.synchronize()
            self._declare(idx, stream)
            for f in launchers:
                f(stream)
            stream.synchronize()
            self.graphs.append(self._capture(idx, stream))
        self.upload_all()
        self.primary.synchronize()

    def _capture(self, idx: int, stream: Any) -> Any:
        p = self.primary
        with p:
            p.begin_capture(self.rt.capture_mode)  # thread-local: allocations and syncs are refused
            try:
                self._fork.record(p)
                stream.wait_event(self._fork)
                self._declare(idx, stream)
                for f in self.launchers[idx]:
                    f(stream)
            except BaseException:
                self._abandon_capture([stream])
                raise
            self._join.record(stream)
            p.wait_event(self._join)
            return p.end_capture()

    def _abandon_capture(self, forked: list[Any]) -> None:
        """A launcher failed mid-capture: join the forked streams back and end the capture, ignoring
        what that says, so that the launcher's own error is the one raised (ending a capture with a
        stream still forked would report cudaErrorStreamCaptureUnjoined instead)."""
        p = self.primary
        for stream in forked:
            try:
                self._join.record(stream)
                p.wait_event(self._join)
            except Exception:  # noqa: BLE001 - the capture is being thrown away
                pass
        try:
            p.end_capture()
        except Exception:  # noqa: BLE001 - as above
            pass

    def debug_dot(self, idx: int) -> str:
        """The captured CUDA graph of atlas entry ``idx`` in DOT (CuPy >= 14)."""
        g = self.graphs[idx]
        return "" if g is None else g.debug_dot_str()

    def stream_graph(self, variant: str = "train_base") -> StepGraph:
        """A training step of ``variant`` as the device runs it, for the graph view: its entries (GraphId,
        stream, bytes read and written), the streams, and the event edges inside the step and from the
        step before (gpu/deps.py step_graph: the edges this executor orders by, drop_edge aside)."""
        gids = [variant] * 3
        return step_graph(self.compiled, self.train_step_gids(gids, 1), self.train_step_gids(gids, 0))

    # ---- step programs -------------------------------------------------------------------------
    def kernels(self, variant: str, gid: GraphId) -> Program:
        """One closure: wait for the conflicting launches on other streams, launch the entry's graph on
        its own stream, record its event (gpu/streams.py)."""
        idx = self.entry(variant, gid)
        if idx < 0 or not self.launchers[idx]:
            return []
        graph, stream, order = self.graphs[idx], self._stream_of(idx), self.order
        if graph is None:  # e.g. the val transfer of a task without val data: fail only if run
            missing = self.launchers[idx][0]
            return [lambda: missing(stream)]
        prepare = getattr(self.launchers[idx][0], "prepare", None)

        def launch() -> None:
            if prepare is not None:  # pinned staging: the copy out of it at this entry's last launch is done
                order.event(idx).synchronize()
                prepare()
            order.before(idx, stream)
            graph.launch(stream)
            order.after(idx, stream)
        return [launch]

    def _program(self, key: tuple, gids: list[tuple[str, GraphId]]) -> Program:
        """capture="step": the whole program as one graph (captured on first use); else per entry."""
        if self.capture == "entry" or key in self._programs:
            return super()._program(key, gids)
        idxs = [i for i in (self.entry(v, g) for v, g in gids) if i >= 0 and self.launchers[i]]
        if any(self.graphs[i] is None for i in idxs):  # an unavailable entry: fail as entry mode does
            return super()._program(key, gids)
        graph = self._capture_program(idxs)
        self.program_graphs[key] = graph
        p, order = self.primary, self.order
        staged = [(self._staged.setdefault(i, self.rt.event()), prep) for i in idxs
                  if (prep := getattr(self.launchers[i][0], "prepare", None)) is not None]

        def step() -> None:  # pinned staging: the graph that last copied out of it must be done
            for event, prepare in staged:
                event.synchronize()
                prepare()
            order.before(ALL, p)  # after any entry run on its own (batch-norm folding, inference)
            graph.launch(p)
            order.after(ALL, p)
            for event, _ in staged:
                event.record(p)
        self._programs[key] = [step]
        return self._programs[key]

    def _capture_program(self, idxs: list[int]) -> Any:
        """One graph: each entry on its stream after the entries its byte conflicts require (the
        program's edges, gpu/deps.py), forked from the primary stream and joined back at the end."""
        names = [self.atlas.captures[i].gid.name for i in idxs]
        preds: list[list[int]] = [[] for _ in idxs]
        for a, b in program_edges([self.accesses[i] for i in idxs]).within:
            if (names[a], names[b]) != self.drop_edge:
                preds[b].append(a)
        p, start = self.primary, self.rt.event()
        done = [self.rt.event() for _ in idxs]
        last: dict[int, tuple[Any, int]] = {}  # id(stream) -> (stream, its last entry so far)
        with p:
            p.begin_capture(self.rt.capture_mode)  # thread-local: allocations and syncs are refused
            try:
                start.record(p)
                for j, i in enumerate(idxs):
                    stream = self._stream_of(i)
                    if id(stream) not in last:
                        stream.wait_event(start)
                    for a in preds[j]:
                        if self._stream_of(idxs[a]) is not stream:
                            stream.wait_event(done[a])
                    last[id(stream)] = (stream, j)
                    self._declare(i, stream)
                    for f in self.launchers[i]:
                        f(stream)
                    done[j].record(stream)
                for stream, j in last.values():
                    p.wait_event(done[j])
            except BaseException:
                self._abandon_capture([s for s, _ in last.values()])
                raise
            return p.end_capture()

    def view(self, variant: str, name: str) -> Any:
        return self.views[variant][self.compiled.ids[name]]

    # ---- host hand-over ------------------------------------------------------------------------
    def _span(self, v: np.ndarray) -> tuple[int, int]:
        """The arena byte range of a host view (padded rows: their padding copied along, zeros)."""
        a = v.ctypes.data - self._host_base
        n = span_bytes(v)
        if not 0 <= a <= a + n <= self._host_bytes.nbytes:
            raise DeviceError("push/pull: the view is not part of the host arena. Fix: pass views from "
                              "task.executor.view(), not copies.")
        return a, a + n

    # Each runs on the primary stream after every stream's work, and every stream's next entry waits
    # for it (StreamOrder's ALL): the host writes or reads bytes that any entry may use.
    def upload_all(self) -> None:
        self._hand_over(lambda: self.rt.upload(self.bytes, self._host_bytes, self.primary))

    def download_all(self) -> None:
        self.rt.synchronize()
        self._hand_over(lambda: self.rt.download(self.bytes, self._host_bytes, self.primary))

    def push(self, *views: np.ndarray) -> None:
        def copy() -> None:
            for v in views:
                a, b = self._span(v)
                self.rt.upload(self.bytes[a:b], self._host_bytes[a:b], self.primary)
        self._hand_over(copy)

    def pull(self, *views: np.ndarray) -> None:
        def copy() -> None:
            for v in views:
                a, b = self._span(v)
                self.rt.download(self.bytes[a:b], self._host_bytes[a:b], self.primary)
        self._hand_over(copy)

    def _hand_over(self, copy: Callable[[], None]) -> None:
        self.order.before(ALL, self.primary)
        copy()
        self.order.after(ALL, self.primary)

    def set_perm(self, source: str, perm: np.ndarray) -> None:
        """data="device" keeps a device copy of each order; with "pinned" the host gathers with the
        host's order (updated in place by the task), so there is nothing to copy."""
        if source in self.perms:  # after the transfers that gathered with the old order
            self._hand_over(lambda: self.rt.upload(self.perms[source], perm, self.primary))

    def close(self) -> None:
        self.rt.synchronize()
        self.gemm.close()

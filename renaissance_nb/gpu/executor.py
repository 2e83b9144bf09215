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

A step is then a handful of graph launches. TRANSFER graphs go to the TRANS stream so the
next batch's gather overlaps the current step; the graphs that read an input buffer wait
for that buffer's transfer event first.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..errors import DeviceError
from ..compiler.ids import GraphId, StreamKind
from ..kernels.cpu import BindEnv
from ..memory.dtensor import ALIGNMENT, span_bytes, tensor_view
from ..memory.region import Region
from ..runtime.replay import Executor, Program, StepPrograms
from .cublas import WORKSPACE_BYTES
from .kernels import NVRTC_OPTIONS, GpuBindEnv, bind_launchers, kernel_source, unsupported_ops
from .runtime import DeviceRuntime, cupy_runtime


DATA_MODES = ("auto", "device", "pinned")
CAPTURE_MODES = ("entry", "step")


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
    """

    def __init__(self, compiled: Any, host: Executor, env: BindEnv, nan_policy: str = "raise",
                 data: str = "auto", runtime: DeviceRuntime | None = None, capture: str = "entry") -> None:
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
        self.views = {v: [tensor_view(self.bytes, t) for t in p] for v, p in compiled.plans.items()}
        self.module = rt.module(kernel_source(), NVRTC_OPTIONS)
        self.gemm = rt.gemm(rt.zeros(WORKSPACE_BYTES))
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
        self.primary = rt.stream()
        self.streams = {kind: rt.stream() for kind in StreamKind}
        self._fork, self._join = rt.event(), rt.event()
        self._ready = {b: rt.event() for b in "AB"}
        self._done = {b: rt.event() for b in "AB"}
        self._trans_join = rt.event()
        self._staged: dict[int, Any] = {}  # step mode: per transfer entry, "its staging was last read here"
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
            for f in launchers:
                f(stream)
            stream.synchronize()
            self.graphs.append(self._capture(launchers, stream))
        self.upload_all()
        self.primary.synchronize()

    def _capture(self, launchers: list[Any], stream: Any) -> Any:
        p = self.primary
        with p:
            p.begin_capture(self.rt.capture_mode)  # thread-local: allocations and syncs are refused
            try:
                self._fork.record(p)
                stream.wait_event(self._fork)
                for f in launchers:
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

    # ---- step programs -------------------------------------------------------------------------
    def kernels(self, variant: str, gid: GraphId) -> Program:
        idx = self.entry(variant, gid)
        if idx < 0 or not self.launchers[idx]:
            return []
        graph, p = self.graphs[idx], self.primary
        if graph is None:  # e.g. the val transfer of a task without val data: fail only if run
            missing = self.launchers[idx][0]
            return [lambda: missing(p)]
        name = gid.name
        if name in ("TRANSFER_A", "TRANSFER_B"):
            buf = name[-1]
            ready, done, trans = self._ready[buf], self._done[buf], self.streams[StreamKind.TRANS]
            prepare = getattr(self.launchers[idx][0], "prepare", None)

            def transfer() -> None:  # after everything queued so far (the last reader of buf), off the primary
                if prepare is not None:  # pinned staging: the copy out of it two steps ago must be done
                    done.synchronize()
                    prepare()
                ready.record(p)
                trans.wait_event(ready)
                graph.launch(trans)
                done.record(trans)
            return [transfer]
        if name.endswith(("_A", "_B")):
            done = self._done[name[-1]]

            def reads_buffer() -> None:
                p.wait_event(done)
                graph.launch(p)
            return [reads_buffer]
        return [lambda: graph.launch(p)]

    def _program(self, key: tuple, gids: list[tuple[str, GraphId]]) -> Program:
        """capture="step": the whole program as one graph (captured on first use); else per entry."""
        if self.capture == "entry" or key in self._programs:
            return super()._program(key, gids)
        idxs = [i for i in (self.entry(v, g) for v, g in gids) if i >= 0 and self.launchers[i]]
        if any(self.graphs[i] is None for i in idxs):  # an unavailable entry: fail as entry mode does
            return super()._program(key, gids)
        graph = self._capture_program(idxs)
        self.program_graphs[key] = graph
        p = self.primary
        staged = [(self._staged.setdefault(i, self.rt.event()), prep) for i in idxs
                  if (prep := getattr(self.launchers[i][0], "prepare", None)) is not None]
        if not staged:
            self._programs[key] = [lambda: graph.launch(p)]
            return self._programs[key]

        def step() -> None:  # pinned staging: the graph that last copied out of it must be done
            for event, prepare in staged:
                event.synchronize()
                prepare()
            graph.launch(p)
            for event, _ in staged:
                event.record(p)
        self._programs[key] = [step]
        return self._programs[key]

    def _capture_program(self, idxs: list[int]) -> Any:
        """One graph: each entry forked onto its stream and joined back in program order, except
        transfers, which run beside the rest on TRANS and are joined at the end (they fill the
        input buffer the next step reads; this step reads the other one)."""
        p, trans = self.primary, self.streams[StreamKind.TRANS]
        with p:
            p.begin_capture(self.rt.capture_mode)  # thread-local: allocations and syncs are refused
            forked: list[Any] = []
            try:
                for i in idxs:
                    stream = self._stream_of(i)
                    self._fork.record(p)
                    stream.wait_event(self._fork)
                    forked.append(stream)
                    for f in self.launchers[i]:
                        f(stream)
                    if stream is trans:
                        continue
                    self._join.record(stream)
                    p.wait_event(self._join)
                    forked.remove(stream)
                if trans in forked:
                    self._trans_join.record(trans)
                    p.wait_event(self._trans_join)
                    forked = [s for s in forked if s is not trans]
            except BaseException:
                self._abandon_capture(forked)
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

    def upload_all(self) -> None:
        self.rt.upload(self.bytes, self._host_bytes, self.primary)

    def download_all(self) -> None:
        self.rt.synchronize()
        self.rt.download(self.bytes, self._host_bytes, self.primary)

    def push(self, *views: np.ndarray) -> None:
        for v in views:
            a, b = self._span(v)
            self.rt.upload(self.bytes[a:b], self._host_bytes[a:b], self.primary)

    def pull(self, *views: np.ndarray) -> None:
        for v in views:
            a, b = self._span(v)
            self.rt.download(self.bytes[a:b], self._host_bytes[a:b], self.primary)

    def set_perm(self, source: str, perm: np.ndarray) -> None:
        """data="device" keeps a device copy of each order; with "pinned" the host gathers with the
        host's order (updated in place by the task), so there is nothing to copy."""
        if source in self.perms:
            self.rt.upload(self.perms[source], perm, self.primary)

    def close(self) -> None:
        self.rt.synchronize()
        self.gemm.close()

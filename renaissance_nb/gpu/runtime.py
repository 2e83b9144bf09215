"""What the GPU executor asks of CUDA, in one place.

The executor (executor.py) never names CuPy: it allocates, copies, makes streams and
events, captures and launches graphs through a :class:`DeviceRuntime`. On a GPU that is
:func:`cupy_runtime`. The test suite passes a CPU stand-in with the same semantics for the
parts a CPU can check (tests/cuda_emulator.py: work queued on a capturing stream is
recorded, not run; a graph launch replays it), so the executor's own logic (capture
linking, warm-up restore, transfers, the host hand-over) runs in CI, not only on a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .kernels import MemoryOps


@dataclass(frozen=True)
class DeviceRuntime:
    """Device operations, each a plain function (see cupy_runtime for their meaning)."""

    zeros: Callable[[int], Any]                      # device bytes, zeroed
    asarray: Callable[[np.ndarray], Any]             # a device copy of a host array
    ptr: Callable[[Any], int]                        # device address of an array's first element
    upload: Callable[[Any, np.ndarray, Any], None]   # device array <- host array, on a stream
    download: Callable[[Any, np.ndarray, Any], None]  # host array <- device array, on a stream
    stream: Callable[[], Any]    # a new non-blocking stream: begin/end_capture, wait_event, synchronize
    event: Callable[[], Any]     # a new event: record(stream), synchronize()
    synchronize: Callable[[], None]                  # wait for all work on the device
    free_bytes: Callable[[], int]
    pinned: Callable[[int], Any]                     # page-locked host buffer of n bytes
    module: Callable[[str, tuple], Any]              # compiled kernels: get_function(name)(grid, block, args)
    gemm: Callable[[Any], Any]                       # workspace -> an object with bind(c, a, b)
    memory_ops: Callable[[], MemoryOps]
    capture_mode: int = 1  # cudaStreamCaptureModeThreadLocal: see CAPTURE_MODE
    # (stream, entry name, arena (start, end), reads, writes): the arena byte ranges the work queued next
    # on the stream belongs to, as absolute addresses. Nothing on CUDA; the CPU stand-in checks every
    # access against them and orders the accesses of different streams (a race detector).
    declare: Callable[..., None] = lambda stream, name, scope, reads, writes: None


CAPTURE_MODE = 1
"""cudaStreamCaptureModeThreadLocal, the mode every capture begins in (the original's): while this thread
captures, CUDA refuses the "potentially unsafe" calls (cudaMalloc from a pool that grows, a synchronising
copy), so a launcher that would allocate or sync cannot leave a pointer in the graph that the pool later
reuses. CuPy's default is relaxed (0 = global, 1 = thread-local, 2 = relaxed), which lets them through."""


def cupy_runtime() -> DeviceRuntime:
    """The real one: CuPy arrays, streams, events and graphs; cuBLAS through cublas.Gemm."""
    import cupy

    from .cublas import Gemm
    from .kernels import cupy_memory_ops

    def upload(dst: Any, src: np.ndarray, stream: Any) -> None:
        dst.set(src, stream=stream)

    def download(src: Any, dst: np.ndarray, stream: Any) -> None:
        src.get(stream=stream, out=dst)
        stream.synchronize()  # CuPy 12's get(stream=...) returns before the copy lands; 13's waits

    return DeviceRuntime(
        zeros=lambda n: cupy.zeros(n, cupy.uint8),
        asarray=cupy.asarray,
        ptr=lambda a: a.data.ptr,
        upload=upload,
        download=download,
        stream=lambda: cupy.cuda.Stream(non_blocking=True),
        event=lambda: cupy.cuda.Event(disable_timing=True),
        synchronize=lambda: cupy.cuda.Device().synchronize(),
        free_bytes=lambda: cupy.cuda.runtime.memGetInfo()[0],
        pinned=cupy.cuda.alloc_pinned_memory,
        module=lambda code, options: cupy.RawModule(code=code, options=options),
        gemm=Gemm,
        memory_ops=cupy_memory_ops,
        capture_mode=cupy.cuda.runtime.streamCaptureModeThreadLocal,
    )

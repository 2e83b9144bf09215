"""What every GPU kernel module shares: the bind environment, the launch helpers and a registrar.

A GPU kernel module (kernels.py, image_kernels.py) fills a table of its own; kernels.py joins
them into ``GPU_KERNELS``. Nothing here imports a kernel module.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

Launch = Callable[[Any], None]
THREADS = 256
MAX_BLOCKS = 8192


@dataclass
class GpuBindEnv:
    """What GPU kernels need besides their views: the compiled module, cuBLAS, data on the device,
    and the four memory operations that are not kernels of ours (copy, zero, fill, add).

    ``module.get_function(name)`` gives a callable ``fn(grid, block, args)`` that launches on the
    current stream; ``gemm.bind(c, a, b)`` gives a launcher of ``c = a @ b``. The test suite binds
    this same table against a CPU build of the CUDA source (tests/cuda_emulator.py), so what
    runs here is checked argument by argument without a GPU.
    """

    module: Any
    gemm: Any
    ops: "MemoryOps"
    seed: int = 0
    sources: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    perms: dict[str, Any] = field(default_factory=dict)
    range_view: Callable[[str, str, str], Any] | None = None
    batch: int = 0
    nan_policy: str = "raise"
    # data="pinned": the data sets stay on the host; each transfer is a host gather into pinned
    # staging (before the graph launch) and an async copy inside the graph
    data: str = "device"
    host_sources: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    host_perms: dict[str, np.ndarray] = field(default_factory=dict)
    host_twin: Callable[[Any], np.ndarray] | None = None   # device view -> host-arena view, same bytes
    pinned: Callable[[tuple, Any], np.ndarray] | None = None  # page-locked host array
    scratch: Callable[[tuple, Any], Any] | None = None       # bind-time device scratch (partial sums)
    cpu_env: Any = None  # the CPU backend's BindEnv: image batches are gathered on the host with its kernel


@dataclass(frozen=True)
class MemoryOps:
    """Launcher factories for plain memory work on the arena."""

    memcpy: Callable[[Any, Any], Launch]          # dst, src: same number of bytes, contiguous
    h2d: Callable[[Any, np.ndarray], Launch]      # device view <- pinned host array, same bytes
    memset0: Callable[[Sequence[Any]], Launch]    # zero these views
    fill: Callable[[Sequence[Any], float], Launch]
    add: Callable[[Any, Any, Any], Launch]        # c = a + b with broadcasting


def grid_size(n: int) -> tuple[int]:
    """Blocks of THREADS for a grid-stride loop over n items (at most MAX_BLOCKS)."""
    return (max(1, min(MAX_BLOCKS, -(-int(n) // THREADS))),)


def launch_grid(env: GpuBindEnv, name: str, n: int, *args: Any) -> Launch:
    """A grid-stride kernel over n items, with its arguments fixed now."""
    fn, grid, block = env.module.get_function(name), grid_size(n), (THREADS,)

    def launch(stream: Any) -> None:
        with stream:
            fn(grid, block, args)
    return launch


def launch_single(env: GpuBindEnv, name: str, *args: Any) -> Launch:
    """A one-thread kernel (counters, tallies), with its arguments fixed now."""
    fn = env.module.get_function(name)

    def launch(stream: Any) -> None:
        with stream:
            fn((1,), (1,), args)
    return launch


def sequence(*launches: Launch) -> Launch:
    """One launcher that enqueues these in order."""
    def launch(stream: Any) -> None:
        for f in launches:
            f(stream)
    return launch

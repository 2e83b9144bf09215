"""Planned against measured: the process's resident memory during a run, and a GPU's, beside the plan.

Why: the plan says what the arena and the data take; the operating system says what the process
holds. ``ResidentMemory`` is a run() callback that reads /proc/self/statm (resident pages) at the
start, every ``every`` steps and at each epoch's end, and keeps the arena's and the data's bytes
beside the samples, so one chart draws both (``rows()``). The difference is what the plan does
not own: the interpreter, NumPy, numba's compiled code, OpenBLAS/MKL buffers, the widgets.

On a GPU task the same samples also read the device (``device_memory``): CuPy's default pool
(``used_bytes``: bytes in live device arrays; ``total_bytes``: what the pool holds from CUDA,
cached free blocks included) and ``cudaMemGetInfo`` (the whole device: every process, the CUDA
context), beside the planned device arena and the data the plan keeps on the device. Without
CuPy or a device these readings are None and nothing else changes.
"""
from __future__ import annotations

import importlib
import os
import resource
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, bad_argument
from ..text import human_bytes

if TYPE_CHECKING:
    from ..runtime.runner import Runner

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int:
    """This process's resident memory now (Linux: /proc/self/statm; elsewhere the peak so far)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def cupy_with_device() -> Any | None:
    """CuPy, when it imports and sees a CUDA device; None otherwise (no CuPy, no driver, no GPU)."""
    try:
        cupy = importlib.import_module("cupy")  # optional: imported by name, so nothing needs its stubs
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
    except Exception:  # noqa: BLE001 - ImportError, or CUDARuntimeError where there is no driver
        return None
    return cupy


@dataclass(frozen=True)
class DeviceMemory:
    """One reading of a GPU's memory beside the plan, in bytes."""

    arena: int
    """The plan's arena: the device arena is one allocation of this size (plus alignment slack)."""
    data: int
    """The training and validation data the plan keeps on the device (data='device'), else 0."""
    pool_used: int
    """CuPy's default pool: bytes in live device arrays (the arena, the data, workspaces, scratch)."""
    pool_total: int
    """Bytes the pool holds from CUDA: used plus cached free blocks."""
    device_free: int
    device_total: int

    @property
    def planned(self) -> int:
        return self.arena + self.data

    @property
    def beyond_plan(self) -> int:
        """Pool bytes the plan does not name: cuBLAS workspaces, kernels' partial sums, alignment."""
        return self.pool_used - self.planned

    @property
    def device_used(self) -> int:
        """cudaMemGetInfo's total minus free: every allocation on the device, the CUDA context and
        other processes included."""
        return self.device_total - self.device_free

    def row(self) -> dict[str, int]:
        return {"device_arena": self.arena, "device_data": self.data, "pool_used": self.pool_used,
                "pool_total": self.pool_total, "device_used": self.device_used, "device_total": self.device_total}

    def summary(self) -> str:
        share = f" ({self.planned / self.pool_used:.1%} of it planned)" if self.pool_used else ""
        return (f"GPU: CuPy's pool holds {human_bytes(self.pool_used)} in live arrays{share}, "
                f"{human_bytes(self.pool_total)} from CUDA; planned: arena {human_bytes(self.arena)} + data "
                f"{human_bytes(self.data)}, {human_bytes(self.beyond_plan)} beyond the plan (workspaces, scratch); "
                f"the device has {human_bytes(self.device_used)} of {human_bytes(self.device_total)} in use")


def device_memory(arena_bytes: int, data_bytes: int = 0, cupy: Any = None) -> DeviceMemory | None:
    """A reading of the device now, beside the planned bytes. ``cupy``: the CuPy module (or an object
    with its ``get_default_memory_pool()`` and ``cuda.runtime.memGetInfo()``); None: CuPy itself, when
    it sees a device. Returns None without one."""
    cp = cupy if cupy is not None else cupy_with_device()
    if cp is None:
        return None
    pool = cp.get_default_memory_pool()
    free, total = cp.cuda.runtime.memGetInfo()
    return DeviceMemory(int(arena_bytes), int(data_bytes), int(pool.used_bytes()), int(pool.total_bytes()),
                        int(free), int(total))


def device_data_bytes(gpu: Any) -> int:
    """Bytes of data a GPU executor copied to the device (samples, labels and sample orders), 0 when
    it streams batches from the host (data='pinned')."""
    if gpu is None or gpu.data != "device":
        return 0
    return (sum(x.nbytes + y.nbytes for x, y in gpu.host_sources.values())
            + sum(p.nbytes for p in gpu.host_perms.values()))


def device_memory_of(runner: "Runner | None", arena_bytes: int, cupy: Any = None) -> DeviceMemory | None:
    """The device reading of a compiled GPU task; None for a CPU task (or before compile)."""
    gpu = None if runner is None else runner.gpu
    if gpu is None:
        return None
    return device_memory(arena_bytes, device_data_bytes(gpu), cupy)


@dataclass
class ResidentMemory:
    """A run() callback sampling resident memory; ``every``: also at the step boundaries run() calls
    callbacks at (every 16 steps and an epoch's last) whose step count it divides (None: epochs only).
    On a GPU task each sample also reads the device (see ``device_memory``; ``cupy`` as there)."""

    every: int | None = None
    samples: list[dict[str, int]] = field(default_factory=list)
    arena_bytes: int = 0
    data_bytes: int = 0
    cupy: Any = field(default=None, repr=False)
    device_data_bytes: int = 0
    reads_device: bool = False

    def __post_init__(self) -> None:
        if self.every is not None and (isinstance(self.every, bool) or not isinstance(self.every, int)
                                       or self.every < 1):
            raise bad_argument(ConfigError, "ResidentMemory", "every", self.every, "an int >= 1 or None",
                               "pass every=50 to sample every 50 steps, or None for epoch ends only")

    def __call__(self, kind: str, info: dict[str, Any]) -> None:
        if kind == "start":
            task = info.get("task")
            runner = getattr(task, "runner", None)
            if runner is not None:
                self.arena_bytes = runner.arena.nbytes
                data = runner.config.data
                self.data_bytes = sum(a.nbytes for s in (data.train, data.val) if s is not None for a in (s.x, s.y))
                if runner.gpu is not None:
                    self.cupy = self.cupy if self.cupy is not None else cupy_with_device()
                    self.reads_device = self.cupy is not None
                    self.device_data_bytes = device_data_bytes(runner.gpu)
            self._sample(info.get("epoch", 0), -1)
        elif kind == "step" and self.every and info["step"] % self.every == 0:
            self._sample(info["epoch"], info["step"])
        elif kind == "epoch":
            self._sample(int(getattr(info, "epoch", 0)), -1)  # an EpochRecord

    def _sample(self, epoch: int, step: int) -> None:
        sample = {"epoch": int(epoch), "step": int(step), "resident": resident_bytes()}
        reading = device_memory(self.arena_bytes, self.device_data_bytes, self.cupy) if self.reads_device else None
        self.samples.append({**sample, **(reading.row() if reading else {})})

    def rows(self) -> list[dict[str, int]]:
        """One row per sample: resident bytes, the planned arena and data, and what neither holds."""
        planned = self.arena_bytes + self.data_bytes
        return [{**s, "arena": self.arena_bytes, "data": self.data_bytes, "other": s["resident"] - planned}
                for s in self.samples]

    def summary(self) -> str:
        if not self.samples:
            return "ResidentMemory: no samples (pass it to run(callbacks=[...]))"
        peak = max(s["resident"] for s in self.samples)
        growth = self.samples[-1]["resident"] - self.samples[0]["resident"]
        text = (f"resident {human_bytes(peak)} at most over {len(self.samples)} samples (grew "
                f"{human_bytes(max(growth, 0))} from the start); planned: arena {human_bytes(self.arena_bytes)}"
                f" + data {human_bytes(self.data_bytes)}")
        if self.reads_device:
            pool = max(s["pool_used"] for s in self.samples)
            text += (f"; GPU: CuPy's pool {human_bytes(pool)} at most in live arrays against a planned device arena "
                     f"{human_bytes(self.arena_bytes)} + data {human_bytes(self.device_data_bytes)}")
        return text

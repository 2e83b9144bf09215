"""Device selection: is there a CUDA GPU that CuPy can drive, and which device does a task get."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from ..errors import DeviceError, bad_argument

CHOICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class DeviceInfo:
    """What the GPU backend runs on (printed by benchmarks and kept with their results)."""

    name: str
    compute_capability: str
    memory_gib: float
    cupy: str
    cuda_runtime: int
    driver: int

    def __str__(self) -> str:
        return (f"{self.name} (sm_{self.compute_capability}, {self.memory_gib:.0f} GiB), CuPy {self.cupy}, "
                f"CUDA runtime {self.cuda_runtime}, driver {self.driver}")


@functools.lru_cache(maxsize=1)
def probe() -> tuple[DeviceInfo | None, str]:
    """(info, "") when a GPU is usable, else (None, the reason). Cached: the answer cannot change."""
    try:
        import cupy
    except ImportError:
        return None, "CuPy is not installed (pip install 'renaissance_nb[gpu]')"
    except Exception as exc:  # a broken CUDA install can fail at import
        return None, f"CuPy failed to import: {exc}"
    try:
        rt = cupy.cuda.runtime
        if rt.getDeviceCount() < 1:
            return None, "CuPy found no CUDA device"
        props = rt.getDeviceProperties(0)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        return DeviceInfo(name, f"{props['major']}{props['minor']}", props["totalGlobalMem"] / 2**30,
                          cupy.__version__, rt.runtimeGetVersion(), rt.driverGetVersion()), ""
    except Exception as exc:  # CUDARuntimeError: no driver, driver too old, no device
        return None, f"CuPy cannot use a CUDA device here: {exc}"


def resolve_device(choice: Any) -> str:
    """"auto" -> "cuda" when :func:`probe` finds a GPU, else "cpu"; "cuda" without one is an error."""
    if choice not in CHOICES:
        raise bad_argument(DeviceError, "device", "device", choice, f"one of {CHOICES}",
                           "pass 'auto' (GPU when CuPy finds one), 'cuda' or 'cpu'")
    if choice == "cpu":
        return "cpu"
    info, reason = probe()
    if info is not None:
        return "cuda"
    if choice == "auto":
        return "cpu"
    raise DeviceError(f"device('cuda'): {reason}. Fix: install CuPy for your CUDA version on a machine with an "
                      "NVIDIA GPU, or use device('cpu') / device('auto').")

"""The CUDA backend: the same compiled plan, replayed as captured CUDA graphs (CuPy).

Only the executor and the kernels differ from the CPU backend: the BluePrint, the compiler
stages, the MemoryPlan offsets and the GraphAtlas are shared. Nothing here imports CuPy at
module import time, so the package imports on machines without CUDA; :func:`probe` says
whether a GPU can be used, and why not.
"""
from .device import DeviceInfo, probe, resolve_device

__all__ = ["DeviceInfo", "probe", "resolve_device"]

"""Run the GPU backend's CUDA kernels on the CPU: a test harness, not a backend.

The CUDA source (renaissance_nb/gpu/src) is compiled by g++ with a small shim that turns
``__global__`` functions into plain functions and emulates a launch by calling the kernel
once per (block, thread), in order. That is exact for every kernel that does not talk
between threads; the one-block reduction of rnb_softmax_xent is built with a block of one
thread (RNB_THREADS=1), so its rows are summed in order. Wrappers and ctypes signatures
are generated from the kernels' own parameter lists, so a call from the GPU kernel table
with a wrong argument count fails here as it would on a GPU.

:class:`EmulatedExecutor` binds the GPU kernel table (renaissance_nb/gpu/kernels.py) over a
second NumPy arena, with NumPy stand-ins for cuBLAS and the memory operations, and
implements the host hand-over, so ``DeepLearningTask.run()`` drives it exactly as it
drives the CUDA executor: only capture, streams and events are left out.
"""
from __future__ import annotations

import ctypes
import hashlib
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from renaissance_nb.gpu.cublas import check_gemm, gemm_layout
from renaissance_nb.gpu.kernels import GpuBindEnv, MemoryOps, bind_launchers, kernel_source
from renaissance_nb.memory.region import Region
from renaissance_nb.runtime.replay import StepPrograms

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


def build(workdir: Path) -> tuple[ctypes.CDLL, dict[str, list[tuple[str, str]]]]:
    """Compile the CPU harness (cached by the source's hash) and load it."""
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
    text = SHIM + source + "\n" + "\n".join(wrappers) + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    lib_path = workdir / f"rnb_emulator_{digest}.so"
    if not lib_path.exists():
        src = workdir / f"rnb_emulator_{digest}.cpp"
        src.write_text(text)
        tmp = workdir / f"rnb_emulator_{digest}.{np.random.randint(1 << 30)}.so"
        subprocess.run([gxx, "-O1", "-std=c++17", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC",
                        "-o", str(tmp), str(src)], check=True, capture_output=True, text=True)
        tmp.replace(lib_path)
    lib = ctypes.CDLL(str(lib_path))
    for name, params in sigs.items():
        fn = getattr(lib, f"emu_{name}")
        fn.argtypes = [ctypes.c_uint, ctypes.c_uint] + [_ctype(t) for t, _ in params]
        fn.restype = None
    return lib, sigs


class EmulatedModule:
    """Stands in for cupy.RawModule: get_function(name)(grid, block, args) runs on the CPU."""

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
            conv = []
            for (ctype, pname), a in zip(params, args):
                if ctype.endswith("*"):
                    if not isinstance(a, np.ndarray):
                        raise TypeError(f"{name}: {pname} must be an array, got {type(a).__name__}")
                    conv.append(a.ctypes.data)
                else:
                    if isinstance(a, np.ndarray):
                        raise TypeError(f"{name}: {pname} must be a scalar, got an array")
                    conv.append(a.item() if isinstance(a, np.generic) else a)
            g, b = (1, 1) if name in ONE_BLOCK else (int(grid[0]), int(block[0]))
            fn(g, b, *conv)
            self.launches[name] = self.launches.get(name, 0) + 1
        return launch


class NumpyGemm:
    """cuBLAS's stand-in: the same operand checks, NumPy's product."""

    def bind(self, c: np.ndarray, a: np.ndarray, b: np.ndarray) -> Any:
        check_gemm(c, a, b)
        gemm_layout(a)
        gemm_layout(b)
        mm = np.matmul
        return lambda stream: mm(a, b, out=c)


def numpy_memory_ops() -> MemoryOps:
    def memcpy(dst: np.ndarray, src: np.ndarray) -> Any:
        d, s = dst.reshape(-1).view(np.uint8), src.reshape(-1).view(np.uint8)
        return lambda stream: np.copyto(d, s)

    def memset0(views: list[np.ndarray]) -> Any:
        def launch(stream: Any) -> None:
            for v in views:
                v.fill(0)
        return launch

    def fill(views: list[np.ndarray], value: float) -> Any:
        def launch(stream: Any) -> None:
            for v in views:
                v.fill(value)
        return launch

    def add(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> Any:
        return lambda stream: np.add(a, b, out=c)
    return MemoryOps(memcpy, memcpy, memset0, fill, add)


class _NoStream:
    ptr = 0

    def __enter__(self) -> "_NoStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class EmulatedExecutor(StepPrograms):
    """The GPU kernel table over a second (NumPy) arena, with the GPU executor's hand-over."""

    def __init__(self, task: Any, module: EmulatedModule, data: str = "device") -> None:
        compiled, host = task.compiled, task.executor
        super().__init__(compiled)
        self.host = host
        self._host_bytes = host.arena.bytes
        self._host_base = self._host_bytes.ctypes.data
        self.bytes = np.zeros_like(self._host_bytes)
        plan = host.arena.plan
        self.views = {v: [self.bytes[t.offset: t.offset + t.nbytes].view(t.dtype).reshape(t.shape) for t in p]
                      for v, p in compiled.plans.items()}
        env = task._env
        sources = {k: (np.ascontiguousarray(x.reshape(len(x), -1), np.float32), np.ascontiguousarray(y, np.int32))
                   for k, (x, y) in env.sources.items()}
        self.perms = {k: v.copy() for k, v in env.perms.items()}
        self.data = data

        def host_twin(view: np.ndarray) -> np.ndarray:
            a = view.ctypes.data - self.bytes.ctypes.data
            return self._host_bytes[a: a + view.nbytes].view(view.dtype).reshape(view.shape)

        def range_view(first: str, last: str, dtype: str) -> np.ndarray:
            a, b = plan.region_range(Region[first], Region[last])
            return self.bytes[a:b].view(dtype)

        ops, gemm = numpy_memory_ops(), NumpyGemm()

        def make_env(batch: int) -> GpuBindEnv:
            return GpuBindEnv(module, gemm, ops, env.seed, sources, self.perms, range_view, batch, task._nan_policy,
                              data, sources, env.perms, host_twin, lambda shape, dtype: np.zeros(shape, dtype))
        self.names, self.launchers = bind_launchers(compiled, self.views, make_env)
        self.stream = _NoStream()

    def kernels(self, variant: str, gid: Any) -> list:
        idx = self.entry(variant, gid)
        if idx < 0 or not self.launchers[idx]:
            return []
        launchers, stream = self.launchers[idx], self.stream
        prepare = getattr(launchers[0], "prepare", None)  # pinned staging: the host's gather first

        def run() -> None:
            if prepare is not None:
                prepare()
            for f in launchers:
                f(stream)
        return [run]

    def _span(self, v: np.ndarray) -> slice:
        a = v.ctypes.data - self._host_base
        assert 0 <= a <= a + v.nbytes <= self._host_bytes.nbytes, "not a view of the host arena"
        return slice(a, a + v.nbytes)

    def upload_all(self) -> None:
        self.bytes[...] = self._host_bytes

    def download_all(self) -> None:
        self._host_bytes[...] = self.bytes

    def push(self, *views: np.ndarray) -> None:
        for v in views:
            s = self._span(v)
            self.bytes[s] = self._host_bytes[s]

    def pull(self, *views: np.ndarray) -> None:
        for v in views:
            s = self._span(v)
            self._host_bytes[s] = self.bytes[s]

    def set_perm(self, source: str, perm: np.ndarray) -> None:
        self.perms[source][...] = perm

"""Capture-safe matrix products: cuBLAS called on our own handle, with a preset workspace.

Why this path: CuPy's matmul refuses to run while a stream is capturing (cuBLAS may
allocate its workspace lazily, and allocation is illegal inside a capture; cupy issue
6290). cuBLAS itself supports capture once a workspace is set with cublasSetWorkspace, so
this module loads the libcublas that CuPy already mapped, creates a handle, gives it a
fixed workspace that lives as long as the arena, and calls cublasSgemm_v2 with host
scalars (captured by value). Of the candidates (cuTENSOR contraction, nvmath-python, a
tiled RawKernel), this one needs no new dependency and runs NVIDIA's tuned SGEMM kernels;
FP32 math (no TF32) keeps results within float32 rounding of the CPU backend.
benchmarks/gpu_device_check.py times it, captured, against CuPy's eager matmul at the
MLP's shapes; it has not run on a GPU yet (no device was lent to this project so far).
"""
from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any, Callable

from ..errors import DeviceError

CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF = 0, 2, 14
CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT = 68, -1
LOWP_TYPES = {"float16": CUDA_R_16F, "bfloat16": CUDA_R_16BF, "uint16": CUDA_R_16BF}
"""cudaDataType of a 16-bit operand by its dtype's name: the device views bf16 as uint16 (its bytes)."""
CUBLAS_DEFAULT_MATH = 0  # SGEMM in FP32 (TF32 only if the user sets NVIDIA_TF32_OVERRIDE=1)
WORKSPACE_BYTES = 32 << 20  # NVIDIA's recommendation for Hopper is 32 MiB


def _find_libcublas() -> ctypes.CDLL:
    """The libcublas CuPy loaded (same handle types), else the one the loader finds."""
    try:  # CuPy's own handle: this maps the libcublas CuPy uses into the process
        import cupy
        cupy.cuda.device.get_cublas_handle()
    except Exception:
        pass
    paths = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                part = line.split()[-1]
                if "libcublas.so" in part and "libcublasLt" not in part and part not in paths:
                    paths.append(part)
    except OSError:
        pass
    try:  # the NVIDIA wheels' loader (cuda-pathfinder), which CuPy 14 also uses
        from cuda.pathfinder import load_nvidia_dynamic_lib
        paths.append(load_nvidia_dynamic_lib("cublas").abs_path)
    except Exception:
        pass
    found = ctypes.util.find_library("cublas")
    for name in (*paths, found, "libcublas.so.13", "libcublas.so.12", "libcublas.so"):
        if not name:
            continue
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise DeviceError("cuBLAS: libcublas could not be loaded. Fix: install the CUDA toolkit's cuBLAS or "
                      "the nvidia-cublas wheel that matches your CuPy.")


def _row_major_ld(x: Any) -> int | None:
    """The leading dimension of a 2-D view whose rows are contiguous (possibly padded), else None."""
    item = x.itemsize
    r, c = x.shape
    s0, s1 = x.strides
    if (s1 == item or c == 1) and (r == 1 or (s0 % item == 0 and s0 // item >= c)):
        return s0 // item if r > 1 else max(1, c)
    return None


def gemm_layout(x: Any) -> tuple[int, int]:
    """(cuBLAS op, leading dimension) of a 2-D row-major matrix (op N) or a transposed view of one
    (op T); its rows may be padded (a leading dimension longer than the row)."""
    if x.ndim != 2:
        raise DeviceError(f"cuBLAS: a matrix product got a {x.ndim}-D operand of shape {x.shape}; "
                          "the GPU backend multiplies 2-D arena views only.")
    ld = _row_major_ld(x)
    if ld is not None:
        return CUBLAS_OP_N, ld
    ld = _row_major_ld(x.T)
    if ld is not None:
        return CUBLAS_OP_T, ld
    raise DeviceError(f"cuBLAS: operand of shape {x.shape} with strides {x.strides} is neither row-major nor "
                      "a transposed row-major view. Fix: multiply arena views (tensor_view) or their .T, not "
                      "other slices.")


def check_gemm(c: Any, a: Any, b: Any) -> None:
    """c = a @ b must be (m, k) @ (k, n) into a row-major (m, n), its rows possibly padded."""
    m, k = a.shape
    k2, n = b.shape
    if k2 != k or c.shape != (m, n) or _row_major_ld(c) is None:
        raise DeviceError(f"cuBLAS: cannot multiply {a.shape} @ {b.shape} into {c.shape} with strides "
                          f"{c.strides}: expected (m, k) @ (k, n) into a row-major (m, n), its rows possibly "
                          "padded. Fix: give the product operands of matching shapes and a row-major result view.")


def sgemm_args(c: Any, a: Any, b: Any, ptr: Callable[[Any], int]) -> tuple[int, ...]:
    """The cublasSgemm_v2 arguments after the handle, scalars left out, for row-major c = a @ b:
    (transa, transb, m, n, k, A, lda, B, ldb, C, ldc) of cuBLAS's column-major c^T = b^T a^T.
    ``ptr`` gives an operand's device address. A pure function, so the CPU stand-in for cuBLAS
    (tests/cuda_emulator.py) computes its products from exactly these arguments."""
    check_gemm(c, a, b)
    m, k = a.shape
    n = b.shape[1]
    opa, lda = gemm_layout(a)
    opb, ldb = gemm_layout(b)
    return (opb, opa, n, m, k, ptr(b), ldb, ptr(a), lda, ptr(c), gemm_layout(c)[1])


def gemm_types(c: Any, a: Any, b: Any) -> tuple[int, int] | None:
    """None for an fp32 product (cublasSgemm); for mixed precision's (a and b both bf16 or both fp16,
    c fp32 or their format) the (operand, result) cudaDataTypes of cublasGemmEx, which sums in fp32
    (CUBLAS_COMPUTE_32F)."""
    names = (str(a.dtype), str(b.dtype), str(c.dtype))
    if names == ("float32",) * 3:
        return None
    lowp = LOWP_TYPES.get(names[0])
    if lowp is None or LOWP_TYPES.get(names[1]) != lowp or (names[2] != "float32" and LOWP_TYPES.get(names[2]) != lowp):
        raise DeviceError(f"cuBLAS: a product of {names[0]} @ {names[1]} into {names[2]}: expected float32 "
                          "throughout, or both operands bf16 (uint16 storage) or both fp16 with a float32 result "
                          "or one of theirs. Fix: cast the operands (compiler/autocast.py plans the casts).")
    return lowp, CUDA_R_32F if names[2] == "float32" else lowp


class Gemm:
    """Row-major SGEMM (or, for 16-bit operands, GemmEx with fp32 sums) on one cuBLAS handle; every call
    goes to the stream it is given."""

    def __init__(self, workspace: Any) -> None:
        lib = _find_libcublas()
        self.lib = lib
        self._handle = ctypes.c_void_p()
        self._check(lib.cublasCreate_v2(ctypes.byref(self._handle)), "cublasCreate")
        self.workspace = workspace  # a cupy array kept alive as long as this object
        self._check(lib.cublasSetWorkspace_v2(self._handle, ctypes.c_void_p(workspace.data.ptr),
                                              ctypes.c_size_t(workspace.nbytes)), "cublasSetWorkspace")
        self._check(lib.cublasSetMathMode(self._handle, CUBLAS_DEFAULT_MATH), "cublasSetMathMode")
        self._one, self._zero = ctypes.c_float(1.0), ctypes.c_float(0.0)

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise DeviceError(f"cuBLAS: {what} failed with status {status}. Fix: check that CuPy's CUDA version "
                              "matches the driver; run benchmarks/gpu_device_check.py for details.")

    def bind(self, c: Any, a: Any, b: Any):  # type: ignore[no-untyped-def]
        """A launcher for c = a @ b (row-major): cuBLAS computes c^T = b^T a^T in its column-major terms."""
        ta, tb, m, n, k, pa, lda, pb, ldb, pc, ldc = sgemm_args(c, a, b, lambda x: x.data.ptr)
        lib, h, one, zero = self.lib, self._handle, ctypes.byref(self._one), ctypes.byref(self._zero)
        types = gemm_types(c, a, b)
        if types is None:
            call, what = lib.cublasSgemm_v2, "cublasSgemm"
            args: tuple = (ta, tb, m, n, k, one, ctypes.c_void_p(pa), lda, ctypes.c_void_p(pb), ldb, zero,
                           ctypes.c_void_p(pc), ldc)
        else:  # fp32 scalars (the compute type's), the 16-bit operands' type, fp32 sums
            call, what = lib.cublasGemmEx, "cublasGemmEx"
            args = (ta, tb, m, n, k, one, ctypes.c_void_p(pa), types[0], lda, ctypes.c_void_p(pb), types[0], ldb,
                    zero, ctypes.c_void_p(pc), types[1], ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
        ws = (ctypes.c_void_p(self.workspace.data.ptr), ctypes.c_size_t(self.workspace.nbytes))
        check = self._check

        def launch(stream: Any) -> None:
            check(lib.cublasSetStream_v2(h, ctypes.c_void_p(stream.ptr)), "cublasSetStream")
            # cublasSetStream resets the handle to cuBLAS's default workspace pool, which allocates
            # inside a capture: set ours again. A workspace serves one GEMM at a time: the executor
            # gives each stream that multiplies a Gemm of its own (gpu/streams.py StreamGemms).
            check(lib.cublasSetWorkspace_v2(h, *ws), "cublasSetWorkspace")
            check(call(h, *args), what)
        return launch

    def close(self) -> None:
        if self._handle:
            self.lib.cublasDestroy_v2(self._handle)
            self._handle = ctypes.c_void_p()

    def __del__(self) -> None:  # a recompiled or reset task drops its executor without close()
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit the library may be gone
            pass

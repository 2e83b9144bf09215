"""The GPU kernel table: op name -> factory(outs, ins, params, env) -> launcher(stream).

The same contract as the CPU table (kernels/cpu.py): binding resolves every view,
activation code and size once; the launcher only enqueues work on the stream it is
given. Launchers run once eagerly (warm-up: NVRTC compiles, cuBLAS picks its kernels)
and once under stream capture; after that only the captured CUDA graphs replay them.
Nothing a launcher does may allocate or synchronise.
"""
from __future__ import annotations

from importlib import resources
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import DeviceError, PlanError
from ..kernels.base import join_tables, registrar
from ..kernels.fused import gather_batch
from ..kernels.operands import ACT_CODES, ema_ranges, fc_bwd_operands, flat2d, split_scratch
from ..kernels.status import status_error
from ..memory.dtensor import span_bytes
from ..ops import registry
from ..train.rng import StreamId
from . import amp_kernels, image_kernels
from .base import THREADS, GpuBindEnv, Launch, MemoryOps, launch_grid, launch_single, sequence

DENSE_GPU_KERNELS: dict[str, Callable[..., Launch]] = {}
"""This module's kernels: dense layers, element-wise ops, losses, transfers, the update."""
gpu_kernel = registrar(DENSE_GPU_KERNELS)
NVRTC_OPTIONS = ("--fmad=false", "-std=c++17", f"-DRNB_THREADS={THREADS}")
"""--fmad=false: no contraction of a*b+c into one rounding, so the float32 element-wise results
are those of the CPU kernels bit for bit (the CPU kernels are compiled without fastmath).
RNB_THREADS sizes the shared arrays of the block reductions (rnb_softmax_xent, rnb_grad_sq_partials),
which are launched with THREADS threads: one number, set here."""


def kernel_source() -> str:
    """The CUDA C++ of every kernel: the per-element functions, then the __global__ kernels."""
    src = resources.files("renaissance_nb.gpu") / "src"
    files = "\n".join((src / name).read_text() for name in ("rnb_device.cuh", "rnb_kernels.cu", "rnb_image.cu",
                                                                    "rnb_amp.cu"))
    return files + "\n" + registry.cuda_sources()  # the kernels ops define themselves (ops/relu6.py...)


def cupy_memory_ops() -> MemoryOps:
    """The real ones: async runtime copies and memsets on the launcher's stream."""
    import cupy
    from cupy.cuda import runtime

    def memcpy(dst: Any, src: Any) -> Launch:
        d, s, nb, kind = dst.data.ptr, src.data.ptr, dst.nbytes, runtime.memcpyDeviceToDevice
        return lambda stream: runtime.memcpyAsync(d, s, nb, kind, stream.ptr)

    def h2d(dst: Any, src: np.ndarray) -> Launch:
        d, s, nb, kind = dst.data.ptr, src.ctypes.data, dst.nbytes, runtime.memcpyHostToDevice
        return lambda stream: runtime.memcpyAsync(d, s, nb, kind, stream.ptr)

    def memset0(views: Sequence[Any]) -> Launch:
        spans = [(v.data.ptr, span_bytes(v)) for v in views]  # padded rows: their padding is zero too

        def launch(stream: Any) -> None:
            for ptr, nb in spans:
                runtime.memsetAsync(ptr, 0, nb, stream.ptr)
        return launch

    def fill(views: Sequence[Any], value: float) -> Launch:
        def launch(stream: Any) -> None:
            with stream:
                for v in views:
                    v.fill(value)
        return launch

    def add(a: Any, b: Any, c: Any) -> Launch:
        def launch(stream: Any) -> None:
            with stream:
                cupy.add(a, b, out=c)
        return launch
    return MemoryOps(memcpy, h2d, memset0, fill, add)


def _i64(x: int) -> np.int64:
    return np.int64(x)


# ---- linear algebra -----------------------------------------------------------------------
@gpu_kernel("fc_fwd")
def fc_fwd(outs, ins, p, env):
    w = ins[1]
    x, y = ins[0].reshape(-1, w.shape[1]), outs[0].reshape(-1, w.shape[0])  # (B, in) or (B*T, in): per row
    b = ins[2] if len(ins) > 2 else None
    gemm = env.gemm.bind(y, x, w.T)
    act = ACT_CODES[p["act"]]
    if act == 0 and b is None:
        return gemm
    if act > 4:
        raise PlanError(f"fc_fwd: activation {p['act']!r} is not fused into fc (the compiler keeps it separate).")
    n, m = y.shape
    bias = b if b is not None else y
    return sequence(gemm, launch_grid(env, "rnb_bias_act", n * m, y, bias, np.int32(n), np.int32(m),
                                      np.int32(b is not None), np.int32(act), np.float64(p["slope"])))


@gpu_kernel("fc_bwd")
def fc_bwd(outs, ins, p, env):
    """dy *= act'(y) (one element-wise kernel); then three cuBLAS products: dW = dy^T x,
    db = 1^T dy (as on the CPU, and fully parallel, unlike a column loop over the batch), dx = dy W."""
    dy, x, w, y, ones, dw, db, dx = fc_bwd_operands(outs, ins, p)
    act = ACT_CODES[p["act"]]
    parts = []
    if act:
        parts.append(launch_grid(env, "rnb_act_grad", dy.size, dy, y, _i64(dy.size), np.int32(act),
                                 np.float64(p["slope"])))
    parts.append(env.gemm.bind(dw, dy.T, x))
    if db is not None:
        parts.append(env.gemm.bind(db.reshape(1, -1), ones.reshape(1, -1), dy))
    if dx is not None:
        parts.append(env.gemm.bind(dx, dy, w))
    return sequence(*parts)


@gpu_kernel("matmul")
def matmul_k(outs, ins, p, env):
    a, b = ins
    a = a.T if p.get("trans_a") else a
    b = b.T if p.get("trans_b") else b
    return env.gemm.bind(outs[0], a, b)


@gpu_kernel("add")
def add_k(outs, ins, p, env):
    """c = a + b; with a fused ReLU (ops/add.py) the ReLU kernel then runs on c in place: act_fwd's bytes."""
    a, b = ins
    total = env.ops.add(a, b, outs[0])
    if p.get("act", "none") == "none":
        return total
    return sequence(total, act_fwd([outs[0]], [outs[0]], {"act": p["act"], "slope": p.get("slope", 0.0)}, env))


@gpu_kernel("relu")
def relu_k(outs, ins, p, env):
    (x,), (y,) = ins, outs
    return launch_grid(env, "rnb_act_fwd", x.size, x, y, _i64(x.size), np.int32(1), np.float64(0.0))


# ---- element-wise ------------------------------------------------------------------------
@gpu_kernel("act_fwd")
def act_fwd(outs, ins, p, env):
    (x,), (y,) = ins, outs
    return launch_grid(env, "rnb_act_fwd", x.size, x, y, _i64(x.size), np.int32(ACT_CODES[p["act"]]),
                       np.float64(p["slope"]))


@gpu_kernel("act_bwd")
def act_bwd(outs, ins, p, env):
    (dy, x), (dx,) = ins, outs
    return launch_grid(env, "rnb_act_bwd", x.size, dy, x, dx, _i64(x.size), np.int32(ACT_CODES[p["act"]]),
                       np.float64(p["slope"]))


def _memcpy(env: GpuBindEnv, dst: Any, src: Any) -> Launch:
    if dst.nbytes != src.nbytes or not (dst.flags.c_contiguous and src.flags.c_contiguous):
        raise DeviceError(f"copy: {src.shape} -> {dst.shape} is not a contiguous copy of equal size; the GPU "
                          "backend copies flat features only (image layouts run on the CPU backend).")
    return env.ops.memcpy(dst, src)


@gpu_kernel("copy")
def copy_k(outs, ins, p, env):
    return _memcpy(env, outs[0], ins[0])


@gpu_kernel("reshape_copy")
def reshape_copy(outs, ins, p, env):
    """flatten and its gradient: a plain copy, or for (N, H, W, C) feature maps PyTorch's (C, H, W) order."""
    (src,), (dst,) = ins, outs
    if src.ndim == 4 or dst.ndim == 4:
        return image_kernels.flatten_copy(env, src, dst)
    return _memcpy(env, dst, src)


@gpu_kernel("mul")
def mul_k(outs, ins, p, env):
    (a, b), (out,) = ins, outs
    return launch_grid(env, "rnb_mul", out.size, out, a, b, _i64(out.size))


@gpu_kernel("fill")
def fill_k(outs, ins, p, env):
    value = p.get("value", 0.0)
    return env.ops.memset0(list(outs)) if value == 0 else env.ops.fill(list(outs), value)


@gpu_kernel("dropout_fwd")
def dropout_fwd(outs, ins, p, env):
    """The mask from Philox(seed, DROPOUT, offset): the CPU backend's numbers; the offset advances in-graph."""
    (x, offset), (y, mask) = ins, outs
    keep = 1.0 - float(p["p"])
    n = mask.size
    blocks = (n + 3) // 4
    draw = launch_grid(env, "rnb_dropout", blocks, x, y, mask, _i64(n), offset, np.uint64(env.seed),
                       np.uint32(int(StreamId.DROPOUT)), np.float32(keep), np.float32(1.0 / keep))
    return sequence(draw, launch_single(env, "rnb_advance", offset, _i64(blocks)))


# ---- loss and metrics -------------------------------------------------------------------------
@gpu_kernel("softmax_xent")
def softmax_xent_k(outs, ins, p, env):
    logits, labels = flat2d(ins[0]), ins[1]
    result = outs[0]
    grad = bool(p["grad"])
    dlogits = flat2d(outs[1]) if grad else logits
    n, c = logits.shape
    weighted = len(ins) > 2  # CrossEntropyLoss(weight=...): the class weights' arena tensor
    fn = env.module.get_function("rnb_softmax_xent")
    args = (logits, labels, ins[2] if weighted else logits, np.int32(weighted), np.int32(n), np.int32(c),
            np.float64(p["smoothing"]), result, dlogits, np.int32(grad))

    def launch(stream: Any) -> None:
        with stream:
            fn((1,), (THREADS,), args)
    return launch


@gpu_kernel("accum_metrics")
def accum_metrics(outs, ins, p, env):
    result, step = ins
    acc = outs[0]
    log = outs[1] if p.get("log") else acc
    return launch_single(env, "rnb_accum_metrics", result, acc, np.float64(env.batch), log,
                         _i64(outs[1].size if p.get("log") else 0), step)


@gpu_kernel("transfer")
def transfer(outs, ins, p, env):
    """The next batch into an input buffer: data="device" gathers on the device from the data set's
    device copy (perm and cursor in device memory); data="pinned" copies a batch the host gathered
    into pinned staging (the launcher's ``prepare``, called before each launch of its graph)."""
    (cursor,) = ins
    x_out, y_out = outs
    source = p["source"]
    if env.data == "pinned" and source in env.host_sources:
        return _pinned_transfer(env, source, cursor, flat2d(x_out), y_out)
    if source not in env.sources:
        def missing(stream: Any) -> None:
            raise PlanError(f"transfer: no {source!r} data was given to the task. Fix: pass {source} data to .data().")
        missing.unavailable = True  # type: ignore[attr-defined]
        return missing
    xs, ys = env.sources[source]
    x2 = flat2d(x_out)
    n, d = x2.shape
    perm = env.perms[source]
    gather = launch_grid(env, "rnb_gather", n * d, xs, ys, perm, _i64(perm.size), cursor, x2, y_out, np.int32(n),
                         _i64(d))
    return sequence(gather, launch_single(env, "rnb_advance", cursor, _i64(n)))


# ---- region-wide operations ---------------------------------------------------------------------
def _pinned_transfer(env: GpuBindEnv, source: str, cursor: Any, x2: Any, y_out: Any) -> Launch:
    xs, ys = env.host_sources[source]
    perm, host_cursor = env.host_perms[source], env.host_twin(cursor)
    sx, sy = env.pinned(x2.shape, np.float32), env.pinned(y_out.shape, np.int32)
    launch = sequence(env.ops.h2d(x2, sx), env.ops.h2d(y_out, sy),
                      launch_single(env, "rnb_advance", cursor, _i64(x2.shape[0])))

    def prepare() -> None:  # numba, no GIL: rows perm[cursor .. cursor + n) into the staging arrays
        status = gather_batch(xs, ys, perm, host_cursor, sx, sy)
        if status:
            raise status_error(status, "transfer", source, sy.shape[0], perm, int(host_cursor[0]))
    launch.prepare = prepare  # type: ignore[attr-defined]
    return launch


@gpu_kernel("zero_range")
def zero_range(outs, ins, p, env):
    return env.ops.memset0([env.range_view(p["first"], p["last"], "uint8")])


@gpu_kernel("nan_check")
def nan_check(outs, ins, p, env):
    """Probe every gradient, then fold in the loss: flag 1 = skip this update, 2 = halted (policy raise)."""
    result, _step = ins
    flag, skipped = split_scratch(outs, p)[0]  # the CPU's probe partials are not used here
    grads = env.range_view(p["first"], p["last"], "float32")
    policy = 1 if p.get("policy", "raise") == "skip" else 0
    return sequence(launch_grid(env, "rnb_nonfinite_probe", grads.size, grads, _i64(grads.size), flag),
                    launch_single(env, "rnb_nonfinite_tally", result, flag, skipped, np.int32(policy)))


@gpu_kernel("clip_grad_norm")
def clip_grad_norm(outs, ins, p, env):
    """Squares summed by CLIP_BLOCKS blocks, their partial sums added in block order by one thread (the
    same order on every GPU), then the scaling grid-stride; all three skip a flagged step."""
    (flag,) = ins
    clip, partial = outs
    grads = env.range_view(p["first"], p["last"], "float32")
    n = _i64(grads.size)
    sums, total = env.module.get_function("rnb_grad_sq_partials"), env.module.get_function("rnb_grad_norm")
    blocks = int(partial.size)

    def norm(stream: Any) -> None:
        with stream:
            sums((blocks,), (THREADS,), (grads, n, flag, partial))
            total((1,), (1,), (partial, np.int32(blocks), flag, np.float32(p["max_norm"]), clip))
    return sequence(norm, launch_grid(env, "rnb_grad_scale", grads.size, grads, n, flag, clip))


@gpu_kernel("optimizer")
def optimizer_k(outs, ins, p, env):
    """The update its definition binds (renaissance_nb/optim/, by the node's ``kind``), then the step counter."""
    from ..optim import definition  # the definitions bind this table's launch helpers: imported at bind time
    flag, (step,) = ins[1], outs
    update = definition(p["kind"], "optimizer").bind_gpu(outs, ins, p, env)
    done = "rnb_optimizer_count" if p.get("keep_flag", False) else "rnb_optimizer_done"  # the EMA clears it
    return sequence(update, launch_single(env, done, step, flag))


@gpu_kernel("optimizer_norms")
def optimizer_norms(outs, ins, p, env):
    """Per-tensor norms an optimizer needs before its update (LARS_NORMS), as its definition binds them."""
    from ..optim import definition
    return definition(p["kind"], "optimizer_norms").bind_gpu_norms(outs, ins, p, env)


@gpu_kernel("ema_update")
def ema_update(outs, ins, p, env):
    if len(ins) < 2:
        raise PlanError("ema_update: the GPU kernel reads [step, nan.flag] (the compiler's graphs give both); "
                        "a hand-built node gave only the step. Fix: add the NaN flag tensor as its second input.")
    step, flag = ins[0], ins[1]
    e, w, be, bw = ema_ranges(env.range_view)
    decay = np.float64(p["decay"])
    parts = [launch_grid(env, "rnb_ema", e.size, e, w, _i64(e.size), step, flag, decay)]
    if be.size:
        parts.append(launch_grid(env, "rnb_ema", be.size, be, bw, _i64(be.size), step, flag, decay))
    return sequence(*parts, launch_single(env, "rnb_skip_done", flag))


GPU_KERNELS: dict[str, Callable[..., Launch]] = join_tables(DENSE_GPU_KERNELS, image_kernels.IMAGE_GPU_KERNELS,
                                                             amp_kernels.AMP_GPU_KERNELS, registry.gpu_kernels())
"""The complete GPU table, op name -> factory: the one place the GPU kernel modules' tables are joined."""


def unsupported_ops(ops: Sequence[str]) -> list[str]:
    """Ops of a plan that have no GPU kernel (none of the ops the compiler emits today; a plan
    built by hand may use others)."""
    return sorted({op for op in ops if op not in GPU_KERNELS})


def bind_launchers(compiled: Any, views: dict[str, list[Any]], make_env: Callable[[int], GpuBindEnv]
                   ) -> tuple[list[str], list[list[Launch]]]:
    """Bind every distinct atlas entry with this table: (names, launcher lists), in atlas order.

    ``views`` maps a variant to its tensor views (device arrays on a GPU); ``make_env(batch)``
    gives the bind environment for a variant's batch size.
    """
    graphs = {"train": compiled.graphs.train, "inference": compiled.graphs.inference}
    names, bound = [], []
    for key in compiled.atlas.captures:
        env = make_env(compiled.shapes.specs[key.variant].batch)
        vs = views[key.variant]
        name = f"{key.graph}/{key.gid.name}/s{key.shape_id}"
        launchers = []
        for n in graphs[key.graph].nodes(key.gid):
            if n.op not in GPU_KERNELS:
                raise DeviceError(f"{name}: op {n.op!r} has no GPU kernel. Fix: use device('cpu') for this model.")
            try:
                launchers.append(GPU_KERNELS[n.op]([vs[i] for i in n.outputs], [vs[i] for i in n.inputs], n.p, env))
            except (ValueError, IndexError, KeyError, TypeError) as exc:
                raise PlanError(f"{name}: cannot bind node {n!r} on the GPU: {exc}.") from exc
        names.append(name)
        bound.append(launchers)
    return names, bound

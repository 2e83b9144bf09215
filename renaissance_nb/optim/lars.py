"""LARS (You, Gitman and Ginsburg 2017, "Large Batch Training of Convolutional Networks"): momentum SGD
whose step for each weight tensor is scaled by a trust ratio. The settings are train/optimizers.py ``LARS``.

For each weight tensor w (fc weights, conv kernels: the W_FC_WEIGHT, W_FIRST_CONV and W_DEEP_CONV regions)
with gradient g, after the NaN check and clipping::

    trust = trust_coefficient * ||w|| / (||g|| + weight_decay * ||w|| + eps)     (1 when ||w|| or ||g|| is 0)
    m = momentum * m + trust * (g + weight_decay * w)
    w = w - lr * m

Biases and batch-norm parameters (and the zero padding of the ranges) are excluded from the trust ratio and
from weight decay: ``m = momentum * m + g; w = w - lr * m``. Two nodes per step:

* LARS_NORMS, ``optimizer_norms``: [||w||, ||g||] of each weight tensor into its ``<weight>@n`` tensor of
  the N regions (float32 (2,)): float64 sums of squares in one fixed order (kernels/fused.py
  ``sq_sum_chunked``, the C twin the same), their square roots rounded to float32. A weight's norm covers
  its slot (a padded matrix's row padding is zero and adds nothing).
* OPTIMIZER, ``optimizer``: one pass over the W/G/M ranges, each weight tensor with its trust ratio, computed
  in float64 from the stored norms and rounded to float32; the arithmetic per element is float32 as SGD's.

CPU: kernels/native.c ``rnb_lars_norms`` and ``rnb_lars`` where the C kernels are built, else their numba
twins kernels/fused.py ``lars_norms`` and ``lars_update`` (the same bytes). GPU: gpu/src/rnb_kernels.cu
(the clip norm's ``rnb_grad_sq_partials`` per tensor, ``rnb_lars_norms``, ``rnb_lars``).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import PlanError
from ..kernels import blas, fused, native
from ..kernels.operands import optimizer_ranges
from ..memory.dtensor import span_bytes
from ..train.optimizers import LARS
from .base import MenuEntry, NodeSpec, OptimizerDefinition, Reader, cpu_operands, update_node

NORMS = ("N_FC_WEIGHT", "N_DEEP_CONV")
"""The N regions' range: one (2,) tensor per adapted weight, where the weight's region has an N twin."""
GPU_NORM_BLOCKS = 64
"""The most blocks whose partial sums make one norm on the GPU (a fixed count: a fixed order of the sums)."""


def adapted_weights(ids: Mapping[str, int]) -> list[str]:
    """The weights LARS adapts: those the tensor table gave an ``@n`` tensor (compiler/layers.py gives one
    where the N family has the weight's region), in table order."""
    return [name[: -len("@n")] for name in ids if name.endswith("@n")]


def _address(a: Any) -> int:
    face = getattr(a, "__cuda_array_interface__", None) or a.__array_interface__
    return int(face["data"][0])


def _offset(view: Any, base: Any, what: str) -> tuple[int, int]:
    """(first element, elements spanned) of ``view`` inside the flat float32 range ``base``."""
    at, span = _address(view) - _address(base), span_bytes(view)
    if at % 4 or span % 4 or at < 0 or at + span > base.size * 4:
        raise PlanError(f"LARS: {what} does not lie inside its flat range ({at} bytes in, {span} long, the range "
                        f"{base.size * 4}). Fix: keep the weight and norm tensors in their W and N regions.")
    return at // 4, span // 4


def segments(w: Any, n: Any, weights: Sequence[Any], norms: Sequence[Any]) -> np.ndarray:
    """One row per adapted weight, in address order: (offset in the W range, its span, offset of its norm pair
    in the N range); G and M list the same tensors at the same offsets (kernels/operands.py checks sizes)."""
    rows = []
    for i, (wv, nv) in enumerate(zip(weights, norms)):
        lo, size = _offset(wv, w, f"weight {i}")
        at, two = _offset(nv, n, f"the norms of weight {i}")
        if two != 2:
            raise PlanError(f"LARS: the norms of weight {i} hold {two} values, not 2 ([||w||, ||g||]).")
        rows.append((lo, size, at))
    return np.array(sorted(rows), np.int64).reshape(-1, 3)


def pieces(seg: np.ndarray, total: int) -> np.ndarray:
    """The W range cut in order into (start, end, N offset) for each adapted weight and (start, end, -1) for
    each run between them (excluded parameters and padding)."""
    out, at = [], 0
    for lo, size, nat in seg:
        if lo < at:
            raise PlanError("LARS: two weight tensors overlap in the W range.")
        if lo > at:
            out.append((at, int(lo), -1))
        out.append((int(lo), int(lo + size), int(nat)))
        at = int(lo + size)
    if at < total:
        out.append((at, total, -1))
    return np.array(out, np.int64).reshape(-1, 3)


class LarsDefinition(OptimizerDefinition):
    kind = LARS.kind
    label = "LARS"
    menu = (MenuEntry(LARS.kind, "LARS", lambda: LARS()),)

    def update_nodes(self, ids: Mapping[str, int], p: Mapping[str, Any]) -> list[NodeSpec]:
        """LARS_NORMS: optimizer_norms reads each weight and its gradient, writes its norms; then OPTIMIZER,
        whose node lists each weight and its norms (the W/G/M ranges it sweeps are compiler/touches.py's)."""
        weights = adapted_weights(ids)
        if not weights:
            raise PlanError("LARS: the model has no fc or conv weight to adapt. Fix: use SGD for this model.")
        norms = ("LARS_NORMS", "optimizer_norms", [ids["nan.flag"], *(ids[x] for b in weights for x in (b, f"{b}@grad"))],
                 [ids[f"{b}@n"] for b in weights], {"kind": self.kind})
        return [norms, update_node(ids, p, [ids[x] for b in weights for x in (b, f"{b}@n")])]

    def bind_cpu_norms(self, outs: Sequence[Any], ins: Sequence[Any], p: Mapping[str, Any],
                       env: Any) -> Callable[[], None]:
        flag, weights = ins[0], ins[1::2]
        w, g, _, _ = optimizer_ranges(env.range_view)
        n = env.range_view(*NORMS, "float32")
        seg = segments(w, n, weights, outs)
        threaded = blas.THREADED
        f = fused.lars_norms_par if threaded else fused.lars_norms
        norms = native.bind_lars_norms(w, g, n, seg, blas.pass_threads(threaded)) or (lambda: f(w, g, n, seg))

        def run() -> None:
            if flag[0]:  # a step the NaN check skips keeps the last norms
                return
            norms()
        return run

    def bind_cpu(self, outs: Sequence[Any], ins: Sequence[Any], p: Mapping[str, Any], env: Any) -> Callable[[], None]:
        o = cpu_operands(outs, ins, env)
        n = env.range_view(*NORMS, "float32")
        cut = pieces(segments(o.w, n, o.extra[0::2], o.extra[1::2]), o.w.size)
        mom, wd, eta, eps = (float(p[k]) for k in ("momentum", "weight_decay", "trust_coefficient", "eps"))
        w, g, m, lr_table, step = o.w, o.g, o.m, o.lr_table, o.step
        f = fused.lars_update_par if o.threaded else fused.lars_update
        update = native.bind_lars(w, g, m, n, cut, lr_table, step, mom, wd, eta, eps, o.threads)
        if update is None:
            def update() -> None:
                f(w, g, m, n, cut, lr_table, step, mom, wd, eta, eps)
        return update

    def bind_gpu_norms(self, outs: Sequence[Any], ins: Sequence[Any], p: Mapping[str, Any],
                       env: Any) -> Callable[[Any], None]:
        """Per weight: the clip norm's block partial sums of w and of g (float64, a fixed tree per block), then
        one thread adds each in block order and writes [||w||, ||g||] as float32."""
        from ..gpu.base import THREADS, launch_single, sequence  # the GPU backend only where it binds
        flag, weights = ins[0], ins[1::2]
        if env.scratch is None:
            raise PlanError("optimizer_norms: the GPU kernels need bind-time scratch memory (GpuBindEnv.scratch).")
        w, g, _, _ = optimizer_ranges(env.range_view)
        partial = env.scratch((2 * len(outs), GPU_NORM_BLOCKS), np.float64)
        sums, launches = env.module.get_function("rnb_grad_sq_partials"), []
        for i, (wv, nv) in enumerate(zip(weights, outs)):
            lo, size = _offset(wv, w, f"weight {i}")
            blocks = max(1, min(GPU_NORM_BLOCKS, -(-size // THREADS)))
            pw, pg = partial[2 * i, :blocks], partial[2 * i + 1, :blocks]
            for x, part in ((w[lo:lo + size], pw), (g[lo:lo + size], pg)):
                launches.append(_blocks(sums, blocks, THREADS, (x, np.int64(size), flag, part)))
            launches.append(launch_single(env, "rnb_lars_norms", pw, pg, np.int32(blocks), flag, nv))
        return sequence(*launches)

    def bind_gpu(self, outs: Sequence[Any], ins: Sequence[Any], p: Mapping[str, Any], env: Any) -> Callable[[Any], None]:
        """One launch per piece of the W range (pieces): a weight with its norms, or a run of excluded values."""
        from ..gpu.base import launch_grid, sequence
        lr_table, flag, extra = ins[0], ins[1], ins[2:]
        (step,) = outs
        w, g, m, _ = optimizer_ranges(env.range_view)
        n = env.range_view(*NORMS, "float32")
        scalars = tuple(np.float64(p[k]) for k in ("momentum", "weight_decay", "trust_coefficient", "eps"))
        launches = []
        for a, b, at in pieces(segments(w, n, extra[0::2], extra[1::2]), w.size):
            norms = n[at:at + 2] if at >= 0 else w[a:a + 1]  # unread where the piece is not adapted
            launches.append(launch_grid(env, "rnb_lars", b - a, w[a:b], g[a:b], m[a:b], norms, np.int64(b - a),
                                        lr_table, np.int64(lr_table.size), step, flag, *scalars, np.int32(at >= 0)))
        return sequence(*launches)

    def old_weights(self, read: Reader, name: str, w: np.ndarray, g: np.ndarray, t: int, lr: float,
                    p: Mapping[str, Any]) -> tuple[np.ndarray, str]:
        """w = w_old - lr * m with m the new momentum buffer, for adapted and excluded tensors alike: W_old = W + lr * M.
        An adapted weight's line also gives the trust ratio its stored norms make."""
        old = w + lr * read(f"{name}@m").astype(np.float64)
        try:
            wn, gn = (float(x) for x in read(f"{name}@n"))
        except PlanError:  # no such tensor: a bias or batch-norm parameter, not adapted
            return old, "LARS, excluded from the trust ratio and weight decay (a bias or batch-norm parameter): dW = -lr * M"
        wd, eta, eps = float(p["weight_decay"]), float(p["trust_coefficient"]), float(p["eps"])
        trust = eta * wn / (gn + wd * wn + eps) if wn > 0 and gn > 0 else 1.0
        return old, (f"LARS: dW = -lr * M, M = momentum * M + trust * (G + wd * W_old), trust = "
                     f"{eta:g} * ||W|| / (||G|| + {wd:g} * ||W|| + {eps:g}) = {trust:.4g} (||W|| = {wn:.4g}, "
                     f"||G|| = {gn:.4g} before the step)")


def _blocks(fn: Any, blocks: int, threads: int, args: tuple) -> Callable[[Any], None]:
    """A launcher of ``blocks`` blocks of ``threads`` (a block reduction: its grid is its order of sums)."""
    def launch(stream: Any) -> None:
        with stream:
            fn((blocks,), (threads,), args)
    return launch


DEFINITION = LarsDefinition()

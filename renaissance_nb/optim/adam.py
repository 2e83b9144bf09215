"""Adam and AdamW (torch.optim.Adam, torch.optim.AdamW): one definition, the weight decay's kind apart.

Adam adds its L2 weight decay to the gradient; AdamW decays the weights first (decoupled). The update
is one pass over the whole W/G/M/V ranges: kernels/native.c ``rnb_adam`` where the C kernels are built,
else kernels/fused.py ``adam_update`` (the same bytes); gpu/src/rnb_kernels.cu ``rnb_adam`` on a GPU.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..kernels import fused, native, program
from ..kernels.operands import optimizer_ranges
from ..train.optimizers import Adam, AdamW, Optimizer
from .base import MenuEntry, NodeSpec, OptimizerDefinition, Reader, cpu_operands, element_offset, update_node


class AdamDefinition(OptimizerDefinition):
    """``decoupled``: AdamW's weight decay (w *= 1 - lr * wd before the step), else Adam's (g += wd * w)."""

    def __init__(self, builder: type[Optimizer], decoupled: bool) -> None:
        self.kind, self.label, self.decoupled = builder.kind, builder.__name__, decoupled
        self.menu = (MenuEntry(builder.kind, builder.__name__, builder),)

    def bind_cpu(self, outs: Sequence[Any], ins: Sequence[Any], p: Mapping[str, Any], env: Any) -> Callable[[], None]:
        o = cpu_operands(outs, ins, env)
        f = fused.adam_update_par if o.threaded else fused.adam_update
        b1, b2, eps, wd = float(p["beta1"]), float(p["beta2"]), float(p["eps"]), float(p["weight_decay"])
        decoupled, maximize = self.decoupled, bool(p.get("maximize", False))
        w, g, m, v, lr_table, step = o.w, o.g, o.m, o.v, o.lr_table, o.step

        def bind(lo: int, hi: int, decay: float) -> Callable[[], None]:
            ws, gs, ms, vs = w[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi]
            bound = native.bind_adam(ws, gs, ms, vs, lr_table, step, b1, b2, eps, decay, decoupled, maximize,
                                     o.threads)
            return bound or (lambda: f(ws, gs, ms, vs, lr_table, step, b1, b2, eps, decay, decoupled, maximize))
        if not o.extra:
            return bind(0, w.size, wd)
        cut = element_offset(o.extra[0], w)  # decay="matrices": the first decayed weight (compiler/pipeline.py)
        exempt, decayed = bind(0, cut, 0.0), bind(cut, w.size, wd)
        count_back = native.bind_count_back(step)
        if count_back is not None:
            return program.chain(exempt, count_back, decayed)  # native when both passes are C

        def update() -> None:  # two element-wise passes, one step: each pass counts it, so one count is undone
            exempt()
            step[0] -= 1
            decayed()
        return update

    def update_nodes(self, ids: Mapping[str, int], p: Mapping[str, Any]) -> list[NodeSpec]:
        """The update reads, with decay="matrices", the first weight decayed (where the exempt prefix of
        the W range, norms, biases and embeddings, ends)."""
        first = p.get("decay_from")
        return [update_node(ids, {k: v for k, v in p.items() if k != "decay_from"}, [ids[first]] if first else [])]

    def bind_gpu(self, outs: Sequence[Any], ins: Sequence[Any], p: Mapping[str, Any], env: Any) -> Callable[[Any], None]:
        from ..gpu.base import launch_grid  # the GPU backend only where it binds
        lr_table, flag = ins[0], ins[1]
        (step,) = outs
        if len(ins) > 2:
            from ..errors import DeviceError
            raise DeviceError(f"{self.label}(decay='matrices') has no GPU update yet. Fix: decay='all', or "
                              "device('cpu').")
        w, g, m, v = optimizer_ranges(env.range_view)
        return launch_grid(env, "rnb_adam", w.size, w, g, m, v, np.int64(w.size), lr_table, np.int64(lr_table.size),
                           step, flag, np.float64(p["beta1"]), np.float64(p["beta2"]), np.float64(p["eps"]),
                           np.float64(p["weight_decay"]), np.int32(self.decoupled),
                           np.int32(bool(p.get("maximize", False))))

    def old_weights(self, read: Reader, name: str, w: np.ndarray, g: np.ndarray, t: int, lr: float,
                    p: Mapping[str, Any]) -> tuple[np.ndarray, str]:
        """W_old = W + u, u = lr / (1 - b1^t) * M / (sqrt(V) / sqrt(1 - b2^t) + eps), from the new moments.
        AdamW also decays: W = W_old * (1 - lr * wd) - u, so W_old = (W + u) / (1 - lr * wd)."""
        b1, b2, eps, wd = float(p["beta1"]), float(p["beta2"]), float(p["eps"]), float(p.get("weight_decay", 0.0))
        m, v = read(f"{name}@m").astype(np.float64), read(f"{name}@v").astype(np.float64)
        u = lr / (1.0 - b1 ** t) * m / (np.sqrt(v) / np.sqrt(1.0 - b2 ** t) + eps)
        if self.decoupled:
            return (w + u) / (1.0 - lr * wd), "AdamW: dW = -lr * wd * W_old - lr * M_hat / (sqrt(V_hat) + eps)"
        return w + u, "Adam: dW = -lr * M_hat / (sqrt(V_hat) + eps)"


ADAM = AdamDefinition(Adam, decoupled=False)
ADAMW = AdamDefinition(AdamW, decoupled=True)

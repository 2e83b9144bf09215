"""SGD (torch.optim.SGD): momentum, dampening, Nesterov, L2 weight decay, ``maximize``.

The update is one pass over the whole W/G/M ranges: kernels/native.c ``rnb_sgd`` where the C kernels
are built, else kernels/fused.py ``sgd_update`` (the same bytes); gpu/src/rnb_kernels.cu ``rnb_sgd``
on a GPU. Without momentum there is no M.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..kernels import fused, native
from ..kernels.base import EMPTY_F32
from ..kernels.operands import optimizer_ranges
from ..train.optimizers import SGD
from .base import MenuEntry, OptimizerDefinition, Reader, cpu_operands


class SgdDefinition(OptimizerDefinition):
    kind = SGD.kind
    label = "SGD"
    menu = (MenuEntry("sgd", "SGD", SGD), MenuEntry("sgd_momentum", "SGD + momentum", lambda: SGD().momentum(0.9)))

    def menu_value(self, p: Mapping[str, Any]) -> str:
        return self.menu[1].value if p["momentum"] else self.menu[0].value

    def bind_cpu(self, outs: Sequence[Any], ins: Sequence[Any], p: Mapping[str, Any], env: Any) -> Callable[[], None]:
        o = cpu_operands(outs, ins, env)
        fs = fused.sgd_update_par if o.threaded else fused.sgd_update
        mom, damp, wd, nest = float(p["momentum"]), float(p["dampening"]), float(p["weight_decay"]), bool(p["nesterov"])
        maximize = bool(p.get("maximize", False))
        w, g, lr_table, step = o.w, o.g, o.lr_table, o.step
        m = o.m if mom != 0 else EMPTY_F32
        update = native.bind_sgd(w, g, m, lr_table, step, mom, damp, wd, nest, maximize, o.threads)
        if update is None:
            def update() -> None:
                fs(w, g, m, lr_table, step, mom, damp, wd, nest, maximize)
        return update

    def bind_gpu(self, outs: Sequence[Any], ins: Sequence[Any], p: Mapping[str, Any], env: Any) -> Callable[[Any], None]:
        from ..gpu.base import launch_grid  # the GPU backend only where it binds
        lr_table, flag = ins[0], ins[1]
        (step,) = outs
        w, g, m, _ = optimizer_ranges(env.range_view)
        mom, wd = float(p["momentum"]), float(p["weight_decay"])
        return launch_grid(env, "rnb_sgd", w.size, w, g, m if mom != 0 else w, np.int64(w.size), lr_table,
                           np.int64(lr_table.size), step, flag, np.float32(mom), np.float32(1.0 - float(p["dampening"])),
                           np.float32(wd), np.int32(wd != 0.0), np.int32(mom != 0), np.int32(bool(p["nesterov"])),
                           np.int32(bool(p.get("maximize", False))))

    def old_weights(self, read: Reader, name: str, w: np.ndarray, g: np.ndarray, t: int, lr: float,
                    p: Mapping[str, Any]) -> tuple[np.ndarray, str]:
        """With momentum (not Nesterov): W_old = W + lr * M, the new momentum buffer. Without momentum, or
        Nesterov: W = W_old - lr * (s + wd * W_old), s = ±G (+ momentum * M), so W_old = (W + lr * s) / (1 - lr * wd)."""
        mom, wd = float(p["momentum"]), float(p["weight_decay"])
        sign = -1.0 if p.get("maximize") else 1.0
        if mom and not p["nesterov"]:
            return w + lr * read(f"{name}@m").astype(np.float64), "SGD with momentum: dW = -lr * M"
        s = sign * g + (mom * read(f"{name}@m").astype(np.float64) if mom else 0.0)
        return (w + lr * s) / (1.0 - lr * wd), "SGD: dW = -lr * (G + wd * W_old)" + (" + Nesterov momentum" if mom else "")


DEFINITION = SgdDefinition()

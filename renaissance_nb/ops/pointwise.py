"""What an element-wise op with kernels of its own shares (relu6, hardswish, elu): planning (the
input's shape, any layout), emission (``<kind>_fwd`` reads x, ``<kind>_bwd`` reads dy and x), and the
binding of its numba loops and CUDA kernels. A subclass gives its builder, its two numba loops over
flat float32 arrays (``fwd(x, y, alpha)``, ``bwd(dy, x, dx, alpha)``), its CUDA source with kernels
``rnb_<kind>_fwd(x, y, n, alpha)`` and ``rnb_<kind>_bwd(dy, x, dx, n, alpha)``, and its ONNX nodes.

Why x and not y in the backward: relu6 and elu could use y, hardswish cannot; one form for all
keeps the CPU, the GPU and the tests alike.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .registry import Op

Loop = Callable[..., None]


class Pointwise(Op):
    layout = "elementwise"
    fwd_loop: Loop
    bwd_loop: Loop

    def __init__(self) -> None:
        self.cpu_kernels = {f"{self.kind}_fwd": self.bind_fwd, f"{self.kind}_bwd": self.bind_bwd}
        self.gpu_kernels = {f"{self.kind}_fwd": self.launch_fwd, f"{self.kind}_bwd": self.launch_bwd}

    def alpha(self, p: dict[str, Any]) -> float:
        """The op's one float parameter the kernels take (elu's alpha; 0 where it has none)."""
        return 0.0

    def describe(self, p: dict[str, Any]) -> str:
        args = ", ".join(f"{k}={v}" for k, v in p.items())
        return f"{self.kind}({args})" if args else self.kind

    def forward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, training: bool,
                ema: bool) -> None:
        e.emit(g, gid, f"{self.kind}_fwd", [xs[0]], [y], layer.name, **layer.p)

    def backward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, dy: int,
                 dxs: list[int | None]) -> None:
        if dxs[0] is not None:
            e.emit(g, gid, f"{self.kind}_bwd", [dy, xs[0]], [dxs[0]], layer.name, **layer.p)

    def decode(self, d: Any, layer: Any, xs: list[str], y: str) -> None:
        d.add(y, d.shapes[xs[0]])
        d.emit(f"{self.kind}_fwd", [xs[0]], [y], layer.name, **layer.p)

    # ---- kernels: factories with kernels/base.py's and gpu/kernels.py's contracts -----------
    def bind_fwd(self, outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Callable[[], None]:
        (x,), (y,) = ins, outs
        f, alpha = self.fwd_loop, np.float32(self.alpha(p))
        return lambda: f(x, y, alpha)

    def bind_bwd(self, outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Callable[[], None]:
        (dy, x), (dx,) = ins, outs
        f, alpha = self.bwd_loop, np.float32(self.alpha(p))
        return lambda: f(dy, x, dx, alpha)

    def launch_fwd(self, outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Any:
        from ..gpu.base import launch_grid
        (x,), (y,) = ins, outs
        return launch_grid(env, f"rnb_{self.kind}_fwd", x.size, x, y, np.int64(x.size), np.float32(self.alpha(p)))

    def launch_bwd(self, outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Any:
        from ..gpu.base import launch_grid
        (dy, x), (dx,) = ins, outs
        return launch_grid(env, f"rnb_{self.kind}_bwd", x.size, dy, x, dx, np.int64(x.size),
                           np.float32(self.alpha(p)))

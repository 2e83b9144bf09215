"""One convolution layer's CPU kernels (kernels/conv.py) against their three GEMMs alone.

    python benchmarks/conv_layer.py [--n 128] [--hw 14] [--cin 32] [--cout 64] [--k 3] [--reps 30]

Forward and backward of one 3x3 conv (bias, ReLU, dx) through the kernel table, best of
``reps``; the gap to the GEMM-only time is what im2col, col2im and the fused passes cost.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from renaissance_nb.kernels.cpu import KERNELS, BindEnv  # noqa: E402
from renaissance_nb.kernels.operands import out_size  # noqa: E402


def benchmark(n: int = 128, hw: int = 14, cin: int = 32, cout: int = 64, k: int = 3, reps: int = 30) -> dict:
    """Forward+backward of one conv (bias, ReLU, dx) vs the same three GEMMs alone; best-of-reps.

    ``python benchmarks/conv_layer.py``. On a shared machine take the best of a few runs: the
    numbers are minima, so noise only ever makes them worse.
    """
    rng = np.random.default_rng(0)
    pad = k // 2
    ho = out_size(hw, k, 1, pad)
    m, kk = n * ho * ho, k * k * cin
    x = rng.standard_normal((n, hw, hw, cin), dtype=np.float32)
    w = (rng.standard_normal((cout, k, k, cin)) / np.sqrt(kk)).astype(np.float32)
    b = np.zeros(cout, np.float32)
    y, cols = np.empty((n, ho, ho, cout), np.float32), np.empty((m, kk), np.float32)
    dy, dw, db, dx, dcols = (rng.standard_normal(y.shape, dtype=np.float32), np.empty_like(w), np.empty_like(b),
                             np.empty_like(x), np.empty_like(cols))
    prm = dict(k=k, s=1, p=pad, bias=True, act="relu", need_dx=True)
    fwd = KERNELS["conv_fwd"]([y, cols], [x, w, b], prm, BindEnv())
    bwd = KERNELS["conv_bwd"]([dw, db, dx, dcols], [dy, x, w, cols, y], prm, BindEnv())
    y2, dy2, dw2, wmat = y.reshape(m, cout), dy.reshape(m, cout), dw.reshape(cout, -1), w.reshape(cout, -1)
    mm = np.matmul

    def gemms() -> None:
        mm(cols, wmat.T, out=y2)
        mm(dy2.T, cols, out=dw2)
        mm(dy2, wmat, out=dcols)

    best = {"fwd": 1e9, "bwd": 1e9, "gemms": 1e9}
    fwd(), bwd(), gemms()
    for _ in range(reps):
        for name, f in (("fwd", fwd), ("bwd", bwd), ("gemms", gemms)):
            t0 = time.perf_counter()
            f()
            best[name] = min(best[name], time.perf_counter() - t0)
    flop = 3 * 2.0 * m * kk * cout
    return {"fwd_ms": best["fwd"] * 1e3, "bwd_ms": best["bwd"] * 1e3,
            "conv_gflops": flop / (best["fwd"] + best["bwd"]) / 1e9, "gemm_only_gflops": flop / best["gemms"] / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("n", 128), ("hw", 14), ("cin", 32), ("cout", 64), ("k", 3), ("reps", 30)):
        ap.add_argument(f"--{name}", type=int, default=default)
    a = ap.parse_args()
    result = benchmark(a.n, a.hw, a.cin, a.cout, a.k, a.reps)
    print(", ".join(f"{k} {v:.2f}" for k, v in result.items()))


if __name__ == "__main__":
    main()

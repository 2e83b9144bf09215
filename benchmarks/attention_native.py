"""Causal self-attention's C kernels (renaissance_nb/kernels/attention_native.c) against the NumPy and numba
kernels they stand in for (ops/attention_kernels.py), per call.

    PYTHONPATH=. python benchmarks/attention_native.py [--shape 32,4,128,32] [--block 64] [--repeats 30]

For each kernel (the materialised form's four, the flash form's two) both paths are bound on the same
arrays (batch, heads, T, hd from --shape) and called ``repeats`` times after two warm-up calls, inside
blas.own_cores() as a training step replays them: the NumPy/numba path as a plan on numba's threads binds
it (np.matmul, and the ``par`` twins of the row loops where the work is large enough), the C path on the
pool's threads; and each on one thread (a busy machine's second core may not be free). Printed: the
machine, each kernel's median and best milliseconds per call and the ratios C / numba of the medians.
Both give the same bytes (tests/test_attention_native.py); this measures time.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import numpy as np

from machine import machine_line  # benchmarks/machine.py
from renaissance_nb.kernels import attention_native as an
from renaissance_nb.kernels import blas, native
from renaissance_nb.ops import attention_kernels as ak

NUMBA = {"an op only numba has"}


def arrays(b: int, h: int, t: int, hd: int, block: int) -> dict[str, np.ndarray]:
    """Every tensor the six kernels read or write, filled as a training step would leave them."""
    rng = np.random.default_rng(0)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    heads, blk = (b, h, t, hd), min(block, t)
    a = {"qkv": f(b, t, 3 * h * hd), "dy": f(b, t, h * hd), "y": f(b, t, h * hd), "dqkv": f(b, t, 3 * h * hd),
         "probs": f(b, h, t, t), "dprobs": f(b, h, t, t), "lse": f(b, h, t), "dsum": f(b, h, t),
         "sblk": f(b * h, blk, blk), "dpblk": f(b * h, blk, blk), "pq": f(b * h, blk, hd), "pk": f(b * h, blk, hd),
         "mrow": np.zeros((b * h, blk)), "lrow": np.zeros((b * h, blk)), "acc": np.zeros((b * h, blk, hd))}
    a.update({r: f(*heads) for r in ("q", "k", "v", "o", "do", "dq", "dk", "dv")})
    ak.bind_scores([a["q"], a["k"], a["v"], a["probs"]], [a["qkv"]], {}, None)()
    ak.bind_flash_fwd([a[r] for r in ("q", "k", "v", "y", "lse", "sblk", "mrow", "lrow", "acc", "pq", "o")],
                      [a["qkv"]], {"block": block}, None)()
    return a


def kernels(a: dict[str, np.ndarray], block: int) -> dict[str, dict[str, Callable]]:
    """kernel name -> {column: kernel}: the NumPy/numba kernel bound serially and as a plan on numba's threads
    binds it, the C kernel on one thread and on the pool's (numba's count)."""
    g = lambda *names: [a[n] for n in names]  # noqa: E731
    table = {  # name: (numba binder, its outs, its ins, params, C binder's arguments)
        "attn_scores": (ak.bind_scores, g("q", "k", "v", "probs"), g("qkv"), {}, an.bind_scores,
                        g("qkv", "q", "k", "v", "probs")),
        "attn_mix": (ak.bind_mix, g("y", "o"), g("probs", "v"), {}, an.bind_mix, g("probs", "v", "y", "o")),
        "attn_mix_bwd": (ak.bind_mix_bwd, g("dprobs", "dv", "do"), g("dy", "probs", "v"), {}, an.bind_mix_bwd,
                         g("dy", "probs", "v", "dprobs", "dv", "do")),
        "attn_scores_bwd": (ak.bind_scores_bwd, g("dqkv", "dq", "dk", "dprobs"), g("dprobs", "probs", "q", "k", "dv"),
                            {}, an.bind_scores_bwd, g("dprobs", "probs", "q", "k", "dv", "dqkv", "dq", "dk")),
        "flash_attn_fwd": (ak.bind_flash_fwd, g("q", "k", "v", "y", "lse", "sblk", "mrow", "lrow", "acc", "pq", "o"),
                           g("qkv"), {"block": block}, an.bind_flash_fwd,
                           g("qkv", "q", "k", "v", "y", "lse", "sblk", "mrow", "lrow", "acc", "pq", "o") + [block]),
        "flash_attn_bwd": (ak.bind_flash_bwd, g("dqkv", "dq", "dk", "dv", "sblk", "dpblk", "pq", "pk", "do", "o",
                                                "dsum"), g("dy", "y", "q", "k", "v", "lse"), {"block": block},
                           an.bind_flash_bwd, g("dy", "y", "q", "k", "v", "lse", "dqkv", "dq", "dk", "dv", "sblk",
                                                "dpblk", "pq", "pk", "do", "o", "dsum") + [block]),
    }
    out = {}
    for name, (bind, outs, ins, p, c_bind, c_args) in table.items():
        with native.chosen_for(NUMBA):
            par = bind(outs, ins, p, None)
        out[name] = {"numba 1": bind(outs, ins, p, None), "numba plan": par, "C 1": c_bind(*c_args, 1),
                     "C pool": c_bind(*c_args, blas.pass_threads(True))}
        assert None not in out[name].values(), f"{name}: the C binder declined"
    return out


def timed(kernel: Callable[[], Any], repeats: int) -> list[float]:
    kernel()
    kernel()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        kernel()
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="32,4,128,32", help="batch,heads,T,hd")
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    b, h, t, hd = map(int, args.shape.split(","))
    print(machine_line())
    print(f"batch {b}, {h} heads, T={t}, hd={hd}, flash block {args.block}; numba threads "
          f"{blas.pass_threads(True)}; ms per call, median (best)")
    a = arrays(b, h, t, hd, args.block)
    with blas.own_cores():
        for name, ks in kernels(a, args.block).items():
            times: dict[str, list[float]] = {c: [] for c in ks}
            for _ in range(3):  # interleaved, so a busy machine's slow patches fall on every column
                for c, k in ks.items():
                    times[c] += timed(k, max(1, args.repeats // 3))
            med = {c: statistics.median(v) * 1e3 for c, v in times.items()}
            cols = "  ".join(f"{c} {med[c]:7.3f} ({min(times[c]) * 1e3:7.3f})" for c in ks)
            print(f"{name:16s} {cols}  C/numba {med['C 1'] / med['numba 1']:4.2f} (1 thread), "
                  f"{med['C pool'] / med['numba plan']:4.2f} (threads)")


if __name__ == "__main__":
    main()

"""3x3 stride-1 convolutions by Winograd F(4x4, 3x3) and F(2x2, 3x3) against the im2col tiles they replaced, per layer.

    python benchmarks/winograd_cpu.py [--rounds 15] [--batch 128]

For each layer shape (the README ResNet's, the conv net's, notebook 08's and a few more), the three kernels are bound
through the kernel table on the planned scratch (kernels/operands.conv_scratch_shape), the
forward and the backward (weight and input gradients) timed alternately, round by round, in this
one process; printed: medians in ms and the ratios F(4x4, 3x3) / im2col and F(2x2, 3x3) / im2col (RNB_WINOGRAD=4, 2
and 0 while they bind; kernels/winograd.tile picks F(4x4, 3x3) by these). All give the convolution to
float32 rounding (tests/test_winograd.py); this measures only the time. Rows below
kernels/winograd.MIN_CHANNELS are timed with the threshold lifted: the library runs them by im2col.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from machine import machine_line  # noqa: E402  (benchmarks/machine.py)

from renaissance_nb.kernels import blas  # noqa: E402
from renaissance_nb.kernels import winograd as wino  # noqa: E402
from renaissance_nb.kernels.cpu import KERNELS, BindEnv  # noqa: E402
from renaissance_nb.ops.conv import CONV_DW_PARTIALS  # noqa: E402
from renaissance_nb.kernels.operands import conv_scratch_shape  # noqa: E402

SHAPES = [(32, 32, 32, "README ResNet conv2/conv3"), (16, 64, 64, "README ResNet conv6"),
          (14, 32, 64, "conv net layer 2"), (7, 64, 128, "conv net layer 3"), (28, 16, 16, ""), (8, 64, 64, ""),
          (7, 16, 16, "notebook 08's conv6"), (14, 8, 8, "notebook 08's conv2/conv3: below MIN_CHANNELS, im2col runs"),
          (32, 8, 8, "below MIN_CHANNELS, im2col runs")]


KINDS = ("4", "2", "0")
"""RNB_WINOGRAD while binding: F(4x4, 3x3), F(2x2, 3x3), im2col."""


def bound(n: int, h: int, c: int, co: int, kind: str) -> tuple:
    """(forward, backward) kernels of one 3x3 stride-1 conv by F(4x4, 3x3), F(2x2, 3x3) or im2col (``kind``)."""
    winograd = kind != "0"
    os.environ["RNB_WINOGRAD"] = kind  # read when a kernel binds
    wino.MIN_CHANNELS = 1  # time the rows below the threshold too: the table shows why it is there
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, h, h, c), dtype=np.float32)
    w = (rng.standard_normal((co, 3, 3, c)) / np.sqrt(9 * c)).astype(np.float32)
    y = np.zeros((n, h, h, co), np.float32)
    dy = rng.standard_normal(y.shape, dtype=np.float32)
    cols = np.zeros(conv_scratch_shape(n, h, h, 3, 1, 1, c), np.float32)
    bwd_cols, dw, dx = np.zeros_like(cols), np.zeros_like(w), np.zeros_like(x)
    parts = np.zeros((CONV_DW_PARTIALS, co, 9 * c), np.float32)
    p = dict(k=3, s=1, p=1, bias=False, act="none")
    fwd = KERNELS["conv_fwd"]([y, cols], [x, w], p, BindEnv())
    bwd = KERNELS["conv_bwd"]([dw, dx, bwd_cols, parts], [dy, x, w, bwd_cols, y],
                              {**p, "need_dx": True, "scratch": ("dw_partials",)}, BindEnv())
    bound = getattr(fwd, "winograd", ()) + getattr(bwd, "winograd", ())
    want = ("forward", "weight gradient", "input gradient") if winograd else ()
    assert bound == want, f"{h}x{h} {c} -> {co}: the kernel table bound {bound or 'im2col'}, expected {want or 'im2col'}"
    return fwd, bwd


def timed(kernel) -> float:  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    kernel()
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--batch", type=int, default=128)
    args = ap.parse_args()
    print(f"{machine_line()}; numpy {np.__version__}; {blas.describe()}")
    print(f"3x3 stride-1 convolutions, batch {args.batch}, NHWC float32, medians of {args.rounds} alternating rounds "
          "(ms; backward = weight and input gradients)")
    print(f"  {'H=W':>4} {'Cin':>4} {'Cout':>4}   {'fwd F4':>7} {'F2':>7} {'im2col':>7} {'F4/i':>6} {'F2/i':>6}   "
          f"{'bwd F4':>7} {'F2':>7} {'im2col':>7} {'F4/i':>6} {'F2/i':>6}   layer")
    for h, c, co, label in SHAPES:
        kinds = {k: bound(args.batch, h, c, co, k) for k in KINDS}
        times: dict[tuple[str, int], list[float]] = {(k, i): [] for k in kinds for i in (0, 1)}
        for k, pair in kinds.items():  # warm-up: compiles, fills caches
            pair[0](), pair[1]()
        for r in range(args.rounds):
            for k in (KINDS[r % 3:] + KINDS[:r % 3]):
                for i in (0, 1):
                    times[(k, i)].append(timed(kinds[k][i]))
        med = {key: statistics.median(v) * 1e3 for key, v in times.items()}
        cells = ["   ".join(f"{med[('4', i)]:7.2f} {med[('2', i)]:7.2f} {med[('0', i)]:7.2f} "
                            f"{med[('4', i)] / med[('0', i)]:5.2f}x {med[('2', i)] / med[('0', i)]:5.2f}x" for i in (0, 1))]
        print(f"  {h:>4} {c:>4} {co:>4}   {cells[0]}   {label}")
    os.environ.pop("RNB_WINOGRAD", None)
    return 0


if __name__ == "__main__":
    sys.exit(main())

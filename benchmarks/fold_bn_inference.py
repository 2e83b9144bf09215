"""Inference with and without options(fold_bn=True): a ResNet-style net's evaluate() over a validation
set, both tasks in this process, interleaved rounds, medians; plus what the folded weights cost.

    python benchmarks/fold_bn_inference.py [--rounds 7] [--batch 128] [--samples 2048] [--width 32]

Printed: the machine, BLAS and threads; each side's ms per evaluation by round; the medians, their
spread and the ratio folded/plain; the arena of each plan. Both tasks train the same weights (one short
epoch, so the batch norms' running statistics are real), which the script checks before timing.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from machine import machine_line  # benchmarks/machine.py
from renaissance_nb import RESNET_3_3, RESNET_3_3_DS, DeepLearningTask, block, cbr, fc, gap, seq
from renaissance_nb.kernels import blas
from renaissance_nb.text import human_bytes


def build(fold: bool, x: np.ndarray, y: np.ndarray, batch: int, width: int) -> DeepLearningTask:
    net = seq(cbr(width, 3, 1, 1), block(width, RESNET_3_3), block(2 * width, RESNET_3_3_DS),
              block(2 * width, RESNET_3_3), block(4 * width, RESNET_3_3_DS), gap(), fc(10))
    n = len(x) // 2
    task = (DeepLearningTask(f"fold_bn={fold}").model(net).data(train=(x[:n], y[:n]), val=(x[n:], y[n:]),
                                                               batch_size=batch)
            .total_epochs(1).seed(0).options(fold_bn=fold))
    task.run(progress=False)
    return task


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--samples", type=int, default=2048)
    ap.add_argument("--width", type=int, default=32)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((a.samples, 3, 32, 32)).astype(np.float32)
    y = rng.integers(0, 10, a.samples)
    plain, folded = build(False, x, y, a.batch, a.width), build(True, x, y, a.batch, a.width)
    assert all(np.array_equal(v, folded.state_dict()[k]) for k, v in plain.state_dict().items())
    xv, yv = x[a.samples // 2:], y[a.samples // 2:]
    times: dict[str, list[float]] = {"plain": [], "folded": []}
    for r in range(a.rounds):
        for side in (("plain", "folded") if r % 2 == 0 else ("folded", "plain")):
            task = plain if side == "plain" else folded
            t0 = time.perf_counter()
            task.evaluate(xv, yv)
            times[side].append(1e3 * (time.perf_counter() - t0))
    print(machine_line())
    print(f"BLAS: {blas.describe()}")
    print(f"ResNet-style net, width {a.width}, 32x32 inputs, {len(xv)} validation samples, batch {a.batch}")
    for side, ts in times.items():
        print(f"  {side:7s} ms/evaluate by round: " + " ".join(f"{t:.1f}" for t in ts)
              + f"   median {statistics.median(ts):.1f} (spread {min(ts):.1f}-{max(ts):.1f})")
    print(f"  folded / plain (medians): {statistics.median(times['folded']) / statistics.median(times['plain']):.3f}")
    la, lb = plain.predict_logits(xv[:256]), folded.predict_logits(xv[:256])
    print(f"  logits max |diff| / max |logit|: {np.abs(la - lb).max() / np.abs(la).max():.1e}")
    for task in (plain, folded):
        print(f"  {task.name}: arena {human_bytes(task.compiled.plan.total_bytes)}, "
              f"{len(task.compiled.arch.folded)} pairs folded")


if __name__ == "__main__":
    main()

"""A conv net's first run after an install, with and without Winograd's kernels: what they cost to compile.

    python benchmarks/cold_start_conv.py [--rounds 3]

Each round runs the same job in fresh processes with an empty numba cache (its own NUMBA_CACHE_DIR):
the conv net of benchmarks/convnet_mnist.py (three cbr stages, pooling, gap, fc) compiled and trained
one epoch on 896 random 28x28 images at batch 128, once as it runs by default (its 32 -> 64 and
64 -> 128 convolutions by Winograd F(2x2, 3x3)) and once with ``RNB_WINOGRAD=0`` (every conv by
im2col tiles), in alternating order, the warm-up helper on as a user gets it; then each once more with
its cache warm. Printed: the machine, every wall time, the medians. Winograd's kernels are more numba
code to compile (kernels/winograd.py), once per machine; this measures that cost.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

from cold_start import ROOT, machine, wall  # benchmarks/cold_start.py

JOB = """
import sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
import renaissance_nb as rnb
from convnet_mnist import convnet
rng = np.random.default_rng(0)
x, y = rng.standard_normal((1024, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, 1024).astype(np.int32)
t = (rnb.DeepLearningTask("c").model(convnet()).data(train=(x[:896], y[:896]), val=(x[896:], y[896:]), batch_size=128)
     .optimizer(rnb.AdamW()).total_epochs(1).seed(0))
t.compile()
t.run(progress=False)
print(next((n for n in t.runner.notes if "Winograd" in n), "no Winograd layers"))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    job = [sys.executable, "-c", JOB, str(ROOT / "benchmarks")]
    base = {**os.environ, "PYTHONPATH": str(ROOT)}
    print(machine())
    print("conv net (benchmarks/convnet_mnist.py), compile + one epoch of 7 steps at batch 128, fresh processes")
    times: dict[str, list[float]] = {"winograd cold": [], "im2col cold": [], "winograd warm": [], "im2col warm": []}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.rounds):
            runs = [("winograd", "1"), ("im2col", "0")]
            for name, flag in runs if k % 2 == 0 else runs[::-1]:
                env = {**base, "RNB_WINOGRAD": flag, "NUMBA_CACHE_DIR": os.path.join(tmp, f"{name}{k}")}
                s, last = wall(job, env)
                times[f"{name} cold"].append(s)
                print(f"  round {k + 1}: {name:8s} cold {s:6.2f} s   ({last[:90]})")
        for name, flag in (("winograd", "1"), ("im2col", "0")):
            env = {**base, "RNB_WINOGRAD": flag, "NUMBA_CACHE_DIR": os.path.join(tmp, f"{name}0")}
            times[f"{name} warm"].append(wall(job, env)[0])
    med = {k: statistics.median(v) for k, v in times.items()}
    print("medians: " + ", ".join(f"{k} {v:.2f} s" for k, v in med.items()))
    print(f"Winograd's compile cost on a first run: {med['winograd cold'] - med['im2col cold']:+.2f} s; "
          f"warm, the same job: {med['winograd warm'] - med['im2col warm']:+.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

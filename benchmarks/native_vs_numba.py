"""The C kernels (renaissance_nb/kernels/native.c) against the numba kernels they stand in for, per step.

    python benchmarks/native_vs_numba.py [--rounds 5] [--models mlp,conv]

Every round runs, for each model, one fresh process with the C kernels and one with ``RNB_NATIVE=0``
(alternating which goes first); each trains a warm-up epoch and then times two epochs of the
compiled step (the run's own epoch records). mlp: the seed MLP at batch 128 on 20,000 random
samples; conv: benchmarks/convnet_mnist.py's conv net at batch 128 on 2,560 random images. Its conv,
batch norm and pooling kernels are numba's, so by default (the "C" column) the plan keeps all its
passes on numba's threads too (kernels/native.py chosen_for: with its fc, loss and optimizer in C on
OpenMP's threads beside numba's the step took 1.40x as long); the row checks that the default costs
the conv net nothing. Printed: the machine, the medians, spreads and the ratio C / numba. The two
give the same bytes (tests/test_native.py); this measures only the time.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from machine import machine_line  # benchmarks/machine.py

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[2])
from renaissance_nb import DeepLearningTask, seq, fc, relu, AdamW
from renaissance_nb.kernels import native
which = sys.argv[1]
rng = np.random.default_rng(0)
if which == "mlp":
    model, x = seq(fc(1024), relu(), fc(512), relu(), fc(256), relu(), fc(10)), rng.standard_normal((20000, 784))
else:
    from convnet_mnist import convnet
    model, x = convnet(), rng.standard_normal((2560, 1, 28, 28))
y = rng.integers(0, 10, len(x)).astype(np.int64)
t = (DeepLearningTask("bench").model(model).data(train=(x.astype(np.float32), y), batch_size=128)
     .optimizer(AdamW().lr(1e-3)).total_epochs(3).seed(0))
t.run(1, progress=False)  # warm-up: kernels compiled or loaded, caches hot
t.run(progress=False)
ms = [1e3 * r.seconds / t.steps_per_epoch for r in t.result.history[1:]]
print(json.dumps({"ms": ms, "native": native.lib() is not None}))
"""


def run(which: str, native: bool) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RNB_NATIVE": "1" if native else "0"}
    out = subprocess.run([sys.executable, "-c", CHILD, which, str(ROOT / "benchmarks")], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["native"] == native, r
    return statistics.median(r["ms"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--models", default="mlp,conv")
    args = ap.parse_args()
    from renaissance_nb.kernels import blas, native
    print(f"{machine_line()} · {blas.describe()} · {native.status().describe()}")
    for which in args.models.split(","):
        times: dict[str, list[float]] = {"C": [], "numba": []}
        for k in range(args.rounds):
            order = [("C", True), ("numba", False)]
            for name, flag in order if k % 2 == 0 else order[::-1]:
                times[name].append(run(which, flag))
            print(f"{which} round {k + 1}: C {times['C'][-1]:.2f} ms/step   numba {times['numba'][-1]:.2f} ms/step",
                  flush=True)
        med = {k: statistics.median(v) for k, v in times.items()}
        for name, v in times.items():
            print(f"{which} {name:5} median {med[name]:.2f} ms/step, spread {min(v):.2f}-{max(v):.2f}")
        print(f"{which}: C / numba = {med['C'] / med['numba']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

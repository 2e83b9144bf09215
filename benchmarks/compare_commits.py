"""Before/after: a model's step time at two commits of this repository, interleaved.

    python benchmarks/compare_commits.py BEFORE [AFTER] [--rounds 7] [--batch 128] [--samples 20000]
                                         [--model mlp|resnet|convnet] [--precision fp32|bf16|fp16]

``--model mlp`` (the default) is the seed MLP on (N, 784) inputs; ``resnet`` a small ResNet (cbr, two
basic blocks, one downsampling, gap, fc) on (N, 3, 32, 32) inputs, which the conv, batch-norm and
Winograd paths run; ``convnet`` benchmarks/convnet_mnist.py's conv net (three cbr stages, two max pools) on
(N, 1, 28, 28) inputs.

BEFORE and AFTER are git revisions (AFTER defaults to the working tree). Each is checked out
into a temporary worktree (the working tree is used as it is); every round runs one fresh
process per side, alternating which goes first, and each process trains one warm-up epoch
(numba loads or compiles its kernels there) and then times ``--epochs`` epochs of the compiled
step (the epoch time of the run's own records, validation excluded: the data has none).
Printed: the machine, CPU, BLAS and threads, each side's per-round ms/step, medians, the spread
(min-max) and the ratio AFTER/BEFORE of the medians. A refactor should read ~1.00 within the spread.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from machine import machine_line  # benchmarks/machine.py

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
import numpy as np
import renaissance_nb as rnb
from renaissance_nb import DeepLearningTask, seq, fc, relu, AdamW
from renaissance_nb.kernels import blas
n, batch, epochs, model, precision = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
rng = np.random.default_rng(0)
if model == "resnet":
    from renaissance_nb import RESNET_3_3, RESNET_3_3_DS, block, cbr, gap
    net = seq(cbr(32, 3, 1, 1), block(32, RESNET_3_3), block(64, RESNET_3_3_DS), block(64, RESNET_3_3), gap(), fc(10))
    x = rng.standard_normal((n, 3, 32, 32)).astype(np.float32)
elif model == "convnet":
    from renaissance_nb import cbr, gap, maxpool
    net = seq(cbr(32, 3, 1, 1), maxpool(2), cbr(64, 3, 1, 1), maxpool(2), cbr(128, 3, 1, 1), gap(), fc(10))
    x = rng.standard_normal((n, 1, 28, 28)).astype(np.float32)
else:
    net = seq(fc(1024), relu(), fc(512), relu(), fc(256), relu(), fc(10))
    x = rng.standard_normal((n, 784)).astype(np.float32)
y = rng.integers(0, 10, n).astype(np.int64)
t = (DeepLearningTask("bench").model(net)
     .data(train=(x, y), batch_size=batch).optimizer(AdamW().lr(1e-3)).total_epochs(1 + epochs).seed(0))
if precision != "fp32":
    t.precision(precision)
t.run(1, progress=False)                 # warm-up: kernels compiled or loaded, caches hot
t.run(progress=False)
steps = t.steps_per_epoch
ms = [1e3 * r.seconds / steps for r in t.result.history[1:]]
print(json.dumps({"ms_per_step": ms, "blas": blas.describe(), "file": rnb.__file__}))
"""


def worktree(rev: str, into: str) -> str:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", into, rev], check=True)
    return into


def run_side(src: str, n: int, batch: int, epochs: int, model: str, precision: str) -> dict:
    env = {**os.environ, "PYTHONPATH": src}
    out = subprocess.run([sys.executable, "-c", CHILD, str(n), str(batch), str(epochs), model, precision], cwd=src,
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def machine() -> str:
    return machine_line()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("before")
    ap.add_argument("after", nargs="?", default=None)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--model", choices=("mlp", "resnet", "convnet"), default="mlp")
    ap.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sides = {"before": worktree(args.before, os.path.join(tmp, "before"))}
        sides["after"] = worktree(args.after, os.path.join(tmp, "after")) if args.after else str(ROOT)
        try:
            results: dict[str, list[float]] = {k: [] for k in sides}
            blas_text = {}
            print(machine())
            for r in range(args.rounds):
                order = list(sides) if r % 2 == 0 else list(reversed(sides))
                for side in order:
                    got = run_side(sides[side], args.samples, args.batch, args.epochs, args.model, args.precision)
                    results[side].append(statistics.median(got["ms_per_step"]))
                    blas_text[side] = got["blas"]
                print(f"round {r + 1}: " + "  ".join(f"{k} {results[k][-1]:.3f} ms/step" for k in sides), flush=True)
        finally:
            for side, path in sides.items():
                if path != str(ROOT):
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", path], check=False)
    for side in sides:
        print(f"{side:6} ({args.before if side == 'before' else args.after or 'working tree'}): {blas_text[side]}")
    med = {k: statistics.median(v) for k, v in results.items()}
    for k, v in results.items():
        print(f"{k:6} median {med[k]:.3f} ms/step, spread {min(v):.3f}-{max(v):.3f} over {len(v)} rounds")
    print(f"after / before = {med['after'] / med['before']:.3f} ({args.model}, {args.precision}, batch {args.batch}, "
          f"{args.samples} samples, {args.epochs} timed epochs per process)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A conv net's first run after an install, against PyTorch eager's: what compiling the kernels costs.

    python benchmarks/cold_start_conv.py [--rounds 3]

Each round runs the same job in fresh processes, in alternating order: the conv net of
benchmarks/convnet_mnist.py (three cbr stages, max pooling, gap, fc; its 32 -> 64 and 64 -> 128
convolutions by Winograd F(2x2, 3x3)) compiled and trained one epoch on 896 random 28x28 images at batch
128, with a validation pass over 128 more,

* ours with its C kernels, both caches empty: its own RNB_CACHE_DIR (the library's core part is compiled,
  about 2.1 s of CPU for kernels/native.c, conv_native.c, winograd_native.c, winograd43_native.c and the
  pool; the GPT's and mixed precision's part is not needed) and its own NUMBA_CACHE_DIR;
* ours with ``RNB_NATIVE=0`` and an empty numba cache: every kernel numba's, compiled on the first run
  (the conv net's path before its C twins, kernels/conv_native.py), the warm-up helper on as a user gets it;
* the same job in PyTorch eager (the same layers, AdamW), from its process's start (import torch included);

then ours once more with both caches warm. Printed: the machine, every wall time, the medians, and the
ratio of our cold first run to PyTorch eager's.
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
print(next((n for n in t.runner.notes if n.startswith("device")), "")[-90:])
"""

TORCH_JOB = """
import numpy as np
import torch
from torch import nn
torch.manual_seed(0)
rng = np.random.default_rng(0)
x = torch.from_numpy(rng.standard_normal((1024, 1, 28, 28), dtype=np.float32))
y = torch.from_numpy(rng.integers(0, 10, 1024).astype(np.int64))
def cbr(cin, cout):
    return [nn.Conv2d(cin, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]
net = nn.Sequential(*cbr(1, 32), nn.MaxPool2d(2), *cbr(32, 64), nn.MaxPool2d(2), *cbr(64, 128),
                    nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))
opt, loss_fn = torch.optim.AdamW(net.parameters()), nn.CrossEntropyLoss()
perm = torch.randperm(896)
for i in range(0, 896, 128):
    idx = perm[i:i + 128]
    opt.zero_grad(set_to_none=True)
    loss_fn(net(x[idx]), y[idx]).backward()
    opt.step()
net.eval()
with torch.no_grad():
    top1 = (net(x[896:]).argmax(1) == y[896:]).float().mean().item()
print(f"torch {torch.__version__}, val top-1 {top1:.3f}")
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    ours = [sys.executable, "-c", JOB, str(ROOT / "benchmarks")]
    torch_job = [sys.executable, "-c", TORCH_JOB]
    base = {**os.environ, "PYTHONPATH": str(ROOT)}
    print(machine())
    print("conv net (benchmarks/convnet_mnist.py), compile + one epoch of 7 steps at batch 128 + validation, "
          "fresh processes")
    times: dict[str, list[float]] = {"C cold": [], "numba cold": [], "torch eager": [], "C warm": []}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.rounds):
            runs = [("C cold", ours, {"RNB_CACHE_DIR": os.path.join(tmp, f"c{k}"),
                                      "NUMBA_CACHE_DIR": os.path.join(tmp, f"cn{k}")}),
                    ("numba cold", ours, {"RNB_NATIVE": "0", "NUMBA_CACHE_DIR": os.path.join(tmp, f"n{k}")}),
                    ("torch eager", torch_job, {})]
            for name, cmd, env in runs if k % 2 == 0 else runs[::-1]:
                s, last = wall(cmd, {**base, **env})
                times[name].append(s)
                print(f"  round {k + 1}: {name:11s} {s:6.2f} s   ({last})")
        for k in range(args.rounds):
            env = {"RNB_CACHE_DIR": os.path.join(tmp, "c0"), "NUMBA_CACHE_DIR": os.path.join(tmp, "cn0")}
            times["C warm"].append(wall(ours, {**base, **env})[0])
    med = {k: statistics.median(v) for k, v in times.items()}
    print("medians: " + ", ".join(f"{k} {v:.2f} s" for k, v in med.items()))
    print(f"our cold first run / PyTorch eager's: {med['C cold'] / med['torch eager']:.2f}x with the C kernels, "
          f"{med['numba cold'] / med['torch eager']:.2f}x with numba's (RNB_NATIVE=0); warm, ours takes "
          f"{med['C warm']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Side-by-side CPU benchmark of the conv net (issue 4's three cbr stages, pooling, gap, fc):
renaissance_nb against the same layers in PyTorch eager (default and fused AdamW) and
torch.compile (fused AdamW; its compile time reported apart), label smoothing, batch 128;
then the memory of each side (arena against PyTorch's peak resident growth).

    python benchmarks/convnet_cpu.py [--samples 5120] [--rounds 3] [--no-compile] [--no-memory]

Same harness as mlp_cpu.py: each contender in its own process, epochs interleaved, medians;
also the im2col products' time at the 1024^3 sgemm rate (their step FLOPs, measured by segments
of an extra epoch as in mlp_cpu.py) and the fraction of it the step takes. That was a roofline
while every conv was im2col + sgemm; the 3x3 stride-1 convs now run by Winograd F(2x2, 3x3)
(kernels/winograd.py), which multiplies less, so a step can pass it (over 100%).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import renaissance_nb as rnb  # noqa: E402
from convnet_mnist import convnet  # noqa: E402
from machine import machine_line  # noqa: E402
from mlp_cpu import (TorchContender, our_sgemm, peak_rss_child, print_memory, print_roofline,  # noqa: E402
                     print_skipped, print_times, roofline_epoch, run_isolated)

CONVS = ((28, 1, 32), (14, 32, 64), (7, 64, 128))
"""(output height = width, Cin, Cout) of the conv net's three 3x3 convolutions (padding 1)."""
ROOFLINE_EVERY = 16
"""Steps per roofline segment: an epoch here is 40 steps of about 50 ms."""


def step_flops(batch: int) -> float:
    """The products of a training step: each convolution as its im2col GEMM (M = batch*H*W,
    K = 9*Cin, N = Cout) forward, for dW and for dx (none for the first layer), and the fc."""
    total = 0.0
    for i, (hw, cin, cout) in enumerate(CONVS):
        total += 2.0 * batch * hw * hw * 9 * cin * cout * (2 if i == 0 else 3)
    return total + 2.0 * batch * CONVS[-1][2] * 10 * 3


def load_images(n: int) -> tuple[np.ndarray, np.ndarray]:
    shared = ROOT.parent / "shared" / "data" / "mnist"
    if shared.exists():
        s = rnb.datasets.mnist(shared, layout="image")
        return s.train.x[:n], s.train.y[:n]
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, n).astype(np.int32)


class Ours:
    name = "renaissance_nb"

    def __init__(self, x: np.ndarray, y: np.ndarray, batch: int, net: rnb.BluePrint | None = None) -> None:
        """The conv net (or ``net``), label smoothing 0.1, AdamW; compiled and one epoch run (warm)."""
        t = time.perf_counter()
        self.task = (rnb.DeepLearningTask("bench").model(net or convnet()).data(train=(x, y), batch_size=batch)
                     .loss(rnb.CrossEntropyLoss().label_smoothing(0.1)).optimizer(rnb.AdamW())
                     .total_epochs(1000).seed(0))
        self.task.compile()
        self.compile_s = time.perf_counter() - t
        self.epoch()

    def epoch(self) -> float:
        t = time.perf_counter()
        self.task.run(epochs=1, progress=False)
        return time.perf_counter() - t

    def roofline_epoch(self, flops_per_step: float) -> list[tuple[float, float, int]]:
        return roofline_epoch(self.task, flops_per_step, ROOFLINE_EVERY)


class Torch(TorchContender):
    """The conv net in PyTorch (NCHW, the same layers), AdamW with PyTorch's default weight decay."""

    def __init__(self, x: np.ndarray, y: np.ndarray, batch: int, mode: str = "eager") -> None:
        import torch
        from torch import nn
        torch.manual_seed(0)

        def cbr(cin: int, cout: int) -> list:
            return [nn.Conv2d(cin, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]
        model = nn.Sequential(*cbr(1, 32), nn.MaxPool2d(2), *cbr(32, 64), nn.MaxPool2d(2), *cbr(64, 128),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))
        super().__init__(model, x, y, batch, mode)


def torch_version() -> str:
    """PyTorch's version with its threads set to every core, or "not installed"."""
    try:
        import torch
    except ImportError:
        return "not installed"
    torch.set_num_threads(os.cpu_count() or 1)
    return torch.__version__


def bench_args(samples: int) -> argparse.ArgumentParser:
    """The flags of a side-by-side step benchmark (--samples, --rounds, --batch, --no-compile)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=samples)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--no-compile", action="store_true")
    return ap


def side_by_side(module: str, args: argparse.Namespace, have_torch: bool, flops: float = 0.0) -> dict:
    """run_isolated for ``module``'s contenders: ours, PyTorch eager (default and fused AdamW) and,
    unless --no-compile, torch.compile."""
    kinds = ["ours", "eager", "fused"] + ([] if args.no_compile else ["compile"])
    return run_isolated(args.batch, args.samples, args.rounds, have_torch, not args.no_compile, 0, module=module,
                        kinds=kinds, flops_per_step=flops)


def load(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The training data of this benchmark: (x, y)."""
    return load_images(n)


def make_contender(kind: str, batch: int, samples: int, data=None):  # type: ignore[no-untyped-def]
    """Build one contender ("ours", "eager", "fused", "compile")."""
    x, y = data if data is not None else load_images(samples)
    return Ours(x, y, batch) if kind == "ours" else Torch(x, y, batch, kind)


def main() -> int:
    ap = bench_args(5120)
    ap.add_argument("--no-memory", action="store_true")
    args = ap.parse_args()
    print(f"{machine_line()}; numpy {np.__version__}; torch {torch_version()}; our products: {our_sgemm()[0]}")
    flops = step_flops(args.batch)
    have_torch = torch_version() != "not installed"
    r = side_by_side("convnet_cpu", args, have_torch, flops)
    print(f"conv net, batch {args.batch}, {r['steps']} steps per pass, medians of {args.rounds} interleaved rounds")
    print_times(r)
    if "roofline_fraction" in r:
        rate = statistics.median(r["sgemm_rates"])
        print_roofline(r, flops / rate, rate, name="im2col products at the sgemm rate (Winograd's convs multiply "
                       "less and can pass it)")
    print_skipped(r)
    if not args.no_memory:
        mem = {"ours": peak_rss_child("ours", args.batch, args.samples, "convnet_cpu")}
        if have_torch:
            mem["torch"] = peak_rss_child("eager", args.batch, args.samples, "convnet_cpu")
        print_memory(mem, args.batch)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Side-by-side CPU step time of the README's ResNet (the ResNet block net: stem cbr(32), a basic
block, a downsampling block, gap, fc) against the same layers in PyTorch eager (default and fused
AdamW) and torch.compile (fused AdamW; its compile time reported apart): 3x32x32 random images,
batch 128, label smoothing, no augmentation or EMA on either side (the step alone).

    python benchmarks/resnet_cpu.py [--samples 2560] [--rounds 3] [--no-compile]

The harness of convnet_cpu.py and mlp_cpu.py: each contender in its own process, epochs
interleaved round by round, medians.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import renaissance_nb as rnb  # noqa: E402
from machine import machine_line  # noqa: E402
from convnet_cpu import Ours, bench_args, side_by_side, torch_version  # noqa: E402
from mlp_cpu import TorchContender, our_sgemm, print_skipped, print_times  # noqa: E402


def load(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, 3, 32, 32), dtype=np.float32), rng.integers(0, 10, n).astype(np.int32)


def resnet() -> rnb.BluePrint:
    """The README's ResNet."""
    from renaissance_nb import RESNET_3_3, RESNET_3_3_DS, block, cbr, fc, gap, seq
    return seq(cbr(32, 3, 1, 1), block(32, RESNET_3_3), block(64, RESNET_3_3_DS), gap(), fc(10))


class Torch(TorchContender):
    """The same net in PyTorch (NCHW), AdamW with PyTorch's default weight decay."""

    def __init__(self, x: np.ndarray, y: np.ndarray, batch: int, mode: str = "eager") -> None:
        import torch
        from torch import nn
        torch.manual_seed(0)

        def cbr(cin: int, cout: int, s: int) -> list:
            return [nn.Conv2d(cin, cout, 3, s, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]

        class Block(nn.Module):
            def __init__(self, cin: int, cout: int, down: bool) -> None:
                super().__init__()
                self.main = nn.Sequential(*cbr(cin, cout, 2 if down else 1),
                                          nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
                self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, 2, 0, bias=False), nn.BatchNorm2d(cout))
                              if down else nn.Identity())

            def forward(self, t):  # type: ignore[no-untyped-def]
                return torch.relu(self.short(t) + self.main(t))
        model = nn.Sequential(*cbr(3, 32, 1), Block(32, 32, False), Block(32, 64, True), nn.AdaptiveAvgPool2d(1),
                              nn.Flatten(), nn.Linear(64, 10))
        super().__init__(model, x, y, batch, mode)


def make_contender(kind: str, batch: int, samples: int, data=None):  # type: ignore[no-untyped-def]
    """Build one contender ("ours", "eager", "fused", "compile")."""
    x, y = data if data is not None else load(samples)
    return Ours(x, y, batch, resnet()) if kind == "ours" else Torch(x, y, batch, kind)


def main() -> int:
    args = bench_args(2560).parse_args()
    tver = torch_version()
    print(f"{machine_line()}; numpy {np.__version__}; torch {tver}; our products: {our_sgemm()[0]}")
    r = side_by_side("resnet_cpu", args, tver != "not installed")
    print(f"ResNet block net (README), 3x32x32, batch {args.batch}, {r['steps']} steps per pass, "
          f"medians of {args.rounds} interleaved rounds")
    print_times(r)
    print_skipped(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())

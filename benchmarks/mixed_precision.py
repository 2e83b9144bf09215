"""Mixed precision on this CPU: the planned arena in bf16 and fp16 against fp32 (the seed MLP, the conv
net, the README's ResNet), the seed MLP's accuracy after the same epochs, and the step time.

    python benchmarks/mixed_precision.py [--epochs 5] [--seeds 5] [--out FILE]
    python benchmarks/mixed_precision.py --memory-only   # the arena table alone (plans only, seconds)

Memory is the plan's (task.memory_inspector.what_if(precision=...)): no training needed, the same on
every machine. Accuracy: the seed MLP (784-1024-512-256-10, AdamW, batch 128) on the embedded MNIST
digits, ``--epochs`` epochs in each precision from each of ``--seeds`` seeds (one seed's difference is a
few validation samples either way), validation top-1 at the end: the mean and the range over the
seeds. Speed: each precision's median epoch time (its validation pass included) over all its runs,
the precisions interleaved within a seed, divided by the steps of an epoch.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import numpy as np  # noqa: E402

import renaissance_nb as rnb  # noqa: E402
from convnet_mnist import convnet  # noqa: E402
from machine import machine_line  # noqa: E402
from renaissance_nb.blueprint import RESNET_3_3, RESNET_3_3_DS, block, cbr, gap  # noqa: E402
from renaissance_nb.text import human_bytes  # noqa: E402

PRECISIONS = ("fp32", "bf16", "fp16")


def seed_mlp() -> rnb.BluePrint:
    return rnb.seq(rnb.fc(1024), rnb.relu(), rnb.fc(512), rnb.relu(), rnb.fc(256), rnb.relu(), rnb.fc(10))


def tasks() -> dict[str, rnb.DeepLearningTask]:
    """The three models the table plans, each with the data shape it trains on."""
    rng = np.random.default_rng(0)
    digits = rnb.datasets.default_mnist()
    img = rng.standard_normal((256, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, 256).astype(np.int32)
    cifar = rng.standard_normal((256, 3, 32, 32), dtype=np.float32), rng.integers(0, 10, 256).astype(np.int32)
    resnet = rnb.seq(cbr(32, 3, 1, 1), block(32, RESNET_3_3), block(64, RESNET_3_3_DS), gap(), rnb.fc(10))
    return {
        "seed MLP, batch 128": rnb.DeepLearningTask().model(seed_mlp()).data(digits, batch_size=128),
        "conv net, batch 128": rnb.DeepLearningTask().model(convnet()).data(train=img, batch_size=128),
        "README ResNet, batch 128": (rnb.DeepLearningTask().model(resnet).data(train=cifar, batch_size=128)
                                     .augment(crop_pad=4, flip=True).ema(0.999)),
    }


def memory_table() -> list[str]:
    rows = ["| model | fp32 arena | bf16 arena | fp16 arena | bf16 / fp32 | bf16: in 16-bit floats | bf16: activations "
            "fp32 -> bf16 | bf16: cast buffers (T) |", "|---|---|---|---|---|---|---|---|"]
    for name, task in tasks().items():
        m = task.memory_inspector
        by = {p: m.what_if(precision=p) for p in PRECISIONS}
        b = by["bf16"]
        half = b.by_dtype().get("bfloat16", 0)
        act = (by["fp32"].by_category()["activations"], b.by_category()["activations"])
        rows.append(f"| {name} | {human_bytes(by['fp32'].arena_bytes)} | {human_bytes(b.arena_bytes)} | "
                    f"{human_bytes(by['fp16'].arena_bytes)} | {b.arena_bytes / by['fp32'].arena_bytes:.2f}x | "
                    f"{human_bytes(half)} | {human_bytes(act[0])} -> {human_bytes(act[1])} | "
                    f"{human_bytes(b.by_category()['temporaries'])} |")
    return rows


def train(precision: str, epochs: int, seed: int) -> tuple[float, float, int]:
    """(validation top-1 after ``epochs``, seconds of the last epoch, steps per epoch)."""
    task = (rnb.DeepLearningTask().model(seed_mlp()).data(rnb.datasets.default_mnist(), batch_size=128)
            .total_epochs(epochs).seed(seed).precision(precision))
    task.compile()
    result = task.run(progress=False)
    last = result.history[-1]
    return float(last.val_top1), float(last.seconds), task.config.steps_per_epoch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--memory-only", action="store_true")
    args = ap.parse_args()
    if args.memory_only:
        print("\n".join(memory_table()))
        return 0
    lines = [f"# mixed precision: {machine_line()}", "", "## The planned arena (task.memory_inspector.what_if)", ""]
    lines += memory_table()
    acc: dict[str, list[float]] = {p: [] for p in PRECISIONS}
    secs: dict[str, list[float]] = {p: [] for p in PRECISIONS}
    steps = 1
    for seed in range(args.seeds):  # interleaved: a busy machine slows every precision alike
        for p in PRECISIONS:
            top1, s, steps = train(p, args.epochs, seed)
            acc[p].append(100 * top1)
            secs[p].append(s)
    lines += ["", f"## The seed MLP on the embedded MNIST digits: {args.epochs} epochs, batch 128, AdamW, seeds 0-"
              f"{args.seeds - 1}", "", "| precision | val top-1, mean (range) | vs fp32 (points, mean) | step time (median) "
              "| vs fp32 |", "|---|---|---|---|---|"]
    base_acc, base_step = statistics.mean(acc["fp32"]), statistics.median(secs["fp32"]) / steps
    for p in PRECISIONS:
        step, mean = statistics.median(secs[p]) / steps, statistics.mean(acc[p])
        lines.append(f"| {p} | {mean:.2f}% ({min(acc[p]):.2f}-{max(acc[p]):.2f}) | {mean - base_acc:+.2f} | "
                     f"{1e3 * step:.2f} ms | {step / base_step:.2f}x |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Train the small conv net of issue 4 on the full MNIST and report test accuracy,
EMA accuracy and epoch times (the 'done means' figure; not a timed test).

    python benchmarks/convnet_mnist.py [--mnist DIR] [--epochs 5] [--batch-size 128]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import renaissance_nb as rnb  # noqa: E402
from renaissance_nb.blueprint import cbr, gap, maxpool  # noqa: E402


def convnet():  # type: ignore[no-untyped-def]
    """Three conv+bn+relu stages, two max-pools, global average pooling, fc."""
    return rnb.seq(cbr(32, 3, 1, 1), maxpool(2), cbr(64, 3, 1, 1), maxpool(2), cbr(128, 3, 1, 1), gap(), rnb.fc(10))


def resnet():  # type: ignore[no-untyped-def]
    """A small ResNet: stem, a basic block, a downsampling block, gap, fc (resolution-free)."""
    from renaissance_nb.blueprint import RESNET_3_3, RESNET_3_3_DS, block
    return rnb.seq(cbr(16, 3, 1, 1), block(16, RESNET_3_3), block(32, RESNET_3_3_DS), gap(), rnb.fc(10))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mnist", default=str(ROOT.parent / "shared" / "data" / "mnist"))
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--limit", type=int, default=0, help="use only this many training samples")
    ap.add_argument("--resnet", action="store_true", help="the ResNet with add2, progressive resizing 20 -> 28 px")
    args = ap.parse_args()
    data = rnb.datasets.mnist(args.mnist, layout="image")
    if args.limit:
        data = rnb.datasets.from_arrays((data.train.x[:args.limit], data.train.y[:args.limit]),
                                        (data.val.x, data.val.y))
    task = (rnb.DeepLearningTask("resnet" if args.resnet else "convnet")
            .model(resnet() if args.resnet else convnet()).data(data, batch_size=args.batch_size)
            .loss(rnb.CrossEntropyLoss().label_smoothing(0.1)).optimizer(rnb.AdamW().weight_decay(5e-4))
            .scheduler(rnb.CosineAnnealingLR().base_lr(3e-3).warmup(0.5)).total_epochs(args.epochs)
            .ema(0.998).seed(0))
    if args.resnet:
        task.train_resolution(20, 28, boundary_epoch=max(1, args.epochs // 2))
    t = time.perf_counter()
    task.compile()
    print(f"compile {time.perf_counter() - t:.2f}s; {task.summary().splitlines()[0]}")
    print(task.memory)
    print(task.compiled.atlas.as_text())
    r = task.run(progress="lines")
    print(r)
    last = r.history[-1]
    print(f"final test top-1 {100 * last.val_top1:.2f}% (EMA {100 * last.ema_top1:.2f}%), "
          f"median epoch {sorted(h.seconds for h in r.history)[len(r.history) // 2]:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

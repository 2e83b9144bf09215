"""Where training data comes from: one namespace for the user.

Example::

    from renaissance_nb import datasets

    data = datasets.default_mnist()                  # 5,000 real digits, offline, 4000/1000
    data = datasets.mnist("~/data/mnist", download=True, layout="image")  # full 60k/10k
    data = datasets.from_arrays((x_train, y_train), (x_val, y_val), num_classes=3)
    print(data)          # DataSplits('MNIST', train=60000, val=10000, sample_shape=(1, 28, 28), classes=10)
    data.train.x, data.train.y   # float32 (N, ...), int32 (N,)
"""
from __future__ import annotations

from .data import (
    DataSplits,
    Dataset,
    default_mnist,
    download_mnist,
    from_arrays,
    mnist,
    read_idx,
)

__all__ = ["DataSplits", "Dataset", "default_mnist", "download_mnist", "from_arrays", "mnist", "read_idx"]

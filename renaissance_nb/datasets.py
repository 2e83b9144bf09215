"""Where training data comes from: one namespace for the user.

Example::

    from renaissance_nb import datasets

    data = datasets.default_mnist()                  # 5,000 real digits, offline, 4000/1000
    data = datasets.mnist("~/data/mnist", download=True, layout="image")  # full 60k/10k
    data = datasets.cifar10("~/data/cifar10", download=True)   # 50k/10k, (N, 3, 32, 32) NCHW
    data = datasets.from_arrays((x_train, y_train), (x_val, y_val), num_classes=3)
    print(data)          # DataSplits('MNIST', train=60000, val=10000, sample_shape=(1, 28, 28), classes=10)
    data.train.x, data.train.y   # float32 (N, ...), int32 (N,)
"""
from __future__ import annotations

from .data import (
    CIFAR10_CLASSES,
    DataSplits,
    Dataset,
    cifar10,
    default_mnist,
    download_cifar10,
    download_mnist,
    from_arrays,
    mnist,
    read_idx,
    resize_bilinear,
)

__all__ = ["CIFAR10_CLASSES", "DataSplits", "Dataset", "cifar10", "default_mnist", "download_cifar10",
           "download_mnist", "from_arrays", "mnist", "read_idx", "resize_bilinear"]

"""Data sets for renaissance_nb: validated in-memory arrays, MNIST (IDX files), CIFAR-10 and the offline default."""
from __future__ import annotations

from .arrays import DataSplits, Dataset, from_arrays, make_splits, validate_arrays
from .augment import augment_draws, bilinear_weights, resize_bilinear
from .cifar import (
    CIFAR10_CLASSES,
    CIFAR10_MD5,
    CIFAR10_MEAN,
    CIFAR10_STD,
    DEFAULT_CIFAR10_URL,
    cifar10,
    download_cifar10,
    extract_cifar10,
    find_cifar10,
    read_cifar_batch,
)
from .default import default_mnist
from .mnist import (
    DEFAULT_MNIST_URL,
    MNIST_FILES,
    MNIST_MIRRORS,
    MNIST_SHA256,
    download_mnist,
    find_mnist_files,
    mnist,
    read_idx,
    verify_mnist_files,
)

__all__ = [
    "CIFAR10_CLASSES",
    "CIFAR10_MD5",
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "DEFAULT_CIFAR10_URL",
    "augment_draws",
    "bilinear_weights",
    "cifar10",
    "download_cifar10",
    "extract_cifar10",
    "find_cifar10",
    "read_cifar_batch",
    "resize_bilinear",
    "DEFAULT_MNIST_URL",
    "MNIST_FILES",
    "MNIST_MIRRORS",
    "MNIST_SHA256",
    "DataSplits",
    "Dataset",
    "default_mnist",
    "download_mnist",
    "find_mnist_files",
    "from_arrays",
    "make_splits",
    "mnist",
    "read_idx",
    "validate_arrays",
    "verify_mnist_files",
]

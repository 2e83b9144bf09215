"""Data sets for renaissance_nb: validated in-memory arrays, MNIST (IDX files) and the offline default."""
from __future__ import annotations

from .arrays import DataSplits, Dataset, from_arrays, make_splits, validate_arrays
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

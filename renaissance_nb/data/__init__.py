"""Data sets for renaissance_nb: validated in-memory arrays, MNIST (IDX files), CIFAR-10, the offline defaults
(MNIST-5k and the embedded tiny-shakespeare text), character tokens and token windows."""
from __future__ import annotations

from .arrays import DataSplits, Dataset, from_arrays, make_splits, validate_arrays, validate_tokens
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
from .corpus import CORPUS_SHA256, corpus_text, default_text
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
from .shakespeare import (
    DEFAULT_TINY_SHAKESPEARE_URL,
    TINY_SHAKESPEARE_SHA256,
    download_tiny_shakespeare,
    tiny_shakespeare,
)
from .text import tokens
from .tokenizer import CharTokenizer

__all__ = [
    "CORPUS_SHA256",
    "CharTokenizer",
    "DEFAULT_TINY_SHAKESPEARE_URL",
    "TINY_SHAKESPEARE_SHA256",
    "corpus_text",
    "default_text",
    "download_tiny_shakespeare",
    "tiny_shakespeare",
    "tokens",
    "validate_tokens",
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

"""Where training data comes from: one namespace for the user.

Example::

    from renaissance_nb import datasets

    data = datasets.default_mnist()                  # 5,000 real digits, offline, 4000/1000
    data = datasets.mnist("~/data/mnist", download=True, layout="image")  # full 60k/10k
    data = datasets.cifar10("~/data/cifar10", download=True)   # 50k/10k, (N, 3, 32, 32) NCHW
    data = datasets.from_arrays((x_train, y_train), (x_val, y_val), num_classes=3)
    print(data)          # DataSplits('MNIST', train=60000, val=10000, sample_shape=(1, 28, 28), classes=10)
    data.train.x, data.train.y   # float32 (N, ...), int32 (N,)

    text = datasets.default_text(context=128)  # tiny-shakespeare, shipped in the package: 7781/864 windows
    text.train.x, text.train.y   # int32 (N, 128) token ids; y[:, t] is the character after x[:, t]
    text.tokenizer.decode(text.train.x[0])     # the first window's 128 characters
    mine = datasets.tokens(datasets.corpus_text()[:50_000], context=64)  # windows of any str (or id array)
"""
from __future__ import annotations

from .data import (
    CIFAR10_CLASSES,
    CharTokenizer,
    DataSplits,
    Dataset,
    cifar10,
    corpus_text,
    default_mnist,
    default_text,
    download_cifar10,
    download_mnist,
    download_tiny_shakespeare,
    from_arrays,
    mnist,
    read_idx,
    resize_bilinear,
    tiny_shakespeare,
    tokens,
)

__all__ = ["CIFAR10_CLASSES", "CharTokenizer", "DataSplits", "Dataset", "cifar10", "corpus_text", "default_mnist",
           "default_text", "download_cifar10", "download_mnist", "download_tiny_shakespeare", "from_arrays", "mnist",
           "read_idx", "resize_bilinear", "tiny_shakespeare", "tokens"]

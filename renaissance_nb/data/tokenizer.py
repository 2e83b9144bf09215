"""A character tokenizer: each distinct character of a text is one token id.

Why characters: a character language model needs no trained vocabulary, so the same text gives
the same ids on every machine, and a checkpoint can carry the whole tokenizer as one short string.
Encoding and decoding go through NumPy lookups on code points (no Python loop per character), so
a megabyte of text encodes in milliseconds.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..checks import as_int
from ..errors import DataError, bad_argument

_KIND = "char"


def _code_points(text: str) -> np.ndarray:
    """The text's Unicode code points as uint32, one per character."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


def _char_name(c: str) -> str:
    return f"{c!r} (U+{ord(c):04X})"


class CharTokenizer:
    """Vocabulary = the sorted distinct characters of the text it is built from; id i is ``chars[i]``.

    ``CharTokenizer(text)`` or ``CharTokenizer.from_text(text)``; ``encode(str)`` gives int32 ids,
    ``decode(ids)`` the text back; ``to_dict()`` / ``from_dict()`` carry it in a checkpoint (JSON).
    """

    def __init__(self, text: str) -> None:
        if not isinstance(text, str) or not text:
            raise bad_argument(DataError, "CharTokenizer", "text", text, "a non-empty str (its distinct characters "
                               "become the vocabulary)", "pass the training text, e.g. CharTokenizer(open(path).read())")
        self._chars = "".join(sorted(set(text)))
        codes = _code_points(self._chars)
        self._codes = codes  # id -> code point
        self._lookup = np.full(int(codes.max()) + 1, -1, dtype=np.int32)  # code point -> id, -1 unknown
        self._lookup[codes] = np.arange(len(codes), dtype=np.int32)

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        """The tokenizer of ``text``'s characters (the same as ``CharTokenizer(text)``)."""
        return cls(text)

    @property
    def chars(self) -> str:
        """The vocabulary in id order: ``chars[i]`` is the character of id i."""
        return self._chars

    @property
    def vocab_size(self) -> int:
        return len(self._chars)

    def __len__(self) -> int:
        return self.vocab_size

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharTokenizer) and other.chars == self.chars

    def __hash__(self) -> int:
        return hash((_KIND, self._chars))

    def __repr__(self) -> str:
        shown = self._chars if len(self._chars) <= 40 else self._chars[:37] + "..."
        return f"CharTokenizer(vocab_size={self.vocab_size}, chars={shown!r})"

    def encode(self, text: str) -> np.ndarray:
        """``text`` as int32 ids (1-D, one per character); a character outside the vocabulary is a
        DataError naming it and where it is."""
        if not isinstance(text, str):
            raise bad_argument(DataError, "CharTokenizer.encode", "text", text, "a str",
                               "pass text; decode(ids) goes the other way")
        codes = _code_points(text)
        known = codes < len(self._lookup)
        ids = np.full(len(codes), -1, dtype=np.int32)
        ids[known] = self._lookup[codes[known]]
        if len(ids) and int(ids.min()) < 0:
            i = int(np.argmax(ids < 0))
            missing = sorted(set(text) - set(self._chars))
            listed = ", ".join(_char_name(c) for c in missing[:5]) + (", ..." if len(missing) > 5 else "")
            raise bad_argument(
                DataError, "CharTokenizer.encode", "text", text,
                f"only characters of this tokenizer's {self.vocab_size}-character vocabulary; "
                f"{_char_name(text[i])} at index {i} is not in it (unknown: {listed})",
                "build the tokenizer from a text that holds every character you will encode "
                "(CharTokenizer(train_text + other_text)), or remove those characters first")
        return ids

    def decode(self, ids: Any) -> str:
        """The text of ``ids`` (a 1-D sequence or array of ints in [0, vocab_size))."""
        a = _ids(ids, "CharTokenizer.decode", "ids")
        if a.ndim != 1:
            raise bad_argument(DataError, "CharTokenizer.decode", "ids", a, "a 1-D sequence of token ids",
                               "decode one row at a time, e.g. decode(ids[0]), or flatten with ids.reshape(-1)")
        check_ids(a, self.vocab_size, "CharTokenizer.decode", "ids", "decode ids made by this tokenizer")
        return self._codes[a].tobytes().decode("utf-32-le", "surrogatepass")

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: ``{"kind": "char", "chars": ...}``; ``from_dict`` rebuilds the same ids."""
        return {"kind": _KIND, "chars": self._chars}

    @classmethod
    def from_dict(cls, d: Any) -> CharTokenizer:
        """The tokenizer ``to_dict`` described (as read back from a checkpoint's JSON)."""
        chars = d.get("chars") if isinstance(d, dict) and d.get("kind") == _KIND else None
        if not isinstance(chars, str) or not chars or "".join(sorted(set(chars))) != chars:
            raise bad_argument(DataError, "CharTokenizer.from_dict", "d", d,
                               '{"kind": "char", "chars": <distinct characters in sorted order>}',
                               "pass what CharTokenizer.to_dict() returned, unchanged")
        return cls(chars)


def _ids(ids: Any, where: str, argument: str) -> np.ndarray:
    """``ids`` as an integer array, or a DataError (strings, floats, bools and ragged lists are not ids)."""
    if isinstance(ids, (str, bytes, dict, set)) or ids is None:
        a = None
    else:
        try:
            a = np.asarray(ids)
        except (ValueError, TypeError):
            a = None
        if a is not None and a.size == 0 and a.dtype.kind == "f":
            a = a.astype(np.int64)  # an empty list is read as float64: it holds no wrong id
    if a is None or a.dtype.kind not in "iu":
        raise bad_argument(DataError, where, argument, ids, "integer token ids (an int array or a list of ints)",
                           "pass ids as np.asarray(ids, dtype=np.int64); encode(text) gives them for a text")
    return a


def check_ids(a: np.ndarray, vocab: int, where: str, argument: str, fix: str) -> None:
    """Every id of ``a`` in [0, vocab), else a DataError naming the first one outside."""
    if a.size == 0 or (int(a.min()) >= 0 and int(a.max()) < vocab):
        return
    flat = int(np.argmax((a.reshape(-1) < 0) | (a.reshape(-1) >= vocab)))
    at = tuple(int(i) for i in np.unravel_index(flat, a.shape))
    raise bad_argument(DataError, where, argument, a, f"ids in [0, {vocab}) for a vocabulary of {vocab}; found "
                       f"{argument}[{', '.join(map(str, at))}]={a[at].item()}", fix)


def check_tokenizer(tokenizer: Any, where: str) -> Any:
    """``tokenizer`` when it has what the windows need (``encode``, ``decode``, an int ``vocab_size``)."""
    vocab = as_int(getattr(tokenizer, "vocab_size", None))
    if not (callable(getattr(tokenizer, "encode", None)) and callable(getattr(tokenizer, "decode", None))
            and vocab is not None and vocab >= 1):
        raise bad_argument(DataError, where, "tokenizer", tokenizer,
                           "None or a tokenizer with encode(), decode() and vocab_size (a CharTokenizer)",
                           "pass tokenizer=CharTokenizer(text), or None to build one from the text")
    return tokenizer


__all__ = ["CharTokenizer", "check_ids", "check_tokenizer"]

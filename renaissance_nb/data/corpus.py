"""The offline default text: tiny-shakespeare, shipped inside the package.

It lets a fresh install train a character language model with no network and no download step.
The file is the whole of char-rnn's ``data/tinyshakespeare/input.txt`` (1,115,394 characters of
Shakespeare's plays, public domain; collected by Andrej Karpathy for char-rnn), bzip2-compressed
to 328 KB. Its SHA-256 is checked on every first load, so every machine trains on the same bytes
and a damaged install says so instead of training on something else.
"""
from __future__ import annotations

import bz2
import hashlib
from functools import lru_cache
from importlib import resources

from ..errors import DataError, bad_argument
from .arrays import DataSplits
from .shakespeare import TINY_SHAKESPEARE_CHARS, TINY_SHAKESPEARE_SHA256
from .text import check_context, check_val_fraction, tokens, tokens_needed

CORPUS_FILE = "tinyshakespeare.txt.bz2"
#: SHA-256 of the uncompressed text: the whole of the file tiny_shakespeare() downloads.
CORPUS_SHA256 = TINY_SHAKESPEARE_SHA256
CORPUS_CHARS = TINY_SHAKESPEARE_CHARS
CORPUS_NAME = f"tiny-shakespeare (embedded, {CORPUS_CHARS:,} chars)"

_REINSTALL = "reinstall renaissance_nb (pip install --force-reinstall renaissance_nb)"


@lru_cache(maxsize=1)
def corpus_text() -> str:
    """The embedded text (checked against CORPUS_SHA256 on the first call, cached after)."""
    try:
        packed = resources.files(__package__).joinpath(CORPUS_FILE).read_bytes()
    except OSError as exc:
        raise DataError(f"corpus_text: the embedded corpus {CORPUS_FILE} is missing from the installed package "
                        f"({exc.strerror or exc}). Fix: {_REINSTALL}, or load the text with "
                        "datasets.tiny_shakespeare(root, download=True).") from None
    return unpack_corpus(packed)


def unpack_corpus(packed: bytes) -> str:
    """The text of the shipped file's bytes, or a DataError when they are not the expected text."""
    try:
        raw = bz2.decompress(packed)
    except (OSError, EOFError, ValueError) as exc:
        raw = f"<not bzip2: {exc}>".encode()
    actual = hashlib.sha256(raw).hexdigest()
    if actual != CORPUS_SHA256:
        raise DataError(f"corpus_text: the embedded corpus {CORPUS_FILE} is damaged: its text has sha256 {actual}, "
                        f"expected {CORPUS_SHA256}. Fix: {_REINSTALL}.")
    return raw.decode("utf-8")


def default_text(context: int = 128, val_fraction: float = 0.1) -> DataSplits:
    """The embedded tiny-shakespeare as character token windows (offline).

    x and y are int32 (N, context), y shifted by one token; the tokenizer (65 characters) is
    ``splits.tokenizer``; the last ``val_fraction`` of the text is validation.
    """
    c = check_context(context, "default_text")
    f = check_val_fraction(val_fraction, "default_text")
    if tokens_needed(c, f) > CORPUS_CHARS:
        raise bad_argument(DataError, "default_text", "context", context, f"a context whose windows fit in "
                           f"{CORPUS_CHARS:,} characters with val_fraction={f:g} (at most "
                           f"{_longest_context(f):,})", "pass a smaller context, e.g. context=128")
    return tokens(corpus_text(), c, val_fraction=f, name=CORPUS_NAME)


def _longest_context(val_fraction: float) -> int:
    """The longest context the corpus has one window of, in train and (when val_fraction > 0) in val."""
    lo, hi = 1, CORPUS_CHARS
    while lo < hi:  # tokens_needed grows with the context
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if tokens_needed(mid, val_fraction) <= CORPUS_CHARS else (lo, mid - 1)
    return lo


__all__ = ["CORPUS_CHARS", "CORPUS_FILE", "CORPUS_NAME", "CORPUS_SHA256", "corpus_text", "default_text"]

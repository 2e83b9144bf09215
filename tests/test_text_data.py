"""Text data: the character tokenizer, token windows (datasets.tokens), the embedded tiny-shakespeare
and its download loader (against a local HTTP server only)."""
from __future__ import annotations

import bz2
import dataclasses
import fnmatch
import hashlib
import json
import tomllib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers import serve_directory

from renaissance_nb import datasets
from renaissance_nb.data import CORPUS_SHA256, TINY_SHAKESPEARE_SHA256, validate_tokens
from renaissance_nb.data.arrays import DataSplits, Dataset, checked_splits, held_out
from renaissance_nb.data.corpus import CORPUS_FILE, unpack_corpus
from renaissance_nb.data.text import tokens_needed
from renaissance_nb.errors import DataError, DownloadError

ROOT = Path(__file__).resolve().parents[1]
SHA = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"  # char-rnn's tinyshakespeare/input.txt


# ---------------------------------------------------------------- the tokenizer


def test_vocabulary_is_the_sorted_distinct_characters() -> None:
    tok = datasets.CharTokenizer("hello world\n")
    assert tok.chars == "\n dehlorw" and tok.vocab_size == 9 and len(tok) == 9
    ids = tok.encode("hello")
    assert ids.dtype == np.int32 and ids.tolist() == [4, 3, 5, 5, 6]
    assert tok.decode(ids) == "hello" and tok.decode([8, 6, 7, 5, 2]) == "world"
    assert datasets.CharTokenizer.from_text("hello world\n") == tok
    assert repr(tok) == "CharTokenizer(vocab_size=9, chars='\\n dehlorw')"


def test_round_trip_of_unicode_and_of_the_whole_corpus() -> None:
    text = "naïve café — 東京 🙂\n"
    tok = datasets.CharTokenizer(text)
    assert tok.vocab_size == len(set(text)) == 14
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode("").tolist() == [] and tok.decode([]) == ""
    corpus = datasets.corpus_text()
    big = datasets.CharTokenizer(corpus)
    ids = big.encode(corpus)
    assert ids.shape == (1_115_394,) and big.vocab_size == 65
    assert big.decode(ids) == corpus
    assert big.chars[int(ids[0])] == "F" and big.decode(ids[:14]) == "First Citizen:"


def test_unknown_character_names_it_and_the_fix() -> None:
    tok = datasets.CharTokenizer("hello")
    with pytest.raises(DataError) as info:
        tok.encode("helloZ?")
    msg = str(info.value)
    assert "'Z' (U+005A) at index 5" in msg and "'?' (U+003F)" in msg and "4-character vocabulary" in msg
    assert "Fix: build the tokenizer from a text" in msg
    with pytest.raises(DataError, match="expected a str"):
        tok.encode(b"hello")  # type: ignore[arg-type]
    with pytest.raises(DataError, match="non-empty str"):
        datasets.CharTokenizer("")


@pytest.mark.parametrize("ids, expected", [
    ([0, 5], r"ids in \[0, 5\).*found ids\[1\]=5"),
    (np.array([-1]), r"found ids\[0\]=-1"),
    ([0.0, 1.0], "integer token ids"),
    ("01", "integer token ids"),
    (np.zeros((2, 2), np.int32), "decode one row at a time"),
])
def test_decode_refuses_what_is_not_ids(ids, expected) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(DataError, match=expected):
        datasets.CharTokenizer("abcde").decode(ids)


def test_to_dict_survives_json_and_rebuilds_the_same_ids() -> None:
    tok = datasets.CharTokenizer("To be, or not to be:\nthat is the question.")
    d = json.loads(json.dumps(tok.to_dict()))
    assert d == {"kind": "char", "chars": "\n ,.:Tabehinoqrstu"}
    back = datasets.CharTokenizer.from_dict(d)
    assert back == tok and back.encode("question").tolist() == tok.encode("question").tolist()
    for bad in ({"kind": "bpe", "chars": "ab"}, {"kind": "char", "chars": "ba"}, {"kind": "char"}, "ab", None):
        with pytest.raises(DataError, match="CharTokenizer.to_dict"):
            datasets.CharTokenizer.from_dict(bad)


# ---------------------------------------------------------------- token windows


def test_windows_are_shifted_by_one_and_split_by_position() -> None:
    text = "abcdefghij" * 20  # 200 chars: the last floor(200 * 0.1) = 20 are validation
    s = datasets.tokens(text, 4)
    tok = s.tokenizer
    assert isinstance(tok, datasets.CharTokenizer) and tok.chars == "abcdefghij"
    assert (len(s.train), len(s.val)) == (36, 4)  # 180 // 5 and 20 // 5 windows of 5 tokens
    for d in (s.train, s.val):
        assert d.x.dtype == np.int32 and d.y.dtype == np.int32 and d.x.flags.c_contiguous and d.y.flags.c_contiguous
        assert d.x.shape == d.y.shape and d.is_tokens and d.num_classes == 10 and d.tokenizer is tok
    assert s.train.x[0].tolist() == [0, 1, 2, 3] and s.train.y[0].tolist() == [1, 2, 3, 4]
    assert s.train.x[1].tolist() == [5, 6, 7, 8] and s.train.y[1].tolist() == [6, 7, 8, 9]
    np.testing.assert_array_equal(s.train.y[:, :-1], s.train.x[:, 1:])
    assert "".join(tok.decode(np.r_[x, y[-1]]) for x, y in zip(s.val.x, s.val.y)) == text[180:]
    assert (s.sample_shape, s.num_classes, s.name) == ((4,), 10, "text")
    assert repr(s) == "DataSplits('text', train=36, val=4, context=4, vocab=10)"
    assert repr(s.train) == "Dataset('text/train', N=36, context=4, vocab=10)"


def test_no_window_straddles_the_split() -> None:
    ids = np.arange(1000)  # every id distinct: where each came from is its value
    s = datasets.tokens(ids, 7, val_fraction=0.25, name="ramp")
    cut = 750
    train = np.concatenate([s.train.x.ravel(), s.train.y.ravel()])
    val = np.concatenate([s.val.x.ravel(), s.val.y.ravel()])
    assert train.max() < cut <= val.min()
    assert (len(s.train), len(s.val)) == (93, 31)  # 750 // 8, 250 // 8
    assert s.val.x[0].tolist() == list(range(750, 757)) and s.val.y[-1].tolist() == list(range(991, 998))  # 998, 999: the tail
    assert s.num_classes == 1000 and s.tokenizer is None and s.name == "ramp" and s.train.name == "ramp/train"


def test_id_streams_take_their_vocabulary_from_max_id_the_tokenizer_or_vocab_size() -> None:
    ids = np.array([0, 3, 1, 2] * 10, dtype=np.int64)
    assert datasets.tokens(ids, 3, val_fraction=0).num_classes == 4
    assert datasets.tokens(ids, 3, val_fraction=0, vocab_size=50).num_classes == 50
    tok = datasets.CharTokenizer("abcdef")
    s = datasets.tokens(list(ids), 3, tokenizer=tok, val_fraction=0)
    assert s.num_classes == 6 and s.tokenizer is tok and s.val is None and len(s.train) == 10
    with pytest.raises(DataError, match=r"ids in \[0, 3\).*found data\[1\]=3"):
        datasets.tokens(ids, 3, tokenizer=datasets.CharTokenizer("abc"))
    with pytest.raises(DataError, match="the tokenizer's vocab_size, 6"):
        datasets.tokens(ids, 3, tokenizer=tok, vocab_size=7)


def test_a_text_is_encoded_with_the_tokenizer_given() -> None:
    tok = datasets.CharTokenizer("abcdefghijklmnopqrstuvwxyz ")
    s = datasets.tokens("hello world " * 30, 5, tokenizer=tok)
    assert s.num_classes == 27 and tok.decode(s.train.x[0]) == "hello"
    with pytest.raises(DataError, match=r"'H' \(U\+0048\) at index 0"):
        datasets.tokens("Hello world " * 30, 5, tokenizer=tok)


def test_shortest_text_is_exactly_what_the_message_says() -> None:
    assert tokens_needed(8, 0.1) == 90 and tokens_needed(128, 0.1) == 1290 and tokens_needed(3, 0.0) == 4
    with pytest.raises(DataError) as info:
        datasets.tokens("ab" * 44 + "a", 8)  # 89 characters
    msg = str(info.value)
    assert "at least 90 tokens for context=8" in msg and "got 89" in msg and "val_fraction=0.1" in msg
    s = datasets.tokens("ab" * 45, 8)  # 90: one window on each side
    assert (len(s.train), len(s.val)) == (9, 1)
    for n in (tokens_needed(c, f) for c in (1, 5, 33) for f in (0.0, 0.05, 0.3, 0.5, 0.9)):
        assert n >= 2


@pytest.mark.parametrize("kwargs, expected", [
    (dict(context=0), "context=0 is invalid; expected an int >= 1"),
    (dict(context=2.5), "context=2.5"),
    (dict(context=True), "context=True"),
    (dict(val_fraction=1.0), r"val_fraction=1.0 is invalid; expected a number in \[0, 1\)"),
    (dict(val_fraction=-0.1), "val_fraction=-0.1"),
    (dict(val_fraction="0.1"), "val_fraction='0.1'"),
    (dict(name=""), "name=''"),
    (dict(data=""), "a non-empty text"),
    (dict(data=b"abcd" * 50), r"decode bytes to str first"),
    (dict(data=np.ones((4, 50), np.int32)), r"ids.reshape\(-1\)"),
    (dict(data=np.linspace(0, 1, 200)), "1-D integer array"),
    (dict(data=np.r_[np.arange(100), -3]), r"ids >= 0; found data\[100\]=-3"),
    (dict(data="a" * 200), "a vocabulary of at least 2 tokens; this one has 1"),
    (dict(tokenizer="abc"), "tokenizer='abc'"),
    (dict(vocab_size=1), "vocab_size=1"),
])
def test_bad_arguments_are_named(kwargs, expected) -> None:  # type: ignore[no-untyped-def]
    args = dict(data="abcdefgh" * 25, context=4)
    args.update(kwargs)
    with pytest.raises(DataError, match=expected) as info:
        datasets.tokens(**args)
    assert str(info.value).startswith("tokens: ") and "Fix: " in str(info.value)


# ---------------------------------------------------------------- Dataset and the splits' checks


def test_labelled_datasets_are_unchanged_and_frozen() -> None:
    d = Dataset(np.zeros((3, 2), np.float32), np.zeros(3, np.int32), 2, "flat")
    assert d.tokenizer is None and not d.is_tokens
    assert repr(d) == "Dataset('flat', N=3, sample_shape=(2,), classes=2)"
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.tokenizer = "x"  # type: ignore[misc]
    s = DataSplits(d, None, "flat")
    assert s.tokenizer is None and repr(s) == "DataSplits('flat', train=3, val=None, sample_shape=(2,), classes=2)"


def test_checked_splits_keeps_token_data_and_refuses_ids_past_the_vocabulary() -> None:
    s = datasets.tokens("abcdefgh" * 25, 4)
    checked = checked_splits(s)
    assert checked.tokenizer is s.tokenizer and checked.val is not None and checked.val.tokenizer is s.tokenizer
    np.testing.assert_array_equal(checked.train.y, s.train.y)
    x = s.train.x.copy()
    x[2, 3] = 8
    with pytest.raises(DataError, match=r"ids in \[0, 8\).*found train X\[2, 3\]=8"):
        checked_splits(DataSplits(Dataset(x, s.train.y, 8, "t"), None, "t"))
    short = Dataset(s.val.x[:, :3], s.val.y[:, :3], 8, "v")  # type: ignore[union-attr]
    with pytest.raises(DataError, match="token windows of context 4"):
        checked_splits(DataSplits(s.train, short, "t"))


def test_held_out_token_windows_are_the_last_ones() -> None:
    s = datasets.tokens(np.arange(400) % 50, 9, val_fraction=0)  # 40 windows of 10 tokens
    h = held_out(s.train, 0.25, "h")
    assert (len(h.train), len(h.val)) == (30, 10) and h.tokenizer is None  # type: ignore[arg-type]
    np.testing.assert_array_equal(h.val.x, s.train.x[30:])  # type: ignore[union-attr]
    np.testing.assert_array_equal(h.train.y, s.train.y[:30])
    tok = datasets.CharTokenizer("ab")
    t = held_out(datasets.tokens("ab" * 50, 4, tokenizer=tok, val_fraction=0).train, 0.1, "t")
    assert t.tokenizer is tok and t.val.tokenizer is tok and len(t.val) == 2  # type: ignore[union-attr]


def test_validate_tokens_converts_and_checks() -> None:
    d = validate_tokens([[1, 2], [3, 0]], np.array([[2, 3], [0, 1]], np.int64), 4)
    assert d.x.dtype == np.int32 and d.y.dtype == np.int32 and d.is_tokens and d.num_classes == 4
    with pytest.raises(DataError, match="the shape of train X"):
        validate_tokens([[1, 2]], [[1, 2, 3]], 4)
    with pytest.raises(DataError, match="integer array of shape"):
        validate_tokens([[1.5, 2]], [[1, 2]], 4)
    with pytest.raises(DataError, match="num_classes=1"):
        validate_tokens([[1, 0]], [[1, 0]], 1)


# ---------------------------------------------------------------- the embedded corpus


def test_embedded_corpus_is_tiny_shakespeare_byte_for_byte() -> None:
    text = datasets.corpus_text()
    assert CORPUS_SHA256 == TINY_SHAKESPEARE_SHA256 == SHA
    assert len(text) == 1_115_394 and hashlib.sha256(text.encode("utf-8")).hexdigest() == SHA
    assert text.startswith("First Citizen:\nBefore we proceed any further, hear me speak.\n")
    assert datasets.corpus_text() is text  # read and checked once


def test_default_text_windows() -> None:
    s = datasets.default_text()
    # 1,115,394 chars: val the last 111,539 (864 windows of 129), train the first 1,003,855 (7,781)
    assert (len(s.train), len(s.val), s.sample_shape, s.num_classes) == (7781, 864, (128,), 65)  # type: ignore[arg-type]
    assert s.name == "tiny-shakespeare (embedded, 1,115,394 chars)" and s.train.name.endswith("/train")
    text = datasets.corpus_text()
    assert s.tokenizer.decode(s.train.x[0]) == text[:128] and s.tokenizer.decode(s.train.y[0]) == text[1:129]
    assert s.tokenizer.decode(s.val.x[0]) == text[1_003_855:1_003_855 + 128]  # type: ignore[union-attr]
    small = datasets.default_text(context=32, val_fraction=0)
    assert small.val is None and len(small.train) == 1_115_394 // 33
    with pytest.raises(DataError, match=r"default_text: context=1000000 .*at most 111,538"):
        datasets.default_text(context=1_000_000)
    with pytest.raises(DataError, match="default_text: val_fraction=1"):
        datasets.default_text(val_fraction=1)


def test_a_damaged_corpus_is_refused() -> None:
    with pytest.raises(DataError, match="is damaged.*reinstall"):
        unpack_corpus(b"not bzip2")
    other = hashlib.sha256(b"Other text\n").hexdigest()
    with pytest.raises(DataError, match=f"has sha256 {other}, expected {SHA}"):
        unpack_corpus(bz2.compress(b"Other text\n"))


def test_the_wheel_ships_the_corpus() -> None:
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    shipped = ROOT / "renaissance_nb" / "data" / CORPUS_FILE
    assert shipped.is_file() and shipped.stat().st_size < 400_000
    assert "renaissance_nb.data" in conf["packages"]
    assert any(fnmatch.fnmatch(CORPUS_FILE, p) for p in conf["package-data"]["renaissance_nb.data"])


# ---------------------------------------------------------------- the download (local server only)


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """Serve the real input.txt (the embedded corpus's bytes) from 127.0.0.1; yields (url, server dir)."""
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    srv = tmp_path / "server"
    srv.mkdir()
    (srv / "input.txt").write_bytes(datasets.corpus_text().encode("utf-8"))
    with serve_directory(srv) as url:
        yield url, srv


def test_download_verifies_and_gives_the_embedded_windows(served, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    url, _ = served
    root = tmp_path / "cache" / "shakespeare"
    s = datasets.tiny_shakespeare(root, download=True, context=64, base_url=url)
    assert "downloading" in capsys.readouterr().err
    assert [p.name for p in root.iterdir()] == ["input.txt"]  # no temp file left
    assert hashlib.sha256((root / "input.txt").read_bytes()).hexdigest() == SHA
    ref = datasets.default_text(context=64)
    assert s.name == "tiny-shakespeare" and (len(s.train), len(s.val)) == (len(ref.train), len(ref.val))  # type: ignore[arg-type]
    np.testing.assert_array_equal(s.train.x, ref.train.x)
    np.testing.assert_array_equal(s.val.y, ref.val.y)  # type: ignore[union-attr]
    assert s.tokenizer == ref.tokenizer
    again = datasets.tiny_shakespeare(root, download=True, base_url="http://127.0.0.1:9/")  # never contacted
    assert again.sample_shape == (128,) and "downloading" not in capsys.readouterr().err


def test_a_download_killed_mid_transfer_is_cleared_by_the_next(served, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A download's temporary file is named and locked as every writer's (files.new_temporary): one that a
    download killed by SIGTERM or SIGKILL left (no process holds it, its pid runs no more) is removed by the
    next download into the folder (a .download-*.part file stayed for good, 163 MiB for CIFAR's archive)."""
    import subprocess
    import sys
    url, _ = served
    root = tmp_path / "tiny"
    root.mkdir()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid no process runs now
    left = root / f".rnb-{gone.pid}-killed.tmp"
    left.write_bytes(b"half a download")
    datasets.download_tiny_shakespeare(root, base_url=url, progress=False)
    assert sorted(p.name for p in root.iterdir()) == ["input.txt"]


def test_a_corrupted_download_is_refused_and_leaves_nothing(served, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, srv = served
    bad = datasets.corpus_text().replace("Citizen", "Citizan", 1).encode("utf-8")
    (srv / "input.txt").write_bytes(bad)
    root = tmp_path / "new" / "tiny"
    with pytest.raises(DownloadError) as info:
        datasets.tiny_shakespeare(root, download=True, base_url=url)
    msg = str(info.value)
    assert f"expected sha256 {SHA}, got {hashlib.sha256(bad).hexdigest()}" in msg and "Fix: " in msg
    assert isinstance(info.value, OSError) and list(tmp_path.iterdir()) == [srv.parent / "server"]
    with pytest.raises(DownloadError, match="404"):
        datasets.download_tiny_shakespeare(root, base_url=url + "missing/", progress=False)
    assert not (tmp_path / "new").exists()


def test_missing_and_damaged_local_files_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(DataError) as info:
        datasets.tiny_shakespeare(tmp_path)
    assert "input.txt" in str(info.value) and "download=True" in str(info.value) and "default_text()" in str(info.value)
    (tmp_path / "input.txt").write_text("Not Shakespeare at all.\n")
    with pytest.raises(DataError, match="has sha256 .* expected 86c4e6aa.*Fix: delete it"):
        datasets.tiny_shakespeare(tmp_path, download=True, base_url="http://127.0.0.1:9/")
    for kwargs, expected in ((dict(download="yes"), "download='yes'"), (dict(context=0), "context=0"),
                             (dict(timeout=0), "timeout=0"), (dict(val_fraction=2), "val_fraction=2"),
                             (dict(root=None), "root=None")):
        with pytest.raises(DataError, match=expected):
            datasets.tiny_shakespeare(**{"root": tmp_path, **kwargs})  # type: ignore[arg-type]

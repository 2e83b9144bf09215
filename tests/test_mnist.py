"""IDX reading, the download path (against a local HTTP server only) and real MNIST if present."""
from __future__ import annotations

import gzip
import hashlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers import serve_directory

from renaissance_nb import datasets
from renaissance_nb.data import (
    MNIST_FILES,
    download_mnist,
    find_mnist_files,
    mnist,
    read_idx,
)
from renaissance_nb.errors import DataError, DownloadError

SHARED_MNIST = Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist"

_CODES = {np.dtype(np.uint8): 0x08, np.dtype(np.int8): 0x09, np.dtype(np.int16): 0x0B,
          np.dtype(np.int32): 0x0C, np.dtype(np.float32): 0x0D, np.dtype(np.float64): 0x0E}


def idx_bytes(arr: np.ndarray) -> bytes:
    """Encode ``arr`` in the IDX format (big-endian header and payload)."""
    head = bytes([0, 0, _CODES[arr.dtype], arr.ndim]) + np.array(arr.shape, dtype=">u4").tobytes()
    return head + arr.astype(arr.dtype.newbyteorder(">")).tobytes()


def write_idx(path: Path, arr: np.ndarray, gz: bool = False) -> Path:
    data = idx_bytes(arr)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def fake_mnist(n_train: int = 12, n_test: int = 5, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": (np.arange(n_train) % 10).astype(np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": (np.arange(n_test) % 10).astype(np.uint8)[::-1].copy(),
    }


# ---------------------------------------------------------------- IDX


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
@pytest.mark.parametrize("gz", [False, True])
def test_idx_roundtrip(tmp_path: Path, dtype, gz: bool) -> None:  # type: ignore[no-untyped-def]
    arr = (np.random.default_rng(3).random((7, 4, 3)) * 100 - 50).astype(dtype)
    p = write_idx(tmp_path / "a-idx3", arr, gz=gz)  # no ".gz" suffix: detection is by magic bytes
    out = read_idx(p)
    assert out.dtype == np.dtype(dtype).newbyteorder("=") and out.shape == (7, 4, 3)
    np.testing.assert_array_equal(out, arr)


def test_idx_1d_labels(tmp_path: Path) -> None:
    labels = np.array([5, 0, 4, 1, 9], dtype=np.uint8)
    np.testing.assert_array_equal(read_idx(write_idx(tmp_path / "l.gz", labels, gz=True)), labels)


def test_idx_truncated(tmp_path: Path) -> None:
    data = idx_bytes(np.zeros((10, 28, 28), dtype=np.uint8))
    p = tmp_path / "short-idx3-ubyte"
    p.write_bytes(data[:-100])
    with pytest.raises(DataError) as info:
        read_idx(p)
    msg = str(info.value)
    assert str(p) in msg and "7840" in msg and "7740" in msg and "truncated" in msg and "Fix" in msg


def test_idx_truncated_gzip(tmp_path: Path) -> None:
    blob = gzip.compress(idx_bytes(np.arange(4000, dtype=np.int32)))
    p = tmp_path / "cut.gz"
    p.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(DataError, match="Fix"):
        read_idx(p)


def test_idx_bad_magic(tmp_path: Path) -> None:
    p = tmp_path / "notidx"
    p.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(DataError) as info:
        read_idx(p)
    assert str(p) in str(info.value) and "magic" in str(info.value)
    p.write_bytes(bytes([0, 0, 0x07, 1, 0, 0, 0, 1, 0]))  # unknown dtype code
    with pytest.raises(DataError, match="magic"):
        read_idx(p)


def test_idx_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="nope"):
        read_idx(tmp_path / "nope")


# ---------------------------------------------------------------- local folders


def test_mnist_from_folder_raw_and_gz(tmp_path: Path) -> None:
    arrays = fake_mnist()
    for i, (name, arr) in enumerate(arrays.items()):
        write_idx(tmp_path / (name + (".gz" if i % 2 else "")), arr, gz=bool(i % 2))
    assert set(find_mnist_files(tmp_path)) == set(MNIST_FILES)
    d = mnist(tmp_path, normalize=False)
    assert d.name == "MNIST" and len(d.train) == 12 and d.val is not None and len(d.val) == 5
    assert d.train.x.shape == (12, 784) and d.train.x.dtype == np.float32
    np.testing.assert_allclose(d.train.x, arrays["train-images-idx3-ubyte"].reshape(12, 784) / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(d.val.y, arrays["t10k-labels-idx1-ubyte"])
    img = datasets.mnist(tmp_path, layout="image")
    assert img.train.x.shape == (12, 1, 28, 28) and img.val.x.shape == (5, 1, 28, 28)  # type: ignore[union-attr]
    expect = (arrays["t10k-images-idx3-ubyte"][:, None] / 255.0 - 0.1307) / 0.3081
    np.testing.assert_allclose(img.val.x, expect, rtol=1e-5, atol=1e-5)  # type: ignore[union-attr]


def test_mnist_missing_files_tell_the_fix(tmp_path: Path) -> None:
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(3, dtype=np.uint8))
    with pytest.raises(DataError) as info:
        mnist(tmp_path)
    msg = str(info.value)
    assert "download=True" in msg and "train-images-idx3-ubyte" in msg and "Fix" in msg
    assert "train-labels-idx1-ubyte," not in msg  # the present one is not listed as missing


def test_mnist_verify_catches_wrong_files(tmp_path: Path) -> None:
    for name, arr in fake_mnist().items():
        write_idx(tmp_path / name, arr)
    mnist(tmp_path)  # verify=False by default: loads
    with pytest.raises(DataError, match="sha256"):
        mnist(tmp_path, verify=True)


def test_mnist_bad_layout(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="layout"):
        mnist(tmp_path, layout="nchw")


def test_a_label_byte_past_nine_names_the_label_file(tmp_path: Path) -> None:
    """The generic array check said 'raise num_classes', which mnist() has no argument for, and named no file."""
    files = fake_mnist()
    files["train-labels-idx1-ubyte"][4] = 255
    for name, arr in files.items():
        write_idx(tmp_path / name, arr)
    with pytest.raises(DataError, match=r"label 4 of .*train-labels-idx1-ubyte is 255; MNIST's labels are 0-9\. Fix: "):
        mnist(tmp_path)


# ---------------------------------------------------------------- download (local server only)


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path, dict[str, str], dict[str, np.ndarray]]]:
    """Serve fake MNIST .gz files from 127.0.0.1 on an ephemeral port; yields (url, dir, sha256s, arrays)."""
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    srv_dir = tmp_path / "server"
    srv_dir.mkdir()
    arrays = fake_mnist()
    sums = {}
    for name, arr in arrays.items():
        raw = idx_bytes(arr)
        sums[name] = hashlib.sha256(raw).hexdigest()
        (srv_dir / f"{name}.gz").write_bytes(gzip.compress(raw))

    with serve_directory(srv_dir) as url:
        yield url, srv_dir, sums, arrays


def test_download_and_load(served, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    url, _, sums, arrays = served
    root = tmp_path / "cache" / "mnist"
    files = download_mnist(root, base_url=url, checksums=sums, timeout=5)
    assert sorted(p.name for p in root.iterdir()) == sorted(f"{n}.gz" for n in MNIST_FILES)  # no temp files left
    assert {n: p.name for n, p in files.items()} == {n: f"{n}.gz" for n in MNIST_FILES}
    err = capsys.readouterr().err
    assert err.count("downloading") == 4 and "sha256 verified" in err
    for name, arr in arrays.items():
        np.testing.assert_array_equal(read_idx(files[name]), arr)
    d = mnist(root, verify=True, checksums=sums)
    assert len(d.train) == 12 and len(d.val) == 5  # type: ignore[arg-type]
    # second call: nothing missing, nothing downloaded
    download_mnist(root, base_url=url, checksums=sums)
    assert "downloading" not in capsys.readouterr().err


def test_mnist_download_true(served, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, _, sums, arrays = served
    d = mnist(tmp_path / "m", download=True, base_url=url, checksums=sums, layout="image", normalize=False)
    assert d.train.x.shape == (12, 1, 28, 28)
    np.testing.assert_array_equal(d.train.y, arrays["train-labels-idx1-ubyte"])


def test_download_checksum_mismatch_leaves_nothing(served, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, _, sums, _ = served
    wrong = dict(sums, **{"t10k-images-idx3-ubyte": "0" * 64})
    root = tmp_path / "dl"
    with pytest.raises(DownloadError) as info:
        download_mnist(root, base_url=url, checksums=wrong, progress=False)
    msg = str(info.value)
    assert "t10k-images-idx3-ubyte" in msg and "0" * 64 in msg and sums["t10k-images-idx3-ubyte"] in msg
    assert "Fix" in msg and isinstance(info.value, OSError)
    names = sorted(p.name for p in root.iterdir())
    assert "t10k-images-idx3-ubyte.gz" not in names and not any(n.startswith(".download") for n in names)
    assert names == ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"]  # earlier good files kept


def test_download_http_error_falls_through_mirrors(served, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, srv_dir, sums, _ = served
    dead = url + "missing/"  # 404 for every file
    files = download_mnist(tmp_path / "r", base_url=[dead, url], checksums=sums, progress=False)
    assert set(files) == set(MNIST_FILES)
    with pytest.raises(DownloadError) as info:
        download_mnist(tmp_path / "r2", base_url=dead, checksums=sums, progress=False)
    assert "404" in str(info.value) or "Not Found" in str(info.value)
    assert not (tmp_path / "r2").exists()  # the folder made for the download went with it


def test_a_failed_download_removes_only_the_folders_it_made(served, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, _, sums, _ = served
    (tmp_path / "kept").mkdir()
    with pytest.raises(DownloadError):
        download_mnist(tmp_path / "kept" / "a" / "b", base_url=url + "missing/", checksums=sums, progress=False)
    assert (tmp_path / "kept").is_dir() and list((tmp_path / "kept").iterdir()) == []


# ---------------------------------------------------------------- real MNIST (only where the shared folder exists)


def test_real_mnist_if_available() -> None:
    if not SHARED_MNIST.is_dir():
        pytest.skip(f"real MNIST not found at {SHARED_MNIST}; nothing to check offline")
    d = mnist(SHARED_MNIST, verify=True, normalize=False)
    assert len(d.train) == 60000 and d.val is not None and len(d.val) == 10000
    assert d.train.x.shape == (60000, 784) and d.val.x.shape == (10000, 784)
    assert d.num_classes == 10
    train_hist = np.bincount(d.train.y, minlength=10)
    val_hist = np.bincount(d.val.y, minlength=10)
    assert train_hist.sum() == 60000 and val_hist.sum() == 10000
    np.testing.assert_array_equal(train_hist, [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949])
    np.testing.assert_array_equal(val_hist, [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009])
    assert d.train.x.min() == 0.0 and d.train.x.max() == 1.0
    assert 0.12 < float(d.train.x.mean()) < 0.14  # the 0.1307 mean used for normalization
    norm = mnist(SHARED_MNIST, layout="image")
    assert norm.train.x.shape == (60000, 1, 28, 28)
    assert abs(float(norm.train.x.mean())) < 1e-3 and abs(float(norm.train.x.std()) - 1.0) < 1e-3


def test_a_root_that_cannot_be_made_leaves_no_parent_behind(tmp_path: Path) -> None:
    """mkdir(parents=True) makes the parents before the last folder fails ('File name too long')."""
    root = tmp_path / "a" / ("x" * 300)
    with pytest.raises(DownloadError, match="a writable folder"):
        download_mnist(root, base_url="http://127.0.0.1:9/", progress=False)
    assert not (tmp_path / "a").exists()


def test_downloads_get_the_umask_mode_and_a_bad_timeout_or_root_is_named(
        served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Files renamed into place from mkstemp used to stay owner-only (0600): a shared data folder was
    unreadable to everyone else. A timeout that is no positive number, and a root that cannot be
    written, are named as such, not reported as network failures of every mirror."""
    import os
    import tempfile
    url, _, sums, _ = served
    old = os.umask(0o022)
    try:
        files = download_mnist(tmp_path / "m", base_url=url, checksums=sums, progress=False)
    finally:
        os.umask(old)
    assert {oct(p.stat().st_mode & 0o777) for p in files.values()} == {"0o644"}
    for bad in ("5", -1, 0, float("nan")):
        with pytest.raises(DataError, match=r"download_mnist: timeout=.* is invalid; expected seconds > 0"):
            download_mnist(tmp_path / "t", base_url=url, checksums=sums, timeout=bad, progress=False)

    def denied(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(tempfile, "mkstemp", denied)
    with pytest.raises(DownloadError, match=r"root=.* is invalid; expected a writable folder\. Fix: choose another "
                                            r"root \(Permission denied\)"):
        download_mnist(tmp_path / "w", base_url=url, checksums=sums, progress=False)

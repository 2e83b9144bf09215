"""CIFAR-10 binary files, the loader and the download (against a local HTTP server only)."""
from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers import serve_directory

from renaissance_nb import datasets
from renaissance_nb.data import (
    CIFAR10_MD5,
    CIFAR10_MEAN,
    CIFAR10_STD,
    cifar10,
    download_cifar10,
    extract_cifar10,
    find_cifar10,
    read_cifar_batch,
)
from renaissance_nb.data.cifar import CIFAR10_ARCHIVE, CIFAR10_FILES, CIFAR10_FOLDER
from renaissance_nb.errors import DataError, DownloadError

PER_FILE = 2


def fake_cifar(seed: int = 0, per_file: int = PER_FILE) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """name -> (images uint8 (n, 3, 32, 32), labels uint8 (n,)) for the six batch files."""
    rng = np.random.default_rng(seed)
    out = {}
    for k, name in enumerate(CIFAR10_FILES):
        images = rng.integers(0, 256, (per_file, 3, 32, 32), dtype=np.uint8)
        labels = ((np.arange(per_file) + 3 * k) % 10).astype(np.uint8)
        out[name] = (images, labels)
    return out


def record_bytes(images: np.ndarray, labels: np.ndarray) -> bytes:
    table = np.concatenate([labels.reshape(-1, 1), images.reshape(len(images), -1)], axis=1)
    return table.astype(np.uint8).tobytes()


def write_folder(folder: Path, arrays: dict[str, tuple[np.ndarray, np.ndarray]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, (images, labels) in arrays.items():
        (folder / name).write_bytes(record_bytes(images, labels))
    return folder


def make_archive(path: Path, arrays: dict[str, tuple[np.ndarray, np.ndarray]], extra: list[tarfile.TarInfo] | None = None) -> bytes:
    """A cifar-10-binary.tar.gz lookalike (folder entry, six files, a readme like the real one)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        d = tarfile.TarInfo(CIFAR10_FOLDER)
        d.type = tarfile.DIRTYPE
        d.mode = 0o755
        tar.addfile(d)
        files = {name: record_bytes(*arr) for name, arr in arrays.items()}
        files["batches.meta.txt"] = b"\n".join(n.encode() for n in datasets.CIFAR10_CLASSES)
        for name, data in files.items():
            info = tarfile.TarInfo(f"{CIFAR10_FOLDER}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra or []:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isfile() else None)
    blob = buf.getvalue()
    path.write_bytes(blob)
    return blob


def expected_x(images: np.ndarray, normalize: bool) -> np.ndarray:
    x = images.astype(np.float64) / 255.0
    if normalize:
        x = (x - np.array(CIFAR10_MEAN).reshape(1, 3, 1, 1)) / np.array(CIFAR10_STD).reshape(1, 3, 1, 1)
    return x


# ---------------------------------------------------------------- local folders


def test_read_batch_file(tmp_path: Path) -> None:
    arrays = fake_cifar(per_file=3)
    folder = write_folder(tmp_path / CIFAR10_FOLDER, arrays)
    images, labels = read_cifar_batch(folder / "data_batch_2.bin")
    assert images.shape == (3, 3, 32, 32) and images.dtype == np.uint8 and labels.dtype == np.uint8
    np.testing.assert_array_equal(images, arrays["data_batch_2.bin"][0])
    np.testing.assert_array_equal(labels, arrays["data_batch_2.bin"][1])


def test_load_from_folder(tmp_path: Path) -> None:
    arrays = fake_cifar()
    write_folder(tmp_path / CIFAR10_FOLDER, arrays)
    assert find_cifar10(tmp_path) == tmp_path / CIFAR10_FOLDER
    d = cifar10(tmp_path)
    assert d.name == "CIFAR-10" and d.num_classes == 10 and d.val is not None
    assert d.train.x.shape == (5 * PER_FILE, 3, 32, 32) and d.val.x.shape == (PER_FILE, 3, 32, 32)
    assert d.train.x.dtype == np.float32 and d.train.y.dtype == np.int32 and d.train.x.flags.c_contiguous
    assert d.train.name == "CIFAR-10/train" and d.val.name == "CIFAR-10/val"
    train_imgs = np.concatenate([arrays[f"data_batch_{i}.bin"][0] for i in range(1, 6)])
    train_lbls = np.concatenate([arrays[f"data_batch_{i}.bin"][1] for i in range(1, 6)])
    np.testing.assert_array_equal(d.train.y, train_lbls)
    np.testing.assert_array_equal(d.val.y, arrays["test_batch.bin"][1])
    np.testing.assert_allclose(d.train.x, expected_x(train_imgs, True), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(d.val.x, expected_x(arrays["test_batch.bin"][0], True), rtol=1e-5, atol=1e-5)
    # channel-major records: plane 0 of the first image is the red channel, i.e. bytes 1..1024
    raw = (tmp_path / CIFAR10_FOLDER / "data_batch_1.bin").read_bytes()
    red = np.frombuffer(raw, np.uint8, count=1024, offset=1).reshape(32, 32)
    np.testing.assert_allclose(d.train.x[0, 0], (red / 255.0 - 0.4914) / 0.2470, rtol=1e-5, atol=1e-5)
    raw_x = datasets.cifar10(tmp_path / CIFAR10_FOLDER, normalize=False)  # root may be the folder itself
    np.testing.assert_allclose(raw_x.train.x, train_imgs / 255.0, rtol=1e-6)
    assert raw_x.train.x.min() >= 0.0 and raw_x.train.x.max() <= 1.0


def test_truncated_file_is_a_data_error(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / CIFAR10_FOLDER, fake_cifar())
    p = folder / "data_batch_3.bin"
    p.write_bytes(p.read_bytes()[:-100])
    with pytest.raises(DataError) as info:
        cifar10(tmp_path)
    msg = str(info.value)
    assert str(p) in msg and "3073" in msg and "truncated" in msg and "Fix" in msg and "download=True" in msg
    p.write_bytes(b"")
    with pytest.raises(DataError, match="empty"):
        read_cifar_batch(p)


def test_bad_label_and_missing_files(tmp_path: Path) -> None:
    arrays = fake_cifar()
    folder = write_folder(tmp_path / CIFAR10_FOLDER, arrays)
    images, labels = arrays["test_batch.bin"]
    (folder / "test_batch.bin").write_bytes(record_bytes(images, np.array([1, 17], np.uint8)))
    with pytest.raises(DataError, match="label 17"):
        cifar10(tmp_path)
    (folder / "test_batch.bin").unlink()
    (folder / "data_batch_4.bin").unlink()
    with pytest.raises(DataError) as info:
        cifar10(tmp_path)
    msg = str(info.value)
    assert "data_batch_4.bin" in msg and "test_batch.bin" in msg and "data_batch_1.bin" not in msg
    assert "download=True" in msg and "Fix" in msg
    with pytest.raises(DataError, match="normalize"):
        cifar10(tmp_path, normalize="yes")  # type: ignore[arg-type]


# ---------------------------------------------------------------- download (local server only)


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path, bytes, dict]]:
    """Serve a fake cifar-10-binary.tar.gz from 127.0.0.1; yields (url, server dir, archive bytes, arrays)."""
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    srv_dir = tmp_path / "server"
    srv_dir.mkdir()
    arrays = fake_cifar(seed=5)
    blob = make_archive(srv_dir / CIFAR10_ARCHIVE, arrays)

    with serve_directory(srv_dir) as url:
        yield url, srv_dir, blob, arrays


def test_download_and_load(served, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    url, _, blob, arrays = served
    root = tmp_path / "cache" / "cifar"
    sha = hashlib.sha256(blob).hexdigest()
    d = cifar10(root, download=True, base_url=url, sha256=sha)
    err = capsys.readouterr().err
    assert "downloading" in err and "sha256 verified" in err
    assert sorted(p.name for p in root.iterdir()) == sorted([CIFAR10_ARCHIVE, CIFAR10_FOLDER])  # no temp left
    extracted = sorted(p.name for p in (root / CIFAR10_FOLDER).iterdir())
    assert extracted == sorted([*CIFAR10_FILES, "batches.meta.txt"])
    assert (root / CIFAR10_ARCHIVE).read_bytes() == blob
    assert d.train.x.shape == (10, 3, 32, 32) and d.val.x.shape == (2, 3, 32, 32)  # type: ignore[union-attr]
    np.testing.assert_array_equal(d.val.y, arrays["test_batch.bin"][1])  # type: ignore[union-attr]
    np.testing.assert_allclose(d.val.x, expected_x(arrays["test_batch.bin"][0], True),  # type: ignore[union-attr]
                               rtol=1e-5, atol=1e-5)
    # second call: the folder is there, nothing is downloaded (even from a dead URL)
    again = cifar10(root, download=True, base_url="http://127.0.0.1:9/", sha256=sha)
    np.testing.assert_array_equal(again.train.x, d.train.x)
    assert "downloading" not in capsys.readouterr().err


def test_download_with_md5(served, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, _, blob, _ = served
    md5 = hashlib.md5(blob).hexdigest()
    folder = download_cifar10(tmp_path / "m", base_url=url, md5=md5, progress=False)
    assert folder == tmp_path / "m" / CIFAR10_FOLDER and find_cifar10(tmp_path / "m") == folder


def test_default_checks_the_published_md5(served, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, _, blob, _ = served
    root = tmp_path / "d"
    with pytest.raises(DownloadError) as info:
        download_cifar10(root, base_url=url, progress=False)  # sha256=None: the fake is not the real archive
    msg = str(info.value)
    assert CIFAR10_MD5 in msg and hashlib.md5(blob).hexdigest() in msg and "Fix" in msg
    assert not root.exists()  # nothing left, not even the folder made for it


def test_checksum_mismatch_leaves_nothing(served, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, _, blob, _ = served
    root = tmp_path / "bad"
    with pytest.raises(DownloadError) as info:
        cifar10(root, download=True, base_url=url, sha256="0" * 64)
    msg = str(info.value)
    assert "0" * 64 in msg and hashlib.sha256(blob).hexdigest() in msg and "Fix" in msg
    assert isinstance(info.value, OSError)
    assert not root.exists()  # no archive, no .part file, no folder, not even root
    with pytest.raises(DownloadError, match="hex digits"):
        download_cifar10(root, base_url=url, sha256="abc")


def test_http_error(served, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, _, _, _ = served
    root = tmp_path / "r"
    with pytest.raises(DownloadError) as info:
        download_cifar10(root, base_url=url + "missing/", progress=False)
    assert ("404" in str(info.value) or "Not Found" in str(info.value)) and "Fix" in str(info.value)
    assert not root.exists()


def test_archive_copied_by_hand_is_verified_and_used(tmp_path: Path) -> None:
    root = tmp_path / "hand"
    root.mkdir()
    blob = make_archive(root / CIFAR10_ARCHIVE, fake_cifar(seed=2))
    dead = "http://127.0.0.1:9/"  # never contacted
    with pytest.raises(DownloadError, match="already in root"):
        download_cifar10(root, base_url=dead, sha256="1" * 64, progress=False)
    d = cifar10(root, download=True, base_url=dead, sha256=hashlib.sha256(blob).hexdigest())
    assert len(d.train) == 10


def test_a_failed_download_leaves_no_folder_behind(tmp_path: Path) -> None:
    with pytest.raises(DownloadError, match="could not download"):
        download_cifar10(tmp_path / "new" / "cifar", base_url="http://127.0.0.1:9/", progress=False)
    assert list(tmp_path.iterdir()) == []  # it used to leave the empty folders it made


def test_a_failed_extraction_into_a_new_root_leaves_no_folder_behind(tmp_path: Path) -> None:
    (tmp_path / "junk.tar.gz").write_bytes(b"not an archive")
    with pytest.raises(DownloadError, match="readable"):
        extract_cifar10(tmp_path / "junk.tar.gz", tmp_path / "new" / "cifar")
    assert [p.name for p in tmp_path.iterdir()] == ["junk.tar.gz"]  # it used to leave new/cifar/
    archive = tmp_path / CIFAR10_ARCHIVE
    make_archive(archive, fake_cifar())
    assert extract_cifar10(archive, tmp_path / "new" / "cifar") == tmp_path / "new" / "cifar" / CIFAR10_FOLDER


@pytest.mark.parametrize("bad_name", ["../evil.bin", "/tmp/abs_evil.bin", f"{CIFAR10_FOLDER}/../../evil.bin"])
def test_unsafe_archive_members_are_refused(tmp_path: Path, bad_name: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    info = tarfile.TarInfo(bad_name)
    info.size = 4
    make_archive(root / CIFAR10_ARCHIVE, fake_cifar(), extra=[info])
    with pytest.raises(DownloadError) as err:
        extract_cifar10(root / CIFAR10_ARCHIVE, root)
    assert repr(bad_name) in str(err.value) and "Fix" in str(err.value)
    assert sorted(p.name for p in root.iterdir()) == [CIFAR10_ARCHIVE]  # nothing extracted, no temp folder
    assert not (tmp_path / "evil.bin").exists()


def test_links_in_archive_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    link = tarfile.TarInfo(f"{CIFAR10_FOLDER}/passwd")
    link.type = tarfile.SYMTYPE
    link.linkname = "/etc/passwd"
    make_archive(root / CIFAR10_ARCHIVE, fake_cifar(), extra=[link])
    with pytest.raises(DownloadError, match="link"):
        extract_cifar10(root / CIFAR10_ARCHIVE, root)
    assert sorted(p.name for p in root.iterdir()) == [CIFAR10_ARCHIVE]


def test_wrong_archive_content(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    arrays = fake_cifar()
    del arrays["test_batch.bin"]
    make_archive(root / CIFAR10_ARCHIVE, arrays)
    with pytest.raises(DownloadError, match="test_batch.bin"):
        extract_cifar10(root / CIFAR10_ARCHIVE, root)
    (root / "junk.tar.gz").write_bytes(b"not a tar at all")
    with pytest.raises(DownloadError, match="Fix"):
        extract_cifar10(root / "junk.tar.gz", root)
    assert sorted(p.name for p in root.iterdir()) == sorted([CIFAR10_ARCHIVE, "junk.tar.gz"])


def test_the_archive_and_folder_get_the_umask_mode(served, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """mkstemp/mkdtemp made them owner-only (0600/0700): a shared data folder unreadable to others."""
    import os
    url, _, blob, _ = served
    old = os.umask(0o022)
    try:
        folder = download_cifar10(tmp_path / "c", base_url=url, sha256=hashlib.sha256(blob).hexdigest(),
                                  progress=False)
    finally:
        os.umask(old)
    assert oct((tmp_path / "c" / CIFAR10_ARCHIVE).stat().st_mode & 0o777) == "0o644"
    assert oct(folder.stat().st_mode & 0o777) == "0o755"
    assert {oct(p.stat().st_mode & 0o777) for p in folder.iterdir()} == {"0o644"}
    with pytest.raises(DataError, match=r"timeout=-1 is invalid; expected seconds > 0"):
        download_cifar10(tmp_path / "d", base_url=url, timeout=-1, progress=False)


def test_a_folder_unpacked_meanwhile_by_another_call_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two calls unpacking into one root: the second's rename finds the first's folder (ENOTEMPTY)."""
    import os
    from renaissance_nb.data import cifar as cifar_mod
    root = tmp_path / "r"
    root.mkdir()
    arrays = fake_cifar(seed=3)
    make_archive(root / CIFAR10_ARCHIVE, arrays)
    real_replace = os.replace

    def racing(src, dst):  # type: ignore[no-untyped-def]
        if Path(dst).name == CIFAR10_FOLDER and not Path(dst).exists():
            write_folder(Path(dst), arrays)  # the other call finishes first
        return real_replace(src, dst)
    monkeypatch.setattr(cifar_mod.os, "replace", racing)
    folder = cifar_mod.extract_cifar10(root / CIFAR10_ARCHIVE, root)
    assert folder == root / CIFAR10_FOLDER and not [p for p in root.iterdir() if p.name.startswith(".extract")]
    assert len(cifar10(root).train) == 10

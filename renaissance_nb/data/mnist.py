"""MNIST from the four standard IDX files: read (raw or gzip), find, download, verify.

The files are read from any folder, so the same loader serves a user's cache, a shared
data folder or a test fixture; downloads are checked against the SHA-256 of the original
uncompressed distribution so a bad mirror can never feed silently corrupted data.
"""
from __future__ import annotations

import gzip
import hashlib
import os
import sys
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ..errors import DataError, DownloadError, bad_argument
from .arrays import DataSplits, Dataset, check_flag, check_path, validate_arrays
from .download import check_timeout, check_writable, download_folder, fetch, fetch_or_why, unreadable

MNIST_FILES: tuple[str, ...] = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)

MNIST_SHA256: dict[str, str] = {
    "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
    "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
    "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
}

DEFAULT_MNIST_URL = "https://ossci-datasets.s3.amazonaws.com/mnist/"
#: Tried in order when ``base_url`` is left at its default.
MNIST_MIRRORS: tuple[str, ...] = (
    DEFAULT_MNIST_URL,
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "https://yann.lecun.com/exdb/mnist/",
)

MNIST_MEAN = 0.1307
MNIST_STD = 0.3081

_GZIP_MAGIC = b"\x1f\x8b"
_IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def _read_bytes(path: Path) -> bytes:
    """The file's uncompressed content; gzip is detected by its magic bytes, not the name."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise bad_argument(
            DataError, "read_idx", "path", str(path), "a readable IDX file (raw or .gz)",
            f"check the path ({exc.strerror or exc})",
        ) from None
    if raw[:2] != _GZIP_MAGIC:
        return raw
    try:
        return gzip.decompress(raw)
    except (EOFError, OSError, zlib.error) as exc:
        raise bad_argument(
            DataError, "read_idx", "path", str(path), f"a complete gzip file (decompression failed: {exc})",
            "the file is truncated or corrupted: delete it and download it again",
        ) from None


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read one IDX file (raw or gzip) into an array of native byte order, checking the header."""
    path = check_path(path, "read_idx", "path", "~/data/mnist/train-images-idx3-ubyte.gz")
    data = _read_bytes(path)
    where = "read_idx"
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise bad_argument(
            DataError, where, "path", str(path),
            f"an IDX file starting with magic 00 00 <dtype code> <ndim>; got {data[:4].hex(' ') or 'empty file'}",
            "this is not an IDX file (or it is corrupted): point at the MNIST *-ubyte files",
        )
    dtype = _IDX_DTYPES[data[2]]
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise bad_argument(
            DataError, where, "path", str(path), f"a header of {header} bytes for {ndim} dims; file has {len(data)}",
            "the file is truncated: delete it and download it again",
        )
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    actual = len(data) - header
    if actual != expected:
        state = "truncated" if actual < expected else "longer than its header says"
        raise bad_argument(
            DataError, where, "path", str(path),
            f"{expected} payload bytes for dims {dims} of {dtype.name}; found {actual} ({state})",
            "the file is damaged: delete it and download it again",
        )
    arr = np.frombuffer(data, dtype=dtype, offset=header).reshape(dims)
    return arr.astype(dtype.newbyteorder("="), copy=True)


def find_mnist_files(root: str | os.PathLike[str]) -> dict[str, Path]:
    """Map each MNIST file name to ``root/NAME`` or ``root/NAME.gz`` where one exists (raw preferred)."""
    root = check_path(root, "find_mnist_files", "root", "~/data/mnist").expanduser()
    found: dict[str, Path] = {}
    try:
        for name in MNIST_FILES:
            for candidate in (root / name, root / f"{name}.gz"):
                if candidate.is_file():
                    found[name] = candidate
                    break
    except OSError as exc:  # a folder on the way that this user may not enter
        raise unreadable("mnist", root, exc) from None
    return found


def _sha256_uncompressed(path: Path) -> str:
    """SHA-256 of the file's uncompressed bytes (gunzipped if it is gzip)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        is_gz = f.read(2) == _GZIP_MAGIC
    opener = gzip.open if is_gz else open
    try:
        with opener(path, "rb") as f:  # type: ignore[operator]
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except (EOFError, OSError, zlib.error) as exc:
        return f"<unreadable: {exc}>"
    return h.hexdigest()


def _mirrors(base_url: str | Sequence[str]) -> list[str]:
    if isinstance(base_url, str):
        urls = list(MNIST_MIRRORS) if base_url == DEFAULT_MNIST_URL else [base_url]
    else:
        urls = list(base_url)
    if not urls or not all(isinstance(u, str) and u for u in urls):
        raise bad_argument(
            DownloadError, "download_mnist", "base_url", base_url, "a URL string (or a list of mirror URLs)",
            f"pass e.g. base_url={DEFAULT_MNIST_URL!r}",
        )
    return [u if u.endswith("/") else u + "/" for u in urls]


_fetch = fetch


def download_mnist(
    root: str | os.PathLike[str],
    *,
    base_url: str | Sequence[str] = DEFAULT_MNIST_URL,
    checksums: Mapping[str, str] = MNIST_SHA256,
    timeout: float = 30,
    progress: bool = True,
) -> dict[str, Path]:
    """Download the missing ``NAME.gz`` files into ``root``, verify them, and return all four paths.

    Each file goes to a temp file, is checked against ``checksums`` (SHA-256 of the
    uncompressed bytes) and only then renamed into place, so ``root`` never holds a
    partial or corrupt file.
    """
    root = check_path(root, "download_mnist", "root", "~/data/mnist").expanduser()
    urls = _mirrors(base_url)
    timeout = check_timeout("download_mnist", timeout)
    with download_folder(root, "download_mnist"):
        found = find_mnist_files(root)
        if len(found) < len(MNIST_FILES):
            check_writable("download_mnist", root)
        for name in MNIST_FILES:
            if name in found:
                continue
            if name not in checksums:
                raise bad_argument(
                    DownloadError, "download_mnist", "checksums", dict(checksums), f"a SHA-256 for every file, missing {name!r}",
                    "pass checksums=MNIST_SHA256 (or your own dict covering all four files)",
                )
            expected = checksums[name].lower()
            failures: list[str] = []
            for url_base in urls:
                url = f"{url_base}{name}.gz"
                if progress:
                    print(f"MNIST: downloading {url} ...", file=sys.stderr, flush=True)
                tmp, why = fetch_or_why(url, root, timeout, _fetch)
                if tmp is None:
                    failures.append(f"{url}: {why}")
                    continue
                actual = _sha256_uncompressed(tmp)
                if actual != expected:
                    tmp.unlink(missing_ok=True)
                    failures.append(f"{url}: checksum mismatch for {name}, expected sha256 {expected}, got {actual}")
                    continue
                dest = root / f"{name}.gz"
                os.replace(tmp, dest)
                found[name] = dest
                if progress:
                    print(f"MNIST: {name}.gz ok ({dest.stat().st_size:,} bytes, sha256 verified)", file=sys.stderr, flush=True)
                break
            else:
                raise DownloadError(
                    f"download_mnist: could not get {name}.gz into {root}. Tried: " + "; ".join(failures)
                    + f". Fix: check the network or base_url, or copy the four MNIST files into {root} yourself."
                )
    return found


def verify_mnist_files(files: Mapping[str, Path], checksums: Mapping[str, str] = MNIST_SHA256) -> None:
    """Raise DataError for any file whose uncompressed SHA-256 differs from ``checksums``."""
    for name, path in files.items():
        expected = checksums.get(name)
        if expected is None:
            continue
        actual = _sha256_uncompressed(path)
        if actual != expected.lower():
            raise DataError(
                f"mnist: file {path} has sha256 {actual}, expected {expected}. "
                "Fix: delete it and call mnist(..., download=True), or copy an intact file there."
            )


def _to_dataset(images: np.ndarray, labels: np.ndarray, what: str, layout: str, normalize: bool, path: Path,
                labels_path: Path) -> Dataset:
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise bad_argument(
            DataError, "mnist", "root", str(path.parent),
            f"image files of shape (N, rows, cols) with N labels; got images {images.shape}, labels {labels.shape}",
            "the MNIST files are mismatched: use the four files of one distribution",
        )
    if labels.size and int(labels.max()) >= 10:  # a label byte past 9: the file is damaged or not MNIST's
        i = int(np.argmax(labels >= 10))
        raise DataError(f"mnist: label {i} of {labels_path} is {int(labels[i])}; MNIST's labels are 0-9. Fix: the file "
                        "is damaged or not MNIST's: delete it and call mnist(..., download=True), or copy an intact "
                        "file there.")
    n, rows, cols = images.shape
    x = images.astype(np.float32)
    x *= np.float32(1.0 / 255.0)
    if normalize:
        x -= np.float32(MNIST_MEAN)
        x *= np.float32(1.0 / MNIST_STD)
    x = x.reshape(n, rows * cols) if layout == "flat" else x.reshape(n, 1, rows, cols)
    ds = validate_arrays(x, labels, what=what, num_classes=10, where="mnist")
    return Dataset(ds.x, ds.y, ds.num_classes, f"MNIST/{what}")


def check_layout(layout: str, where: str) -> None:
    """'flat' -> (N, 784) for dense nets; 'image' -> (N, 1, 28, 28) for conv nets."""
    if layout not in ("flat", "image"):
        raise bad_argument(
            DataError, where, "layout", layout, "'flat' for (N, 784) or 'image' for (N, 1, 28, 28)",
            "pass layout='flat' for dense models or layout='image' for convolutional models",
        )


def mnist(
    root: str | os.PathLike[str] = "~/data/mnist",
    *,
    download: bool = False,
    layout: str = "flat",
    normalize: bool = True,
    verify: bool = False,
    base_url: str | Sequence[str] = DEFAULT_MNIST_URL,
    checksums: Mapping[str, str] = MNIST_SHA256,
) -> DataSplits:
    """Load MNIST from ``root``: train = the 60k training files, val = the 10k test files.

    ``normalize`` gives ``(pixel/255 - 0.1307) / 0.3081`` (else ``pixel/255``). Local
    files are hash-checked only with ``verify=True`` (hashing costs time); downloads
    are always checked.
    """
    check_layout(layout, "mnist")
    root_p = check_path(root, "mnist", "root", "~/data/mnist").expanduser()
    download = check_flag(download, "mnist", "download", "pass download=True to fetch missing files, else False")
    normalize = check_flag(normalize, "mnist", "normalize",
                           "pass normalize=True for mean/std scaling or False for pixel/255")
    verify = check_flag(verify, "mnist", "verify", "pass verify=True to hash-check local files, else False")
    files = find_mnist_files(root_p)
    missing = [n for n in MNIST_FILES if n not in files]
    if missing:
        if not download:
            raise bad_argument(
                DataError, "mnist", "root", str(root_p),
                f"a folder holding the four MNIST files (raw or .gz); missing {', '.join(missing)}",
                "pass download=True to fetch them, or point root at a folder that contains them",
            )
        files = download_mnist(root_p, base_url=base_url, checksums=checksums)
    if verify:
        verify_mnist_files(files, checksums)
    tr_i, tr_l, te_i, te_l = (files[n] for n in MNIST_FILES)
    train = _to_dataset(read_idx(tr_i), read_idx(tr_l), "train", layout, normalize, tr_i, tr_l)
    val = _to_dataset(read_idx(te_i), read_idx(te_l), "val", layout, normalize, te_i, te_l)
    return DataSplits(train=train, val=val, name="MNIST")

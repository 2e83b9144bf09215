"""CIFAR-10 from its "binary version" files (and their download, checksummed).

Layout of the distribution (https://www.cs.toronto.edu/~kriz/cifar.html): the archive
``cifar-10-binary.tar.gz`` holds a folder ``cifar-10-batches-bin/`` with the training
files ``data_batch_1.bin`` .. ``data_batch_5.bin`` (10,000 images each) and
``test_batch.bin`` (10,000 images). Every record is 3,073 bytes: one label byte (0..9)
then 3,072 pixel bytes, the 32x32 red plane, then green, then blue (channel-major, rows
top to bottom), so a file reshapes straight to (N, 3, 32, 32).

The loader gives NCHW float32 images (the layout every data set in this package uses;
the image transfer kernel turns them channels-last on the way into the arena) and
int32 labels. The download goes to a temp file next to its destination, is checked
(SHA-256 when given, else the MD5 the CIFAR page publishes) and only then renamed into
place; the archive is unpacked member by member with path checks, into a temp folder
that is renamed into place at the end, so ``root`` never holds a partial data set.
"""
from __future__ import annotations

import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

import numpy as np

from ..errors import DataError, DownloadError, bad_argument
from .arrays import DataSplits, Dataset, check_flag, check_path, validate_arrays
from ..files import with_default_mode
from .download import (check_timeout, check_writable, download_folder, fetch, fetch_or_why, file_digest, unreadable,
                       unwritable)

#: Where the archive is published (the page https://www.cs.toronto.edu/~kriz/cifar.html links it).
DEFAULT_CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/"
CIFAR10_ARCHIVE = "cifar-10-binary.tar.gz"
#: The MD5 the CIFAR page publishes for ``cifar-10-binary.tar.gz`` (used when no SHA-256 is given).
CIFAR10_MD5 = "c32a1d4ab5d03f1284b67883e8d87530"
CIFAR10_FOLDER = "cifar-10-batches-bin"
CIFAR10_TRAIN_FILES: tuple[str, ...] = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
CIFAR10_TEST_FILE = "test_batch.bin"
CIFAR10_FILES: tuple[str, ...] = CIFAR10_TRAIN_FILES + (CIFAR10_TEST_FILE,)
CIFAR10_CLASSES: tuple[str, ...] = (
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
)
#: Per-channel (R, G, B) mean and std of the training pixels scaled to [0, 1].
CIFAR10_MEAN: tuple[float, float, float] = (0.4914, 0.4822, 0.4465)
CIFAR10_STD: tuple[float, float, float] = (0.2470, 0.2435, 0.2616)

_RECORD = 1 + 3 * 32 * 32
_NAME = "CIFAR-10"


# --------------------------------------------------------------------------- reading


def read_cifar_batch(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray]:
    """One binary-version batch file -> (images uint8 (N, 3, 32, 32), labels uint8 (N,)).

    Raises DataError for an unreadable, empty or truncated file, or a label outside 0..9.
    """
    where = "cifar10"
    path = check_path(path, where, "path", "~/data/cifar10/cifar-10-batches-bin/test_batch.bin")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise bad_argument(
            DataError, where, "path", str(path), "a readable CIFAR-10 batch file",
            f"check the path ({exc.strerror or exc})",
        ) from None
    if len(raw) == 0 or len(raw) % _RECORD:
        whole, rest = divmod(len(raw), _RECORD)
        state = "empty" if not raw else f"{whole} whole records and {rest} stray bytes: truncated or not a CIFAR-10 file"
        raise bad_argument(
            DataError, where, "path", str(path),
            f"a whole number of {_RECORD}-byte records (1 label byte + 3x32x32 pixels); "
            f"{path} has {len(raw)} bytes ({state})",
            "the file is damaged: delete the cifar-10-batches-bin folder and load with download=True "
            "(or unpack cifar-10-binary.tar.gz again)",
        )
    table = np.frombuffer(raw, dtype=np.uint8).reshape(-1, _RECORD)
    labels = table[:, 0].copy()
    if labels.max() > 9:
        i = int(np.argmax(labels > 9))
        raise bad_argument(
            DataError, where, "path", str(path),
            f"label bytes in 0..9; record {i} of {path} has label {int(labels[i])}",
            "this is not a CIFAR-10 binary file (CIFAR-100 has two label bytes): point root at cifar-10-batches-bin",
        )
    images = table[:, 1:].reshape(-1, 3, 32, 32).copy()
    return images, labels


def find_cifar10(root: str | os.PathLike[str]) -> Path | None:
    """The folder holding the six batch files: ``root/cifar-10-batches-bin`` or ``root`` itself."""
    root = check_path(root, "find_cifar10", "root", "~/data/cifar10").expanduser()
    try:
        for folder in (root / CIFAR10_FOLDER, root):
            if all((folder / name).is_file() for name in CIFAR10_FILES):
                return folder
    except OSError as exc:  # a folder on the way that this user may not enter
        raise unreadable("cifar10", root, exc) from None
    return None


def _missing(root: Path) -> list[str]:
    folder = root / CIFAR10_FOLDER if (root / CIFAR10_FOLDER).is_dir() else root
    return [n for n in CIFAR10_FILES if not (folder / n).is_file()]


# --------------------------------------------------------------------------- download


def _expected_digests(sha256: str | None, md5: str | None, where: str) -> list[tuple[str, str]]:
    """[(algorithm, hex)] to check: the SHA-256 when given (plus an explicit MD5), else the published MD5."""
    checks: list[tuple[str, str]] = []
    for algo, value, length in (("sha256", sha256, 64), ("md5", md5, 32)):
        if value is None:
            continue
        v = value.lower() if isinstance(value, str) else value
        if not isinstance(v, str) or len(v) != length or any(c not in "0123456789abcdef" for c in v):
            raise bad_argument(
                DownloadError, where, algo, value, f"None or {length} hex digits",
                f"pass the archive's {algo.upper()} as a hex string, e.g. from `{algo}sum {CIFAR10_ARCHIVE}`",
            )
        checks.append((algo, v))
    if not checks:
        checks.append(("md5", CIFAR10_MD5))
    return checks


def _verify(path: Path, checks: list[tuple[str, str]]) -> str | None:
    """None when every digest matches, else a sentence naming the first mismatch (as the archive:
    a download is checked in a temporary file whose name would tell the user nothing)."""
    for algo, expected in checks:
        actual = file_digest(path, algo)
        if actual != expected:
            return f"checksum mismatch for {CIFAR10_ARCHIVE}: expected {algo} {expected}, got {actual}"
    return None


_fetch = fetch


def _safe_member_path(name: str) -> PurePosixPath | None:
    """The member's relative path, or None when it is absolute or climbs out with '..'."""
    if not name or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return None
    p = PurePosixPath(name.replace("\\", "/"))
    if p.is_absolute() or any(part == ".." for part in p.parts):
        return None
    return p


def _check_members(members: list[tarfile.TarInfo], archive: Path, where: str) -> None:
    """Every member a relative path to a regular file or folder, before anything is written."""
    for m in members:
        rel = _safe_member_path(m.name)
        if rel is None:
            raise bad_argument(
                DownloadError, where, "archive", str(archive),
                f"members with relative paths inside the archive; {m.name!r} is absolute or contains '..'",
                "do not use this archive: get cifar-10-binary.tar.gz from the official page",
            )
        if not (m.isfile() or m.isdir()):
            raise bad_argument(
                DownloadError, where, "archive", str(archive),
                f"only regular files and folders; {m.name!r} is a link or special file",
                "do not use this archive: get cifar-10-binary.tar.gz from the official page",
            )


def extract_cifar10(archive: str | os.PathLike[str], root: str | os.PathLike[str]) -> Path:
    """Unpack ``cifar-10-batches-bin/`` from ``archive`` into ``root`` safely; return the folder.

    Every member is checked before anything is written: absolute paths, '..' components,
    links and device files are refused (DownloadError). Regular files are copied by
    hand into a temp folder under ``root`` which is renamed into place at the end.
    """
    where = "extract_cifar10"
    archive = check_path(archive, where, "archive", f"~/data/cifar10/{CIFAR10_ARCHIVE}")
    root = check_path(root, where, "root", "~/data/cifar10").expanduser()
    dest = root / CIFAR10_FOLDER
    with download_folder(root, where):  # a root made here and left empty by a failure is removed
        try:
            tmp_dir = Path(tempfile.mkdtemp(prefix=".extract-", dir=root))
            with_default_mode(tmp_dir, folder=True)
        except OSError as exc:
            raise unwritable(where, root, exc) from None
        try:
            try:
                tar = tarfile.open(archive, "r:*")
            except (tarfile.TarError, OSError, EOFError) as exc:
                raise bad_argument(
                    DownloadError, where, "archive", str(archive), f"a readable .tar.gz archive ({exc})",
                    f"delete {archive} and download it again",
                ) from None
            with tar:
                try:
                    members = tar.getmembers()
                except (tarfile.TarError, OSError, EOFError) as exc:
                    raise bad_argument(
                        DownloadError, where, "archive", str(archive), f"a complete .tar.gz archive ({exc})",
                        f"the archive is truncated or corrupted: delete {archive} and download it again",
                    ) from None
                _check_members(members, archive, where)
                found: set[str] = set()
                for m in members:
                    rel = _safe_member_path(m.name)
                    assert rel is not None
                    parts = [p for p in rel.parts if p not in ("", ".")]
                    if not m.isfile() or len(parts) != 2 or parts[0] != CIFAR10_FOLDER:
                        continue  # only the batch folder's own files (skips readme/meta in subfolders)
                    src = tar.extractfile(m)
                    if src is None:  # pragma: no cover - isfile() members always have data
                        continue
                    with src, open(tmp_dir / parts[1], "wb") as out:
                        shutil.copyfileobj(src, out, 1 << 20)
                    found.add(parts[1])
            missing = [n for n in CIFAR10_FILES if n not in found]
            if missing:
                raise bad_argument(
                    DownloadError, where, "archive", str(archive),
                    f"a {CIFAR10_FOLDER}/ folder with the six batch files; missing {', '.join(missing)}",
                    "this is not the CIFAR-10 binary archive: use cifar-10-binary.tar.gz "
                    "(not the python or matlab version)",
                )
            if dest.is_dir():  # an incomplete earlier folder: replace its batch files, keep anything else
                for name in CIFAR10_FILES:
                    os.replace(tmp_dir / name, dest / name)
                shutil.rmtree(tmp_dir, ignore_errors=True)
            else:
                try:
                    os.replace(tmp_dir, dest)
                except OSError:  # another call unpacked it between the check and the rename: use theirs
                    if find_cifar10(root) != dest:
                        raise
                    shutil.rmtree(tmp_dir, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp_dir, ignore_errors=True)
            raise
        return dest


def download_cifar10(
    root: str | os.PathLike[str],
    *,
    base_url: str = DEFAULT_CIFAR10_URL,
    sha256: str | None = None,
    md5: str | None = None,
    timeout: float = 60,
    progress: bool = True,
) -> Path:
    """Make sure ``root/cifar-10-batches-bin`` holds the six files; download and unpack if needed.

    The archive ``base_url + "cifar-10-binary.tar.gz"`` (default
    https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz, about 163 MiB) goes to a
    temp file in ``root``, is verified and only then renamed to
    ``root/cifar-10-binary.tar.gz`` and unpacked. Verification: ``sha256`` when given
    (and ``md5`` too if also given), else the published MD5 ``CIFAR10_MD5``. An
    archive already in ``root`` (e.g. copied by hand) is verified the same way and
    used without downloading. Returns the batch folder.
    """
    where = "download_cifar10"
    root = check_path(root, where, "root", "~/data/cifar10").expanduser()
    if not isinstance(base_url, str) or not base_url:
        raise bad_argument(
            DownloadError, where, "base_url", base_url, "a URL string of the folder holding the archive",
            f"pass e.g. base_url={DEFAULT_CIFAR10_URL!r}",
        )
    checks = _expected_digests(sha256, md5, where)
    timeout = check_timeout(where, timeout)
    folder = find_cifar10(root)
    if folder is not None:
        return folder
    with download_folder(root, where):
        archive = root / CIFAR10_ARCHIVE
        check_writable(where, root)
        if archive.is_file():
            why = _verify(archive, checks)
            if why is not None:
                raise DownloadError(
                    f"{where}: the archive {archive} already in root fails its check ({why}). "
                    f"Fix: delete {archive} and call again to download it, or pass the right sha256=."
                )
        else:
            url = (base_url if base_url.endswith("/") else base_url + "/") + CIFAR10_ARCHIVE
            if progress:
                print(f"CIFAR-10: downloading {url} ...", file=sys.stderr, flush=True)
            tmp, why_s = fetch_or_why(url, root, timeout, _fetch)
            if tmp is None:
                raise DownloadError(
                    f"{where}: could not download {url}: {why_s}. Fix: check the network or base_url, or download "
                    f"{CIFAR10_ARCHIVE} yourself and put it (or its unpacked {CIFAR10_FOLDER}/ folder) into {root}."
                )
            why = _verify(tmp, checks)
            if why is not None:
                tmp.unlink(missing_ok=True)
                raise DownloadError(
                    f"{where}: {url}: {why}; the download was deleted. Fix: retry (the transfer may have been "
                    "corrupted), check base_url, or pass the right sha256= for the archive you expect."
                )
            os.replace(tmp, archive)
            if progress:
                algos = " and ".join(a for a, _ in checks)
                print(f"CIFAR-10: {CIFAR10_ARCHIVE} ok ({archive.stat().st_size:,} bytes, {algos} verified)",
                      file=sys.stderr, flush=True)
        return extract_cifar10(archive, root)


# --------------------------------------------------------------------------- loading


def _to_dataset(images: np.ndarray, labels: np.ndarray, what: str, normalize: bool) -> Dataset:
    x = images.astype(np.float32)
    x *= np.float32(1.0 / 255.0)
    if normalize:
        x -= np.asarray(CIFAR10_MEAN, dtype=np.float32).reshape(1, 3, 1, 1)
        x /= np.asarray(CIFAR10_STD, dtype=np.float32).reshape(1, 3, 1, 1)
    ds = validate_arrays(x, labels, what=what, num_classes=10, where="cifar10")
    return Dataset(ds.x, ds.y, ds.num_classes, f"{_NAME}/{what}")


def cifar10(
    root: str | os.PathLike[str] = "~/data/cifar10",
    *,
    download: bool = False,
    normalize: bool = True,
    base_url: str = DEFAULT_CIFAR10_URL,
    sha256: str | None = None,
    md5: str | None = None,
) -> DataSplits:
    """Load CIFAR-10: train = the five data batches (50k), val = the test batch (10k), 10 classes.

    ``root`` may be the folder holding ``cifar-10-batches-bin/`` or that folder itself.
    Images come as float32 NCHW (N, 3, 32, 32): ``pixel/255`` normalized per channel
    with mean (0.4914, 0.4822, 0.4465) and std (0.2470, 0.2435, 0.2616) when
    ``normalize`` (else ``pixel/255``); labels int32 (class names in
    ``CIFAR10_CLASSES``). ``download=True`` fetches the archive when the files are
    missing (see :func:`download_cifar10` for ``base_url``, ``sha256``, ``md5``).
    """
    where = "cifar10"
    normalize = check_flag(normalize, where, "normalize",
                           "pass normalize=True for mean/std scaling or False for pixel/255")
    download = check_flag(download, where, "download", "pass download=True to fetch missing files, else False")
    root_p = check_path(root, where, "root", "~/data/cifar10").expanduser()
    folder = find_cifar10(root_p)
    if folder is None:
        if not download:
            raise bad_argument(
                DataError, where, "root", str(root_p),
                f"a folder holding {CIFAR10_FOLDER}/ with the six CIFAR-10 binary files; "
                f"missing {', '.join(_missing(root_p))}",
                "pass download=True to fetch them, or point root at a folder that contains them",
            )
        folder = download_cifar10(root_p, base_url=base_url, sha256=sha256, md5=md5)
    parts = [read_cifar_batch(folder / name) for name in CIFAR10_TRAIN_FILES]
    tr_images = np.concatenate([p[0] for p in parts])
    tr_labels = np.concatenate([p[1] for p in parts])
    del parts
    te_images, te_labels = read_cifar_batch(folder / CIFAR10_TEST_FILE)
    train = _to_dataset(tr_images, tr_labels, "train", normalize)
    val = _to_dataset(te_images, te_labels, "val", normalize)
    return DataSplits(train=train, val=val, name=_NAME)

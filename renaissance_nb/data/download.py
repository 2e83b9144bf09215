"""Downloading a file atomically: into a temp file beside its destination, renamed later; the
folder made for it removed again if the download fails."""
from __future__ import annotations

import hashlib
import http.client
import os
import tempfile
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from ..errors import DataError, DownloadError, bad_argument
from ..files import new_temporary


def unwritable(where: str, root: Path, exc: OSError) -> DownloadError:
    """The error for a root the call cannot write into."""
    return bad_argument(DownloadError, where, "root", str(root), "a writable folder",
                        f"choose another root ({exc.strerror or exc})")


def unreadable(where: str, root: Path, exc: OSError) -> DataError:
    """The error for a data folder this user cannot look into (a shared folder's permissions)."""
    return bad_argument(DataError, where, "root", str(root), "a folder this user can read",
                        f"ask its owner to make it readable (chmod -R a+rX), or copy the files elsewhere "
                        f"({exc.strerror or exc}: {exc.filename})")


@contextmanager
def download_folder(root: Path, where: str) -> Iterator[Path]:
    """Make ``root`` (and its missing parents) for a download; if the block fails, remove the folders
    made here that are still empty, so a failed call leaves the disk as it found it."""
    made = []
    p = root
    while not os.path.lexists(p) and p != p.parent:  # os.path: False, not an error, for a name too long
        made.append(p)
        p = p.parent
    try:
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a parent may be made before the failure ("File name too long")
            raise unwritable(where, root, exc) from None
        yield root
    except BaseException:
        for d in made:  # deepest first; skip those never made, stop at the first that holds something
            if not os.path.isdir(d):
                continue
            try:
                d.rmdir()
            except OSError:
                break
        raise


def check_timeout(where: str, timeout: object) -> float:
    """``timeout=``: seconds > 0 (urllib's socket timeout, per read), else a DataError naming it."""
    from ..checks import as_float
    t = as_float(timeout)
    if t is None or t <= 0:
        raise bad_argument(DataError, where, "timeout", timeout, "seconds > 0 (each read of the transfer)",
                           "pass e.g. timeout=30")
    return t


def check_writable(where: str, root: Path) -> None:
    """Refuse a root the call cannot write into before any mirror is tried (a temp file is made and
    removed): otherwise each mirror would fail on the file, reported as a network failure."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".download-", suffix=".probe", dir=root)
    except OSError as exc:
        raise unwritable(where, root, exc) from None
    os.close(fd)
    os.unlink(tmp)


def fetch(url: str, dest_dir: Path, timeout: float) -> Path:
    """Download ``url`` into a temp file in ``dest_dir`` (same filesystem, so a later rename is atomic), named
    and locked as every writer's (files.new_temporary): one a killed download left (SIGTERM, SIGKILL) is removed
    by the next download or save into that folder."""
    fd, tmp = new_temporary(str(dest_dir))
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as resp:
            for chunk in iter(lambda: resp.read(1 << 20), b""):
                out.write(chunk)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def fetch_or_why(url: str, dest_dir: Path, timeout: float,
                 fetch_with: Callable[[str, Path, float], Path] = fetch) -> tuple[Path | None, str]:
    """(the temp file, "") or (None, why the download failed: "HTTP 404 Not Found", the network's
    reason...), for a message that lists every mirror tried."""
    try:
        return fetch_with(url, dest_dir, timeout), ""
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        why = f"HTTP {exc.code} {exc.reason}" if isinstance(exc, urllib.error.HTTPError) else getattr(exc, "reason", exc)
        return None, str(why)


def file_digest(path: Path, algorithm: str = "sha256") -> str:
    """The hex digest of the file's bytes, read a MiB at a time."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()

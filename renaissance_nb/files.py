"""Files written atomically (a temp file renamed into place) get the mode a plain ``open()`` or
``mkdir()`` would have given them.

Why: ``tempfile.mkstemp``/``mkdtemp`` make owner-only files (0600) and folders (0700), and the
rename keeps that mode, so a checkpoint or a dataset in a shared folder would be unreadable to
everyone else.
"""
from __future__ import annotations

import os
import tempfile
import threading
from typing import Any, BinaryIO, Callable

_LOCK = threading.Lock()


def _umask() -> int:
    """The process's umask: read from /proc on Linux; elsewhere set and restored at once (os.umask
    can only be read that way, which another thread creating a file just then would see)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def with_default_mode(path: str | os.PathLike[str], folder: bool = False) -> None:
    """chmod ``path`` to 0666 (0777 for a folder) less the process's umask, where the file system
    allows it (vfat, CIFS and some FUSE mounts refuse chmod: the file keeps the mode it has)."""
    try:
        os.chmod(path, (0o777 if folder else 0o666) & ~_umask())
    except OSError:
        pass


def write_atomically(path: Any, write: Callable[[BinaryIO], object], *, op: str, error: type[Exception],
                     example: str, verb: str = "write") -> str:
    """Write a file through ``write(f)`` into a temporary file in the same folder, fsync it, then
    ``os.replace`` it onto ``path``: a failure at any point (a full disk, a refused name, an exception
    in ``write``) leaves whatever ``path`` held before and no temporary file behind. ``error`` (the
    caller's library error) names ``op`` and the path when the path cannot be written; ``example`` is
    a file name to suggest, ``verb`` the caller's word for writing ("save")."""
    given = path
    try:
        path = os.fspath(path)
    except TypeError:
        path = None  # type: ignore[assignment]
    if not isinstance(path, str) or not path or os.path.isdir(path):
        raise error(f"{op}: path={given!r} is invalid; expected a file name (not a folder). Fix: pass e.g. "
                    f"{example!r}.")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise error(f"{op}: the folder {folder!r} of path {path!r} does not exist. Fix: create it first "
                    f"(os.makedirs) or {verb} elsewhere.")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".rnb-", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise error(f"{op}: cannot write in the folder {folder!r} of path {path!r} ({exc.strerror}). Fix: {verb} "
                    "to a folder you can write to.") from None
    try:
        with_default_mode(tmp)  # mkstemp's file is owner-only; this one is a file like any other
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.replace(tmp, path)
        except (OSError, ValueError) as exc:  # a name the file system refuses ("embedded null byte", too long...)
            raise error(f"{op}: cannot write {path!r} ({getattr(exc, 'strerror', None) or exc}). Fix: {verb} under "
                        "another name.") from None
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _sync_folder(folder)
    return path


def _sync_folder(folder: str) -> None:
    """Make a rename in ``folder`` durable (POSIX); harmless where unsupported."""
    try:
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass

"""Files written atomically (a temp file renamed into place) get the mode a plain ``open()`` or
``mkdir()`` would have given them; the temporary files of writers killed mid-write are removed by
the next write into their folder.

Why: ``tempfile.mkstemp``/``mkdtemp`` make owner-only files (0600) and folders (0700), and the
rename keeps that mode, so a checkpoint or a dataset in a shared folder would be unreadable to
everyone else.
"""
from __future__ import annotations

import os
import re
import tempfile
import threading
import time
from typing import Any, BinaryIO, Callable

try:
    import fcntl
except ImportError:  # Windows: the pid in the name alone tells a live writer's file
    fcntl = None  # type: ignore[assignment]

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


TEMP_PREFIX, TEMP_SUFFIX = ".rnb-", ".tmp"
"""A writer's temporary file is ``.rnb-<pid>-<random>.tmp``, beside the file it becomes."""
_TEMP_NAME = re.compile(r"^\.rnb-(?:(\d+)-)?[\w]+\.tmp$")
LEGACY_AGE = 3600.0
"""Seconds after which a temporary file without a pid (written before names carried one) counts as stale."""


def _hold(fd: int) -> None:
    """An exclusive lock on the writer's open temporary file, released when it closes (or its process dies)."""
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a file system without locks: the pid in the name still protects it
            pass


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (one of another user's counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _unlocked(path: str) -> bool:
    """Whether no writer holds ``path`` (the lock is free); True where there are no locks to ask."""
    if fcntl is None:
        return True
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:  # held: a writer is at work (here, or on another machine sharing the folder)
        return False
    finally:
        os.close(fd)


def remove_stale_temporaries(folder: str) -> list[str]:
    """Remove the temporary files that writers killed mid-write (SIGKILL, a power loss) left in ``folder``;
    returns their names. A file is stale when its writer is gone: no process holds its lock and the pid in
    its name runs no more here (a live writer, on this machine or another sharing the folder, holds the
    lock; the pid covers the moment between its creating the file and locking it, and file systems without
    locks); an older file without a pid, when no lock is held and it is an hour old."""
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        m = _TEMP_NAME.match(name)
        if m is None:
            continue
        path = os.path.join(folder, name)
        try:
            old = time.time() - os.stat(path).st_mtime > LEGACY_AGE
            gone = not _alive(int(m[1])) if m[1] else old
            if gone and _unlocked(path):
                os.unlink(path)
                removed.append(name)
        except OSError:  # removed by another cleaner just now, or not ours to remove
            continue
    return removed


def write_atomically(path: Any, write: Callable[[BinaryIO], object], *, op: str, error: type[Exception],
                     example: str, verb: str = "write") -> str:
    """Write a file through ``write(f)`` into a temporary file in the same folder, fsync it, then
    ``os.replace`` it onto ``path``: a failure at any point (a full disk, a refused name, an exception
    in ``write``) leaves whatever ``path`` held before and no temporary file behind. ``error`` (the
    caller's library error) names ``op`` and the path when the path cannot be written; ``example`` is
    a file name to suggest, ``verb`` the caller's word for writing ("save"). A process killed mid-write
    cannot clean up: the next write into the folder removes what such writers left
    (``remove_stale_temporaries``)."""
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
        fd, tmp = new_temporary(folder)
    except OSError as exc:
        raise error(f"{op}: cannot write in the folder {folder!r} of path {path!r} ({exc.strerror}). Fix: {verb} "
                    "to a folder you can write to.") from None
    try:
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


def new_temporary(folder: str) -> tuple[int, str]:
    """A writer's temporary file in ``folder`` (``.rnb-<pid>-<random>.tmp``), open (the fd) and locked while this
    process holds it, with a plain file's mode (mkstemp's is owner-only); what writers killed earlier left there
    is removed first. The writer renames it into place, or unlinks it on failure; a writer killed meanwhile
    leaves it to the next one (remove_stale_temporaries)."""
    remove_stale_temporaries(folder)
    fd, tmp = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-", suffix=TEMP_SUFFIX, dir=folder)
    _hold(fd)  # while this writer lives, no other one takes its file for litter
    with_default_mode(tmp)
    return fd, tmp


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

"""Files written atomically (a temp file renamed into place) get the mode a plain ``open()`` or
``mkdir()`` would have given them.

Why: ``tempfile.mkstemp``/``mkdtemp`` make owner-only files (0600) and folders (0700), and the
rename keeps that mode, so a checkpoint or a dataset in a shared folder would be unreadable to
everyone else.
"""
from __future__ import annotations

import os
import threading

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

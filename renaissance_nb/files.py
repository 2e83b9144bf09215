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
    with _LOCK:  # os.umask can only be read by setting it: set it back at once, one thread at a time
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def with_default_mode(path: str | os.PathLike[str], folder: bool = False) -> None:
    """chmod ``path`` to 0666 (0777 for a folder) less the process's umask."""
    os.chmod(path, (0o777 if folder else 0o666) & ~_umask())

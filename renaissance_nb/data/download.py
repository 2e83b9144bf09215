"""Downloading a file atomically: into a temp file beside its destination, renamed later."""
from __future__ import annotations

import os
import tempfile
import urllib.request
from pathlib import Path


def fetch(url: str, dest_dir: Path, timeout: float) -> Path:
    """Download ``url`` into a temp file in ``dest_dir`` (same filesystem, so a later rename is atomic)."""
    fd, tmp = tempfile.mkstemp(prefix=".download-", suffix=".part", dir=dest_dir)
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as resp:
            for chunk in iter(lambda: resp.read(1 << 20), b""):
                out.write(chunk)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)

"""Whether numba's disk cache holds the package's kernels as they are now (runtime/warmup.py asks).

Every jitted function of the package carries the same stamp (jit_cache.py: all the jitted
folders' files) and lives in the same cache folder, so after an install, an edit or a cleared
cache they are all compiled or all loadable. Whoever has compiled a whole plan's kernels into
the cache (the warm-up helper, as its last act) leaves a marker file there named after that
stamp, numba's version and Python's: a cache without the marker is cold. The folder is numba's
own choice for this function (``stats.cache_path``), known without compiling anything.
"""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numba

from ..jit_cache import package_stamp


@numba.njit(cache=True)
def cache_probe(x):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """x + 1: a cached function whose cache folder is the package's."""
    return x + 1


def marker_path() -> Path | None:
    """The marker of a warm cache for this package, numba and Python; None where numba caches nothing."""
    folder = cache_probe.stats.cache_path
    if not folder:
        return None
    key = repr((package_stamp(), numba.__version__, sys.version_info[:2])).encode()
    return Path(folder) / f"rnb-kernels-cached-{hashlib.sha256(key).hexdigest()[:16]}"


def package_cache_was_cold() -> bool:
    """No marker: the kernels were never all compiled into this cache (or their sources changed since)."""
    path = marker_path()
    return path is not None and not path.exists()


def mark_cache_warm() -> None:
    """Leave the marker (after a plan's kernels were all compiled into the cache); best effort."""
    path = marker_path()
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
        except OSError:  # a read-only cache folder: numba caches nothing there either
            pass

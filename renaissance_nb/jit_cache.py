"""numba's disk cache of the package's kernels, stamped with all of their sources at once.

Why: numba stamps each cached function with its own source file only, so a jitted helper
inlined from another module (``conv.bn_train_fwd_finish_`` into ``conv_par``'s kernels) stays
stale in its callers' cache after that module changes: a checkout edited in place then runs
the old code with no sign of it (it hid a fix twice while this was written). Here every jitted
function of the package is stamped with its own file and with the files of every folder that
holds jitted code, so editing any of them recompiles them all. An install rewrites every file,
so users see no difference. If numba's cache API moves, its own per-file stamps apply.
"""
from __future__ import annotations

import functools
import os

os.environ.setdefault("NUMBA_DISABLE_INTEL_SVML", "1")
"""Before numba is imported (this module comes first): with Intel's SVML installed numba would vectorise a
loop's math.exp with SVML's, whose last bits differ from libm's, and a numba kernel would no longer give its
C twin's bytes (kernels/native.py). The C kernels call libm or their own math (native.h)."""
from typing import Any

ROOT = os.path.dirname(os.path.abspath(__file__))
JITTED_FOLDERS = ("kernels", "data", "train", "ops")
"""The package folders whose modules hold numba-jitted code (or helpers such code inlines)."""


@functools.lru_cache(maxsize=1)
def package_stamp(root: str = ROOT) -> tuple[tuple[str, str, float, int], ...]:
    """(folder, file, mtime, size) of every module in the jitted folders, and of the C sources beside them (a
    jitted module may read one at import: gelu_math.py takes its erfc table from gelu_native.c, as a constant
    numba compiles in): one process reads it once."""
    entries = []
    for folder in JITTED_FOLDERS:
        path = os.path.join(root, folder)
        for name in sorted(os.listdir(path)) if os.path.isdir(path) else ():
            if name.endswith((".py", ".c", ".h")):
                st = os.stat(os.path.join(path, name))
                entries.append((folder, name, st.st_mtime, st.st_size))
    return tuple(entries)


def _package_locator(base: Any) -> Any:
    """``base`` (a numba cache locator) for this package's functions only, with the package stamp."""

    class PackageLocator(base):  # type: ignore[misc, valid-type]
        rnb = True

        @classmethod
        def from_function(cls, py_func: Any, py_file: str) -> Any:
            if not os.path.abspath(py_file).startswith(ROOT + os.sep):
                return None
            return super().from_function(py_func, py_file)

        def get_source_stamp(self) -> Any:
            return (super().get_source_stamp(), package_stamp())

    PackageLocator.__name__ = PackageLocator.__qualname__ = f"Package{base.__name__}"
    return PackageLocator


def install() -> bool:
    """Put the package locators first in numba's list (once); False where numba's API differs."""
    try:
        from numba.core import caching

        classes = caching.CacheImpl._locator_classes
        if not any(getattr(c, "rnb", False) for c in classes):
            bases = (caching.UserProvidedCacheLocator, caching.InTreeCacheLocator, caching.UserWideCacheLocator)
            classes[:0] = [_package_locator(b) for b in bases]
        return True
    except (ImportError, AttributeError, TypeError):
        return False


INSTALLED = install()  # at import, which the package does first: before any jitted function is decorated

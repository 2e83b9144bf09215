"""A one-line numba function whose cache state stands for the package's (runtime/warmup.py).

Every jitted function of the package carries the same stamp (jit_cache.py: all the jitted
folders' files) and lives in the same cache folder, so after an install, an edit or a cleared
cache they are all compiled or all loadable; calling this costs ~0.1 s when it compiles and
milliseconds when it loads, and its ``stats`` say which happened.
"""
from __future__ import annotations

import numba


@numba.njit(cache=True)
def cache_probe(x):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """x + 1: anything numba compiles will do."""
    return x + 1


def package_cache_was_cold() -> bool:
    """Whether this process compiled the probe rather than loading it from numba's disk cache."""
    cache_probe(1)
    stats = cache_probe.stats
    return sum(stats.cache_misses.values()) > 0

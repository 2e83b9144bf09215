"""numba's disk cache of the kernels is stamped with all their sources: an edited helper that
another module inlines recompiles its callers instead of running stale (it hid a fix twice)."""
from __future__ import annotations

import os

import numba

from renaissance_nb import jit_cache
from renaissance_nb.kernels import conv_par, fused


def test_package_kernels_use_the_package_stamp_and_others_do_not() -> None:
    assert jit_cache.INSTALLED
    for f in (fused.bias_act_, conv_par.bn_train_fwd_par_):
        locator = f._cache._impl.locator
        assert type(locator).__name__.startswith("Package") and locator.get_source_stamp()[1] == jit_cache.package_stamp()

    @numba.njit(cache=True)
    def outside(x):  # type: ignore[no-untyped-def]
        return x + 1

    assert not type(outside._cache._impl.locator).__name__.startswith("Package")


def test_the_stamp_follows_every_module_of_the_jitted_folders(tmp_path) -> None:  # type: ignore[no-untyped-def]
    for folder in jit_cache.JITTED_FOLDERS:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "a.py").write_text("x = 1\n")
    (tmp_path / "display").mkdir()
    (tmp_path / "display" / "view.py").write_text("y = 1\n")
    stamp = jit_cache.package_stamp.__wrapped__(str(tmp_path))
    assert [(d, n) for d, n, _, _ in stamp] == [(f, "a.py") for f in jit_cache.JITTED_FOLDERS]
    (tmp_path / "display" / "view.py").write_text("y = 22\n")  # not a jitted folder: no recompile
    assert jit_cache.package_stamp.__wrapped__(str(tmp_path)) == stamp
    helper = tmp_path / "kernels" / "a.py"
    helper.write_text("x = 2\n")
    os.utime(helper, (1e9, 1e9))
    assert jit_cache.package_stamp.__wrapped__(str(tmp_path)) != stamp

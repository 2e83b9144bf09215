"""Winograd F(4x4, 3x3) (kernels/winograd43.py, run by winograd.py's passes) against float64 references,
and which layers take it.

F(4x4, 3x3) rounds more than F(2x2, 3x3) (its transforms' entries reach 5 and 8, G's 1/24): these
tests bind it (RNB_WINOGRAD=4) on clipped, tiny and uneven maps with scratch full of NaN and bound
the error of each pass by 1e-5 of its largest output; measured 0.3-5e-6 (F(2x2, 3x3): 1.2-3.5e-7).
tests/test_conv_native.py compares its C and numba bytes.
"""
from __future__ import annotations

import numpy as np
import pytest

from renaissance_nb.kernels import blas, winograd

pytestmark = pytest.mark.skipif(not blas.THREADED, reason="Winograd's products use the library's own sgemm")


def _reference(x: np.ndarray, w: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(y, dx, dw) of conv3x3 (stride 1, padding 1) in float64, summed tap by tap."""
    n, h, wd, _ = x.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    dyp = np.pad(dy.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    y, dx, dw = np.zeros(dy.shape), np.zeros(x.shape), np.zeros(w.shape)
    for a in range(3):
        for b in range(3):
            tap = w[:, a, b].astype(np.float64)
            y += xp[:, a:a + h, b:b + wd] @ tap.T
            dx += dyp[:, 2 - a:2 - a + h, 2 - b:2 - b + wd] @ tap
            dw[:, a, b] = np.einsum("nhwc,nhwo->oc", xp[:, a:a + h, b:b + wd], dy.astype(np.float64))
    return y, dx, dw


@pytest.mark.parametrize("n,h,wd,c,co", [(3, 9, 9, 16, 24), (2, 8, 8, 32, 16), (4, 13, 10, 17, 33), (5, 1, 6, 16, 16),
                                         (2, 16, 16, 64, 64), (3, 6, 5, 16, 20)])
def test_f43_matches_the_float64_reference(monkeypatch, n, h, wd, c, co) -> None:
    monkeypatch.setenv("RNB_WINOGRAD", "4")
    rng = np.random.default_rng(n * h + c)
    x = rng.standard_normal((n, h, wd, c)).astype(np.float32)
    w = (rng.standard_normal((co, 3, 3, c)) / np.sqrt(9 * c)).astype(np.float32)
    dy = rng.standard_normal((n, h, wd, co)).astype(np.float32)
    y, dx, dw = np.zeros_like(dy), np.zeros_like(x), np.zeros_like(w)
    scratch = np.full(1 << 21, np.nan, np.float32)
    for a, b in ((c, co), (co, c)):
        assert winograd.chosen(n, h, wd, a, b, scratch.size, False).m == 4
    assert winograd.chosen(n, h, wd, c, co, scratch.size, True).m == 4
    winograd.bind(x, w, y, scratch, np.zeros(0, np.float32), 0)()
    winograd.bind(dy, w, dx, scratch, np.zeros(0, np.float32), 0, flip=True)()
    winograd.bind_dw(x, dy, dw, scratch)()
    for got, ref in zip((y, dx, dw), _reference(x, w, dy)):
        assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()


def test_which_tile_each_map_takes(monkeypatch) -> None:
    assert winograd.tile(32, 32) == winograd.tile(16, 16) == winograd.tile(7, 7) == 4
    assert winograd.tile(6, 6) == winograd.tile(32, 5) == 2
    monkeypatch.setenv("RNB_WINOGRAD", "2")
    assert winograd.tile(32, 32) == 2
    monkeypatch.setenv("RNB_WINOGRAD", "4")
    assert winograd.tile(3, 3) == 4


def test_a_scratch_too_small_for_f43_keeps_f23(monkeypatch) -> None:
    """36 c co floats of U where 16 c co fit: the convolution takes F(2x2, 3x3), and still matches."""
    monkeypatch.setenv("RNB_WINOGRAD", "4")
    n, h, c = 2, 16, 64
    floats = winograd.plan(n, h, h, c, c, 1 << 30).threads * winograd.part_at(h // 2, c, c) + 20 * c * c  # one tile row each
    assert winograd.plan(n, h, h, c, c, floats, m=4) is None and winograd.chosen(n, h, h, c, c, floats, False).m == 2
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, h, h, c)).astype(np.float32)
    w = (rng.standard_normal((c, 3, 3, c)) / 24).astype(np.float32)
    y = np.zeros_like(x)
    winograd.bind(x, w, y, np.full(floats, np.nan, np.float32), np.zeros(0, np.float32), 0)()
    ref = _reference(x, w, np.zeros_like(x))[0]
    assert np.abs(y - ref).max() <= 1e-6 * np.abs(ref).max()

"""Convolutions by tiles of images (kernels/conv_tiled.py) against float64 references.

The tiled path is what conv_fwd / conv_bwd bind on the CPU when the products use the library's
threads and Cin > 1; these tests force several tiles per thread, partial last tiles, more
threads than images, and the fallback that remakes the columns when the backward cannot tile.
"""
from __future__ import annotations

import numpy as np
import pytest

import renaissance_nb.kernels.conv as conv
from renaissance_nb.kernels import blas, conv_tiled
from renaissance_nb.kernels.cpu import KERNELS, BindEnv

pytestmark = pytest.mark.skipif(not blas.THREADED, reason="tiles need the library's own sgemm threads")


def reference(x, w, b, act, dy, k, s, p):
    """(y, dw, dx) in float64 through the serial im2col_/col2im_ and NumPy products."""
    n, h, wd, cin = x.shape
    cout = w.shape[0]
    ho, wo = (h + 2 * p - k) // s + 1, (wd + 2 * p - k) // s + 1
    cols = np.zeros((n * ho * wo, k * k * cin))
    conv.im2col_(x.astype(np.float64).reshape(n, h, wd * cin), cols, cin, k, s, p, ho, wo)
    z = cols @ w.reshape(cout, -1).astype(np.float64).T + (0.0 if b is None else b.astype(np.float64))
    y = np.maximum(z, 0.0) if act == "relu" else z
    g = dy.reshape(-1, cout).astype(np.float64) * ((z > 0) if act == "relu" else 1.0)
    dw = (g.T @ cols).reshape(w.shape)
    dx = np.zeros((n, h, wd * cin))
    conv.col2im_(g @ w.reshape(cout, -1).astype(np.float64), dx, cin, k, s, p, ho, wo)
    return y.reshape(n, ho, wo, cout), dw, dx.reshape(x.shape)


def close(a, ref):
    scale = max(1.0, float(np.abs(ref).max()))
    assert np.abs(a - ref).max() <= 2e-5 * scale, float(np.abs(a - ref).max())


class Case:
    def __init__(self, n, h, cin, cout, k, s, p, bias, act, need_dx=True, seed=0):
        rng = np.random.default_rng(seed)
        self.k, self.s, self.p, self.act = k, s, p, act
        self.x = rng.standard_normal((n, h, h, cin)).astype(np.float32)
        self.w = (rng.standard_normal((cout, k, k, cin)) / np.sqrt(k * k * cin)).astype(np.float32)
        self.b = rng.standard_normal(cout).astype(np.float32) if bias else None
        ho = (h + 2 * p - k) // s + 1
        self.y = np.zeros((n, ho, ho, cout), np.float32)
        self.cols = np.zeros((n * ho * ho, k * k * cin), np.float32)
        self.dy = rng.standard_normal(self.y.shape).astype(np.float32)
        self.dw, self.db = np.zeros_like(self.w), np.zeros(cout, np.float32)
        self.dx, self.dcols = np.zeros_like(self.x), np.zeros_like(self.cols)
        prm = dict(k=k, s=s, p=p, bias=bias, act=act, need_dx=need_dx)
        ins = [self.x, self.w] + ([self.b] if bias else [])
        self.fwd = KERNELS["conv_fwd"]([self.y, self.cols], ins, prm, BindEnv())
        outs = [self.dw] + ([self.db] if bias else []) + ([self.dx, self.dcols] if need_dx else [])
        self.bwd = KERNELS["conv_bwd"](outs, [self.dy, self.x, self.w, self.cols, self.y], prm, BindEnv())

    def check(self, need_dx=True):
        y, dw, dx = reference(self.x, self.w, self.b, self.act, self.dy, self.k, self.s, self.p)
        self.fwd()
        close(self.y, y)
        self.bwd()
        close(self.dw, dw)
        if need_dx:
            close(self.dx, dx)
        else:
            assert not self.dx.any()


@pytest.fixture
def small_tiles(monkeypatch):
    """One image per tile: several tiles per thread and a partial last one."""
    monkeypatch.setattr(conv_tiled, "TILE_BYTES", 1)


@pytest.mark.parametrize("n,h,cin,cout,k,s,p", [(5, 7, 3, 4, 3, 1, 1), (7, 9, 8, 5, 3, 2, 1), (3, 8, 2, 6, 5, 1, 2),
                                                (4, 6, 4, 3, 2, 2, 0), (1, 5, 3, 2, 3, 1, 0)])
@pytest.mark.parametrize("bias,act", [(True, "relu"), (False, "none")])
def test_tiled_conv_matches_the_float64_reference(small_tiles, n, h, cin, cout, k, s, p, bias, act) -> None:
    c = Case(n, h, cin, cout, k, s, p, bias, act, seed=n + h)
    assert conv_tiled.applies(c.x, c.w, c.cols, k, s, p)
    c.check()


def test_tiled_conv_with_default_tiles_and_without_dx() -> None:
    Case(32, 14, 16, 32, 3, 1, 1, False, "none").check()
    Case(6, 8, 3, 8, 3, 1, 1, True, "relu", need_dx=False).check(need_dx=False)


def test_tiled_backward_repeats_its_bytes(small_tiles) -> None:
    c = Case(9, 7, 4, 6, 3, 1, 1, True, "relu")
    c.fwd()
    dy = c.dy.copy()
    c.bwd()
    first = (c.dw.copy(), c.dx.copy(), c.db.copy())
    c.dy[...] = dy  # the pre-pass masks dy in place
    c.fwd()
    c.bwd()
    assert all(np.array_equal(a, b) for a, b in zip(first, (c.dw, c.dx, c.db)))


def test_a_backward_that_cannot_tile_remakes_the_columns() -> None:
    """The forward ran by tiles (cols holds scratch); a dx view the tiles cannot address sends the
    backward down the plain path, which must im2col again rather than read cols."""
    c = Case(4, 6, 3, 5, 3, 1, 1, False, "none")
    wide = np.zeros(c.x.shape[:-1] + (2 * c.x.shape[-1],), np.float32)
    dx = wide[..., ::2]  # not contiguous
    bwd = KERNELS["conv_bwd"]([c.dw, dx, c.dcols], [c.dy, c.x, c.w, c.cols, c.y],
                              dict(k=3, s=1, p=1, bias=False, act="none", need_dx=True), BindEnv())
    y, dw, dxr = reference(c.x, c.w, None, "none", c.dy, 3, 1, 1)
    c.fwd()
    c.cols[...] = np.nan  # what the forward leaves there is scratch: nothing may read it
    bwd()
    close(c.dw, dw)
    close(dx, dxr)


def test_which_convolutions_tile() -> None:
    x, w, cols = np.zeros((2, 5, 5, 3), np.float32), np.zeros((4, 3, 3, 3), np.float32), np.zeros((50, 27), np.float32)
    assert conv_tiled.applies(x, w, cols, 3, 1, 1)
    assert not conv_tiled.applies(x[..., :1].copy(), w[..., :1].copy(), cols[:, :9].copy(), 3, 1, 1)  # Cin 1
    assert not conv_tiled.applies(x, w[:, :1, :1].copy(), x.reshape(50, 3), 1, 1, 0)  # a plain product
    assert not conv_tiled.applies(x.astype(np.float64), w, cols, 3, 1, 1)
    assert not conv_tiled.applies(x, w, None, 3, 1, 1)
    assert conv_tiled.plan_tiles(1, 25, 27)[0] == 1  # never more threads than images

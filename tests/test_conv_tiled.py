"""Convolutions by tiles of images (kernels/conv_tiled.py) against float64 references.

The tiled path is what conv_fwd / conv_bwd bind on the CPU when the products use the library's
threads and Cin > 1; these tests force several tiles per thread, partial last tiles, more
threads than images, and the fallback that remakes the columns when the backward cannot tile.
"""
from __future__ import annotations

import numpy as np
import pytest
from conv_cases import Case, close, reference
from helpers import train_in_processes

from renaissance_nb.kernels import blas, conv_tiled, operands
from renaissance_nb.kernels.cpu import KERNELS, BindEnv

pytestmark = pytest.mark.skipif(not blas.THREADED, reason="tiles need the library's own sgemm threads")


@pytest.fixture(autouse=True)
def im2col_only(monkeypatch):
    """3x3 stride-1 convs would take Winograd's path (tests/test_winograd.py); here they tile."""
    monkeypatch.setenv("RNB_WINOGRAD", "0")


@pytest.fixture
def small_tiles(monkeypatch):
    """One image per tile: several tiles per thread and a partial last one."""
    monkeypatch.setattr(operands, "CONV_TILE_BYTES", 1)


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
    assert conv_tiled.plan_tiles(1, 25, 27, 1)[0] == 1  # never more threads than images


_TRAIN_CONV = """
import sys, numpy as np, renaissance_nb as rnb
from renaissance_nb.blueprint import cbr, gap, maxpool
from renaissance_nb.kernels import blas
rng = np.random.default_rng(0)
x = rng.standard_normal((320, 1, 12, 12), dtype=np.float32)
y = (x[:, 0, :, :5].mean((1, 2)) > 0).astype(np.int32) + 2 * (x[:, 0, :5, :].mean((1, 2)) > 0).astype(np.int32)
net = rnb.seq(cbr(8, 3, 1, 1), maxpool(2), cbr(16, 3, 1, 1), gap(), rnb.fc(4))
t = (rnb.DeepLearningTask("t").model(net).data(train=(x, y), batch_size=32)
     .optimizer(rnb.AdamW().lr(3e-3)).total_epochs(4).seed(2))
r = t.run(progress=False)
np.savez(sys.argv[1], threaded=np.array(blas.THREADED), losses=r.step_losses, **t.state_dict())
"""


def test_a_conv_net_trained_by_tiles_matches_the_plain_path(tmp_path) -> None:
    """A conv net (a one-channel first layer, a tiled second, batch norm) trained on the library's
    threads and with RNB_OWN_THREADS=0 (im2col matrices, np.matmul, serial passes): the same run
    up to float32 rounding; the tiled path repeats its bytes in a fresh process."""
    runs = train_in_processes(tmp_path, _TRAIN_CONV, {"own": {}, "own2": {}, "plain": {"RNB_OWN_THREADS": "0"}})
    assert runs["own"]["threaded"] and not runs["plain"]["threaded"]
    assert all(np.array_equal(runs["own"][k], runs["own2"][k]) for k in runs["own"])
    np.testing.assert_allclose(runs["own"]["losses"], runs["plain"]["losses"], rtol=1e-4)
    assert runs["own"]["losses"][-8:].mean() < 0.9 * runs["own"]["losses"][:8].mean()  # it learned
    for k, v in runs["plain"].items():
        if k not in ("threaded", "losses"):
            np.testing.assert_allclose(runs["own"][k], v, rtol=1e-3, atol=1e-4, err_msg=k)

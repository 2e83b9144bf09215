"""3x3 stride-1 convolutions by Winograd F(2x2, 3x3) (kernels/winograd.py) against float64 references.

conv_fwd / conv_bwd bind this path on the CPU for 3x3, stride 1, padding 1 convolutions of at least
MIN_CHANNELS channels in and out; these tests check the forward (with bias and ReLU), the weight and
input gradients on odd, tiny and uneven shapes, with scratch full of NaN (nothing may read what it
did not write), on 1 to 3 threads, the fall-back to im2col where the scratch is too small, and a
trained net against the im2col path.
"""
from __future__ import annotations

import numba
import numpy as np
import pytest
from conv_cases import Case, close, reference
from helpers import train_in_processes

from renaissance_nb.kernels import blas, winograd
from renaissance_nb.kernels.cpu import KERNELS, BindEnv

pytestmark = pytest.mark.skipif(not blas.THREADED, reason="Winograd's products use the library's own sgemm")


@pytest.fixture
def spy(monkeypatch):
    """Counts the Winograd passes bound: {"fwd": n, "dw": n, "dx": n}."""
    seen = {"fwd": 0, "dw": 0, "dx": 0}
    bind, bind_dw = winograd.bind, winograd.bind_dw

    def counting(*a, **k):  # type: ignore[no-untyped-def]
        out = bind(*a, **k)
        seen["dx" if k.get("flip") else "fwd"] += out is not None
        return out

    def counting_dw(*a, **k):  # type: ignore[no-untyped-def]
        out = bind_dw(*a, **k)
        seen["dw"] += out is not None
        return out
    monkeypatch.setattr(winograd, "bind", counting)
    monkeypatch.setattr(winograd, "bind_dw", counting_dw)
    return seen


@pytest.mark.parametrize("n,h,cin,cout", [(4, 8, 16, 16), (6, 7, 33, 34), (160, 1, 32, 32), (48, 2, 32, 16), (8, 5, 32, 40),
                                          (6, 13, 20, 18)])
@pytest.mark.parametrize("bias,act", [(True, "relu"), (False, "none")])
def test_winograd_conv_matches_the_float64_reference(spy, n, h, cin, cout, bias, act) -> None:
    c = Case(n, h, cin, cout, 3, 1, 1, bias, act, seed=n * h + cin)
    assert spy == {"fwd": 1, "dw": 1, "dx": 1}
    c.cols[...] = np.nan
    c.check()


def test_the_scratch_left_by_the_forward_is_not_read(spy) -> None:
    c = Case(8, 6, 16, 24, 3, 1, 1, True, "relu")
    y, dw, dx = reference(c.x, c.w, c.b, "relu", c.dy, 3, 1, 1)
    c.fwd()
    close(c.y, y)
    c.cols[...] = np.nan
    c.bwd()
    close(c.dw, dw)
    close(c.dx, dx)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_every_thread_count_matches_and_repeats_its_bytes(spy, threads) -> None:
    if threads > numba.config.NUMBA_NUM_THREADS:
        pytest.skip(f"numba has {numba.config.NUMBA_NUM_THREADS} threads here")
    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        c = Case(5, 9, 32, 32, 3, 1, 1, True, "relu")
        dy = c.dy.copy()
        c.check()
        first = (c.y.copy(), c.dw.copy(), c.dx.copy())
        c.dy[...] = dy  # the backward's pre-pass masks dy in place
        c.fwd()
        c.bwd()
        assert all(np.array_equal(a, b) for a, b in zip(first, (c.y, c.dw, c.dx)))
    finally:
        numba.set_num_threads(before)


def test_without_dx_only_the_weight_gradient_runs(spy) -> None:
    Case(4, 6, 16, 16, 3, 1, 1, False, "none", need_dx=False).check(need_dx=False)
    assert spy == {"fwd": 1, "dw": 1, "dx": 0}


def test_a_scratch_too_small_for_the_tiles_keeps_im2col(spy) -> None:
    """One image's columns of a 64-channel 8x8 conv hold 36,864 floats; U alone needs 65,536: the conv
    binds its im2col tiles instead, and still matches the reference."""
    n, h, c = 2, 8, 64
    assert winograd.plan(n, h, h, c, c, h * h * 9 * c) is None
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, h, h, c)).astype(np.float32)
    w = (rng.standard_normal((c, 3, 3, c)) / 24).astype(np.float32)
    y, cols = np.zeros((n, h, h, c), np.float32), np.zeros((h * h, 9 * c), np.float32)
    KERNELS["conv_fwd"]([y, cols], [x, w], dict(k=3, s=1, p=1, bias=False, act="none"), BindEnv())()
    assert spy["fwd"] == 0
    close(y, reference(x, w, None, "none", np.zeros_like(y), 3, 1, 1)[0])


def test_which_convolutions_use_winograd(monkeypatch) -> None:
    x, w = np.zeros((2, 6, 6, 16), np.float32), np.zeros((16, 3, 3, 16), np.float32)
    assert winograd.applies(3, 1, 1, 16, 16, x, w)
    assert not winograd.applies(3, 1, 1, 16, 16, np.zeros((2, 7, 7, 16), np.float32), w)  # 64 outputs for 49
    assert winograd.applies(3, 1, 1, 32, 32, np.zeros((2, 7, 7, 32), np.float32), w)
    assert winograd.applies(3, 1, 1, 16, 16, np.zeros((2, 13, 13, 16), np.float32), w)  # 196 for 169
    assert not winograd.applies(3, 2, 1, 16, 16, x, w)  # stride 2
    assert not winograd.applies(3, 1, 0, 16, 16, x, w)  # no padding
    assert not winograd.applies(1, 1, 0, 16, 16, x, w)
    assert not winograd.applies(3, 1, 1, 3, 16, x, w)  # an RGB stem: the transforms would not vectorise
    assert not winograd.applies(3, 1, 1, 8, 16, x, w)  # 8 channels: im2col was faster
    assert not winograd.applies(3, 1, 1, 16, 16, x.astype(np.float64), w)  # the finite-difference tests' float64
    assert not winograd.applies(3, 1, 1, 16, 16, x[:, :, ::2], w)  # not contiguous
    monkeypatch.setenv("RNB_WINOGRAD", "0")
    assert not winograd.applies(3, 1, 1, 16, 16, x, w)


_TRAIN = """
import sys, numpy as np, renaissance_nb as rnb
from renaissance_nb import RESNET_3_3, block, cbr, gap, seq
rng = np.random.default_rng(0)
x = rng.standard_normal((192, 3, 10, 10), dtype=np.float32)
y = (x[:, 0, :, :5].mean((1, 2)) > 0).astype(np.int32) + 2 * (x[:, 1, :5, :].mean((1, 2)) > 0).astype(np.int32)
t = (rnb.DeepLearningTask("t").model(seq(cbr(16, 3, 1, 1), block(16, RESNET_3_3), gap(), rnb.fc(4)))
     .data(train=(x, y), batch_size=32).optimizer(rnb.SGD().lr(0.05).momentum(0.9)).total_epochs(4).seed(2))
r = t.run(progress=False)
np.savez(sys.argv[1], losses=r.step_losses, **t.state_dict())
"""


def test_a_residual_block_trained_by_winograd_matches_im2col(tmp_path) -> None:
    """The same run with RNB_WINOGRAD=0 (every conv by im2col tiles) agrees to float32 rounding (every
    tensor within 1e-5 relative norm), and a Winograd run repeats its bytes in a fresh process. SGD with
    momentum: AdamW turns the rounding of near-zero gradients into lr-sized steps (1.5e-3 relative on a
    bias here, as tests/distributed/worker.py found for 2 ranks against 1)."""
    runs = train_in_processes(tmp_path, _TRAIN, {"wino": {}, "wino2": {}, "im2col": {"RNB_WINOGRAD": "0"}})
    assert all(np.array_equal(runs["wino"][k], runs["wino2"][k]) for k in runs["wino"])
    assert not np.array_equal(runs["wino"]["conv2.weight"], runs["im2col"]["conv2.weight"])  # another path ran
    np.testing.assert_allclose(runs["wino"]["losses"], runs["im2col"]["losses"], rtol=1e-5)
    assert runs["wino"]["losses"][-6:].mean() < 0.9 * runs["wino"]["losses"][:6].mean()  # it learned
    for k, v in runs["im2col"].items():
        if k != "losses":
            assert np.linalg.norm(runs["wino"][k] - v) <= 1e-5 * np.linalg.norm(v), k


def test_the_compile_notes_name_the_winograd_layers(monkeypatch) -> None:
    """conv1 (3 channels in) and the stride-2 conv4/conv5 stay im2col; the 3x3 stride-1 convs of 16 and 32
    channels are listed, forward and backward bound by F(4x4, 3x3) on the 8x8 maps and F(2x2, 3x3) on 4x4."""
    import renaissance_nb as rnb
    from renaissance_nb import RESNET_3_3, RESNET_3_3_DS, block, cbr, gap, seq
    x = np.random.default_rng(0).standard_normal((64, 3, 8, 8), dtype=np.float32)
    y = np.arange(64, dtype=np.int32) % 4

    def compiled():  # type: ignore[no-untyped-def]
        t = (rnb.DeepLearningTask("t").model(seq(cbr(16, 3, 1, 1), block(16, RESNET_3_3), block(32, RESNET_3_3_DS),
                                                 gap(), rnb.fc(4))).data(train=(x, y), batch_size=32))
        t.compile()
        return t
    t = compiled()
    note = next(n for n in t.runner.notes if n.startswith("convolutions by Winograd"))
    assert "(3x3, stride 1): conv2, conv3 by F(4x4, 3x3); conv6 by F(2x2, 3x3);" in note, note  # 8x8 maps, then 4x4
    every = ("forward", "weight gradient", "input gradient")
    assert t.executor.winograd_layers() == {"conv2": every, "conv3": every, "conv6": every}
    assert t.executor.winograd_tiles() == {"conv2": (4,), "conv3": (4,), "conv6": (2,)}
    monkeypatch.setenv("RNB_WINOGRAD", "0")
    t = compiled()
    assert not any("Winograd" in n for n in t.runner.notes) and t.executor.winograd_layers() == {}


def test_the_winograd_passes_match_pytorch(spy) -> None:
    """Forward (bias, ReLU), weight, bias and input gradients of a 32 -> 48 conv on 10x10 images against
    torch.nn.functional.conv2d and autograd, in float32 (our NHWC / (Cout, kh, kw, Cin) layouts moved)."""
    torch = pytest.importorskip("torch")
    c = Case(6, 10, 32, 48, 3, 1, 1, True, "relu", seed=4)
    assert spy == {"fwd": 1, "dw": 1, "dx": 1}
    xt = torch.from_numpy(c.x.transpose(0, 3, 1, 2).copy()).requires_grad_()
    wt = torch.from_numpy(c.w.transpose(0, 3, 1, 2).copy()).requires_grad_()
    bt = torch.from_numpy(c.b.copy()).requires_grad_()
    yt = torch.relu(torch.nn.functional.conv2d(xt, wt, bt, stride=1, padding=1))
    yt.backward(torch.from_numpy(c.dy.transpose(0, 3, 1, 2).copy()))
    c.fwd()
    c.bwd()
    for ours, theirs in ((c.y, yt.detach().numpy().transpose(0, 2, 3, 1)), (c.dw, wt.grad.numpy().transpose(0, 2, 3, 1)),
                         (c.db, bt.grad.numpy()), (c.dx, xt.grad.numpy().transpose(0, 2, 3, 1))):
        assert np.abs(ours - theirs).max() <= 2e-5 * max(1.0, np.abs(theirs).max())


def test_a_weight_gradient_too_large_for_the_scratch_runs_by_tiles_beside_a_winograd_dx() -> None:
    """Two threads, 16 -> 16 channels on 6x6 images, two of them: the scratch holds U and the input
    gradient's buffers but not a 16*16*16 dU partial per thread. dx runs by F(2x2, 3x3), dW by im2col
    tiles; the kernels say which, and both match the reference."""
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs two numba threads")
    before = numba.get_num_threads()
    numba.set_num_threads(2)
    try:
        floats = 2 * 36 * 9 * 16
        assert winograd.plan(2, 6, 6, 16, 16, floats) and not winograd.plan(2, 6, 6, 16, 16, floats, weight_grad=True)
        c = Case(2, 6, 16, 16, 3, 1, 1, True, "relu")
        assert c.fwd.winograd == ("forward",) and c.bwd.winograd == ("input gradient",)
        c.cols[...] = np.nan
        c.check()
    finally:
        numba.set_num_threads(before)


def test_one_scratch_for_columns_and_dcols_as_the_plan_gives_it(spy) -> None:
    """The plan hands conv_bwd its bwd_cols as both ``cols`` and ``dcols``: dW's pass, then U' and dx's
    pass in the same floats."""
    c = Case(4, 8, 16, 24, 3, 1, 1, True, "relu", seed=9)
    y, dw, dx = reference(c.x, c.w, c.b, "relu", c.dy, 3, 1, 1)
    shared = np.full_like(c.cols, np.nan)
    prm = dict(k=3, s=1, p=1, bias=True, act="relu", need_dx=True)
    bwd = KERNELS["conv_bwd"]([c.dw, c.db, c.dx, shared], [c.dy, c.x, c.w, shared, c.y], prm, BindEnv())
    assert bwd.winograd == ("weight gradient", "input gradient")
    c.fwd()
    close(c.y, y)
    bwd()
    close(c.dw, dw)
    close(c.dx, dx)


@pytest.mark.parametrize("h,w", [(5, 8), (8, 3), (1, 7)])
def test_images_that_are_not_square(h, w) -> None:
    """bind / bind_dw on h x w maps, against float64 sums of the nine taps."""
    rng = np.random.default_rng(h * w)
    n, c, co = 6, 16, 20
    x = rng.standard_normal((n, h, w, c)).astype(np.float32)
    wt = (rng.standard_normal((co, 3, 3, c)) / 12).astype(np.float32)
    dy = rng.standard_normal((n, h, w, co)).astype(np.float32)
    y, dx, dw = np.zeros_like(dy), np.zeros_like(x), np.zeros_like(wt)
    scratch = np.full(200_000, np.nan, np.float32)
    winograd.bind(x, wt, y, scratch, np.zeros(0, np.float32), 0)()
    winograd.bind(dy, wt, dx, scratch, np.zeros(0, np.float32), 0, flip=True)()
    winograd.bind_dw(x, dy, dw, scratch)()
    xp = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    dyp = np.pad(dy.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    y64, dx64, dw64 = np.zeros(y.shape), np.zeros(x.shape), np.zeros(wt.shape)
    for a in range(3):
        for b in range(3):
            y64 += np.einsum("nhwc,oc->nhwo", xp[:, a:a + h, b:b + w], wt[:, a, b].astype(np.float64))
            dx64 += np.einsum("nhwo,oc->nhwc", dyp[:, 2 - a:2 - a + h, 2 - b:2 - b + w], wt[:, a, b].astype(np.float64))
            dw64[:, a, b] = np.einsum("nhwc,nhwo->oc", xp[:, a:a + h, b:b + w], dy.astype(np.float64))
    close(y, y64)
    close(dx, dx64)
    close(dw, dw64)

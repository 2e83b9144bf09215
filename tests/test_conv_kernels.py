"""Convolution, batch-norm and pooling kernels (kernels/conv.py), called through the kernel table.

* gradients against central finite differences, in float64 (the factories take any dtype);
* parity with PyTorch (NHWC <-> NCHW, (Cout, kh, kw, Cin) <-> (Cout, Cin, kh, kw)) in float32;
* a replayed conv forward+backward allocates nothing.
"""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from helpers import numgrad

import renaissance_nb.kernels.conv  # noqa: F401  (registers the kernels)
from renaissance_nb.errors import PlanError
from renaissance_nb.kernels.cpu import KERNELS, BindEnv

F64 = np.float64
F32 = np.float32


# ---- helpers -----------------------------------------------------------------------------------
def bind(op: str, outs, ins, **params):
    return KERNELS[op](list(outs), list(ins), params, BindEnv())


def assert_grad(analytic, numeric, tol=1e-6):
    scale = max(1.0, float(np.abs(numeric).max()))
    err = float(np.abs(analytic - numeric).max())
    assert err <= tol * scale, f"max abs error {err} (scale {scale})"


def check_backward(fwd, bwd, y, dy, seed, pairs):
    """loss = sum(y * r) for a random r: run fwd, set dy = r, run bwd, and compare every
    (analytic gradient, input) pair with central differences of the loss."""
    r = np.random.default_rng(seed).standard_normal(y.shape)

    def loss():
        fwd()
        return float((y * r).sum())

    loss()
    dy[...] = r
    bwd()
    for grad, x in pairs:
        assert_grad(grad, numgrad(loss, x))


def out_size(h, k, s, p):
    return (h + 2 * p - k) // s + 1


class Conv:
    """Bound conv_fwd / conv_bwd over freshly made arrays of one dtype."""

    def __init__(self, n, h, w, cin, cout, k, s, p, bias, act, dtype, seed=0, need_dx=True):
        rng = np.random.default_rng(seed)
        self.x = rng.standard_normal((n, h, w, cin)).astype(dtype)
        self.w = (rng.standard_normal((cout, k, k, cin)) / np.sqrt(k * k * cin)).astype(dtype)
        self.b = rng.standard_normal(cout).astype(dtype) if bias else None
        ho, wo = out_size(h, k, s, p), out_size(w, k, s, p)
        m = n * ho * wo
        self.y = np.zeros((n, ho, wo, cout), dtype)
        self.cols = np.zeros((m, k * k * cin), dtype)
        self.dy = np.zeros_like(self.y)
        self.dw = np.zeros_like(self.w)
        self.db = np.zeros(cout, dtype)
        self.dx = np.zeros_like(self.x)
        self.dcols = np.zeros_like(self.cols)
        prm = dict(k=k, s=s, p=p, bias=bias, act=act, need_dx=need_dx)
        ins = [self.x, self.w] + ([self.b] if bias else [])
        self.fwd = bind("conv_fwd", [self.y, self.cols], ins, **prm)
        outs = [self.dw] + ([self.db] if bias else []) + ([self.dx, self.dcols] if need_dx else [])
        self.bwd = bind("conv_bwd", outs, [self.dy, self.x, self.w, self.cols, self.y], **prm)


# ---- finite differences (float64) ---------------------------------------------------------------
@pytest.mark.parametrize("k,s,p", [(3, 1, 1), (3, 2, 1), (1, 2, 0), (1, 1, 0), (2, 2, 0)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("act", ["none", "relu"])
def test_conv_gradients(k, s, p, bias, act):
    c = Conv(2, 5, 6, 3, 4, k, s, p, bias, act, F64, seed=k * 10 + s + p)
    check_backward(c.fwd, c.bwd, c.y, c.dy, 1, [(c.dx, c.x), (c.dw, c.w)] + ([(c.db, c.b)] if bias else []))


def test_conv_bwd_without_dx():
    c = Conv(2, 5, 5, 3, 4, 3, 1, 1, True, "none", F64, need_dx=False)
    c.fwd()
    c.dy[...] = 1.0
    c.bwd()
    assert np.allclose(c.db, c.y.shape[0] * c.y.shape[1] * c.y.shape[2])
    assert not c.dx.any()  # untouched


def test_conv_rejects_bad_shapes():
    x, w = np.zeros((1, 5, 5, 3), F32), np.zeros((4, 3, 3, 2), F32)
    with pytest.raises(PlanError):
        bind("conv_fwd", [np.zeros((1, 5, 5, 4), F32), np.zeros((25, 27), F32)], [x, w], k=3, s=1, p=1,
             bias=False, act="none")


def _bn_arrays(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    c = shape[-1]
    x = (rng.standard_normal(shape) * 2 + 3).astype(dtype)
    gamma = rng.uniform(0.5, 1.5, c).astype(dtype)
    beta = rng.standard_normal(c).astype(dtype)
    return x, gamma, beta


@pytest.mark.parametrize("shape", [(3, 3, 2, 4), (6, 5)])
@pytest.mark.parametrize("act", ["none", "relu"])
def test_bn_gradients(shape, act):
    x, gamma, beta = _bn_arrays(shape, F64)
    c = shape[-1]
    y = np.zeros_like(x)
    mean, invstd, rm, rv = (np.zeros(c) for _ in range(4))
    fwd = bind("bn_fwd", [y, mean, invstd, rm, rv], [x, gamma, beta], momentum=0.1, eps=1e-5, act=act)
    dy, dx, dgamma, dbeta = np.zeros_like(x), np.zeros_like(x), np.zeros(c), np.zeros(c)
    bwd = bind("bn_bwd", [dx, dgamma, dbeta], [dy, x, y, gamma, mean, invstd], act=act)
    check_backward(fwd, bwd, y, dy, 2, [(dx, x), (dgamma, gamma), (dbeta, beta)])


def _pool(kind, x, k, s, p):
    n, h, w, c = x.shape
    y = np.zeros((n, out_size(h, k, s, p), out_size(w, k, s, p), c), x.dtype)
    dy, dx = np.zeros_like(y), np.zeros_like(x)
    if kind == "max":
        am = np.zeros(y.shape, np.int32)
        fwd = bind("maxpool_fwd", [y, am], [x], k=k, s=s, p=p)
        bwd = bind("maxpool_bwd", [dx], [dy, am], k=k, s=s, p=p)
    else:
        fwd = bind("avgpool_fwd", [y], [x], k=k, s=s, p=p)
        bwd = bind("avgpool_bwd", [dx], [dy], k=k, s=s, p=p)
    return y, dy, dx, fwd, bwd


@pytest.mark.parametrize("kind,k,s,p", [("max", 2, 2, 0), ("max", 3, 2, 1), ("avg", 2, 2, 0), ("avg", 3, 2, 1),
                                        ("avg", 3, 1, 1)])
def test_pool_gradients(kind, k, s, p):
    x = np.random.default_rng(3).standard_normal((2, 6, 5, 3))
    y, dy, dx, fwd, bwd = _pool(kind, x, k, s, p)
    check_backward(fwd, bwd, y, dy, 4, [(dx, x)])


@pytest.mark.parametrize("h,w", [(6, 4), (7, 5)])
def test_maxpool_2x2_fast_path_is_the_general_loop(h, w):
    """The 2x2/stride-2 kernel gives the general loop's values and first-max indices, NaN
    and -inf included (odd sizes drop the last row and column, as the general loop does)."""
    from renaissance_nb.kernels.conv import maxpool2_fwd_, maxpool_fwd_
    rng = np.random.default_rng(9)
    x = rng.integers(-3, 3, (3, h, w, 19)).astype(np.float32)  # many ties: the first max must win
    x[0, 0, 0, :4] = np.nan
    x[1, 2, 1, 2:9] = np.nan
    x[2, :2, :2, 5] = -np.inf
    ho, wo = (h - 2) // 2 + 1, (w - 2) // 2 + 1
    y1, y2 = np.zeros((3, ho, wo, 19), np.float32), np.zeros((3, ho, wo, 19), np.float32)
    a1, a2 = np.zeros(y1.shape, np.int32), np.ones(y1.shape, np.int32)
    none = np.zeros((2, 19), np.float32)  # no batch norm's affine (bn_relu False)
    maxpool_fwd_(x, y1, a1, 2, 2, 0, none, False)
    maxpool2_fwd_(x, y2, a2, none, False)
    assert np.array_equal(y1, y2, equal_nan=True) and np.array_equal(a1, a2)
    assert np.isnan(y2).any() and np.isneginf(y2).any()


@pytest.mark.parametrize("h,w,k,s,p", [(7, 6, 3, 1, 1), (7, 6, 3, 2, 1), (5, 4, 5, 1, 2), (6, 7, 5, 2, 2), (3, 3, 5, 1, 3),
                                       (8, 5, 1, 1, 0), (6, 6, 2, 2, 0), (4, 9, 3, 3, 0)])
@pytest.mark.parametrize("threaded", [False, True])
def test_one_channel_im2col_is_the_general_loop(h, w, k, s, p, threaded, monkeypatch):
    """The tap-major im2col of Cin=1 layers, read through tap_major(), holds im2col_'s values
    everywhere, padding included (cols starts full of garbage: every element must be written),
    serial and by image blocks."""
    from renaissance_nb.kernels import conv
    from renaissance_nb.kernels.conv import im2col_, im2col_one_channel, tap_major
    monkeypatch.setattr(conv, "THREADED", threaded)
    x = np.random.default_rng(h * 100 + w * 10 + k).standard_normal((11, h, w, 1)).astype(np.float32)
    ho, wo = out_size(h, k, s, p), out_size(w, k, s, p)
    ref, got = np.full((11 * ho * wo, k * k), 7.0, np.float32), np.full((11 * ho * wo, k * k), np.nan, np.float32)
    im2col_(x.reshape(11, h, w), ref, 1, k, s, p, ho, wo)
    im2col_one_channel(x, got, k, s, p, ho, wo)()
    assert np.array_equal(ref, tap_major(got))


def test_one_channel_columns_need_a_contiguous_buffer():
    from renaissance_nb.kernels.conv import tap_major
    with pytest.raises(PlanError, match="one contiguous block"):
        tap_major(np.zeros((8, 18), np.float32)[:, ::2])


def test_one_channel_conv_gradients():
    c = Conv(2, 6, 5, 1, 4, 3, 1, 1, True, "relu", F64, seed=3)
    check_backward(c.fwd, c.bwd, c.y, c.dy, 2, [(c.dw, c.w), (c.db, c.b)])


@pytest.mark.parametrize("h,w", [(6, 4), (7, 5)])
def test_maxpool_2x2_backward_is_the_general_loop(h, w):
    """The one-pass 2x2/stride-2 backward gives the scatter's bits: ties, NaN, -0.0, odd sizes."""
    from renaissance_nb.kernels.conv import maxpool2_bwd_, maxpool2_fwd_, maxpool_bwd_
    rng = np.random.default_rng(10)
    x = rng.integers(-3, 3, (3, h, w, 19)).astype(np.float32)
    x[0, 0, 0, :4] = np.nan
    ho, wo = (h - 2) // 2 + 1, (w - 2) // 2 + 1
    y, am = np.zeros((3, ho, wo, 19), np.float32), np.zeros((3, ho, wo, 19), np.int32)
    maxpool2_fwd_(x, y, am, np.zeros((2, 19), np.float32), False)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    dy[0, 0, 0, :3] = -0.0
    for relu in (False, True):  # x has negative maxima, zeros and NaN: the ReLU mask's every case
        ref, got = np.full(x.shape, 5.0, np.float32), np.full(x.shape, np.nan, np.float32)
        maxpool_bwd_(dy, am, ref.reshape(3, h * w, 19), y, relu)
        maxpool2_bwd_(dy, am, got, y, relu)
        assert np.array_equal(ref.view(np.int32), got.view(np.int32))


def test_gap_gradients():
    x = np.random.default_rng(5).standard_normal((2, 3, 4, 5))
    y, dy, dx = np.zeros((2, 5)), np.zeros((2, 5)), np.zeros_like(x)
    fwd, bwd = bind("gap_fwd", [y], [x]), bind("gap_bwd", [dx], [dy])
    check_backward(fwd, bwd, y, dy, 6, [(dx, x)])
    fwd()
    assert np.allclose(y, x.mean(axis=(1, 2)))


# ---- PyTorch parity (float32) -------------------------------------------------------------------
def close(ours, ref, rel=1e-4):
    ref = np.asarray(ref, np.float64)
    scale = max(float(np.abs(ref).max()), 1e-6)
    err = float(np.abs(np.asarray(ours, np.float64) - ref).max())
    assert err <= rel * scale, f"max abs error {err}, reference scale {scale}"


def nchw(a):
    return np.ascontiguousarray(a.transpose(0, 3, 1, 2))


def nhwc(t):
    return t.detach().numpy().transpose(0, 2, 3, 1)


@pytest.mark.parametrize("k,s,p", [(3, 1, 1), (3, 2, 1), (1, 2, 0), (1, 1, 0), (5, 1, 2)])
@pytest.mark.parametrize("bias,act", [(True, "relu"), (False, "none")])
def test_conv_matches_torch(k, s, p, bias, act):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    c = Conv(3, 9, 8, 5, 7, k, s, p, bias, act, F32, seed=7)
    xt = torch.tensor(nchw(c.x), requires_grad=True)
    wt = torch.tensor(np.ascontiguousarray(c.w.transpose(0, 3, 1, 2)), requires_grad=True)
    bt = torch.tensor(c.b, requires_grad=True) if bias else None
    yt = F.conv2d(xt, wt, bt, stride=s, padding=p)
    if act == "relu":
        yt = F.relu(yt)
    g = np.random.default_rng(8).standard_normal(c.y.shape).astype(F32)
    yt.backward(torch.tensor(nchw(g)))
    c.fwd()
    close(c.y, nhwc(yt))
    c.dy[...] = g
    c.bwd()
    close(c.dx, nhwc(xt.grad))
    close(c.dw, wt.grad.numpy().transpose(0, 2, 3, 1))
    if bias:
        close(c.db, bt.grad.numpy())


@pytest.mark.parametrize("shape", [(8, 6, 5, 16), (32, 10)])
@pytest.mark.parametrize("act", ["none", "relu"])
def test_bn_matches_torch(shape, act):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    x, gamma, beta = _bn_arrays(shape, F32, seed=9)
    c = shape[-1]
    rng = np.random.default_rng(10)
    rm0 = rng.standard_normal(c).astype(F32)
    rv0 = rng.uniform(0.5, 2, c).astype(F32)
    y = np.zeros_like(x)
    mean, invstd = np.zeros(c, F32), np.zeros(c, F32)
    rm, rv = rm0.copy(), rv0.copy()
    mom, eps = 0.2, 1e-3
    fwd = bind("bn_fwd", [y, mean, invstd, rm, rv], [x, gamma, beta], momentum=mom, eps=eps, act=act)
    dy, dx, dgamma, dbeta = np.zeros_like(x), np.zeros_like(x), np.zeros(c, F32), np.zeros(c, F32)
    bwd = bind("bn_bwd", [dx, dgamma, dbeta], [dy, x, y, gamma, mean, invstd], act=act)

    to_t = nchw if x.ndim == 4 else np.ascontiguousarray
    from_t = nhwc if x.ndim == 4 else (lambda t: t.detach().numpy())
    xt = torch.tensor(to_t(x), requires_grad=True)
    gt, bt = torch.tensor(gamma, requires_grad=True), torch.tensor(beta, requires_grad=True)
    rmt, rvt = torch.tensor(rm0), torch.tensor(rv0)
    yt = F.batch_norm(xt, rmt, rvt, gt, bt, training=True, momentum=mom, eps=eps)
    if act == "relu":
        yt = F.relu(yt)
    g = rng.standard_normal(shape).astype(F32)
    yt.backward(torch.tensor(to_t(g)))

    fwd()
    close(y, from_t(yt))
    close(rm, rmt.numpy())
    close(rv, rvt.numpy())
    axes = tuple(range(x.ndim - 1))
    close(mean, x.astype(F64).mean(axis=axes))
    close(invstd, 1 / np.sqrt(x.astype(F64).var(axis=axes) + eps))
    dy[...] = g
    bwd()
    close(dx, from_t(xt.grad))
    close(dgamma, gt.grad.numpy())
    close(dbeta, bt.grad.numpy())

    # inference: fold the running stats into a per-channel affine, compare with eval-mode BN
    scale, shift = np.zeros(c, F32), np.zeros(c, F32)
    bind("bn_fold", [scale, shift], [gamma, beta, rm, rv], eps=eps)()
    yi = np.zeros_like(x)
    bind("bn_inf", [yi], [x, scale, shift], act=act)()
    ye = F.batch_norm(torch.tensor(to_t(x)), torch.tensor(rm), torch.tensor(rv), torch.tensor(gamma),
                      torch.tensor(beta), training=False, eps=eps)
    if act == "relu":
        ye = F.relu(ye)
    close(yi, from_t(ye))


def test_bn_statistics_do_not_cancel():
    """A large common offset must not destroy the variance (shifted float64 sums)."""
    x = (np.random.default_rng(11).standard_normal((64, 4, 4, 3)) + 1e4).astype(F32)
    c = 3
    y, mean, invstd, rm, rv = np.zeros_like(x), *(np.zeros(c, F32) for _ in range(4))
    bind("bn_fwd", [y, mean, invstd, rm, rv], [x, np.ones(c, F32), np.zeros(c, F32)], momentum=1.0, eps=0.0,
         act="none")()
    ref = x.astype(F64).reshape(-1, c)
    close(rv, ref.var(axis=0, ddof=1), rel=1e-5)
    close(y.reshape(-1, c).std(axis=0), np.ones(c), rel=1e-3)


@pytest.mark.parametrize("kind,k,s,p", [("max", 2, 2, 0), ("max", 3, 2, 1), ("max", 3, 1, 1), ("avg", 2, 2, 0),
                                        ("avg", 3, 2, 1)])
@pytest.mark.parametrize("ties", [False, True])
def test_pool_matches_torch(kind, k, s, p, ties):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(12)
    shape = (3, 9, 7, 6)
    x = (rng.integers(0, 3, shape) if ties else rng.standard_normal(shape)).astype(F32)
    y, dy, dx, fwd, bwd = _pool(kind, x, k, s, p)
    xt = torch.tensor(nchw(x), requires_grad=True)
    if kind == "max":
        yt = F.max_pool2d(xt, k, s, p)
    else:
        yt = F.avg_pool2d(xt, k, s, p, count_include_pad=True)
    g = rng.standard_normal(y.shape).astype(F32)
    yt.backward(torch.tensor(nchw(g)))
    fwd()
    close(y, nhwc(yt))
    dy[...] = g
    bwd()
    close(dx, nhwc(xt.grad))


def test_gap_matches_torch():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(13)
    x = rng.standard_normal((4, 7, 7, 10)).astype(F32)
    y, dy, dx = np.zeros((4, 10), F32), np.zeros((4, 10), F32), np.zeros_like(x)
    fwd, bwd = bind("gap_fwd", [y], [x]), bind("gap_bwd", [dx], [dy])
    xt = torch.tensor(nchw(x), requires_grad=True)
    yt = F.adaptive_avg_pool2d(xt, 1).flatten(1)
    g = rng.standard_normal((4, 10)).astype(F32)
    yt.backward(torch.tensor(g))
    fwd()
    close(y, yt.detach().numpy())
    dy[...] = g
    bwd()
    close(dx, nhwc(xt.grad))


# ---- no allocation in a replayed step ----------------------------------------------------------
@pytest.mark.parametrize("cin", [16, 1])  # 1: the tap-by-tap im2col
def test_conv_step_does_not_allocate(cin):
    c = Conv(32, 14, 14, cin, 32, 3, 1, 1, True, "relu", F32)
    g = np.random.default_rng(14).standard_normal(c.y.shape).astype(F32)
    c.fwd()
    c.dy[...] = g
    c.bwd()  # warm-up (compile / cache load, BLAS buffers)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        for _ in range(20):
            c.fwd()
            c.bwd()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak - base < 32 * 1024, f"conv fwd+bwd allocated {peak - base} bytes"

"""Float32 convolutions bound through the kernel table, and their float64 references
(shared by the tests of the tiled and the one-channel convolutions)."""
from __future__ import annotations

import numpy as np

import renaissance_nb.kernels.conv as conv
from renaissance_nb.kernels.cpu import KERNELS, BindEnv


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

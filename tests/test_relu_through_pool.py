"""A fused ReLU's gradient applied by the max pool that alone reads its output (ops/pool.py
relu_pool_pairs): the same bytes as the layer masking dy itself, and the layer's output no longer
lives into the backward."""
from __future__ import annotations

import numpy as np
import pytest

import renaissance_nb as rnb
from renaissance_nb.blueprint import bn, conv, fc, gap, maxpool, relu, seq
from renaissance_nb.ops import pool

RNG = np.random.default_rng(7)
X = RNG.standard_normal((96, 1, 12, 12), dtype=np.float32)
Y = X[:, 0].reshape(96, 2, 6, 2, 6).sum(axis=(2, 4)).reshape(96, 4).argmax(axis=1).astype(np.int32)  # brightest
# quadrant: a task the nets learn

NETS = {
    "conv, bn + relu, 2x2 pool": seq(conv(6, 3, 1, 1, bias=False), bn(), relu(), maxpool(2),
                                     conv(8, 3, 1, 1, bias=False), bn(), relu(), maxpool(2), gap(), fc(4)),
    "conv + bias + relu, overlapping pool": seq(conv(6, 3, 1, 1, bias=True), relu(), maxpool(3, 2, 1),
                                                conv(8, 3, 1, 1, bias=True), relu(), maxpool(2), gap(), fc(4)),
}


def task(net: rnb.BluePrint, paired: bool, monkeypatch: pytest.MonkeyPatch, precision: str = "fp32"
         ) -> rnb.DeepLearningTask:
    """The net compiled with the pairs (or none: every layer masks its own dy), to train 3 epochs."""
    with monkeypatch.context() as m:
        if not paired:
            m.setattr(pool, "relu_pool_pairs", lambda arch: {})
        t = (rnb.DeepLearningTask("pairs").model(net).data(train=(X, Y), batch_size=32)
             .loss(rnb.CrossEntropyLoss()).optimizer(rnb.AdamW(lr=1e-2)).total_epochs(3).seed(3)
             .precision(precision))
        t.compile()
    return t


def nodes(t: rnb.DeepLearningTask, op: str) -> list:
    train = t.graphs.train
    return [n for gid in train.ids() for n in train.nodes(gid) if n.op == op]


@pytest.mark.parametrize("name,precision", [(n, "fp32") for n in NETS] + [(next(iter(NETS)), "bf16")])
def test_the_pool_applying_the_relu_gradient_gives_the_same_bytes(name: str, precision: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    paired, alone = task(NETS[name], True, monkeypatch, precision), task(NETS[name], False, monkeypatch, precision)
    assert all(n.p.get("relu") for n in nodes(paired, "maxpool_bwd")), "every pool here follows a fused relu"
    ra, rb = paired.run(progress=False), alone.run(progress=False)
    assert [e.train_loss for e in ra.history] == [e.train_loss for e in rb.history]
    assert ra.history[-1].train_loss < ra.history[0].train_loss  # it trains
    sa, sb = paired.state_dict(), alone.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].tobytes() == sb[k].tobytes(), k


def test_the_layer_output_dies_at_the_pool_and_the_arena_shrinks(monkeypatch: pytest.MonkeyPatch) -> None:
    net = NETS["conv, bn + relu, 2x2 pool"]
    paired, alone = task(net, True, monkeypatch), task(net, False, monkeypatch)
    y = paired.plans["train_base"]["bn1.out"].id
    bwd = nodes(paired, "bn_bwd")
    assert bwd and all(n.p["act"] == "none" and n.p["relu_grad"].startswith("maxpool") for n in bwd)
    assert all(len(n.inputs) == 5 for n in bwd), "dy, x, gamma, mean, invstd: not y"
    assert all(y not in n.inputs for n in bwd)
    for n in nodes(paired, "maxpool_bwd"):
        assert len(n.inputs) == 3 and n.p["relu"] is True
    for n in nodes(alone, "maxpool_bwd"):
        assert len(n.inputs) == 2 and "relu" not in n.p
    # bn1's output (6 channels at 12x12) is freed after maxpool1's forward instead of living to bn1's backward
    assert paired.memory_inspector.arena_bytes < alone.memory_inspector.arena_bytes


def test_a_relu_output_read_by_more_than_the_pool_keeps_its_own_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    from renaissance_nb.blueprint import add2
    net = seq(conv(6, 3, 1, 1, bias=False), bn(), relu(), add2(maxpool(3, 1, 1), conv(6, 1, 1, 0, bias=False)),
              maxpool(2), gap(), fc(4))
    t = task(net, True, monkeypatch)
    assert pool.relu_pool_pairs(t.compiled.arch) == {}
    assert all(n.p["act"] == "relu" for n in nodes(t, "bn_bwd"))


def _pool_case(h: int, w: int, k: int, s: int, p: int) -> tuple[np.ndarray, ...]:
    """x after a ReLU (zeros, a NaN), its pooled output and argmax, and dy with a -0.0."""
    from renaissance_nb.kernels import conv as k_conv
    rng = np.random.default_rng(h * 31 + w)
    x = np.maximum(rng.standard_normal((3, h, w, 19)).astype(np.float32), 0)
    x[0, 0, 0, 0] = np.nan
    x[1, :2, :2, :] = 0.0  # whole windows of zeros: their max is 0, not above it
    ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    y, am = np.empty((3, ho, wo, 19), np.float32), np.empty((3, ho, wo, 19), np.int32)
    k_conv.maxpool_fwd_(x, y, am, k, s, p)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    dy[2, 0, 0, 0] = -0.0
    return x, y, am, dy


@pytest.mark.parametrize("h,w,k,s,p", [(6, 8, 2, 2, 0), (7, 5, 2, 2, 0), (7, 6, 3, 2, 1)])
def test_the_masked_pool_gradient_is_the_mask_after_the_pool_and_c_is_numba(h: int, w: int, k: int, s: int,
                                                                          p: int) -> None:
    from renaissance_nb.kernels import conv as k_conv
    from renaissance_nb.kernels import conv_native
    x, y, am, dy = _pool_case(h, w, k, s, p)
    ref = np.empty_like(x)
    k_conv.maxpool_bwd_(dy, am, ref.reshape(3, h * w, 19), y, False)
    ref = np.where(x > 0, ref, np.float32(0.0))  # what the layer's own mask made of it
    two = (k, s, p) == (2, 2, 0)
    got = np.full_like(x, 7.0)
    if two:
        k_conv.maxpool2_bwd_(dy, am, got, y, True)
    else:
        k_conv.maxpool_bwd_(dy, am, got.reshape(3, h * w, 19), y, True)
    assert got.tobytes() == ref.tobytes()
    native = conv_native.bind_maxpool_bwd(dy, am, c_out := np.full_like(x, 7.0), two, 2, y)
    if native is None:
        pytest.skip("no C compiler: the numba loops run")
    native()
    assert c_out.tobytes() == ref.tobytes()

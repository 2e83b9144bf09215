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
    "bn + relu, overlapping and odd pools": seq(conv(6, 3, 1, 1, bias=False), bn(), relu(), maxpool(3, 2, 1),
                                                conv(8, 3, 1, 1, bias=False), bn(), relu(), maxpool(3, 1, 1),
                                                maxpool(2), gap(), fc(4)),
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


@pytest.mark.parametrize("name,precision", [(n, "fp32") for n in NETS] + [(next(iter(NETS)), "bf16"),
                                                                           (next(iter(NETS)), "fp16")])
def test_the_pool_applying_the_relu_gradient_gives_the_same_bytes(name: str, precision: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    paired, alone = task(NETS[name], True, monkeypatch, precision), task(NETS[name], False, monkeypatch, precision)
    pools = paired.compiled.arch.relu_pools
    by_pool = sum(bool(n.p.get("relu")) for n in nodes(paired, "maxpool_bwd"))  # the pool's backward masks
    by_bn = sum(bool(n.p.get("dy_pool")) for n in nodes(paired, "bn_bwd"))  # the batch norm makes the pool's dx
    assert by_pool + by_bn == len(pools) >= 2
    ra, rb = paired.run(progress=False), alone.run(progress=False)
    assert [e.train_loss for e in ra.history] == [e.train_loss for e in rb.history]
    assert ra.history[-1].train_loss < ra.history[0].train_loss  # it trains
    sa, sb = paired.state_dict(), alone.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].tobytes() == sb[k].tobytes(), k


def test_the_layer_output_dies_at_the_pool_and_the_arena_shrinks(monkeypatch: pytest.MonkeyPatch) -> None:
    net = NETS["bn + relu, overlapping and odd pools"]  # overlapping windows: the pool's backward stays a node
    paired, alone = task(net, True, monkeypatch), task(net, False, monkeypatch)
    y = paired.plans["train_base"]["bn1.out"].id
    bwd = nodes(paired, "bn_bwd")
    assert bwd and all(n.p["act"] == "none" and n.p["relu_grad"].startswith("maxpool") for n in bwd)
    assert all(len(n.inputs) == 5 for n in bwd), "dy, x, gamma, mean, invstd: not y"
    assert all(y not in n.inputs for n in bwd)
    for n in nodes(paired, "maxpool_bwd"):
        assert len(n.inputs) == 3 and n.p["relu"] is True or n.layer == "maxpool3"  # maxpool3 follows maxpool2
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
    k_conv.maxpool_fwd_(x, y, am, k, s, p, np.zeros((2, 19), np.float32), False)
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


@pytest.mark.parametrize("h,w,k,s,p", [(6, 8, 2, 2, 0), (7, 5, 2, 2, 0), (7, 6, 3, 2, 1)])
def test_the_pool_of_a_batch_norm_input_and_affine_is_the_pool_of_its_output(h: int, w: int, k: int, s: int,
                                                                             p: int) -> None:
    """maxpool_fwd with bn_relu pools relu(x * a + b) made on the fly: the values and first-max indices of
    the pool of the batch norm's written output (channel_affine_), in numba and in C, NaN and ties included."""
    from renaissance_nb.kernels import conv as k_conv
    from renaissance_nb.kernels import conv_native
    from renaissance_nb.kernels.conv_loops import channel_affine_
    rng = np.random.default_rng(h * 7 + w)
    x = rng.integers(-3, 4, (3, h, w, 19)).astype(np.float32) * np.float32(0.37)  # ties after the affine
    x[0, 0, 0, :3] = np.nan
    aff = np.stack([rng.standard_normal(19), rng.standard_normal(19)]).astype(np.float32)
    aff[0, 4] = 0.0  # a channel the affine makes constant
    bn_y = np.empty_like(x)
    channel_affine_(x.reshape(-1, 19), bn_y.reshape(-1, 19), aff[0], aff[1], 1)  # what bn_fwd writes
    ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    want_y, want_a = np.empty((3, ho, wo, 19), np.float32), np.empty((3, ho, wo, 19), np.int32)
    none = np.zeros((2, 19), np.float32)
    k_conv.maxpool_fwd_(bn_y, want_y, want_a, k, s, p, none, False)
    got_y, got_a = np.full_like(want_y, 9.0), np.full_like(want_a, -1)
    if (k, s, p) == (2, 2, 0):
        k_conv.maxpool2_fwd_(x, got_y, got_a, aff, True)
    else:
        k_conv.maxpool_fwd_(x, got_y, got_a, k, s, p, aff, True)
    assert got_y.tobytes() == want_y.tobytes() and np.array_equal(got_a, want_a)
    c_y, c_a = np.full_like(want_y, 9.0), np.full_like(want_a, -1)
    native = conv_native.bind_maxpool_fwd(x, c_y, c_a, k, s, p, (k, s, p) == (2, 2, 0), 2, aff)
    if native is None:
        pytest.skip("no C compiler: the numba loops run")
    native()
    assert c_y.tobytes() == want_y.tobytes() and np.array_equal(c_a, want_a)


def test_the_batch_norm_before_a_pool_writes_no_output_in_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """bn_fwd (y_by) has no y; the pool reads the batch norm's input and affine; nothing in the training graph
    touches the batch norm's output, which the inference graph still writes and reads. Not under bf16."""
    t = task(NETS["conv, bn + relu, 2x2 pool"], True, monkeypatch)
    plan = t.plans["train_base"]
    for i, name in ((1, "bn1"), (2, "bn2")):
        y = plan[f"{name}.out"].id
        train = t.graphs.train
        touching = [n for gid in train.ids() for n in train.nodes(gid) if y in (*n.inputs, *n.outputs)]
        assert touching == [], touching
        fwd = next(n for n in nodes(t, "bn_fwd") if n.layer == name)
        assert fwd.p["y_by"] == f"maxpool{i}" and len(fwd.outputs) == 4 + 2  # mean, invstd, running x2, scratch
        pool_fwd = next(n for n in nodes(t, "maxpool_fwd") if n.layer == f"maxpool{i}")
        assert pool_fwd.inputs == (plan[f"conv{i}.out"].id, plan[f"{name}.affine"].id)
        inference = t.graphs.inference
        assert any(y in n.outputs for gid in inference.ids() for n in inference.nodes(gid))
    bf16 = task(NETS["conv, bn + relu, 2x2 pool"], True, monkeypatch, "bf16")
    assert all("y_by" not in n.p for n in nodes(bf16, "bn_fwd"))


def test_liveness_off_keeps_the_batch_norm_output_to_read() -> None:
    """options(liveness=False) promises every temporary readable after a step: the pool does not make the
    batch norm's output then (its backward still applies the relu's gradient)."""
    t = (rnb.DeepLearningTask("kept").model(NETS["conv, bn + relu, 2x2 pool"]).data(train=(X, Y), batch_size=32)
         .optimizer(rnb.AdamW(lr=1e-2)).total_epochs(1).seed(3).options(liveness=False))
    t.compile()
    assert all("y_by" not in n.p for n in nodes(t, "bn_fwd")) and all(n.p.get("relu") for n in nodes(t, "maxpool_bwd"))
    t.run(progress=False)
    y = t.read("bn2.out")
    assert (y > 0).mean() > 0.2 and (y >= 0).all()  # a relu output, written


def test_a_hand_built_bn_fwd_without_y_is_checked() -> None:
    """bn_fwd(y_by=...) needs act='relu', four outputs and the 'affine' scratch the pool reads: a PlanError."""
    from renaissance_nb.errors import PlanError
    from renaissance_nb.kernels.base import BindEnv
    from renaissance_nb.kernels.cpu import KERNELS
    x, c = np.ones((8, 3), np.float32), np.ones(3, np.float32)
    outs = [c.copy() for _ in range(4)]
    with pytest.raises(PlanError, match="y_by='maxpool1'.*act='relu'"):
        KERNELS["bn_fwd"](outs, [x, c, c], {"y_by": "maxpool1", "act": "none"}, BindEnv())
    with pytest.raises(PlanError, match="got 5 outputs"):
        KERNELS["bn_fwd"]([x.copy()] + outs, [x, c, c], {"y_by": "maxpool1", "act": "relu"}, BindEnv())


def test_a_grouped_conv_keeps_its_own_relu_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    """Grouped convolutions have kernels of their own (ops/grouped_conv.py), which mask dy themselves."""
    net = seq(conv(6, 3, 1, 1), relu(), conv(6, 3, 1, 1, groups=3), relu(), maxpool(2), gap(), fc(4))
    t = task(net, True, monkeypatch)
    assert t.compiled.arch.relu_pools == {}
    assert all("relu" not in n.p for n in nodes(t, "maxpool_bwd"))


def test_a_bn_bwd_node_missing_y_with_a_relu_is_refused() -> None:
    """A hand-built bn_bwd with act='relu' needs y: a PlanError naming the inputs, not an unpacking error."""
    from renaissance_nb.errors import PlanError
    from renaissance_nb.kernels.base import BindEnv
    from renaissance_nb.kernels.cpu import KERNELS
    x = np.ones((8, 3), np.float32)
    c = np.ones(3, np.float32)
    with pytest.raises(PlanError, match=r"bn_bwd: takes \(dy, x, y, gamma, mean, invstd\).*got 5 inputs"):
        KERNELS["bn_bwd"]([x.copy(), c.copy(), c.copy()], [x, x, c, c, c], {"act": "relu"}, BindEnv())


_NUMBA_RUN = """
import numpy as np
import pytest
import test_relu_through_pool as t
from renaissance_nb.kernels import native
assert native.status().lib is None  # RNB_NATIVE=0: every kernel numba's
mp = pytest.MonkeyPatch()
for name in ("bn + relu, overlapping and odd pools", "conv + bias + relu, overlapping pool"):
    a, b = t.task(t.NETS[name], True, mp), t.task(t.NETS[name], False, mp)
    a.run(progress=False), b.run(progress=False)
    sa, sb = a.state_dict(), b.state_dict()
    print(name, all(sa[k].tobytes() == sb[k].tobytes() for k in sa))
"""


def test_the_numba_kernels_give_the_same_bytes_too() -> None:
    """The same comparison with every kernel numba's (RNB_NATIVE=0, a machine without a C compiler)."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    env = {**os.environ, "RNB_NATIVE": "0", "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent),
                                                                         os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", _NUMBA_RUN], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 2 and all(line.endswith(" True") for line in lines), out.stdout

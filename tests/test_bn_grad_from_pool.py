"""A batch norm whose relu output a max pool with non-overlapping windows alone reads makes the pool's input
gradient itself (ops/pool.py grad_from_pool): no maxpool_bwd node, no dy tensor, the same bytes as the pool's
backward writing dy and the batch norm reading it."""
from __future__ import annotations

import numpy as np
import pytest

import renaissance_nb as rnb
from renaissance_nb.blueprint import bn, conv, fc, gap, maxpool, relu, seq
from renaissance_nb.ops import pool


RNG = np.random.default_rng(11)
X = RNG.standard_normal((80, 2, 13, 11), dtype=np.float32)  # odd maps: a 2x2 pool leaves a row and a column out
Y = (X[:, 0, :6].sum(axis=(1, 2)) > X[:, 0, 7:].sum(axis=(1, 2))).astype(np.int32) * 2 + (X[:, 1].mean(axis=(1, 2)) > 0)

NETS = {
    "2x2 pools, odd maps": seq(conv(6, 3, 1, 1, bias=False), bn(), relu(), maxpool(2),
                               conv(8, 3, 1, 1, bias=False), bn(), relu(), maxpool(2), gap(), fc(4)),
    "3x3 pool, stride 3": seq(conv(5, 3, 1, 1, bias=False), bn(), relu(), maxpool(3),
                              conv(7, 3, 1, 1, bias=False), bn(), relu(), gap(), fc(4)),
}


def task(net: rnb.BluePrint, fused: bool, monkeypatch: pytest.MonkeyPatch, epochs: int = 3) -> rnb.DeepLearningTask:
    """The net compiled with the batch norms making their pools' gradient (or the pools' backward writing it)."""
    with monkeypatch.context() as m:
        if not fused:  # the tensor table and the batch norm's backward ask it
            m.setattr(pool, "grad_from_pool", lambda arch, elide, layer, recompute=False: None)
        t = (rnb.DeepLearningTask("pooled-dy").model(net).data(train=(X, Y), val=(X[:16], Y[:16]), batch_size=16)
             .loss(rnb.CrossEntropyLoss()).optimizer(rnb.AdamW(lr=1e-2)).total_epochs(epochs).seed(4).ema(0.9))
        t.compile()
    return t


def nodes(t: rnb.DeepLearningTask, op: str) -> list:
    train = t.graphs.train
    return [n for gid in train.ids() for n in train.nodes(gid) if n.op == op]


def same_training(a: rnb.DeepLearningTask, b: rnb.DeepLearningTask) -> None:
    ra, rb = a.run(progress=False), b.run(progress=False)
    assert ra.step_losses.tobytes() == rb.step_losses.tobytes()
    assert ra.history[-1].train_loss < ra.history[0].train_loss  # it trains
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].tobytes() == sb[k].tobytes(), k


@pytest.mark.parametrize("name", NETS)
def test_the_batch_norm_making_the_pool_gradient_gives_the_same_bytes(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fused, apart = task(NETS[name], True, monkeypatch), task(NETS[name], False, monkeypatch)
    by_bn = [n for n in nodes(fused, "bn_bwd") if n.p.get("dy_pool")]
    assert len(by_bn) == len(fused.compiled.arch.relu_pools) >= 1
    assert not any(n.p.get("dy_pool") for n in nodes(apart, "bn_bwd"))
    assert len(nodes(fused, "maxpool_bwd")) == len(nodes(apart, "maxpool_bwd")) - len(by_bn)
    same_training(fused, apart)


def test_no_dy_tensor_and_a_smaller_arena(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch norm's dy is never made: nothing in the training graph touches it; the bn_bwd node reads the
    pool's gradient, argmax and output, writes none of its inputs, and the arena shrinks."""
    from renaissance_nb.compiler.touches import in_place_inputs
    fused, apart = task(NETS["2x2 pools, odd maps"], True, monkeypatch), task(NETS["2x2 pools, odd maps"], False,
                                                                                monkeypatch)
    plan = fused.plans["train_base"]
    for i in (1, 2):
        names = [t.name for t in plan]
        assert f"bn{i}.out@grad" not in names and f"bn{i}.out@grad" in [t.name for t in apart.plans["train_base"]]
        node = next(n for n in nodes(fused, "bn_bwd") if n.layer == f"bn{i}")
        want = [plan[t].id for t in (f"maxpool{i}.out@grad", f"maxpool{i}.argmax", f"maxpool{i}.out", f"conv{i}.out")]
        assert list(node.inputs[:4]) == want and node.p["dy_pool"] == 2 and in_place_inputs(node) == []
    assert fused.memory_inspector.arena_bytes < apart.memory_inspector.arena_bytes
    note = [n for n in fused.compiled.notes if n.startswith("batch norms making")]
    assert len(note) == 1 and "bn1 <- maxpool1, bn2 <- maxpool2;" in note[0]
    assert not [n for n in apart.compiled.notes if n.startswith("batch norms making")]


def test_overlapping_windows_mixed_precision_and_liveness_off_keep_the_pool_backward(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows that overlap (k > s) or pad sum several gradients into one value: the pool's backward stays. So does it
    where the pool does not make the batch norm's output (bf16; liveness=False)."""
    overlap = seq(conv(4, 3, 1, 1, bias=False), bn(), relu(), maxpool(3, 2, 1), gap(), fc(4))
    assert not any(n.p.get("dy_pool") for n in nodes(task(overlap, True, monkeypatch, 1), "bn_bwd"))
    net = NETS["2x2 pools, odd maps"]
    for t in (rnb.DeepLearningTask("lowp").model(net).data(train=(X, Y), batch_size=16).total_epochs(1)
              .precision("bf16"),
              rnb.DeepLearningTask("kept").model(net).data(train=(X, Y), batch_size=16).total_epochs(1)
              .options(liveness=False)):
        t.compile()
        assert not any(n.p.get("dy_pool") for n in nodes(t, "bn_bwd"))
        assert all(n.p.get("relu") for n in nodes(t, "maxpool_bwd"))


def test_a_hand_built_pooled_bn_bwd_is_checked() -> None:
    """bn_bwd(dy_pool=k) takes the pool's dy, argmax and y, then x, gamma, mean, invstd, and act='none'."""
    from renaissance_nb.errors import PlanError
    from renaissance_nb.kernels.base import BindEnv
    from renaissance_nb.kernels.cpu import KERNELS
    x, c = np.ones((2, 4, 4, 3), np.float32), np.ones(3, np.float32)
    pdy, am = np.ones((2, 2, 2, 3), np.float32), np.zeros((2, 2, 2, 3), np.int32)
    outs = [x.copy(), c.copy(), c.copy()]
    with pytest.raises(PlanError, match=r"dy_pool=k .* got 5 inputs"):
        KERNELS["bn_bwd"](outs, [pdy, x, c, c, c], {"dy_pool": 2}, BindEnv())
    with pytest.raises(PlanError, match="act='relu'"):
        KERNELS["bn_bwd"](outs, [pdy, am, pdy, x, c, c, c], {"dy_pool": 2, "act": "relu"}, BindEnv())
    with pytest.raises(PlanError, match="pool dy"):
        KERNELS["bn_bwd"](outs, [pdy[:, :1], am, pdy, x, c, c, c], {"dy_pool": 2}, BindEnv())


_NUMBA_RUN = """
import pytest
import test_bn_grad_from_pool as t
from renaissance_nb.kernels import native
assert native.status().lib is None  # RNB_NATIVE=0: every kernel numba's
mp = pytest.MonkeyPatch()
for name in t.NETS:
    t.same_training(t.task(t.NETS[name], True, mp, 2), t.task(t.NETS[name], False, mp, 2))
    print(name, "same")
"""


def test_the_numba_kernels_give_the_same_bytes_too() -> None:
    """The same comparison with every kernel numba's (RNB_NATIVE=0): there the pool's backward writes dy into
    the batch norm's dx, whose passes read and overwrite it in place."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    env = {**os.environ, "RNB_NATIVE": "0", "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent),
                                                                         os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", _NUMBA_RUN], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count(" same") == len(NETS), out.stdout


def test_recompute_keeps_the_pool_backward_where_the_pool_is_recomputed(monkeypatch: pytest.MonkeyPatch) -> None:
    """options(recompute=True): a pool inside a recomputed block has its tensors' twins read by its backward,
    which a batch norm outside the block would not see, so that pair keeps maxpool_bwd; a pool outside every
    block stays fused. The bytes are the unfused run's either way."""
    from renaissance_nb.blueprint_nodes import Named
    inside = seq(conv(6, 3, 1, 1, bias=False), bn(), relu(),
                 Named("pb", seq(maxpool(2), conv(8, 3, 1, 1), relu(), conv(8, 3, 1, 1))), relu(), gap(), fc(4))
    outside = seq(conv(6, 3, 1, 1, bias=False), bn(), relu(), maxpool(2),
                  Named("tail", seq(conv(8, 3, 1, 1), relu(), conv(8, 3, 1, 1))), relu(), gap(), fc(4))
    for net, fused_pairs in ((inside, 0), (outside, 1)):
        with monkeypatch.context() as m:
            m.setattr(rnb.DeepLearningTask, "compile", lambda self, _c=rnb.DeepLearningTask.compile:
                      _c(self.options(recompute=True)))
            a, b = task(net, True, m, 2), task(net, False, m, 2)
        assert sum(bool(n.p.get("dy_pool")) for n in nodes(a, "bn_bwd")) == fused_pairs
        same_training(a, b)

"""Image models end to end: a residual conv net against PyTorch, progressive resizing and
its atlas, EMA, augmentation determinism, and the errors for resolution-bound models."""
from __future__ import annotations

import numpy as np
import pytest
from helpers import one_step_gradients

from renaissance_nb import (AdamW, CosineAnnealingLR, DeepLearningTask, GraphId, PlanError, ShapeError, fc, flatten,
                            relu, seq)
from renaissance_nb.config import PRECISIONS
from renaissance_nb.blueprint import (RESNET_3_3, RESNET_3_3_DS, add2, avgpool, block, bn, cbr, conv, gap, identity,
                                      layernorm, maxpool)


def blobs(n: int, c: int = 3, hw: int = 16, classes: int = 4, seed: int = 0):
    """Learnable images: each class brightens one quadrant, plus noise."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = rng.standard_normal((n, c, hw, hw)).astype(np.float32) * 0.5
    h = hw // 2
    for k in range(classes):
        r, q = divmod(k, 2)
        x[y == k, :, r * h:(r + 1) * h, q * h:(q + 1) * h] += 1.0
    return x, y


def resnet_small(classes: int = 4):
    return seq(cbr(8, 3, 1, 1), block(8, RESNET_3_3), block(16, RESNET_3_3_DS), gap(), fc(classes))


def test_residual_convnet_matches_pytorch_forward_and_gradients() -> None:
    torch = pytest.importorskip("torch")
    from torch import nn
    torch.set_num_threads(2)
    x, y = blobs(16, c=3, hw=12)
    model = seq(cbr(8, 3, 1, 1), maxpool(2), block(8, RESNET_3_3), block(16, RESNET_3_3_DS),
                add2(avgpool(1), seq(conv(16, 1, 1, 0), bn())), gap(), fc(4))
    task = (DeepLearningTask().model(model).data(train=(x, y), batch_size=16, shuffle=False)
            .total_epochs(1).seed(3).options(prefetch=False))
    task.compile()
    sd = task.state_dict()  # before the step: it updates the running statistics
    one_step_gradients(task)
    ours_loss = float(task.executor.view("train_base", "result")[0])

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
            self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
            self.short = None
            if stride != 1:
                self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, 0, bias=False), nn.BatchNorm2d(cout))

        def forward(self, t):
            s = t if self.short is None else self.short(t)
            return torch.relu(s + self.b2(self.c2(torch.relu(self.b1(self.c1(t))))))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.bn = nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8)
            self.blk1, self.blk2 = Block(8, 8, 1), Block(8, 16, 2)
            self.proj, self.pbn = nn.Conv2d(16, 16, 1, 1, 0), nn.BatchNorm2d(16)
            self.fc = nn.Linear(16, 4)

        def forward(self, t):
            t = nn.functional.max_pool2d(torch.relu(self.bn(self.stem(t))), 2)
            t = self.blk2(self.blk1(t))
            t = nn.functional.avg_pool2d(t, 1) + self.pbn(self.proj(t))
            return self.fc(t.mean(dim=(2, 3)))

    net = Net()
    # our layer names in walk order: conv1 bn1 | blk1: conv2 bn2 conv3 bn3 | blk2: conv4 bn4 (shortcut) conv5 bn5
    # conv6 bn6 | add2: conv7 bn7 | fc1
    pairs = [("conv1", net.stem), ("bn1", net.bn), ("conv2", net.blk1.c1), ("bn2", net.blk1.b1),
             ("conv3", net.blk1.c2), ("bn3", net.blk1.b2), ("conv4", net.blk2.short[0]), ("bn4", net.blk2.short[1]),
             ("conv5", net.blk2.c1), ("bn5", net.blk2.b1), ("conv6", net.blk2.c2), ("bn6", net.blk2.b2),
             ("conv7", net.proj), ("bn7", net.pbn), ("fc1", net.fc)]
    with torch.no_grad():
        for name, mod in pairs:
            for role, t in mod.state_dict().items():
                if role == "num_batches_tracked":
                    continue
                t.copy_(torch.from_numpy(sd[f"{name}.{role}"]))
    net.train()
    xt = torch.from_numpy(x)
    loss = nn.functional.cross_entropy(net(xt), torch.from_numpy(y.astype(np.int64)))
    loss.backward()
    assert ours_loss == pytest.approx(float(loss.detach()), rel=1e-5)
    ex = task.executor
    for name, mod in pairs:
        for role, prm in mod.named_parameters():
            g = ex.view("train_base", f"{name}.{role}@grad")
            if g.ndim == 4:
                g = g.transpose(0, 3, 1, 2)
            want = prm.grad.numpy()
            np.testing.assert_allclose(g, want, rtol=2e-4, atol=max(1e-6, 2e-5 * np.abs(want).max()),
                                       err_msg=f"{name}.{role}")
        if isinstance(mod, nn.BatchNorm2d):  # running statistics updated like PyTorch's
            np.testing.assert_allclose(ex.view("train_base", f"{name}.running_var"), mod.running_var.numpy(),
                                       rtol=1e-5, atol=1e-6)


def test_progressive_resizing_trains_and_binds_one_graph_per_shape() -> None:
    x, y = blobs(200, c=3, hw=16)
    xv, yv = blobs(64, c=3, hw=16, seed=1)
    task = (DeepLearningTask().model(resnet_small()).data(train=(x, y), val=(xv, yv), batch_size=48)
            .optimizer(AdamW()).scheduler(CosineAnnealingLR().base_lr(3e-3)).total_epochs(4).seed(0)
            .train_resolution(16, 12, boundary_epoch=2).options(prefetch=False))
    task.compile()
    atlas = task.compiled.atlas
    shapes = {atlas.entry(v, GraphId.DEEP_FWD_BWD).shape_id for v in
              ("train_base", "train_last", "train_lowres", "train_lowres_last")}
    assert len(shapes) == 4  # 48 and 8 rows, at 16x16 and 12x12
    assert atlas.shape_ids[atlas.entry("train_lowres", GraphId.DEEP_FWD_BWD).shape_id] == (48, 3, 12, 12)
    opt = {atlas.entry(v, GraphId.OPTIMIZER).captured_index for v in ("train_base", "train_lowres_last")}
    assert len(opt) == 1 and atlas.entry("train_base", GraphId.OPTIMIZER).shape_id == 0
    # same offsets at both resolutions
    a, b = task.plans["train_base"], task.plans["train_lowres"]
    assert [t.offset for t in a] == [t.offset for t in b]
    assert a["conv1.out"].shape != b["conv1.out"].shape
    r = task.run(progress=False)
    losses = [h.train_loss for h in r.history]
    assert losses[-1] < losses[0]
    assert r.history[-1].val_top1 > 0.45  # 4 classes: chance is 0.25


def test_resolution_bound_model_gets_a_clear_error() -> None:
    x, y = blobs(64, c=1, hw=8)
    task = (DeepLearningTask().model(seq(conv(4, 3, 1, 1), relu(), flatten(), fc(4))).data(train=(x, y), batch_size=16)
            .train_resolution(8, 6, boundary_epoch=1))
    with pytest.raises(ShapeError, match="gap"):
        task.plan()


def test_ema_is_evaluated_and_tracks_weights() -> None:
    x, y = blobs(192, c=1, hw=8)
    xv, yv = blobs(64, c=1, hw=8, seed=2)
    mk = lambda decay: (DeepLearningTask().model(seq(cbr(8, 3, 1, 1), gap(), fc(4)))  # noqa: E731
                        .data(train=(x, y), val=(xv, yv), batch_size=32).total_epochs(2).seed(4).ema(decay)
                        .options(prefetch=False))
    t = mk(0.5)
    r = t.run(progress=False)
    rec = r.history[-1]
    assert rec.ema_top1 is not None and r.best_ema_epoch in (1, 2)
    # a fast EMA ends close to the weights, and so does its accuracy
    ex = t.executor
    w, e = ex.view("train_base", "conv1.weight"), ex.view("train_base", "conv1.weight@ema")
    assert np.abs(w - e).max() < 0.1 * np.abs(w).max()
    assert abs(rec.ema_top1 - rec.val_top1) < 0.1
    slow = mk(0.999)
    slow.run(progress=False)
    ex = slow.executor
    w, e = ex.view("train_base", "conv1.weight"), ex.view("train_base", "conv1.weight@ema")
    assert np.abs(w - e).max() > np.abs(ex.view("train_base", "conv1.weight@ema")).max() * 1e-3


@pytest.mark.parametrize("prefetch", [False, True])
def test_augmentation_runs_are_byte_identical(prefetch: bool) -> None:
    x, y = blobs(96, c=3, hw=8)
    mk = lambda: (DeepLearningTask().model(seq(cbr(4, 3, 1, 1), gap(), fc(4))).data(train=(x, y), batch_size=32)  # noqa: E731
                  .augment(crop_pad=2, flip=True).total_epochs(2).seed(9).options(prefetch=prefetch))
    a, b = mk(), mk()
    a.run(progress=False)
    b.run(progress=False)
    for k, v in a.state_dict().items():
        assert v.tobytes() == b.state_dict()[k].tobytes(), k
    plain = (DeepLearningTask().model(seq(cbr(4, 3, 1, 1), gap(), fc(4))).data(train=(x, y), batch_size=32)
             .total_epochs(2).seed(9).options(prefetch=prefetch))
    plain.run(progress=False)
    assert any(plain.state_dict()[k].tobytes() != v.tobytes() for k, v in a.state_dict().items())


def test_evaluate_and_predict_on_images() -> None:
    x, y = blobs(128, c=1, hw=8)
    task = (DeepLearningTask().model(seq(cbr(8, 3, 1, 1), maxpool(2), gap(), fc(4)))
            .data(train=(x, y), val=(x[:50], y[:50]), batch_size=32).total_epochs(3).seed(1).options(prefetch=False))
    r = task.run(progress=False)
    ev = task.evaluate(x[:50], y[:50])
    assert ev["top1"] == pytest.approx(r.history[-1].val_top1, abs=1e-6)
    assert ev["loss"] == pytest.approx(r.history[-1].val_loss, rel=1e-5)
    pred = task.predict(x[:50])
    assert (pred == y[:50]).mean() == pytest.approx(ev["top1"], abs=1e-9)


def test_prefetch_augment_interrupt_save_resume_is_byte_identical(tmp_path, monkeypatch) -> None:
    """The background loader may be mid-copy when a run stops: the stop drains it, so a checkpoint
    taken then resumes to exactly the weights of an uninterrupted run."""
    import renaissance_nb.runtime.trainer as dt

    x, y = blobs(160, c=3, hw=8)
    mk = lambda: (DeepLearningTask().model(seq(cbr(4, 3, 1, 1), gap(), fc(4))).data(train=(x, y), batch_size=32)  # noqa: E731
                  .augment(crop_pad=2, flip=True).total_epochs(2).seed(11).options(prefetch=True))
    ref = mk()
    ref.run(progress=False)

    class StopAfter(dt.StopFlag):
        checks = 0

        @property
        def requested(self) -> bool:
            StopAfter.checks += 1
            return StopAfter.checks == 3  # after the third step of epoch 1, a copy of batch 4 is in flight

        @requested.setter
        def requested(self, value: bool) -> None:
            pass

    task = mk()
    monkeypatch.setattr(dt, "StopFlag", StopAfter)
    task.run(progress=False)
    monkeypatch.undo()
    assert task.result.interrupted
    path = task.save(str(tmp_path / "mid.npz"))
    back = mk().compile().load_state(path)
    back.run(progress=False)
    for k, v in ref.state_dict().items():
        assert v.tobytes() == back.state_dict()[k].tobytes(), k


@pytest.mark.parametrize("prefetch", [False, True])
def test_the_ema_model_is_evaluated_predicted_and_exported(tmp_path, prefetch: bool) -> None:  # type: ignore[no-untyped-def]
    """ema=True on evaluate/predict*/state_dict/read_state_dict/load_weights: the EMA weights and
    their own BN statistics, the model the epochs' ema columns score."""
    from renaissance_nb import ConfigError, CheckpointError, checkpoint
    x, y = blobs(160, c=1, hw=8)
    xv, yv = blobs(50, c=1, hw=8, seed=2)
    net = seq(cbr(8, 3, 1, 1), maxpool(2), gap(), fc(4))
    t = (DeepLearningTask().model(net).data(train=(x, y), val=(xv, yv), batch_size=32).total_epochs(2).seed(4)
         .ema(0.7).options(prefetch=prefetch))
    rec = t.run(progress=False).history[-1]
    got = t.evaluate(xv, yv, ema=True)
    assert got["top1"] == rec.ema_top1 and got["top5"] == rec.ema_top5 and abs(got["loss"] - rec.ema_loss) < 1e-6
    assert t.evaluate(xv, yv)["top1"] == rec.val_top1
    sd, raw = t.state_dict(ema=True), t.state_dict()
    assert sorted(sd) == sorted(raw) and all(not np.array_equal(sd[k], raw[k]) for k in ("conv1.weight",
                                                                                        "bn1.running_mean"))
    path = t.save(str(tmp_path / "ema.npz"))
    back = checkpoint.read_state_dict(path, ema=True)
    assert all(back[k].tobytes() == sd[k].tobytes() for k in sd)
    plain = DeepLearningTask().model(net).data(train=(x, y), batch_size=32).options(prefetch=prefetch).compile()
    plain.load_state_dict(sd)
    logits = t.predict_logits(xv, ema=True)
    assert plain.predict_logits(xv).tobytes() == logits.tobytes()
    np.testing.assert_array_equal(t.predict(xv, ema=True), logits.argmax(1))
    np.testing.assert_allclose(t.predict_proba(xv, ema=True).sum(1), 1, rtol=1e-6)
    assert not np.array_equal(t.predict_logits(xv), logits)
    assert plain.load_weights(path, ema=True).predict_logits(xv).tobytes() == logits.tobytes()
    with pytest.raises(ConfigError, match=r"predict: ema=True, but this task keeps no EMA weights\. Fix: call "
                                          r"task\.ema\(0\.999\) before compile\(\)"):
        plain.predict(xv, ema=True)
    with pytest.raises(ConfigError, match=r"state_dict: ema='yes' is invalid; expected True or False"):
        t.state_dict(ema="yes")
    with pytest.raises(CheckpointError, match=r"holds no EMA weights \(its task trained without ema\(\)\)\. Fix: "
                                              r"drop ema=True"):
        checkpoint.read_state_dict(plain.save(str(tmp_path / "plain.npz")), ema=True)


def _forward_sums(task: DeepLearningTask) -> list:
    ids, deep = task.compiled.ids, task.compiled.graphs.train.nodes(GraphId.DEEP_FWD_BWD)
    return [n for n in deep if n.op == "add" and list(n.outputs) == [ids[f"{n.layer}.out"]]]


def test_a_residual_add_copies_its_gradient_to_one_branch_only() -> None:
    """add hands dy to both branches; the branch read only by the add gets dy's own buffer (its gradient slot
    is the add's output gradient), so the backward copies dy once per add, into the other branch. The same
    gradients as PyTorch's are checked above; here the graph: one copy node per add, into the other slot.
    (Without fusion: resnet_small's adds are each followed by a ReLU, which fuses into them, below.)"""
    x, y = blobs(16, c=3, hw=12)
    task = DeepLearningTask().model(resnet_small()).data(train=(x, y), batch_size=16).options(fuse=False).compile()
    ids, deep = task.compiled.ids, task.compiled.graphs.train.nodes(GraphId.DEEP_FWD_BWD)
    adds = _forward_sums(task)
    assert len(adds) == 2
    for add in adds:
        dy = ids[f"{add.layer}.out@grad"]
        slots = {ids[f"{name}@grad"] for name in (f for f, i in ids.items() if i in add.inputs and "@" not in f)}
        copies = [n for n in deep if n.op == "copy" and n.layer == add.layer]
        assert len(copies) == 1 and list(copies[0].inputs) == [dy], copies  # one copy, of dy
        assert dy in slots and copies[0].outputs[0] in slots - {dy}  # dy is one branch's slot; the copy the other's


def test_a_relu_after_a_residual_add_fuses_into_it() -> None:
    """add2(...) -> relu(): one node writes relu(a + b) (the sum is never stored), and the backward masks dy by
    that output in place (act_bwd) and hands it on as an add does (dy is one branch's slot, copied to the
    other); the same bytes as unfused, in training and in the saved weights, on fewer tensors."""
    x, y = blobs(48, c=3, hw=12)

    def train(fuse: bool) -> DeepLearningTask:
        task = (DeepLearningTask().model(resnet_small()).data(train=(x[:32], y[:32]), val=(x[32:], y[32:]),
                                                              batch_size=16)
                .optimizer(AdamW()).options(fuse=fuse).total_epochs(2).seed(4).compile())
        task.run(progress=False)
        return task
    fused, plain = train(True), train(False)
    assert [s for s in fused.arch.fused if s.startswith("add")] == ["add1+relu", "add2+relu"]
    ids, deep = fused.compiled.ids, fused.compiled.graphs.train.nodes(GraphId.DEEP_FWD_BWD)
    adds = _forward_sums(fused)
    assert [dict(n.params) for n in adds] == [{"act": "relu", "slope": 0.0}] * 2
    assert not [n for n in deep if n.op == "act_fwd"]  # every ReLU went into a producer
    for add in adds:
        y_out, dy = ids[f"{add.layer}.out"], ids[f"{add.layer}.out@grad"]
        masks = [n for n in deep if n.op == "act_bwd" and n.layer == add.layer]
        assert len(masks) == 1 and list(masks[0].inputs) == [dy, y_out] and list(masks[0].outputs) == [dy]
        copies = [n for n in deep if n.op == "copy" and n.layer == add.layer]
        assert len(copies) == 1 and list(copies[0].inputs) == [dy]
    assert len(fused.compiled.plan) < len(plain.compiled.plan)
    for gone, holds in (("relu5.out", "add2.out"), ("relu1.out", "bn1.out")):
        with pytest.raises(PlanError, match=rf"{gone.split('.')[0]} was fused into .*read '{holds}'"):
            fused.read(gone)
        assert fused.read(holds).shape == plain.read(gone).shape
    for k, v in plain.state_dict().items():
        assert fused.state_dict()[k].tobytes() == v.tobytes(), k
    assert [r.train_loss for r in fused.result.history] == [r.train_loss for r in plain.result.history]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("lowp_first", [True, False])
def test_a_fused_add_relu_keeps_an_fp32_branch_gradient_fp32(precision: str, lowp_first: bool) -> None:
    """Under mixed precision an add of a 16-bit branch (fc) and an fp32 one (layer norm's output) is fp32: its
    masked gradient must reach the fp32 branch unrounded, whichever branch comes first (a layer norm after the
    ReLU makes that gradient not a 16-bit value). Fused and unfused train to the same bytes."""
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((64, 12)).astype(np.float32), rng.integers(0, 4, 64).astype(np.int32)
    branches = (fc(16), identity()) if lowp_first else (identity(), fc(16))

    def train(fuse: bool) -> DeepLearningTask:
        task = (DeepLearningTask().model(seq(fc(16), layernorm(), add2(*branches), relu(), layernorm(), fc(4)))
                .data(train=(x, y), batch_size=16).optimizer(AdamW()).precision(precision).options(fuse=fuse)
                .total_epochs(3).seed(1).compile())
        task.run(progress=False)
        return task
    fused, plain = train(True), train(False)
    assert "add1+relu" in fused.arch.fused
    plan = fused.compiled.plan  # the setup: a 16-bit branch and an fp32 one, so the sum is fp32
    assert plan["fc2.out"].dtype == PRECISIONS[precision] and plan["add1.out"].dtype == "float32"
    for k, v in plain.state_dict().items():
        assert fused.state_dict()[k].tobytes() == v.tobytes(), k

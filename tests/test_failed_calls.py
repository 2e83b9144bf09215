"""A failed call leaves the task as it was, and says what to fix in the library's own words.

Each case here was found by trying bad input through the public API: a stage that failed
late (no GPU, a seed Philox refuses, no memory) used to leave the task half-compiled; an
exception between two steps (a callback) lost the epoch's position; checkpoints forgot
augmentation, EMA and progressive resizing. Every test checks the numbers afterwards:
the task still trains to the same bytes as one that never saw the bad call.
"""
from __future__ import annotations

import numpy as np
import pytest

from renaissance_nb import (AdamW, CheckpointError, ConfigError, DataError, DeepLearningTask, Phase, PlanError,
                            conv, datasets, fc, flatten, gap, maxpool, relu, seq)

rng = np.random.default_rng(0)
X = rng.standard_normal((256, 24)).astype(np.float32)
Y = (X[:, :3].sum(1) > 0).astype(np.int64) + 2 * (X[:, 3] > 0)
IMG = rng.standard_normal((96, 1, 8, 8)).astype(np.float32)
IMG_Y = (IMG[:, 0, :4].mean((1, 2)) > 0).astype(np.int64)


def mlp(**kw) -> DeepLearningTask:
    return (DeepLearningTask("f").model(seq(fc(32), relu(), fc(4)))
            .data(train=(X[:192], Y[:192]), val=(X[192:], Y[192:]), batch_size=kw.get("batch", 32))
            .optimizer(AdamW().lr(3e-3)).total_epochs(kw.get("epochs", 2)).seed(3))


def cnn(head: str = "flatten") -> DeepLearningTask:
    tail = (maxpool(2), flatten()) if head == "flatten" else (gap(),)  # gap() for any input resolution
    return (DeepLearningTask("c").model(seq(conv(4, 3, p=1), relu(), *tail, fc(2)))
            .data(train=(IMG[:64], IMG_Y[:64]), val=(IMG[64:], IMG_Y[64:]), batch_size=16).total_epochs(2).seed(5))


def same(a: DeepLearningTask, b: DeepLearningTask) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(sa[k].tobytes() == sb[k].tobytes() for k in sa)


def trained(task: DeepLearningTask) -> DeepLearningTask:
    task.run(progress=False)
    return task


# ---- a stage that fails late undoes itself ----------------------------------------------------
@pytest.mark.parametrize("start", ["planning", "planned"])
def test_compile_without_a_gpu_leaves_the_task_in_planning(start: str) -> None:
    pytest.importorskip("renaissance_nb.gpu.device")
    from renaissance_nb.gpu.device import probe
    if probe()[0]:
        pytest.skip("a GPU is usable here: compile(device='cuda') succeeds")
    task = mlp().device("cuda")
    if start == "planned":
        task.plan()
    transitions = list(task.transitions)
    with pytest.raises(Exception) as info:
        task.compile()
    assert "cuda" in str(info.value).lower() or "gpu" in str(info.value).lower()
    assert task.phase is Phase.PLANNING and task.transitions == transitions
    assert (task.arch is not None) == (start == "planned")
    if start == "planning":
        task.device("cpu")  # settings can still change: nothing was locked
        assert same(trained(task), trained(mlp()))


def test_a_seed_beyond_64_bits_is_refused_by_seed() -> None:
    task = mlp()
    with pytest.raises(ConfigError, match=r"seed=18446744073709551616.*\[0, 2\*\*64\)"):
        task.seed(2**64)
    assert task.seed(2**64 - 1).settings["seed"] == 2**64 - 1


def test_run_with_bad_epochs_from_planning_changes_nothing() -> None:
    task = mlp()
    with pytest.raises(ConfigError, match="epochs=0"):
        task.run(epochs=0)
    assert task.phase is Phase.PLANNING and task.arch is None
    assert same(trained(task), trained(mlp()))


def test_an_arena_too_large_to_allocate_is_a_plan_error_and_undone() -> None:
    task = (DeepLearningTask("huge").model(seq(fc(10**9), relu(), fc(4)))  # about 0.4 TiB with Adam's moments
            .data(train=(X, Y), batch_size=32).seed(0))
    with pytest.raises(PlanError, match=r"needs [\d.]+ [GT]iB.*Fix: a smaller model"):
        task.compile()
    assert task.phase is Phase.PLANNING and task.arch is None


# ---- an exception between two steps keeps the position --------------------------------------
def test_a_callback_that_raises_mid_epoch_resumes_exactly() -> None:
    ref = trained(mlp(batch=8))
    task = mlp(batch=8).compile()
    calls = []

    def fails_once(kind: str, info: object) -> None:
        if kind == "step" and not calls:
            calls.append(info)
            raise RuntimeError("callback bug")

    with pytest.raises(RuntimeError, match="callback bug"):
        task.run(progress=False, callbacks=[fails_once])
    assert task.result.interrupted and task.run_state.resume_at == (0, 16)
    task.run(progress=False)
    assert int(task.executor.view("train_base", "step")[0]) == ref.total_steps
    assert same(task, ref)
    assert [r.train_loss for r in task.result.history] == [r.train_loss for r in ref.result.history]


def test_a_callback_that_raises_at_an_epoch_end_resumes_at_the_next_epoch() -> None:
    ref = trained(mlp())
    task = mlp().compile()

    def fails_at_epoch(kind: str, info: object) -> None:
        if kind == "epoch":
            raise RuntimeError("epoch callback bug")

    with pytest.raises(RuntimeError):
        task.run(progress=False, callbacks=[fails_at_epoch])
    assert len(task.result.history) == 1 and task.run_state.resume_at is None
    task.run(progress=False)
    assert same(task, ref)


# ---- data and arguments ---------------------------------------------------------------------
def test_data_set_with_val_is_refused_rather_than_dropped() -> None:
    splits = datasets.from_arrays((X[:192], Y[:192]))
    for first in (splits, splits.train):
        with pytest.raises(ConfigError, match="got a data set and val="):
            DeepLearningTask().data(first, val=(X[192:], Y[192:]))


@pytest.mark.parametrize("call, name", [
    (lambda t: t.options(foo=True), "foo"),
    (lambda t: t.data(train=(X, Y), classes=4), "classes"),
    (lambda t: t.run(epoch=1), "epoch"),
])
def test_unknown_keywords_name_the_valid_ones(call, name: str) -> None:  # type: ignore[no-untyped-def]
    task = mlp()
    with pytest.raises(ConfigError, match=f"{name}=.*one of the names") as info:
        call(task)
    assert "Fix:" in str(info.value)
    assert task.phase is Phase.PLANNING


def test_settings_by_position_or_missing_say_how_to_call() -> None:
    with pytest.raises(ConfigError, match=r"options: too many positional arguments.*fuse=\.\.\."):
        mlp().options(True)
    with pytest.raises(ConfigError, match=r"model: missing a required argument: 'blueprint'"):
        DeepLearningTask().model()


@pytest.mark.parametrize("template", ["/tmp/{nme}.npz", "/tmp/{epoch:q}.npz", "/tmp/{0}.npz", ""])
def test_checkpoint_templates_are_checked_when_set(template: str) -> None:
    for setter in ("save_every", "save_best"):
        task = mlp()
        args = (1, template) if setter == "save_every" else (template,)
        with pytest.raises(ConfigError, match=f"{setter}: path="):
            getattr(task, setter)(*args)
        assert task.settings["options"] and task.config.save_every is None and task.config.save_best is None


def test_image_models_refuse_flat_or_channels_last_input() -> None:
    task = cnn().compile()
    for bad in (IMG[64:].reshape(32, -1), IMG[64:].transpose(0, 2, 3, 1), IMG[64:, 0]):
        with pytest.raises(DataError, match=r"images shaped \(N, 1, 8, 8\).*X\.reshape\(-1, 1, 8, 8\)"):
            task.evaluate(bad, IMG_Y[64:])
        with pytest.raises(DataError, match=r"images shaped"):
            task.predict(bad)
    got = task.evaluate(IMG[64:], IMG_Y[64:])
    assert got["n"] == 32 and 0.0 <= got["top1"] <= 1.0
    flat = mlp().compile()  # an MLP's samples have the shape data() took, as data() refuses another (issue 27)
    for call in (lambda x: flat.predict(x), lambda x: flat.evaluate(x, Y[192:])):
        with pytest.raises(DataError, match=r"samples of shape \(24,\) like the training data.*x\.reshape\(-1, 24\)"):
            call(X[192:].reshape(64, 4, 6))


@pytest.mark.parametrize("value", ["abc", [[1.0], [1.0, 2.0]], np.ones(4, np.complex64), None])
def test_load_state_dict_refuses_non_numbers_by_name(value: object) -> None:
    task = mlp().compile()
    before = task.state_dict()
    with pytest.raises(CheckpointError, match=r"load_state_dict: fc2.bias=.*real-valued array of shape \(4,\)"):
        task.load_state_dict({**before, "fc2.bias": value})
    assert all(before[k].tobytes() == v.tobytes() for k, v in task.state_dict().items())


def test_save_paths_that_cannot_be_written_are_checkpoint_errors(tmp_path) -> None:  # type: ignore[no-untyped-def]
    task = mlp().compile()
    for bad in (123, None, str(tmp_path)):
        with pytest.raises(CheckpointError, match=r"save: path=.*expected a file name \(not a folder\)"):
            task.save(bad)  # type: ignore[arg-type]
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        import os
        if os.access(locked, os.W_OK):  # root writes anywhere: use a folder that is a file's path instead
            target = "/proc/renaissance_nb.npz"
        else:
            target = str(locked / "x.npz")
        with pytest.raises(CheckpointError, match="cannot write in the folder"):
            task.save(target)
    finally:
        locked.chmod(0o700)
    assert task.save(str(tmp_path / "ok.npz")).endswith("ok.npz")


# ---- checkpoints keep what training does -------------------------------------------------------
def augmented() -> DeepLearningTask:
    return cnn().augment(crop_pad=1, flip=True)


@pytest.mark.parametrize("build", [
    augmented,
    lambda: cnn().ema(0.9),
    lambda: cnn("gap").train_resolution(6, 8, boundary_epoch=1),
], ids=["augment", "ema", "train_resolution"])
def test_load_rebuilds_augmentation_ema_and_resizing(tmp_path, build) -> None:  # type: ignore[no-untyped-def]
    ref = trained(build())
    task = build().compile()
    task.run(epochs=1, progress=False)
    path = task.save(str(tmp_path / "mid.npz"))
    back = DeepLearningTask.load(path, task.splits)
    assert back.settings["augment"] == task.settings["augment"]
    assert back.settings["ema"] == task.settings["ema"]
    assert back.settings["train_resolution"] == task.settings["train_resolution"]
    back.run(progress=False)
    assert same(back, ref)


def test_a_strict_load_refuses_other_augmentation(tmp_path) -> None:  # type: ignore[no-untyped-def]
    task = augmented().compile()
    path = task.save(str(tmp_path / "a.npz"))
    other = cnn().compile()
    with pytest.raises(CheckpointError, match=r"setting augment differs"):
        other.load_state(path)
    other.load_state(path, strict=False)  # allowed on purpose: fine-tune without augmentation


# ---- what a finished run reports ----------------------------------------------------------------
def test_run_on_a_finished_task_warns_and_changes_nothing() -> None:
    task = trained(mlp())
    before = task.state_dict()
    with pytest.warns(UserWarning, match=r"all total_epochs=2 epochs are trained.*load_state_dict"):
        task.run(progress=False)
    assert len(task.result.history) == 2
    assert all(before[k].tobytes() == v.tobytes() for k, v in task.state_dict().items())


def test_best_top5_is_the_best_epochs_not_the_highest_anywhere() -> None:
    from renaissance_nb.result import EpochRecord, TrainingResult

    rec = [EpochRecord(1, 1.0, 0.5, 0.9, 1.0, 0.60, 0.99, 1e-3, 1.0, 10),
           EpochRecord(2, 0.9, 0.6, 0.9, 0.9, 0.70, 0.95, 1e-3, 1.0, 20),
           EpochRecord(3, 0.8, 0.7, 0.9, 0.9, 0.70, 0.97, 1e-3, 1.0, 30, 0.8, 0.72, 0.91)]
    r = TrainingResult(history=rec)
    assert (r.best_epoch, r.best_top1, r.best_top5) == (2, 0.70, 0.95)  # the earliest of a tie
    assert (r.best_ema_epoch, r.best_ema_top1, r.best_ema_top5) == (3, 0.72, 0.91)
    assert "best top1 70.00%  top5 95.00%  at epoch 2" in repr(r)


def test_plan_is_timed_in_the_history() -> None:
    task = mlp()
    task.plan()
    (note,) = task.transitions
    assert note.operation == "plan" and 0.0 < note.seconds < 60.0


# ---- inspection between steps leaves training as it was ---------------------------------------
def test_evaluate_and_predict_from_a_step_callback_leave_training_unchanged() -> None:
    """Between two steps the input buffer holds the prefetched next batch: evaluating there used
    to overwrite it (every parameter moved by up to 0.03)."""
    ref = trained(mlp(batch=8))
    task = mlp(batch=8).compile()
    seen = []

    def inspect(kind: str, info: object) -> None:
        if kind == "step":
            seen.append(task.evaluate(X[192:], Y[192:])["loss"])
            task.predict(X[:5])

    task.run(progress=False, callbacks=[inspect])
    assert len(seen) == 2 and all(np.isfinite(seen))  # step 16 of each epoch of 24 steps
    assert same(task, ref)
    assert [r.train_loss for r in task.result.history] == [r.train_loss for r in ref.result.history]


def test_predict_after_a_stop_mid_epoch_leaves_the_resume_exact() -> None:
    ref = trained(mlp(batch=8))
    task = mlp(batch=8).compile()

    def stop(kind: str, info: object) -> None:
        if kind == "step":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        task.run(progress=False, callbacks=[stop])
    assert task.run_state.resume_at == (0, 16)
    task.predict(X[:7])
    task.evaluate(X[192:], Y[192:])
    task.run(progress=False)
    assert same(task, ref)


def test_save_from_a_step_callback_records_the_position(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ref = trained(mlp(batch=8))
    task = mlp(batch=8).compile()
    path = str(tmp_path / "cb.npz")

    def save_once(kind: str, info: object) -> None:
        if kind == "step" and not (tmp_path / "cb.npz").exists():
            task.save(path)

    task.run(progress=False, callbacks=[save_once])
    back = DeepLearningTask.load(path, task.splits)
    assert back.run_state.resume_at == (0, 16) and back.run_state.epoch == 0
    back.run(progress=False)
    assert int(back.executor.view("train_base", "step")[0]) == ref.total_steps
    assert same(back, ref) and same(task, ref)


def test_a_failure_in_the_validation_pass_keeps_the_epochs_train_metrics() -> None:
    ref = trained(mlp())
    task = mlp().compile()
    real = task.runner.run_eval
    calls = []

    def fails_once(sched):  # type: ignore[no-untyped-def]
        if not calls:
            calls.append(1)
            real(sched)  # the pass has run (and cleared the shared sums) when the failure comes
            raise KeyboardInterrupt
        return real(sched)

    task.runner.run_eval = fails_once  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        task.run(progress=False)
    assert task.run_state.resume_at == (0, task.steps_per_epoch)
    task.run(progress=False)
    assert same(task, ref)
    got = [(r.train_loss, r.train_top1, r.val_loss) for r in task.result.history]
    assert got == [(r.train_loss, r.train_top1, r.val_loss) for r in ref.result.history]


# ---- a non-finite batch -------------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["skip", "raise"])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_non_finite_batch_keeps_batch_norm_statistics_finite(policy: str) -> None:
    from renaissance_nb import SGD, NumericalError, bn

    task = (DeepLearningTask().model(seq(fc(16), bn(), relu(), fc(4))).data(train=(X[:192].copy(), Y[:192]), batch_size=32)
            .optimizer(SGD().lr(0.05)).total_epochs(2).seed(1).options(nan_policy=policy)).compile()
    task.splits.train.x[7, 3] = np.inf  # past the data checks, as a corrupted shard would be
    if policy == "raise":
        with pytest.raises(NumericalError):
            task.run(progress=False)
    else:
        task.run(progress=False)
        assert task.skipped_updates == 2
    state = task.state_dict()
    assert np.isfinite(state["bn1.running_mean"]).all() and np.isfinite(state["bn1.running_var"]).all()
    assert (state["bn1.running_var"] > 0).all()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_run_stopped_inside_a_step_warns_that_the_next_cannot_reproduce() -> None:
    from renaissance_nb import SGD, NumericalError

    task = (DeepLearningTask().model(seq(fc(16), relu(), fc(4))).data(train=(X[:192] * 1e3, Y[:192]), batch_size=32)
            .optimizer(SGD().lr(1e8)).total_epochs(2))
    with pytest.raises(NumericalError, match=r"step \d+"):
        task.run(progress=False)
    assert task.run_state.resume_at is None and task.run_state.torn_at is not None
    with pytest.warns(UserWarning, match=r"stopped inside step \d+ of epoch 1.*load_state"):
        with pytest.raises(NumericalError):
            task.run(progress=False)


def test_a_bad_argument_anywhere_in_a_call_changes_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """options()/augment() used to apply the arguments checked before the bad one; run() checked its
    callbacks (and resume) only after compiling and dropping the resume point."""
    t = mlp()
    before = dict(t.settings)
    with pytest.raises(ConfigError, match="liveness='yes' is invalid"):
        t.options(nan_policy="skip", fuse=False, liveness="yes")
    with pytest.raises(ConfigError, match="flip='yes' is invalid"):
        t.augment(crop_pad=4, flip="yes")
    assert t.settings == before and t.config.crop_pad == 0
    t.options(fuse=np.bool_(False)).augment(flip=np.bool_(False))  # NumPy's bools are bools
    assert t.config.fuse is False and t.config.flip is False
    for bad, match in ((5, "callbacks=5 is invalid; expected a list of callables"),
                       ([None], "a list of callables; None is not one"),
                       (print, "Fix: wrap it")):
        with pytest.raises(ConfigError, match=match):
            t.run(callbacks=bad)
        assert t.phase is Phase.PLANNING
    with pytest.raises(ConfigError, match=r"resume='no' is invalid; expected True or False"):
        t.run(resume="no")
    for call, match in ((lambda: t.total_epochs(10**400), r"expected an int in \[1, 2147483647\]"),
                        (lambda: t.augment(crop_pad=2**64), r"crop_pad=.* is invalid; expected an int in \[0, 1024\]"),
                        (lambda: t.train_resolution(2**40, 8, 1), r"expected an int or \(H, W\) of ints in \[1, 32768\]"),
                        (lambda: t.seed(2**64), r"expected an int in \[0, 2\*\*64\)")):
        with pytest.raises(ConfigError, match=match):
            call()
    assert t.phase is Phase.PLANNING and t.settings == {**before, "options": t.settings["options"]}
    c = mlp().compile()
    path = c.save(str(tmp_path / "c.npz"))
    with pytest.raises(CheckpointError, match=r"strict='no' is invalid; expected True or False"):
        c.load_state(path, strict="no")
    sd = c.state_dict()
    with pytest.raises(CheckpointError, match=r"keys differ: missing \[\], unexpected \[0, 'step'\]"):
        c.load_state_dict({**sd, 0: np.zeros(1), "step": np.zeros(1)})
    big = {k: (v.astype(np.float64) * 0 + 1e300 if k == "fc1.bias" else v) for k, v in sd.items()}
    with pytest.raises(CheckpointError, match=r"fc1.bias holds values beyond float32's range"):
        c.load_state_dict(big)
    with pytest.raises(CheckpointError, match=r"save: cannot write .* Fix: save under another name"):
        c.save(str(tmp_path / "a\0b.npz"))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ckpt")]


def test_new_api_misuse_gets_named_errors_early(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """From the fuzz of this session's APIs: each of these used to raise Python's or NumPy's own error, name
    an inner call, or fail only after an epoch."""
    from renaissance_nb import (EarlyStopping, LinearLR, OneCycleLR, ReduceLROnPlateau, StopTraining,
                                CosineAnnealingWarmRestarts)
    t = mlp()
    for bad, match in ((EarlyStopping, r"EarlyStopping\(\) makes one"), (lambda: None, r"callables taking \(kind, info\)")):
        with pytest.raises(ConfigError, match=match):
            t.run(callbacks=[bad])
        assert t.phase is Phase.PLANNING
    for make in (lambda: ReduceLROnPlateau(monitor=np.array(["val_loss", "x"])),
                 lambda: OneCycleLR(anneal_strategy=np.array(["cos"])),
                 lambda: EarlyStopping(np.array(["val_loss"])),
                 lambda: mlp().options(nan_policy=np.array(["skip"])),
                 lambda: EarlyStopping(patiense=5)):
        with pytest.raises(ConfigError, match="is invalid"):
            make()
    for sched in (LinearLR(total_iters=1e20), CosineAnnealingWarmRestarts(T_0=1e308)):  # far past training
        assert np.isfinite(sched.table(4, 2)).all()
    with pytest.raises(ConfigError, match="path="):
        mlp().save_every(1, "a\0{epoch}.npz")

    def bare(kind: str, info) -> None:  # type: ignore[no-untyped-def]
        if kind == "epoch":
            raise StopTraining
    res = mlp(epochs=2).run(progress=False, callbacks=[bare])
    assert res.stopped == "StopTraining from a 'epoch' callback" and len(res.history) == 1
    c = mlp().compile()
    path = c.save(str(tmp_path / "c.npz"))
    with pytest.raises(ConfigError, match=r"load_weights: ema='yes' is invalid"):
        c.load_weights(path, ema="yes")
    with pytest.raises(CheckpointError, match=r"load_weights: .* holds no EMA weights"):
        c.load_weights(path, ema=True)
    with pytest.raises(CheckpointError, match=r"load: strict='no' is invalid"):
        DeepLearningTask.load(path, c.splits, strict="no")

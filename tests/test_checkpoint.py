"""Checkpoints: round trip, exact resume (epoch boundary and mid-epoch), and refusal of bad files."""
from __future__ import annotations

import io
import json
import os
import zipfile

import numpy as np
import pytest

import renaissance_nb.runtime.trainer as trainer_mod
from renaissance_nb import (CheckpointError, DeepLearningTask, PhaseError, RenaissanceError, dropout, fc, relu,
                           seq, tanh)
from renaissance_nb import checkpoint

RNG = np.random.default_rng(0)
X = RNG.standard_normal((150, 12)).astype(np.float32)
Y = RNG.integers(0, 4, 150)
XV = RNG.standard_normal((40, 12)).astype(np.float32)
YV = RNG.integers(0, 4, 40)


def make(width: int = 16, act=relu, epochs: int = 2, seed: int = 3, val: bool = True) -> DeepLearningTask:
    t = DeepLearningTask("ck").model(seq(fc(width), act(), dropout(0.2), fc(4)))
    t.data(train=(X, Y), val=(XV, YV) if val else None, batch_size=32, shuffle=True)  # 150/32: partial last batch
    return t.total_epochs(epochs).seed(seed)


def state_bytes(t: DeepLearningTask) -> dict[str, bytes]:
    return {k: v.tobytes() for k, v in t.state_dict().items()}


def saved_ranges(t: DeepLearningTask) -> bytes:
    buf = t.arena.bytes
    return b"".join(buf[slice(*t.memory.region_range(a, b))].tobytes() for _, a, b in checkpoint.STATE_RANGES)


@pytest.fixture(scope="module")
def uninterrupted() -> DeepLearningTask:
    a = make()
    a.run(progress=False)
    return a


def test_round_trip_fresh_task_gives_identical_arena(tmp_path) -> None:
    a = make().compile()
    p = checkpoint.save(a, tmp_path / "a.npz")
    c = make().compile()
    checkpoint.load_state(c, p)
    assert c.arena.bytes.tobytes() == a.arena.bytes.tobytes()


def test_round_trip_after_training_restores_every_saved_byte(tmp_path) -> None:
    a = make()
    a.run(epochs=1, progress=False)
    p = checkpoint.save(a, tmp_path / "a.npz")
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]  # atomic: no temp file left
    c = make().compile()
    checkpoint.load_state(c, p)
    assert saved_ranges(c) == saved_ranges(a)
    assert state_bytes(c) == state_bytes(a)
    assert c.run_state.epoch == 1 and [r.train_loss for r in c.result.history] == [r.train_loss for r in a.result.history]
    # inspectable with numpy alone, no pickle
    with np.load(p, allow_pickle=False) as z:
        header = json.loads(z["header.json"].tobytes())
        assert header["run"]["epoch"] == 1 and header["fingerprint"]["total_bytes"] == a.memory.total_bytes
        assert z["region_W"].dtype == np.uint8


def test_resume_at_epoch_boundary_is_byte_identical(tmp_path, uninterrupted) -> None:
    b = make()
    b.run(epochs=1, progress=False)
    p = checkpoint.save(b, tmp_path / "b.npz")
    c = make().compile()
    checkpoint.load_state(c, p)
    c.run(progress=False)
    assert state_bytes(c) == state_bytes(uninterrupted)
    assert saved_ranges(c) == saved_ranges(uninterrupted)
    assert [r.train_loss for r in c.result.history] == [r.train_loss for r in uninterrupted.result.history]
    assert [r.val_loss for r in c.result.history] == [r.val_loss for r in uninterrupted.result.history]
    np.testing.assert_array_equal(c.result.step_losses, uninterrupted.result.step_losses)


def _stop_after(k: int):
    class StopAfter(trainer_mod.StopFlag):
        def __init__(self) -> None:
            super().__init__()
            self.checks = 0

        @property
        def requested(self) -> bool:
            self.checks += 1
            return self.checks > k

        @requested.setter
        def requested(self, value: bool) -> None:
            pass

    return StopAfter


@pytest.mark.parametrize("pre, k", [(0, 2), (0, 4), (1, 0), (1, 2)],
                         ids=["epoch1-after-step3", "epoch1-after-last-step", "epoch2-after-step1",
                              "epoch2-after-step3"])
def test_resume_mid_epoch_is_byte_identical(tmp_path, monkeypatch, uninterrupted, pre, k) -> None:
    monkeypatch.setenv("RNB_PROGRAM", "0")  # the simulated stop is read at every step boundary: kernel by kernel
    b = make()  # 150 samples / batch 32: 5 steps per epoch, the last one partial
    if pre:
        b.run(epochs=pre, progress=False)
    with monkeypatch.context() as m:
        m.setattr(trainer_mod, "StopFlag", _stop_after(k))
        b.run(progress=False)
    assert b.result.interrupted and b.run_state.resume_at is not None
    p = checkpoint.save(b, tmp_path / "b.npz")
    c = make().compile()
    checkpoint.load_state(c, p)
    assert c.run_state.resume_at == b.run_state.resume_at and c.run_state.epoch == b.run_state.epoch
    c.run(progress=False)
    assert state_bytes(c) == state_bytes(uninterrupted)
    assert saved_ranges(c) == saved_ranges(uninterrupted)
    assert [r.train_loss for r in c.result.history] == [r.train_loss for r in uninterrupted.result.history]
    np.testing.assert_array_equal(c.result.step_losses, uninterrupted.result.step_losses)
    # and the interrupted task itself also continues to the same bytes
    b.run(progress=False)
    assert state_bytes(b) == state_bytes(uninterrupted)


# ---- bad files: an informative CheckpointError and an unchanged task ----------------------------------
@pytest.fixture(scope="module")
def good_file(tmp_path_factory) -> str:
    t = make()
    t.run(epochs=1, progress=False)
    return checkpoint.save(t, tmp_path_factory.mktemp("ck") / "good.npz")


def expect_refused(task: DeepLearningTask, path, *words: str) -> str:
    before = task.arena.bytes.copy()
    state = (task.run_state.epoch, task.run_state.resume_at, list(task.result.history), task.runner.env.perms["train"].copy())
    with pytest.raises(CheckpointError) as info:
        checkpoint.load_state(task, path)
    msg = str(info.value)
    assert isinstance(info.value, RenaissanceError)
    assert "Fix" in msg, msg
    for w in words:
        assert w in msg, msg
    assert task.arena.bytes.tobytes() == before.tobytes()
    assert (task.run_state.epoch, task.run_state.resume_at, list(task.result.history)) == state[:3]
    np.testing.assert_array_equal(task.runner.env.perms["train"], state[3])
    return msg


def trained_target() -> DeepLearningTask:
    t = make(seed=3)
    t.run(epochs=1, progress=False)  # non-trivial bytes to protect
    return t


def test_missing_file(tmp_path) -> None:
    p = tmp_path / "nope.npz"
    expect_refused(trained_target(), p, str(p), "no checkpoint file")


def test_flipped_byte_in_array_data(tmp_path, good_file) -> None:
    raw = bytearray(open(good_file, "rb").read())
    with zipfile.ZipFile(good_file) as z:
        info = z.getinfo("region_W.npy")
    pos = info.header_offset + 30 + len(info.filename) + len(info.extra) + 200  # inside the W bytes
    raw[pos] ^= 0xFF
    p = tmp_path / "flipped.npz"
    p.write_bytes(bytes(raw))
    expect_refused(trained_target(), p, "corrupt")  # the zip CRC catches it


def test_tampered_array_caught_by_sha256(tmp_path, good_file) -> None:
    with np.load(good_file) as z:
        arrays = {k: z[k].copy() for k in z.files}
    arrays["region_W"][5] ^= 1  # a valid zip whose content no longer matches the header's hash
    p = tmp_path / "tampered.npz"
    np.savez(p, **arrays)
    expect_refused(trained_target(), p, "checksum mismatch")


@pytest.mark.parametrize("keep", [0.5, 0.9, 0.0], ids=["half", "90pct", "empty"])
def test_truncated_file(tmp_path, good_file, keep) -> None:
    raw = open(good_file, "rb").read()
    p = tmp_path / "trunc.npz"
    p.write_bytes(raw[: int(len(raw) * keep)])
    expect_refused(trained_target(), p, "corrupt or truncated")


def test_not_a_checkpoint(tmp_path) -> None:
    p = tmp_path / "other.npz"
    np.savez(p, a=np.zeros(3))
    expect_refused(trained_target(), p, "header.json")


def test_wrong_model_width_names_the_tensor(tmp_path, good_file) -> None:
    t = make(width=20)
    t.run(epochs=1, progress=False)
    msg = expect_refused(t, good_file, "tensor 'fc1.bias' differs", "shape [16] in the checkpoint vs [20]")
    assert "offset" not in msg  # the cause (shape) is named, not its consequence


def test_wrong_activation_names_the_model(good_file) -> None:
    t = make(act=tanh)  # same tensors, different model
    t.compile()
    expect_refused(t, good_file, "another model", "tanh")


def test_wrong_seed_is_refused_when_strict(good_file) -> None:
    t = make(seed=4).compile()
    expect_refused(t, good_file, "seed", "strict=False")
    checkpoint.load_state(t, good_file, strict=False)
    assert t.run_state.epoch == 1


def test_load_before_compile_is_a_phase_error(good_file) -> None:
    t = make()
    with pytest.raises(PhaseError) as info:
        checkpoint.load_state(t, good_file)
    assert "load_state()" in str(info.value) and "Fix" in str(info.value)
    assert t.phase.name == "PLANNING"


def test_save_into_missing_folder(tmp_path) -> None:
    t = make().compile()
    with pytest.raises(CheckpointError, match="does not exist"):
        checkpoint.save(t, tmp_path / "no" / "such" / "dir" / "x.npz")


def test_save_overwrites_atomically(tmp_path) -> None:
    t = make().compile()
    p = tmp_path / "x.npz"
    checkpoint.save(t, p)
    t.run(epochs=1, progress=False)
    checkpoint.save(t, p)
    assert checkpoint.read_header(p)["run"]["epoch"] == 1
    assert sorted(os.listdir(tmp_path)) == ["x.npz"]


def test_weights_alone_load_into_a_task_on_other_data(tmp_path) -> None:
    """read_state_dict reads the parameters through the saved plan (padded rows, conv layouts, BN
    statistics), with no task; load_weights puts them into a task built on other data and another
    optimizer; load() with data of another size says so and points there."""
    from renaissance_nb import SGD, bn, conv, flatten, maxpool
    ximg = RNG.standard_normal((90, 3, 6, 6)).astype(np.float32)
    net = seq(conv(4, 3, 1, 1), bn(), relu(), maxpool(2), flatten(), fc(1024), relu(), fc(4))  # fc2: padded rows
    a = DeepLearningTask("w").model(net).data(train=(ximg, Y[:90]), batch_size=32).total_epochs(1).seed(1)
    a.run(progress=False)
    path = a.save(str(tmp_path / "w.npz"))
    sd, want = checkpoint.read_state_dict(path), a.state_dict()
    assert sorted(sd) == sorted(want) and all(sd[k].tobytes() == want[k].tobytes() for k in want)
    assert sd["conv1.weight"].shape == (4, 3, 3, 3) and "bn1.running_var" in sd
    other = ximg[:40]
    b = DeepLearningTask("w").model(net).data(train=(other, Y[:40]), batch_size=8).optimizer(SGD()).compile()
    b.load_weights(path)
    assert all(b.state_dict()[k].tobytes() == want[k].tobytes() for k in want)
    np.testing.assert_array_equal(b.predict(other), a.predict(other))
    with pytest.raises(CheckpointError, match=r"trained on 90 training and 0 validation samples; data has 40 and 0.*"
                                              r"task.load_weights\(path\)"):
        DeepLearningTask.load(path, (other, Y[:40]))
    wide = DeepLearningTask("w").model(seq(conv(8, 3, 1, 1), flatten(), fc(4))).data(train=(other, Y[:40]),
                                                                                    batch_size=8).compile()
    with pytest.raises(CheckpointError, match="keys differ"):
        wide.load_weights(path)


def test_a_val_fraction_split_is_held_out_again_on_load(tmp_path) -> None:  # type: ignore[no-untyped-def]
    t = DeepLearningTask("vf").model(seq(fc(8), relu(), fc(4))).data(train=(X, Y), val_fraction=0.2, batch_size=16)
    t.total_epochs(2).seed(2).run(1, progress=False)
    path = t.save(str(tmp_path / "vf.npz"))
    given, own = DeepLearningTask.load(path, (X, Y)), DeepLearningTask.load(path, t.splits)
    assert len(given.splits.val) == len(own.splits.val) == len(t.splits.val) > 0
    for u in (t, given, own):
        u.run(progress=False)
    assert state_bytes(given) == state_bytes(t) == state_bytes(own)


FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def _v1_data() -> tuple[np.ndarray, np.ndarray]:
    """The arrays tests/fixtures/make_v1_checkpoint.py trained on."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((60, 12)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0)


def test_a_version_1_checkpoint_loads_strictly_and_resumes_exactly(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Format 1 (settings as reprs, a "spec") was written by the library before the config became data
    (tests/fixtures/make_v1_checkpoint.py at that commit): it is upgraded on read, loads strictly, and
    the resumed run ends on the weights that library's uninterrupted run reached, byte for byte."""
    path = os.path.join(FIXTURES, "v1_epoch1.npz")
    header = checkpoint.read_header(path)
    assert header["version"] == checkpoint.VERSION and header["written_as"] == 1
    assert header["config"]["optimizer"]["class"] == "AdamW" and header["run"]["epoch"] == 1
    back = DeepLearningTask.load(path, _v1_data())
    assert back.config.ema == 0.9 and back.run_state.epoch == 1
    back.run(progress=False)
    with np.load(os.path.join(FIXTURES, "v1_final_state.npz")) as z:
        for k, v in back.state_dict().items():
            assert v.tobytes() == z[k].tobytes(), k
    twin = (DeepLearningTask("v1").model(back.blueprint).data(train=_v1_data(), batch_size=16, val_fraction=0.2)
            .optimizer(back.config.optimizer).scheduler(back.config.scheduler).total_epochs(3).seed(5).ema(0.9))
    twin.compile().load_state(path)  # strict: the upgraded record compares as data


def test_an_unknown_format_version_is_refused_naming_who_wrote_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    t = make(epochs=1).compile()
    path = t.save(str(tmp_path / "v.npz"))
    assert checkpoint.read_header(path)["library"] == __import__("renaissance_nb").__version__
    future = _edited(path, str(tmp_path / "v9.npz"), lambda h: h.update(version=9, library="9.0"))
    with pytest.raises(CheckpointError, match=r"written by renaissance_nb 9.0 in checkpoint format version 9; "
                                              r"this library reads versions 1 and 2"):
        t.load_state(future)


def test_load_weights_starts_the_ema_from_them(tmp_path) -> None:  # type: ignore[no-untyped-def]
    a = make(epochs=1)
    a.run(progress=False)
    path = a.save(str(tmp_path / "e.npz"))
    b = make(epochs=1).ema(0.9).compile().load_weights(path)
    for k, v in a.state_dict().items():
        assert b.read(f"{k}@ema").tobytes() == v.tobytes()


def test_class_weights_are_saved_rebuilt_and_checked(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """CrossEntropyLoss(weight=...): loss.weight is arena state written at compile; load() rebuilds the
    loss by its settings and the resumed run is byte-identical; the count is checked at plan()."""
    from renaissance_nb import ConfigError, CrossEntropyLoss
    loss = CrossEntropyLoss(weight=[0.5, 1.0, 2.0, 0.0])
    whole, part = make().loss(loss), make().loss(loss)
    whole.run(progress=False)
    part.run(1, progress=False)
    path = part.save(str(tmp_path / "w.npz"))
    back = DeepLearningTask.load(path, part.splits)
    assert repr(back.config.loss) == "CrossEntropyLoss(label_smoothing=0.0, weight=[0.5, 1.0, 2.0, 0.0])"
    np.testing.assert_array_equal(back.read("loss.weight"), [0.5, 1.0, 2.0, 0.0])
    back.run(progress=False)
    plain = make()
    plain.run(progress=False)
    assert state_bytes(back) == state_bytes(whole) != state_bytes(plain)
    ev = whole.evaluate(XV, YV)
    assert ev["loss"] == pytest.approx(whole.result.history[-1].val_loss, rel=1e-6)
    with pytest.raises(CheckpointError, match="differ"):
        make().compile().load_state(path)  # a plain loss: its plan has no loss.weight
    other = make().loss(CrossEntropyLoss(weight=[0.0, 0.0, 0.0, 5.0])).compile().load_state(path, strict=False)
    np.testing.assert_array_equal(other.read("loss.weight"), [0, 0, 0, 5])  # its own loss, not the checkpoint's
    with pytest.raises(ConfigError, match=r"plan: the loss has 2 class weights \(CrossEntropyLoss\(weight=...\)\); the "
                                          r"data has 4 classes\. Fix: give one weight per class"):
        make().loss(CrossEntropyLoss(weight=[1, 2])).plan()


def test_a_checkpoint_restores_tensor_by_tensor_where_temporaries_moved(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Liveness reuse (or scratch a newer library plans) moves the temporaries and with them the offsets of
    later regions; the state tensors are the same, so the checkpoint restores them where this plan put
    them, and the resumed run ends byte for byte where the saved one's uninterrupted run does."""
    saved = make().options(liveness=False)
    saved.run(1, progress=False)
    path = saved.save(str(tmp_path / "lv.npz"))
    here = make().compile()
    assert here.memory.region_range(*checkpoint.STATE_RANGES[-1][1:]) != \
        saved.memory.region_range(*checkpoint.STATE_RANGES[-1][1:])  # the layouts do differ
    here.load_state(path)
    assert here.run_state.epoch == 1 and here.config.liveness is True
    here.run(progress=False)
    whole = make().options(liveness=False)
    whole.run(progress=False)
    assert state_bytes(here) == state_bytes(whole)
    assert DeepLearningTask.load(path, make().splits).config.liveness is False
    with pytest.raises(CheckpointError, match=r"tensor 'fc2.weight' differs: rows padded to 1040 in the checkpoint "
                                              r"vs contiguous rows in this task. Fix: build the task with "
                                              r"options\(pad_rows=True\)"):
        wide = DeepLearningTask("w").model(seq(fc(1024), relu(), fc(4))).data(train=(X, Y), batch_size=32)
        wide_path = wide.compile().save(str(tmp_path / "w.npz"))
        DeepLearningTask("w").model(seq(fc(1024), relu(), fc(4))).data(train=(X, Y), batch_size=32).options(
            pad_rows=False).compile().load_state(wide_path)


def _edited(path: str, out: str, edit) -> str:  # type: ignore[no-untyped-def]
    """A copy of a checkpoint whose JSON header ``edit(header)`` changed (the checksum covers the arrays)."""
    with zipfile.ZipFile(path) as z:
        parts = {n: z.read(n) for n in z.namelist()}
    key = next(n for n in parts if n.startswith("header"))
    header = json.loads(np.load(io.BytesIO(parts[key])).tobytes().decode())
    edit(header)
    buf = io.BytesIO()
    np.save(buf, np.frombuffer(json.dumps(header, sort_keys=True).encode(), np.uint8))
    parts[key] = buf.getvalue()
    with zipfile.ZipFile(out, "w") as z:
        for n, b in parts.items():
            z.writestr(n, b)
    return out


def test_odd_files_and_edited_headers_are_checkpoint_errors(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Each used to escape as AttributeError, ValueError, IndexError, TypeError, or to load and then
    run a 16-step epoch; a file of one array said the context manager protocol was missing."""
    t = make(epochs=2)
    t.run(1, progress=False)
    good = t.save(str(tmp_path / "g.npz"))
    before = state_bytes(t)
    cases = {
        "fingerprint": (lambda h: h.update(fingerprint=[]), "malformed"),
        "config": (lambda h: h.update(config="x"), "malformed"),
        "resume_short": (lambda h: h["run"].update(resume_at=[1]), "malformed"),
        "resume_far": (lambda h: h["run"].update(resume_at=[1, 999]), r"resumes at step 999 of epoch 2, outside epoch 2 of "
                                                                 r"5 steps"),
    }
    for name, (edit, match) in cases.items():
        bad = _edited(good, str(tmp_path / f"{name}.npz"), edit)
        with pytest.raises(CheckpointError, match=match):
            t.load_state(bad)
        assert state_bytes(t) == before and t.run_state.resume_at is None
    np.save(str(tmp_path / "one.npy"), np.zeros(3))
    with pytest.raises(CheckpointError, match=r"holds a single array \(.npy\), not a checkpoint"):
        t.load_state(str(tmp_path / "one.npy"))
    (tmp_path / "text.npz").write_text("hello")
    with pytest.raises(CheckpointError, match=r"corrupt or truncated, or not a checkpoint \(it is not an .npz archive\)"
                       ) as info:
        t.load_state(str(tmp_path / "text.npz"))
    assert "pickle" not in str(info.value)
    module = _edited(good, str(tmp_path / "mod.npz"), lambda h: h["config"]["optimizer"].update({"class": "checkpoint"}))
    with pytest.raises(CheckpointError, match=r"records a setting this library cannot rebuild \('checkpoint' is no "
                                              r"loss, optimizer or scheduler\)"):
        DeepLearningTask.load(module, t.splits)
    for field, value in (("options", [1]), ("autosave", "x"), ("augment", [0, False])):
        odd = _edited(good, str(tmp_path / f"{field}.npz"), lambda h: h["config"].update({field: value}))
        with pytest.raises(CheckpointError, match=r"load: the task config in .* is malformed"):
            DeepLearningTask.load(odd, t.splits)


def test_a_checkpoint_file_gets_the_umask_mode_and_a_load_clears_a_torn_step(tmp_path) -> None:  # type: ignore[no-untyped-def]
    t = make(epochs=2)
    t.run(1, progress=False)
    old = os.umask(0o022)
    try:
        path = t.save(str(tmp_path / "m.npz"))
    finally:
        os.umask(old)
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"  # mkstemp's 0600 made shared folders unreadable
    t.run_state.torn_at = (1, 3)  # as a kernel error inside a step leaves it
    t.load_state(path)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the torn-step warning would be wrong: the load replaced that state
        t.run(progress=False)
    u = make(epochs=2)
    u.run(progress=False)
    assert state_bytes(t) == state_bytes(u)

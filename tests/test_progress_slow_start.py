"""The slow-start notice: a run whose first step takes long (numba compiling the kernels after an
install) says why, once, in the terminal line or the bar's description; a quick start says nothing."""
from __future__ import annotations

import time

import pytest

from renaissance_nb import progress


def test_line_progress_explains_a_slow_start_once(capsys) -> None:
    p = progress.LineProgress()
    with p.armed(0.05):
        time.sleep(0.3)
        p.disarm()  # the first step is done
        time.sleep(0.1)
    out = capsys.readouterr().out
    assert out == f"... {progress.SLOW_START_NOTE}\n"


def test_a_quick_first_update_or_an_error_leaves_no_notice(capsys) -> None:
    p = progress.LineProgress()
    with p.armed(0.2):
        p.disarm()  # the first step came back in time
    with pytest.raises(RuntimeError), p.armed(0.2):
        raise RuntimeError("a step failed before the notice")
    time.sleep(0.4)
    assert capsys.readouterr().out == ""
    assert p._timer is None


def test_the_bar_shows_the_notice_then_its_name_again() -> None:
    pytest.importorskip("tqdm")
    p = progress.BarProgress(total=32, desc="mlp")
    try:
        with p.armed(0.05):
            time.sleep(0.3)
            assert p.bar.desc.startswith("mlp: the first step is compiling the kernels")
            p.disarm()
            p.update(16, 0.5)
            assert p.bar.desc == "mlp" and p.bar.n == 16
    finally:
        p.close()


def test_a_run_with_cached_kernels_prints_no_notice(capsys) -> None:
    """After a first run in this process the kernels are loaded: a second run starts at once."""
    import numpy as np

    import renaissance_nb as rnb
    x = np.random.default_rng(0).standard_normal((256, 8), dtype=np.float32)
    t = (rnb.DeepLearningTask("t").model(rnb.seq(rnb.fc(16), rnb.relu(), rnb.fc(4)))
         .data(train=(x, np.arange(256, dtype=np.int32) % 4), batch_size=32).total_epochs(2))
    t.run(epochs=1, progress="lines")
    capsys.readouterr()
    t.run(epochs=1, progress="lines")
    out = capsys.readouterr().out
    assert "compiling the kernels" not in out and out.startswith("epoch   2")


def test_only_a_slow_first_step_is_noted(capsys, monkeypatch) -> None:
    """The notice times the first step alone: later slow steps (a big model's 16-step blocks)
    say nothing, while a first step that stalls does."""
    import numpy as np

    import renaissance_nb as rnb
    from renaissance_nb.runtime.replay import EpochSchedule
    monkeypatch.setattr(progress, "SLOW_START_S", 0.2)
    x = np.random.default_rng(0).standard_normal((256, 8), dtype=np.float32)
    t = (rnb.DeepLearningTask("t").model(rnb.seq(rnb.fc(16), rnb.relu(), rnb.fc(4)))
         .data(train=(x, np.arange(256, dtype=np.int32) % 4), batch_size=16).total_epochs(3).compile())
    t.run(epochs=1, progress="lines")  # the kernels are loaded from here on
    capsys.readouterr()
    plain = t.runner.replay.train_schedule

    def with_sleep(slow_steps):  # type: ignore[no-untyped-def]
        def schedule(variants):  # type: ignore[no-untyped-def]
            s = plain(variants)
            steps = [list(k) + ([lambda: time.sleep(0.05)] if i in slow_steps else []) for i, k in enumerate(s.steps)]
            return EpochSchedule(s.prologue, steps, s.batches)
        return schedule
    monkeypatch.setattr(t.runner.replay, "train_schedule", with_sleep(set(range(1, 16))))  # 0.75 s before the first update
    t.run(epochs=1, progress="lines")
    assert "compiling the kernels" not in capsys.readouterr().out
    monkeypatch.setattr(t.runner.replay, "train_schedule", with_sleep({0}))
    monkeypatch.setattr(progress, "SLOW_START_S", 0.02)  # a first step slower than this
    t.run(epochs=1, progress="lines")
    out = capsys.readouterr().out
    assert out.startswith(f"... {progress.SLOW_START_NOTE}\nepoch   3")


def test_a_terminal_gets_lines_inside_a_long_epoch(capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """An epoch longer than LINE_EVERY_S prints where it is; set to 0 here, every 16-step update does."""
    import re

    import numpy as np

    from renaissance_nb import DeepLearningTask, fc, seq
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)
    x = np.random.default_rng(0).standard_normal((256, 4)).astype(np.float32)
    t = DeepLearningTask("p").model(seq(fc(3))).data(train=(x, np.arange(256) % 3), batch_size=8).total_epochs(2)
    t.run(progress="lines")
    lines = capsys.readouterr().out.splitlines()
    mid = [line for line in lines if line.startswith("  epoch ")]
    assert [re.search(r"step ([\d,]+)/32", line).group(1) for line in mid] == ["16", "32"] * 2
    assert all(re.search(r"loss \d+\.\d{4}, \d+\.\d\d ms/step", line) for line in mid)
    assert "epoch ends in about" in mid[0] and "epoch ends" not in mid[1]  # nothing left to say at the end
    assert mid[2].startswith("  epoch 2:") and sum(line.startswith("epoch ") for line in lines) == 2
    monkeypatch.setattr(progress, "LINE_EVERY_S", 3600.0)
    t.reset().total_epochs(1).run(progress="lines")  # an hour between lines: one line per epoch, as before
    assert not [line for line in capsys.readouterr().out.splitlines() if line.startswith("  epoch ")]


def test_lines_after_a_resume_inside_an_epoch_count_the_steps_that_ran(capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A stop after step 10 of 40 (Ctrl-C, simulated): the resumed run's lines say 16, 32, 40 of 40
    (they used to say 26, 42, 50); and the first line's time per step leaves out a slow first step."""
    import re

    import numpy as np

    import renaissance_nb.runtime.trainer as dt
    from renaissance_nb import DeepLearningTask, fc, seq
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)
    monkeypatch.setenv("RNB_PROGRAM", "0")  # the simulated stop is read at every step boundary: kernel by kernel

    class StopAfter(dt.StopFlag):
        reads, after = 0, 10

        @property
        def requested(self) -> bool:  # type: ignore[override]
            StopAfter.reads += 1
            return StopAfter.after is not None and StopAfter.reads >= StopAfter.after

        @requested.setter
        def requested(self, value: bool) -> None:
            pass
    monkeypatch.setattr(dt, "StopFlag", StopAfter)
    x = np.random.default_rng(0).standard_normal((400, 4)).astype(np.float32)
    t = DeepLearningTask("t").model(seq(fc(3))).data(train=(x, np.arange(400) % 3), batch_size=10).total_epochs(1)
    t.run(progress="lines")
    assert t.run_state.resume_at == (0, 10)
    assert "stopped after step 10 of 40 in epoch 1 (Ctrl-C)" in capsys.readouterr().out
    StopAfter.after = None
    capsys.readouterr()
    t.run(progress="lines")
    steps = re.findall(r"step (\d+)/40", capsys.readouterr().out)
    assert steps == ["16", "32", "40"], steps
    p = progress.LineProgress(steps_per_epoch=1000)
    time.sleep(0.5)  # a slow first step, then run() disarms the slow-start timer
    p.disarm()
    p.update(16, 0.5)
    assert float(re.search(r"([\d.]+) ms/step", capsys.readouterr().out).group(1)) < 10.0


@pytest.mark.parametrize("off", [False, None, 0, "none"])
def test_progress_off_in_every_spelling_and_bad_values_refused(capsys, off) -> None:  # type: ignore[no-untyped-def]
    import numpy as np

    from renaissance_nb import ConfigError, DeepLearningTask, fc, seq
    x = np.random.default_rng(0).standard_normal((64, 4)).astype(np.float32)
    t = DeepLearningTask("p").model(seq(fc(3))).data(train=(x, np.arange(64) % 3), batch_size=16).total_epochs(2)
    t.run(1, progress=off)
    assert capsys.readouterr().out == ""
    for bad in ("verbose", "tqdm", 2, 0.5):
        with pytest.raises(ConfigError, match=r"run: progress=.*'auto' \(or True\), 'bar', 'lines', or False/None"):
            t.run(progress=bad)
    assert len(t.result.history) == 1  # a refused call trains nothing


def test_the_bar_after_a_resume_starts_at_the_steps_done() -> None:
    pytest.importorskip("tqdm")
    p = progress.make_progress("bar", total=160, desc="t", steps_per_epoch=40, epoch=1, step=10)
    try:
        assert p.bar.n == 10
        p.update(150, 0.5)
        assert p.bar.n == p.bar.total == 160
    finally:
        p.close()

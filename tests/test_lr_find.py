"""task.lr_find(): the learning-rate range test on the compiled step (inspector/lr_range.py)."""
from __future__ import annotations

import numpy as np
import pytest

from renaissance_nb import AdamW, ConfigError, DeepLearningTask, Phase, fc, relu, seq
from renaissance_nb.inspector.lr_range import DIVERGE, LRRangeTest
from renaissance_nb.train.rng import Philox, StreamId


def blobs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Four Gaussian clusters in 8 dimensions (a problem a learning rate can be too small or too large for)."""
    rng = np.random.default_rng(3)
    y = np.arange(n) % 4
    centres = rng.standard_normal((4, 8)).astype(np.float32) * 2
    return (centres[y] + rng.standard_normal((n, 8)).astype(np.float32)).astype(np.float32), y


def task(epochs: int = 2, seed: int = 0) -> DeepLearningTask:
    x, y = blobs(512)
    return (DeepLearningTask("lr").model(seq(fc(32), relu(), fc(4))).data(train=(x, y), batch_size=32)
            .optimizer(AdamW(lr=1e-3)).total_epochs(epochs).seed(seed))


def weights(t: DeepLearningTask) -> dict[str, bytes]:
    return {k: v.tobytes() for k, v in t.state_dict().items()}


def test_the_ramp_the_losses_and_the_restore() -> None:
    """The lrs rise geometrically from start_lr; the losses are the steps' own (the first is the untrained
    model's); the arena comes back byte for byte, so training afterwards gives the bytes of a task that never
    ran the test; the same test twice gives the same losses."""
    t, plain = task(), task()
    t.compile()
    before = t.arena.bytes.tobytes()
    r = t.lr_find(1e-6, 1.0, 60, progress=False)
    assert t.arena.bytes.tobytes() == before and t.phase is Phase.COMPILED
    assert r.lrs[0] == pytest.approx(1e-6, rel=1e-6) and np.allclose(np.diff(np.log(r.lrs)), np.log(1e6) / 59, rtol=1e-4)
    assert len(r.losses) == len(r.lrs) == len(r.smoothed) <= 60
    assert r.losses[0] == pytest.approx(t.evaluate(*blobs(512)[:2])["loss"], rel=0.2)  # near the untrained loss
    again = t.lr_find(1e-6, 1.0, 60, progress=False)
    assert np.array_equal(again.losses, r.losses)
    t.run(progress=False)
    plain.run(progress=False)
    assert weights(t) == weights(plain)


def test_a_diverging_loss_stops_the_test_and_the_suggestion_trains_best() -> None:
    """Up to lr 100 AdamW diverges: the test stops there, naming why; training at the suggestion beats training
    at a hundredth of it and at a hundred times it (same seed, same data)."""
    t = task()
    r = t.lr_find(1e-6, 100.0, 100, progress=False)
    assert len(r.losses) < 100 and ("passed" in r.stopped or "not finite" in r.stopped), r.stopped
    if "passed" in r.stopped:
        assert r.smoothed[-1] > DIVERGE * r.smoothed.min()
    s = r.suggestion
    assert s is not None and 1e-5 < s < 10, r

    def final_loss(lr: float) -> float:
        u = task(epochs=2, seed=1).optimizer(AdamW(lr=lr))
        return u.run(progress=False).history[-1].train_loss
    at = final_loss(s)
    assert at < final_loss(s / 100) and at < final_loss(min(s * 100, 50.0)), (s, r)
    assert repr(r).startswith("<LRRangeTest ") and f"{s:.3g}" in repr(r)
    assert len(r.rows()) == len(r.lrs) and set(r.rows()[0]) == {"lr", "loss", "smoothed"}
    fig = r.plot()
    assert fig.axes[0].get_xscale() == "log"


@pytest.mark.parametrize("kw, words", [({"start_lr": 0}, "start_lr=0"), ({"end_lr": 1e-9}, "above start_lr"),
                                       ({"steps": 1}, "steps=1"), ({"steps": 2.5}, "steps=2.5"),
                                       ({"progress": "x"}, "lr_find: progress='x'")])
def test_bad_arguments_are_refused_before_anything_compiles(kw, words: str) -> None:  # type: ignore[no-untyped-def]
    t = task()
    with pytest.raises(ConfigError, match=words.replace("(", r"\(")):
        t.lr_find(**kw)
    assert t.phase is Phase.PLANNING  # a refused call compiled nothing


def test_a_short_test_has_no_suggestion() -> None:
    r = task().lr_find(1e-4, 1e-3, 5, progress=False)
    assert isinstance(r, LRRangeTest) and r.suggestion is None and "too few steps" in repr(r)


def test_a_test_ending_on_a_non_finite_loss_reports_the_finite_best() -> None:
    lrs = np.geomspace(1e-4, 1.0, 20)
    losses = np.r_[np.linspace(2.0, 1.0, 19), np.nan]
    r = LRRangeTest(lrs, losses, losses.copy(), "the loss was not finite at step 20")
    assert r.best == (pytest.approx(lrs[18]), pytest.approx(1.0))  # argmin took the NaN's index
    assert r.suggestion is not None and np.isfinite(r.suggestion)


def test_nan_stops_the_test_and_the_order_is_the_first_epochs() -> None:
    """With nan_policy="raise" (the default) a non-finite step ends the test instead of raising NumericalError;
    the batches come in the first epoch's shuffled order (a fresh task's order is 0..n-1: class-sorted data gave
    single-class batches), and the order is put back; a distributed or cuda task is refused before compiling."""
    from renaissance_nb import SGD
    t = task().optimizer(SGD(lr=1e-3))
    t.compile()
    before = t.runner.env.perms["train"].copy()
    r = t.lr_find(1e30, 1e38, 5, progress=False)
    assert "not finite at step" in r.stopped and len(r.losses) < 5, r
    assert np.array_equal(t.runner.env.perms["train"], before)
    x, y = blobs(512)
    order = np.argsort(y, kind="stable")
    xs, ys = x[order], y[order]
    sorted_task = (DeepLearningTask("s").model(seq(fc(32), relu(), fc(4))).data(train=(xs, ys), batch_size=32)
                   .optimizer(AdamW()).total_epochs(1).seed(5)).compile()
    first = sorted_task.lr_find(1e-7, 1e-6, 12, progress=False).losses[0]  # the untrained model's first batch
    perm = Philox(5).permutation(512, int(StreamId.SHUFFLE), 0)  # run()'s first epoch order (runner.shuffle_into)
    assert first == pytest.approx(sorted_task.evaluate(xs[perm[:32]], ys[perm[:32]])["loss"], rel=1e-5)
    assert first != pytest.approx(sorted_task.evaluate(xs[:32], ys[:32])["loss"], rel=1e-3)  # not class 0 alone
    planned_on_two = task().distributed("mpi", ranks=2)  # planned for 2 ranks without MPI
    with pytest.raises(ConfigError, match="distributed task"):
        planned_on_two.lr_find(progress=False)
    assert planned_on_two.phase is Phase.PLANNING
    with pytest.raises(ConfigError, match="float32 holds"):
        task().lr_find(1e-50, 1e-3)

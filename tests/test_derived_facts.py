"""One owner for each fact the config implies: the epoch's batches (train/epochs.py), the base learning
rate (TaskConfig.base_lr), and the compiled plan frozen with the runner's notes kept apart. Each owner is
checked against a brute-force count of what a run does, so a copy of the arithmetic that drifts fails."""
from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

import renaissance_nb as rnb
from renaissance_nb import (ConfigError, CosineAnnealingLR, DeepLearningTask, ReduceLROnPlateau, conv, fc, gap,
                            relu, seq)
from renaissance_nb.compiler.pipeline import learning_rates, local_sizes
from renaissance_nb.runtime.replay import batch_variants, run_schedules
from renaissance_nb.train.epochs import EpochBatches


def brute_batches(n: int, batch: int) -> list[list[int]]:
    """The sample positions of each batch of one pass, sliced as a DataLoader with drop_last=False does."""
    order = list(range(n))
    return [order[i:i + batch] for i in range(0, n, batch)]


def brute_shards(n: int, batch: int, ranks: int) -> list[list[list[int]]]:
    """Per rank, its equal contiguous share of each global batch."""
    out = []
    for k in range(ranks):
        out.append([b[k * len(b) // ranks:(k + 1) * len(b) // ranks] for b in brute_batches(n, batch)])
    return out


# ---- the owner against brute force --------------------------------------------------------------------------
def test_epoch_batches_match_a_brute_force_slicing() -> None:
    for n, batch in itertools.product(range(0, 41), range(1, 13)):
        e, got = EpochBatches(n, batch), brute_batches(n, batch)
        sizes = [len(b) for b in got]
        assert (e.steps, e.sizes()) == (len(got), sizes), (n, batch)
        assert e.remainder == (sizes[-1] if sizes and sizes[-1] < batch else 0), (n, batch)
        assert e.last == (sizes[-1] if sizes else batch), (n, batch)
        labels = ["full" if s == batch else "partial" for s in sizes]
        assert e.labels("full", "partial") == labels == batch_variants(n, batch, "full", "partial"), (n, batch)


def test_each_ranks_share_matches_a_brute_force_split() -> None:
    for n, batch, ranks in itertools.product(range(1, 41), range(1, 13), range(1, 5)):
        e = EpochBatches(n, batch)
        shards = brute_shards(n, batch, ranks)
        even = batch % ranks == 0 and all(len(b) % ranks == 0 for b in brute_batches(n, batch))
        assert e.splits_over(ranks) == even, (n, batch, ranks)
        if not even:
            continue
        mine = e.shard(ranks)
        for k in range(ranks):
            assert mine.sizes() == [len(b) for b in shards[k]], (n, batch, ranks, k)
        assert sorted(i for rank in shards for b in rank for i in b) == list(range(n))  # every sample once


CASES = [  # (n_train, n_val, batch, ranks, train_resolution)
    (10, 0, 4, 1, None),
    (12, 5, 4, 1, None),
    (7, 3, 7, 1, None),
    (10, 4, 3, 1, ((8, 8), (6, 6), 1)),
    (24, 6, 8, 2, None),
    (20, 0, 8, 4, ((8, 8), (6, 6), 1)),
    (36, 9, 12, 3, None),
]


def _task(n: int, n_val: int, batch: int, ranks: int, res) -> DeepLearningTask:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(n * 100 + batch)
    x = rng.standard_normal((n + n_val, 1, 8, 8)).astype(np.float32)
    y = (np.arange(n + n_val) % 3).astype(np.int64)
    val = (x[n:], y[n:]) if n_val else None
    t = (DeepLearningTask("epochs").model(seq(conv(4, 3, 1, 1), relu(), gap(), fc(3)))
         .data(train=(x[:n], y[:n]), val=val, batch_size=batch).total_epochs(2).seed(1))
    if res is not None:
        t.train_resolution(res[0], res[1], boundary_epoch=res[2])
    return t.distributed("mpi", ranks=ranks) if ranks > 1 else t


@pytest.mark.parametrize("n, n_val, batch, ranks, res", CASES)
def test_the_plan_has_the_batches_of_a_brute_force_split(n, n_val, batch, ranks, res) -> None:  # type: ignore[no-untyped-def]
    """Each rank's variants (full and last batch, at each training size; validation) and the steps per
    epoch, as planned, against the brute-force shards of the global batches (plan() needs no MPI)."""
    t = _task(n, n_val, batch, ranks, res)
    t.plan()
    specs = t.planned.shapes.specs
    shards = brute_shards(n, batch, ranks)
    assert t.steps_per_epoch == len(brute_batches(n, batch)) == len(shards[0])
    sizes = [len(b) for b in shards[0]]
    assert all([len(b) for b in rank] == sizes for rank in shards)  # every rank plans the same
    assert (specs["train_base"].batch, specs["train_last"].batch) == (sizes[0], sizes[-1])
    assert (local_sizes(t.config).n, t.config.local_batch) == (n // ranks, batch // ranks)
    first, second = ((8, 8), (8, 8)) if res is None else res[:2]
    assert specs["train_base"].sample_shape == specs["train_last"].sample_shape == (1, *first)
    assert specs["train_lowres"].used == specs["train_lowres_last"].used == (res is not None)
    if res is not None:
        assert specs["train_lowres"].input_shape == (sizes[0], 1, *second)
        assert specs["train_lowres_last"].input_shape == (sizes[-1], 1, *second)
    assert [specs[v].batch for v in t.config.train_batches.labels("train_base", "train_last")] == sizes
    vsizes = [len(b) for b in brute_batches(n_val, t.config.val_batch)]
    assert specs["val_base"].used == specs["val_last"].used == bool(n_val)
    assert [specs[v].batch for v in t.config.val_batches.labels("val_base", "val_last")] == vsizes


@pytest.mark.parametrize("n, n_val, batch, ranks, res", [c for c in CASES if c[3] == 1])
def test_a_run_takes_the_batches_of_a_brute_force_split(n, n_val, batch, ranks, res) -> None:  # type: ignore[no-untyped-def]
    """What the run replays: each epoch's steps (the step counter) and samples (the metric sums the step
    adds each batch's size to), and the shape of each step's variant at each epoch's training size."""
    t = _task(n, n_val, batch, ranks, res).compile()
    sched = run_schedules(t.config, t.runner.replay)
    sizes = [len(b) for b in brute_batches(n, batch)]
    specs = t.compiled.shapes.specs
    for epoch in range(2):
        t.run(1, progress=False)
        assert int(t.read("step")[0]) == (epoch + 1) * len(sizes)
        assert t.read("metrics.sum")[3] == n  # the samples of this epoch's training steps
        variants = sched.train(epoch).variants
        assert [specs[v].batch for v in variants] == sizes
        size = (8, 8) if res is None or epoch < res[2] else res[1]
        assert {specs[v].sample_shape for v in variants} == {(1, *size)}
    assert t.result.history[-1].steps == 2 * t.steps_per_epoch


def test_a_batch_that_does_not_split_is_refused_with_one_that_does() -> None:
    """Were every batch a multiple of the ranks, the last one too, so would be the samples: a sample count
    that is not is refused as such (no batch size helps), a batch size with the nearest one that splits."""
    t = _task(26, 0, 8, 2, None)  # 26 = 3 x 8 + 2: the last batch splits, 2 ranks of 1
    t.plan()
    assert t.planned.shapes.specs["train_last"].batch == 1
    with pytest.raises(ConfigError, match=r"27 training samples do not split evenly over 2 ranks with any batch "
                                          r"size \(27 = 3 x 8 \+ 3\).*Fix: train on a multiple of 2 samples "
                                          r"\(drop 1\), or another number of ranks\."):
        _task(27, 0, 8, 2, None).plan()
    with pytest.raises(ConfigError, match=r"batch_size=10 does not split evenly over 4 ranks.*e\.g\. 8,"):
        _task(36, 0, 10, 4, None).plan()
    assert [b for b in range(1, 40) if EpochBatches(27, b).splits_over(2)] == []
    assert EpochBatches(36, 8).splits_over(4) and EpochBatches(36, 12).shard(4).sizes() == [3, 3, 3]


# ---- the base learning rate --------------------------------------------------------------------------------
def _lr_task(opt, sched, batch: int = 16) -> DeepLearningTask:  # type: ignore[no-untyped-def]
    x = np.random.default_rng(0).standard_normal((64, 5)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    t = (rnb.DeepLearningTask("lr").model(rnb.seq(rnb.fc(2))).data(train=(x, y), val=(x[:16], y[:16]), batch_size=batch)
         .optimizer(opt).total_epochs(2))
    return t.scheduler(sched) if sched is not None else t


@pytest.mark.parametrize("opt, sched, base", [
    (rnb.SGD().lr(0.1), None, 0.1),
    (rnb.AdamW(), None, rnb.AdamW().lr_),
    (rnb.SGD().lr(0.1), CosineAnnealingLR(), 0.1),
    (rnb.AdamW(), CosineAnnealingLR().base_lr(2e-3), 2e-3),
    (rnb.AdamW().lr(2e-3), CosineAnnealingLR().base_lr(2e-3), 2e-3),
    (rnb.SGD().lr(0.05), ReduceLROnPlateau(monitor="val_loss"), 0.05),
    (rnb.SGD(), ReduceLROnPlateau(monitor="val_loss").base_lr(0.3), 0.3),
])
def test_the_base_learning_rate_is_one_value_everywhere(opt, sched, base) -> None:  # type: ignore[no-untyped-def]
    """The table before plan() (cached by the task), plan()'s table, the rate every step reads from the
    arena and ReduceLROnPlateau's first rate all start from ``config.base_lr``."""
    t = _lr_task(opt, sched)
    assert t.config.base_lr == base
    spe, epochs = t.steps_per_epoch, 2
    expected = np.full(spe * epochs, base, np.float32) if sched is None else sched.table(spe, epochs, lr=base)
    np.testing.assert_array_equal(t.lr_table(), expected)
    t.compile()
    np.testing.assert_array_equal(t.planned.lr_table, expected)
    np.testing.assert_array_equal(t.read("lr_table"), expected)
    if isinstance(sched, ReduceLROnPlateau):
        assert t.run_state.plateau["lr"] == base


def test_the_cached_table_follows_every_setting_it_reads() -> None:
    """task.lr_table() before plan() is cached by learning_rates_key: each change it reads gives the
    table planned afresh, and the two-rates check still runs."""
    t = _lr_task(rnb.SGD().lr(0.1), CosineAnnealingLR())
    first = t.lr_table()
    assert t.lr_table() is first  # cached
    smaller = _lr_task(rnb.SGD().lr(0.1), CosineAnnealingLR(), batch=8).config.data
    for change in (lambda: t.optimizer(rnb.SGD().lr(0.2)), lambda: t.scheduler(CosineAnnealingLR(warmup=1)),
                   lambda: t.total_epochs(3), lambda: t.data(smaller, batch_size=8),
                   lambda: t.scheduler(CosineAnnealingLR().base_lr(0.2))):
        before = t.lr_table()
        change()
        np.testing.assert_array_equal(t.lr_table(), learning_rates(t.config))
        assert not np.array_equal(t.lr_table(), before)
    t.optimizer(rnb.SGD().lr(0.5))  # 0.5 against the scheduler's base_lr=0.2
    with pytest.raises(ConfigError, match=r"two learning rates: SGD\(lr=0.5\) and CosineAnnealingLR\(base_lr=0.2\)"):
        t.lr_table()


# ---- the compiled plan, frozen; the runner's notes -----------------------------------------------------------
def test_the_compiled_plan_is_frozen_and_the_runners_notes_are_its_own() -> None:
    t = _lr_task(rnb.SGD().lr(0.1), None).compile()
    c = t.compiled
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.notes = ()  # type: ignore[misc]
    assert isinstance(c.notes, tuple) and isinstance(c.max_slot_bytes, tuple)
    assert any(n.startswith("ZERO_GRAD elided") for n in c.notes)
    assert not any(n.startswith("device:") for n in c.notes)  # binding's facts are the runner's
    assert [n for n in t.runner.notes if n.startswith("device: CPU, ")] == t.runner.notes[:1]
    lines = [line.removeprefix("note: ") for line in t.summary().splitlines() if line.startswith("note: ")]
    assert lines == [*c.notes, *t.runner.notes]  # the summary shows both, the plan's first
    again = _lr_task(rnb.SGD().lr(0.1), None).compile()
    assert again.compiled.notes == c.notes  # compiling again adds nothing to a plan

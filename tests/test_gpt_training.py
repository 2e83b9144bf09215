"""A character GPT learns the embedded corpus: one epoch of 200 steps takes the validation loss well below
the best context-free guess (the characters' unigram entropy), and a seed gives byte-identical weights."""
from __future__ import annotations

import numpy as np

from renaissance_nb import AdamW, DeepLearningTask, datasets, gpt
from renaissance_nb.data.arrays import DataSplits, Dataset

T = 32


def _corpus(n: int, val: int) -> DataSplits:
    data = datasets.default_text(context=T)
    tr, va, tok = data.train, data.val, data.tokenizer
    return DataSplits(Dataset(tr.x[:n], tr.y[:n], tr.num_classes, tr.name, tokenizer=tok),
                      Dataset(va.x[:val], va.y[:val], va.num_classes, va.name, tokenizer=tok), data.name)


def _task(splits: DataSplits, form: str = "flash") -> DeepLearningTask:
    return (DeepLearningTask().model(gpt(splits.num_classes, 64, 2, 4, T, attention_form=form))
            .data(splits, batch_size=32).optimizer(AdamW(lr=3e-3, weight_decay=0.1).decay("matrices"))
            .total_epochs(1).seed(0))


def test_a_char_gpt_learns_the_embedded_corpus() -> None:
    splits = _corpus(6400, 512)
    y = splits.train.y.reshape(-1)
    p = np.bincount(y, minlength=splits.num_classes) / y.size
    unigram = float(-(p[p > 0] * np.log(p[p > 0])).sum())  # the best loss without looking at the context
    task = _task(splits)
    task.run(progress=False)
    val = task.result.history[-1].val_loss
    assert val < unigram - 0.6, (val, unigram)  # 200 steps: about 2.45 against 3.31
    text = task.generate("ROMEO:", 60, temperature=0.8, seed=0)
    assert text.startswith("ROMEO:") and len(text) == 66 and text == task.generate("ROMEO:", 60, temperature=0.8)


def test_a_seed_gives_byte_identical_weights() -> None:
    splits = _corpus(960, 64)
    a, b = _task(splits, "materialized"), _task(splits, "materialized")
    a.run(progress=False)
    b.run(progress=False)
    sa, sb = a.state_dict(), b.state_dict()
    assert all(sa[k].tobytes() == sb[k].tobytes() for k in sa)


def test_progressive_context_trains_short_windows_first_with_the_same_offsets() -> None:
    """train_resolution(16, 32, boundary_epoch=1) on windows of 32: the first epoch reads each window's first
    16 positions (the train_base variant at T = 16), the second the whole windows (train_lowres); every tensor
    keeps its offset across the variants, and the first epoch is the same run as a task trained on the
    16-token prefixes themselves."""
    splits = _corpus(320, 64)
    task = _task(splits, "materialized").total_epochs(2).train_resolution(16, 32, boundary_epoch=1)
    task.compile()
    specs = task.shapes.specs
    assert specs["train_base"].sample_shape == (16,) and specs["train_lowres"].sample_shape == (32,)
    base, low = task.plans["train_base"], task.plans["train_lowres"]
    assert all(base[t.name].offset == t.offset for t in low)
    short = DataSplits(Dataset(np.ascontiguousarray(splits.train.x[:, :16]), np.ascontiguousarray(splits.train.y[:, :16]),
                               splits.num_classes, "prefixes"), None, "prefixes")
    ref = (DeepLearningTask().model(gpt(splits.num_classes, 64, 2, 4, T)).data(short, batch_size=32)
           .optimizer(AdamW(lr=3e-3, weight_decay=0.1).decay("matrices")).total_epochs(1).seed(0))
    task.run(epochs=1, progress=False)
    ref.run(progress=False)
    a, b = task.state_dict(), ref.state_dict()
    assert all(a[k].tobytes() == b[k].tobytes() for k in a)
    task.run(progress=False)  # the second epoch, at the full context
    assert task.result.history[-1].train_loss < task.result.history[0].train_loss


def test_a_training_context_past_the_windows_is_refused() -> None:
    import pytest
    from renaissance_nb.errors import ConfigError
    with pytest.raises(ConfigError, match="context length of at most 32"):
        _task(_corpus(64, 32)).train_resolution(16, 48, boundary_epoch=1).plan()

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

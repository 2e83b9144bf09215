"""Misspelt names get the nearest right one (difflib), and messages say what they mean."""
from __future__ import annotations

import pytest

from renaissance_nb import AdamW, CosineAnnealingLR, DeepLearningTask, datasets
from renaissance_nb.errors import ConfigError


def test_a_misspelt_builder_method_names_the_right_one() -> None:
    task = DeepLearningTask()
    with pytest.raises(AttributeError, match=r"DeepLearningTask has no method or attribute 'epochs'\. "
                                             r"Fix: did you mean total_epochs\?$"):
        task.epochs(3)
    with pytest.raises(AttributeError, match=r"'sed'\. Fix: did you mean seed\?"):
        task.sed(0)
    with pytest.raises(AttributeError, match=r"Fix: the learning rate is the optimizer's: "
                                             r"task\.optimizer\(AdamW\(\)\.lr\(1e-3\)\)\."):
        task.lr(0.1)
    with pytest.raises(AttributeError, match=r"AdamW has no method or attribute 'learning_rate'\. Fix: did you mean lr\?"):
        AdamW().learning_rate(0.1)
    with pytest.raises(AttributeError, match=r"'zzz'\. Fix: help\(DeepLearningTask\) lists its methods\.$"):
        task.zzz  # noqa: B018 - nothing near it
    assert not hasattr(task, "epochs") and hasattr(task, "total_epochs")  # still an AttributeError


def test_a_property_that_fails_inside_keeps_its_own_error() -> None:
    """__getattr__ runs after any AttributeError, one from inside a property too: that one must not turn
    into 'no such attribute'."""
    class Broken(DeepLearningTask):
        @property
        def oops(self) -> int:
            return self.missing_inside  # type: ignore[attr-defined, no-any-return]

    with pytest.raises(AttributeError, match="'missing_inside'"):
        Broken().oops  # noqa: B018


def test_a_misspelt_keyword_names_the_right_one() -> None:
    task = DeepLearningTask()
    with pytest.raises(ConfigError, match=r"data: batchsize=64 is invalid; .* Fix: did you mean batch_size=\? "
                                          r"Write batch_size= instead of batchsize="):
        task.data(datasets.default_mnist(), batchsize=64)
    with pytest.raises(ConfigError, match=r"AdamW\(\): learning_rate=0\.1 is invalid; .* Fix: did you mean lr=\?"):
        AdamW(learning_rate=0.1)
    with pytest.raises(ConfigError, match=r"AdamW\(\): wieght_decay=0\.1 .* Fix: did you mean weight_decay=\?"):
        AdamW(wieght_decay=0.1)


def test_a_warmup_as_long_as_training_is_not_called_longer() -> None:
    """3 epochs of warmup in 3 epochs of training: it used to read 'longer than training'."""
    with pytest.raises(ConfigError, match=r"fewer than 12 steps .*it is 12 steps: warmup as long as training") as info:
        CosineAnnealingLR(warmup=3).table(4, 3)
    assert "longer" not in str(info.value)
    with pytest.raises(ConfigError, match=r"it is 16 steps: warmup longer than training"):
        CosineAnnealingLR(warmup=4).table(4, 3)

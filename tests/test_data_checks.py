"""Data the batch kernels can trust: every way into data() is checked as from_arrays() is.

Found by an audit of the data side: a Dataset built by hand went unchecked, so labels past
num_classes were read out of bounds by the loss kernel; object-dtype labels 1.7 became 1;
augment() on flat data was silently ignored; batch norm with a last batch of one sample
failed at compile with a binding message.
"""
from __future__ import annotations

import numpy as np
import pytest

from renaissance_nb import ConfigError, DataError, DeepLearningTask, bn, datasets, fc, relu, seq
from renaissance_nb.data.arrays import from_arrays

rng = np.random.default_rng(3)
X = rng.standard_normal((64, 12)).astype(np.float32)
Y = rng.integers(0, 4, 64).astype(np.int32)


def task(**kw) -> DeepLearningTask:  # type: ignore[no-untyped-def]
    return DeepLearningTask().model(kw.pop("model", seq(fc(8), relu(), fc(4)))).total_epochs(1).seed(0)


def test_a_hand_built_dataset_is_checked_like_arrays() -> None:
    bad = Y.copy()
    bad[::3] = 9
    with pytest.raises(DataError, match=r"data: train y=.*"):
        task().data(datasets.Dataset(X, bad, 4, "mine"), batch_size=16)
    with pytest.raises(DataError, match=r"data: train y=.*length 64, got 40"):
        task().data(datasets.Dataset(X, Y[:40], 4, "mine"), batch_size=16)
    val = datasets.Dataset(X[:, :5].copy(), Y, 4, "v")
    with pytest.raises(DataError, match=r"data: val=.*samples of shape \(12,\) and 4 classes"):
        task().data(datasets.DataSplits(datasets.Dataset(X, Y, 4, "t"), val, "s"), batch_size=16)


def test_a_hand_built_float64_dataset_trains_like_its_float32_arrays() -> None:
    a = task().data(datasets.Dataset(X.astype(np.float64), Y.astype(np.int64), 4, "d"), batch_size=16)
    b = task().data(train=(X, Y), batch_size=16)
    a.run(progress=False)
    b.run(progress=False)
    assert all(a.state_dict()[k].tobytes() == v.tobytes() for k, v in b.state_dict().items())


def test_object_labels_keep_their_values() -> None:
    with pytest.raises(DataError, match=r"not whole numbers"):
        from_arrays((X[:4], np.array([0, 1.7, 2.2, 3.9], dtype=object)))
    with pytest.raises(DataError, match=r"labels >= 0"):
        from_arrays((X[:4], np.array([-1, 1, 2, 3], dtype=object)))
    with pytest.raises(DataError, match=r"integer class labels"):
        from_arrays((X[:4], np.array(["0", "1", "2", "3"], dtype=object)))
    assert from_arrays((X[:4], np.array([0, 1, 2, 3], dtype=object))).train.y.tolist() == [0, 1, 2, 3]


def test_augment_needs_images() -> None:
    t = task().data(train=(X, Y), batch_size=16).augment(crop_pad=2, flip=True)
    with pytest.raises(ConfigError, match=r"augment\(crop_pad=2, flip=True\) needs image data"):
        t.plan()


def test_batch_norm_with_a_last_batch_of_one_sample_names_the_batch_size() -> None:
    t = task(model=seq(fc(8), bn(), relu(), fc(4))).data(train=(X[:33], Y[:33]), batch_size=16)
    with pytest.raises(ConfigError, match=r"batch_size=16 leaves a last training batch of 1 sample"):
        t.compile()
    task(model=seq(fc(8), bn(), relu(), fc(4))).data(train=(X[:33], Y[:33]), batch_size=11).compile()


def test_num_classes_for_a_class_only_in_val() -> None:
    y_train = np.where(Y == 3, 0, Y)
    with pytest.raises(DataError, match="num_classes"):
        task().data(train=(X, y_train), val=(X, Y), batch_size=16)
    t = task().data(train=(X, y_train), val=(X, Y), batch_size=16, num_classes=4)
    assert t.splits.train.num_classes == 4 and t.splits.val.num_classes == 4


def test_evaluate_errors_name_evaluate() -> None:
    t = task().data(train=(X, Y), batch_size=16).compile()
    with pytest.raises(DataError, match=r"^evaluate: "):
        t.evaluate(X, Y + 10)
    with pytest.raises(DataError, match=r"^predict: "):
        t.predict(X[:, :5][None])

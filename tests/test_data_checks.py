"""Data the batch kernels can trust: every way into data() is checked as from_arrays() is.

Found by an audit of the data side: a Dataset built by hand went unchecked, so labels past
num_classes were read out of bounds by the loss kernel; object-dtype labels 1.7 became 1;
augment() on flat data was silently ignored; batch norm with a last batch of one sample
failed at compile with a binding message.
"""
from __future__ import annotations

import numpy as np
import pytest

from renaissance_nb import (ConfigError, DataError, DeepLearningTask, bn, conv, datasets, dropout, fc, flatten, gap,
                            relu, seq)
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


def test_batch_norm_over_images_takes_a_batch_of_one_sample_as_pytorch_does() -> None:
    """(1, C, H, W) gives a conv's BN H*W values per channel: PyTorch's BatchNorm2d trains on it, and so
    does this (the check used to refuse any BN model); at 1x1 maps, or after fc, one sample is refused."""
    x, y = IMAGES.transpose(0, 3, 1, 2)[:33].copy(), IMAGE_Y[:33]
    t = task(model=seq(conv(4, 3, p=1), bn(), relu(), gap(), fc(4))).data(train=(x, y), batch_size=16)
    t.run(progress=False)
    assert np.isfinite(t.result.history[-1].train_loss)
    with pytest.raises(ConfigError, match=r"plan: with batch_size=1, \S+ would see one value per channel"):
        task(model=seq(fc(8), bn(), relu(), fc(4))).data(train=(X, Y), batch_size=1).compile()
    one_by_one = seq(conv(4, 8), bn(), relu(), gap(), fc(4))  # an 8x8 kernel on 8x8 images: 1x1 maps
    with pytest.raises(ConfigError, match=r"leaves a last training batch of 1 sample \(33 samples\), where \S+ would see one value"):
        task(model=one_by_one).data(train=(x, y), batch_size=16).compile()


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


# ---- channels-last images ----------------------------------------------------------------------
IMAGES = rng.standard_normal((48, 8, 8, 3)).astype(np.float32)  # (N, H, W, C), as Keras, JAX or PIL give them
IMAGE_Y = rng.integers(0, 4, 48).astype(np.int32)


def conv_task(**data_kw) -> DeepLearningTask:  # type: ignore[no-untyped-def]
    x = data_kw.pop("x", IMAGES)
    return task(model=seq(conv(4, 3, p=1), relu(), gap(), fc(4))).data(train=(x, IMAGE_Y), batch_size=16, **data_kw)


def test_channels_last_images_are_refused_at_plan_with_the_fix() -> None:
    t = conv_task()
    with pytest.raises(ConfigError, match=r"plan: the training images are shaped \(8, 8, 3\).*channels-last.*"
                                          r"8 channels of 8x3 images.*channels_last=True"):
        t.plan()
    assert t.arch is None  # nothing planned


def test_channels_last_true_trains_exactly_like_channels_first_data() -> None:
    nchw = np.ascontiguousarray(IMAGES.transpose(0, 3, 1, 2))
    a, b = conv_task(channels_last=True), conv_task(x=nchw)
    assert a.splits.sample_shape == b.splits.sample_shape == (3, 8, 8)
    a.run(progress=False)
    b.run(progress=False)
    for name, w in a.state_dict().items():
        assert np.array_equal(w, b.state_dict()[name]), name
    # evaluate and predict take the layout the task was given
    assert a.evaluate(IMAGES, IMAGE_Y) == b.evaluate(nchw, IMAGE_Y)
    assert np.array_equal(a.predict(IMAGES), b.predict(nchw))


def test_channels_last_is_kept_by_a_checkpoint(tmp_path) -> None:  # type: ignore[no-untyped-def]
    a = conv_task(channels_last=True)
    a.run(progress=False)
    a.save(tmp_path / "c.rnb")
    b = DeepLearningTask.load(str(tmp_path / "c.rnb"), (IMAGES, IMAGE_Y))
    assert b.splits.sample_shape == (3, 8, 8)
    assert np.array_equal(a.predict(IMAGES), b.predict(IMAGES))


def test_channels_last_false_accepts_channels_first_data_that_looks_channels_last() -> None:
    t = conv_task(channels_last=False)
    t.plan()
    assert t.splits.sample_shape == (8, 8, 3)  # 8 channels of 8x3 images, as the user said


def test_channels_last_needs_rank_4_images_and_a_bool() -> None:
    with pytest.raises(DataError, match=r"data: channels_last=True is invalid; expected images shaped \(N, H, W, C\)"):
        task().data(train=(X, Y), batch_size=16, channels_last=True)
    with pytest.raises(ConfigError, match=r"data: channels_last=1 is invalid; expected True, False or None"):
        conv_task(channels_last=1)


def test_flat_models_do_not_care_about_the_channel_axis() -> None:
    t = task(model=seq(flatten(), fc(4))).data(train=(IMAGES, IMAGE_Y), batch_size=16)
    t.plan()  # an MLP reads the pixels in any order: no refusal


def test_a_channels_last_task_takes_its_own_converted_arrays_back() -> None:
    """``task.splits`` holds (N, C, H, W) arrays; evaluate() and DeepLearningTask.load used to move them
    a second time and refuse them."""
    t = conv_task(channels_last=True)
    t.run(progress=False)
    own = t.splits.train
    assert own.x.shape[1:] == (3, 8, 8)
    assert t.evaluate(own.x, own.y) == t.evaluate(IMAGES, IMAGE_Y)
    assert np.array_equal(t.predict(own.x), t.predict(IMAGES))


def test_channels_last_load_takes_a_tasks_own_splits(tmp_path) -> None:  # type: ignore[no-untyped-def]
    t = conv_task(channels_last=True)
    t.run(progress=False)
    t.save(tmp_path / "c.rnb")
    back = DeepLearningTask.load(str(tmp_path / "c.rnb"), t.splits)
    assert back.splits.sample_shape == (3, 8, 8)
    assert np.array_equal(back.predict(IMAGES), t.predict(IMAGES))


@pytest.mark.parametrize("model", [seq(relu(), flatten(), fc(4)), seq(dropout(0.2), flatten(), fc(4))])
def test_element_wise_layers_before_flatten_do_not_care_about_the_channel_axis(model) -> None:  # type: ignore[no-untyped-def]
    task(model=model).data(train=(IMAGES, IMAGE_Y), batch_size=16).plan()  # no refusal


def test_batch_norm_refusal_looks_only_at_the_sizes_that_train() -> None:
    x = IMAGES.transpose(0, 3, 1, 2).copy()
    one_by_one_at_4 = seq(conv(4, 4, s=4), bn(), relu(), gap(), fc(4))  # 8x8 -> 2x2 maps, 4x4 -> 1x1
    t = task(model=one_by_one_at_4).data(train=(x, IMAGE_Y), batch_size=1)
    t.train_resolution(8, 4, boundary_epoch=5)  # 1 epoch: the 4x4 size never trains
    t.plan()
    t = task(model=one_by_one_at_4).total_epochs(2).data(train=(x, IMAGE_Y), batch_size=1)
    t.train_resolution(8, 4, boundary_epoch=1)
    with pytest.raises(ConfigError, match=r"with batch_size=1, \S+ would see one value per channel at the "
                                          r"training size \(4, 4\)"):
        t.plan()


def test_a_checkpoint_from_before_channels_last_loads_its_data_as_given(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Its spec has no channels_last: the task trained on the data as given, even data that looks
    channels-last (8 channels of 8x3 images here), and load must not refuse it now."""
    import json

    from renaissance_nb import checkpoint

    t = conv_task(channels_last=False)
    t.run(progress=False)
    path = tmp_path / "old.rnb"
    t.save(path)
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    header = json.loads(arrays[checkpoint.HEADER_KEY].tobytes())
    for key in ("channels_last", "sample_shape"):
        del header["config"][key]
    arrays[checkpoint.HEADER_KEY] = np.frombuffer(json.dumps(header, sort_keys=True).encode(), np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    back = DeepLearningTask.load(str(path), (IMAGES, IMAGE_Y))
    assert back.splits.sample_shape == (8, 8, 3)
    assert np.array_equal(back.predict(IMAGES), t.predict(IMAGES))


def test_channels_last_load_takes_own_splits_of_any_channel_count(tmp_path) -> None:  # type: ignore[no-untyped-def]
    x8 = rng.standard_normal((48, 8, 8, 8)).astype(np.float32)  # (N, H, W, C) with C = 8
    t = task(model=seq(conv(4, 3, p=1), relu(), gap(), fc(4))).data(train=(x8, IMAGE_Y), batch_size=16,
                                                                    channels_last=True)
    t.run(progress=False)
    t.save(tmp_path / "c8.rnb")
    back = DeepLearningTask.load(str(tmp_path / "c8.rnb"), t.splits)  # already (N, C, H, W)
    assert np.array_equal(back.predict(x8), t.predict(x8))


def test_cubic_channels_last_images_are_moved_by_evaluate_as_by_data() -> None:
    """(N, 6, 6, 6): the shape cannot say which axis is which, so evaluate follows the flag as data() did."""
    cube = rng.standard_normal((48, 6, 6, 6)).astype(np.float32)
    t = task(model=seq(conv(4, 3, p=1), relu(), gap(), fc(4))).data(train=(cube, IMAGE_Y), batch_size=16,
                                                                    channels_last=True)
    t.run(progress=False)
    moved = np.ascontiguousarray(cube.transpose(0, 3, 1, 2))
    assert np.array_equal(t.splits.train.x, moved)
    twin = task(model=seq(conv(4, 3, p=1), relu(), gap(), fc(4))).data(train=(moved, IMAGE_Y), batch_size=16)
    twin.run(progress=False)  # the same bytes as t (test_channels_last_true_trains_exactly_like...)
    # evaluate(cube) is the moved arrays' result, as trained; it used to take the cube unmoved
    assert t.evaluate(cube, IMAGE_Y) == twin.evaluate(moved, IMAGE_Y)


def test_the_finite_check_reads_chunks_and_skips_integers() -> None:
    from renaissance_nb.data.arrays import _all_finite, _check_x
    x = np.zeros((10, 7), np.float32)
    assert _all_finite(x, chunk=8)
    x[9, 6] = np.nan  # in the last, short chunk
    assert not _all_finite(x, chunk=8) and not _all_finite(x)
    x[9, 6], x[1, 2] = 0.0, -np.inf  # in the second
    assert not _all_finite(x, chunk=8)
    big = np.full((3, 4), 255, np.uint8)
    assert _check_x(big, "data", "train x").dtype == np.float32  # no mask at all for integer inputs


def test_val_fraction_holds_out_a_share_of_each_class() -> None:
    from renaissance_nb import ConfigError, DataError, DeepLearningTask, datasets
    d = datasets.default_mnist(val_fraction=0)
    t = DeepLearningTask().data(train=(d.train.x, d.train.y), val_fraction=0.2, batch_size=100)
    s, same = t.splits, datasets.default_mnist(val_fraction=0.2)  # the split default_mnist makes, by class
    assert (len(s.train), len(s.val)) == (4000, 1000) and (np.bincount(s.val.y) == 100).all()
    assert np.array_equal(np.sort(s.val.y), np.sort(same.val.y)) and s.name == "arrays"
    rows = {r.tobytes() for r in s.train.x}
    assert not any(r.tobytes() in rows for r in s.val.x)  # nothing in both
    again = DeepLearningTask().data(train=(d.train.x, d.train.y), val_fraction=0.2)
    assert np.array_equal(again.splits.val.x, s.val.x)  # the same split every time
    with pytest.raises(DataError, match=r"val_fraction=1.5 is invalid; expected a number in \(0, 1\)"):
        DeepLearningTask().data(train=(d.train.x, d.train.y), val_fraction=1.5)
    with pytest.raises(ConfigError, match="val_fraction= and a validation set"):
        DeepLearningTask().data(train=(d.train.x, d.train.y), val=(d.train.x, d.train.y), val_fraction=0.1)
    with pytest.raises(DataError, match=r"train=\(X, y\), val=\(Xv, yv\)"):  # a PyTorch-style pair of pairs
        DeepLearningTask().data(((d.train.x, d.train.y), (d.train.x, d.train.y)))
    two = DeepLearningTask().data(([[1.0, 2.0], [3.0, 4.0]], [0, 1]), batch_size=1)  # (X, y) of two samples
    assert len(two.splits.train) == 2
    whole = datasets.from_arrays((d.train.x, d.train.y))  # DataSplits without a validation set
    assert len(DeepLearningTask().data(whole, val_fraction=0.2).splits.val) == 1000


def test_val_fraction_keeps_every_class_in_training() -> None:
    """A class too small for the share keeps one sample in training: held out whole, it could never
    be learnt (the split is otherwise unchanged: default_mnist's held-out rows stay the same)."""
    from renaissance_nb import DataError, DeepLearningTask
    from renaissance_nb.data.arrays import stratified_split
    y = np.array([0] * 10 + [1] + [2] * 2)
    tr, va = stratified_split(y, 0.6)
    assert sorted(set(y[tr])) == [0, 1, 2] and np.bincount(y[va], minlength=3).tolist() == [6, 0, 1]
    x = np.arange(13, dtype=np.float32)[:, None]
    t = DeepLearningTask().data(train=(x, y), val_fraction=0.6, batch_size=4)
    assert np.bincount(t.splits.train.y).tolist() == [4, 1, 1]
    with pytest.raises(DataError, match="a fraction that leaves samples on both sides of 2 samples"):
        DeepLearningTask().data(train=(x[:2], np.array([0, 1])), val_fraction=0.5)

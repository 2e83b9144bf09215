"""Torch tensors as users pass them to data(), predict() and evaluate() (issue 27): a plain CPU tensor
is read as an array; one that requires grad gets the library's DataError naming the argument and the
.detach() that fixes it, not torch's RuntimeError."""
from __future__ import annotations

import numpy as np
import pytest

from renaissance_nb import DataError, DeepLearningTask, fc, seq

torch = pytest.importorskip("torch")
rng = np.random.default_rng(0)
X = rng.standard_normal((64, 20)).astype(np.float32)
Y = (X[:, 0] > 0).astype(np.int64) + (X[:, 1] > 0)


def test_plain_tensors_are_read_as_arrays() -> None:
    task = DeepLearningTask().model(seq(fc(3))).data(train=(torch.from_numpy(X), torch.from_numpy(Y)), batch_size=32)
    task.compile()
    assert np.array_equal(task.predict(torch.from_numpy(X)), task.predict(X))
    assert task.evaluate(torch.from_numpy(X), torch.from_numpy(Y)) == task.evaluate(X, Y)


def test_tensors_that_require_grad_are_data_errors_suggesting_detach() -> None:
    grad_x = torch.tensor(X, requires_grad=True)
    with pytest.raises(DataError, match=r"train X=tensor\(shape=\(64, 20\).*requires_grad=True\) is invalid.*"
                                        r"this tensor requires grad.*Fix: pass the tensor's \.detach\(\)\.cpu\(\)"):
        DeepLearningTask().data(train=(grad_x, Y), batch_size=32)
    task = DeepLearningTask().model(seq(fc(3))).data(train=(X, Y), batch_size=32).compile()
    before = task.state_dict()
    with pytest.raises(DataError, match=r"predict: x=tensor.*requires grad.*Fix: pass x\.detach\(\)\.cpu\(\)"):
        task.predict(grad_x)
    with pytest.raises(DataError, match=r"evaluate: y=tensor.*requires grad.*Fix: pass y\.detach\(\)\.cpu\(\)"):
        task.evaluate(X, torch.tensor(Y, dtype=torch.float32, requires_grad=True))
    assert np.array_equal(task.predict(grad_x.detach()), task.predict(X))  # the fix works
    assert all(np.array_equal(v, before[k]) for k, v in task.state_dict().items())


def test_predict_and_evaluate_refuse_other_sample_shapes_as_data_does() -> None:
    task = DeepLearningTask().model(seq(fc(3))).data(train=(X, Y), batch_size=32).compile()
    with pytest.raises(DataError, match=r"val X=.*expected samples of shape \(20,\) like train X"):
        DeepLearningTask().data(train=(X, Y), val=(X.reshape(64, 4, 5), Y), batch_size=32)
    for call in (lambda x: task.predict(x), lambda x: task.evaluate(x, Y), lambda x: task.predict_logits(x)):
        with pytest.raises(DataError, match=r"samples of shape \(20,\) like the training data.*x\.reshape\(-1, 20\)"):
            call(X.reshape(64, 4, 5))

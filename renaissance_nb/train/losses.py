"""Losses. Softmax cross-entropy with label smoothing and class weights, fused with top-1/top-5."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..checks import as_float
from ..errors import ConfigError, bad_argument
from .settings import LR_MAX, Settings, check_number


def _class_weights(value: Any) -> tuple[float, ...] | None:
    """``weight=``: None, or one finite weight >= 0 per class (a list, tuple, NumPy array or CPU
    tensor), not all 0. The kernels read them as float32, the dtype of torch's weight tensor."""
    if value is None:
        return None
    where = "CrossEntropyLoss"
    expected = "None, or a 1-D sequence of one weight per class, each in [0, 3.4e38] (float32), not all 0"
    fix = "pass e.g. weight=[1.0, 2.0, 1.0] (len = number of classes), or None for equal weights"
    if getattr(value, "requires_grad", False):  # torch refuses a weight that needs a gradient too
        raise bad_argument(ConfigError, where, "weight", value, "weights that need no gradient",
                           "pass weight.detach()")
    try:
        items = list(np.asarray(value, dtype=object).reshape(-1)) if np.ndim(value) == 1 else None
    except Exception:  # noqa: BLE001 - a ragged or odd object, a tensor NumPy cannot read (bfloat16)
        items = None
    if not items:
        raise bad_argument(ConfigError, where, "weight", value, expected,
                           fix + (", or weight.float() for a tensor" if hasattr(value, "float") else ""))
    out = []
    for i, v in enumerate(items):
        try:
            f = as_float(v.item() if hasattr(v, "item") else v)
        except Exception:  # noqa: BLE001 - an element that cannot be a number
            f = None
        if f is None or not 0 <= f <= LR_MAX:  # the kernels read float32 weights
            raise bad_argument(ConfigError, where, f"weight[{i}]", v, "a finite number in [0, 3.4e38] (float32)",
                               "give every class a weight >= 0 (0 ignores the class)")
        out.append(f)
    if not np.asarray(out, np.float32).any():  # 1e-46 is 0 in float32
        raise bad_argument(ConfigError, where, "weight", value, expected,
                           "give at least one class a weight above 0 (in float32, above 1.4e-45)")
    return tuple(out)


@dataclass(frozen=True, init=False, repr=False)
class CrossEntropyLoss(Settings):
    """torch.nn.CrossEntropyLoss(weight=..., label_smoothing=...) with mean reduction over the batch.

    With ``weight``, as in torch: each sample's loss is scaled by its target's weight, the smoothing
    term weighs every class, and a batch's loss is divided by the sum of its targets' weights (not
    by the batch size). Reported epoch losses average the batches' losses by batch size. One
    difference: a batch whose targets all weigh 0 has loss 0 and no gradient, where torch's 0/0 gives
    NaN (which would stop training, or make an epoch's mean NaN, for a batch with nothing to learn).
    """

    label_smoothing_: float = 0.0
    weight_: tuple[float, ...] | None = None

    def _check(self, name: str, value: Any) -> Any:
        return _class_weights(value) if name == "weight" else value

    def __post_init__(self) -> None:
        self._set("label_smoothing", check_number("CrossEntropyLoss", "label_smoothing", self.label_smoothing_,
                                                  low=0.0, high=1.0, high_open=True,
                                                  fix="use a value in [0, 1), e.g. 0.1"))

    def label_smoothing(self, value: float) -> "CrossEntropyLoss":
        return self._with("label_smoothing", value)

    def weight(self, value: Any) -> "CrossEntropyLoss":
        """One weight per class (torch's ``weight=``), e.g. inverse class frequencies; None for equal."""
        return self._with("weight", value)

    @property
    def class_weights(self) -> np.ndarray:
        """The weights as the kernels read them: float32, empty for none."""
        return np.asarray(self.weight_ or (), np.float32)

    def __repr__(self) -> str:
        """``weight`` only when set: a checkpoint compares this text, and those saved before it existed
        say nothing of it."""
        w = "" if self.weight_ is None else f", weight={list(self.weight_)!r}"
        return f"CrossEntropyLoss(label_smoothing={self.label_smoothing_!r}{w})"

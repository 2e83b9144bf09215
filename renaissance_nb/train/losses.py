"""Losses. Softmax cross-entropy with label smoothing, fused with top-1/top-5."""
from __future__ import annotations

from dataclasses import dataclass

from .settings import Settings, check_number


@dataclass(frozen=True, init=False, repr=False)
class CrossEntropyLoss(Settings):
    """torch.nn.CrossEntropyLoss(label_smoothing=...) with mean reduction over the batch."""

    label_smoothing_: float = 0.0

    def __post_init__(self) -> None:
        self._set("label_smoothing", check_number("CrossEntropyLoss", "label_smoothing", self.label_smoothing_,
                                                  low=0.0, high=1.0, high_open=True,
                                                  fix="use a value in [0, 1), e.g. 0.1"))

    def label_smoothing(self, value: float) -> "CrossEntropyLoss":
        return self._with("label_smoothing", value)

"""ReduceLROnPlateau: the one schedule a table cannot hold ahead, and the epoch-end rule that lowers it.

Why a module of its own: every other schedule is a table computed at compile time (schedulers.py);
this one starts as the constant base_lr and is then stepped at each epoch's end by the trainer
(``plateau_step``, torch's rule) with a field of that epoch's record (``PLATEAU_METRICS``, which
``metric_direction`` says how to compare; EarlyStopping watches the same fields).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import numpy as np

from renaissance_nb.checks import as_int
from renaissance_nb.errors import ConfigError, bad_argument
from renaissance_nb.train.schedule_checks import check_nonneg, check_real
from renaissance_nb.train.schedulers import Scheduler
from renaissance_nb.train.settings import LR_MAX

__all__ = ["ReduceLROnPlateau", "plateau_step", "metric_direction", "PLATEAU_METRICS"]

_S = TypeVar("_S", bound="Scheduler")


def metric_direction(field: str) -> str:
    """'min' for a loss, 'max' for a top-k: which way an EpochRecord field improves."""
    return "min" if field.endswith("_loss") else "max"


PLATEAU_METRICS = ("val_loss", "val_top1", "val_top5", "train_loss", "train_top1", "train_top5", "ema_loss",
                   "ema_top1", "ema_top5")
"""What ReduceLROnPlateau can watch: the fields of an epoch's EpochRecord."""


@dataclass(frozen=True, init=False, repr=False)
class ReduceLROnPlateau(Scheduler):
    """torch ReduceLROnPlateau, stepped at each epoch's end with the ``monitor`` field of its record (default
    the validation loss): after more than ``patience`` epochs without an improvement (by ``threshold``,
    relative or absolute), the rate becomes ``max(lr * factor, min_lr)`` from the next step on, then rests
    ``cooldown`` epochs. The table the step reads starts as the constant base_lr; the task lowers it in
    the arena, so ``task.read("lr_table")`` has the rates in force and ``lr_table()`` the plan."""

    monitor_: str = "val_loss"
    mode_: str | None = None  # None: "min" for a loss, "max" for a top-k (the monitor's direction)
    factor_: float = 0.1
    patience_: int = 10
    threshold_: float = 1e-4
    threshold_mode_: str = "rel"
    cooldown_: int = 0
    min_lr_: float = 0.0
    eps_: float = 1e-8
    _OWN: ClassVar[tuple[str, ...]] = ("monitor", "mode", "factor", "patience", "threshold", "threshold_mode",
                                       "cooldown", "min_lr", "eps")

    def monitor(self: _S, v: str) -> _S:
        """The EpochRecord field to watch: 'val_loss' (default), 'val_top1', 'train_loss', 'ema_loss'..."""
        return self._with("monitor", v)

    def mode(self: _S, v: str | None) -> _S:
        """'min' or 'max'; None (default) picks by the monitor: 'min' for a loss, 'max' for a top-k."""
        return self._with("mode", v)

    @property
    def direction(self) -> str:
        """The mode in force: ``mode``, or the monitor's own direction."""
        return self.mode_ or metric_direction(self.monitor_)

    def factor(self: _S, v: float) -> _S:
        """The multiplier of each reduction, in (0, 1)."""
        return self._with("factor", v)

    def patience(self: _S, v: int) -> _S:
        """Epochs without improvement tolerated before a reduction (>= 0)."""
        return self._with("patience", v)

    def threshold(self: _S, v: float) -> _S:
        """How much better counts as better (>= 0; relative or absolute by threshold_mode)."""
        return self._with("threshold", v)

    def threshold_mode(self: _S, v: str) -> _S:
        """'rel' (default) or 'abs'."""
        return self._with("threshold_mode", v)

    def cooldown(self: _S, v: int) -> _S:
        """Epochs after a reduction before epochs count as bad again (>= 0)."""
        return self._with("cooldown", v)

    def min_lr(self: _S, v: float) -> _S:
        """The floor of the reductions (>= 0)."""
        return self._with("min_lr", v)

    def eps(self: _S, v: float) -> _S:
        """A reduction smaller than this is skipped (>= 0)."""
        return self._with("eps", v)

    def _choice(self, name: str, v: Any, choices: tuple[str, ...]) -> str:
        if not isinstance(v, str) or v not in choices:  # an array's `in` is element-wise
            raise bad_argument(ConfigError, self._where(name), name, v, "one of " + ", ".join(map(repr, choices)),
                               f"pass {name}={choices[0]!r}")
        return str(v)

    def _check_monitor(self, v: Any) -> str:
        return self._choice("monitor", v, PLATEAU_METRICS)

    def _check_mode(self, v: Any) -> str | None:
        return None if v is None else self._choice("mode", v, ("min", "max"))

    def _check_threshold_mode(self, v: Any) -> str:
        return self._choice("threshold_mode", v, ("rel", "abs"))

    def _check_factor(self, v: Any) -> float:
        f = check_real(self._where("factor"), "factor", v, "a number in (0, 1)", "pass e.g. factor=0.1")
        if not 0 < f < 1:  # torch: factor >= 1 is an error
            raise bad_argument(ConfigError, self._where("factor"), "factor", v, "a number in (0, 1)",
                               "pass e.g. factor=0.1")
        return f

    def _check_patience(self, v: Any) -> int:
        return self._epochs_count("patience", v)

    def _check_cooldown(self, v: Any) -> int:
        return self._epochs_count("cooldown", v)

    def _epochs_count(self, name: str, v: Any) -> int:
        n = as_int(v)
        if n is None or not 0 <= n <= 2**31 - 1:
            raise bad_argument(ConfigError, self._where(name), name, v, "a whole number of epochs >= 0",
                               f"pass e.g. {name}=2")
        return n

    def _check_threshold(self, v: Any) -> float:
        return check_nonneg(self._where("threshold"), "threshold", v, "pass e.g. threshold=1e-4")

    def _check_min_lr(self, v: Any) -> float:
        return check_nonneg(self._where("min_lr"), "min_lr", v, "pass e.g. min_lr=1e-6", high=LR_MAX)

    def _check_eps(self, v: Any) -> float:
        return check_nonneg(self._where("eps"), "eps", v, "pass e.g. eps=1e-8")

    def _check_warmup(self, v: Any) -> float:
        w = super()._check_warmup(v)
        if w:  # torch's ReduceLROnPlateau is no chainable schedule either (SequentialLR refuses it)
            raise bad_argument(ConfigError, self._where("warmup"), "warmup", v,
                               "0: ReduceLROnPlateau starts at base_lr and only lowers it",
                               "drop warmup, or use a table schedule such as CosineAnnealingLR().warmup(1)")
        return w

    def _main(self, k: np.ndarray, horizon: int, spe: int, base: float) -> np.ndarray:
        return np.full(k.shape, base, dtype=np.float64)

    def initial_state(self, base_lr: float) -> dict[str, float]:
        """torch's state before the first step: the best metric so far, bad epochs, cooldown left, and the
        rate in force (float64, as torch keeps it in the param group)."""
        return {"best": math.inf if self.direction == "min" else -math.inf, "bad": 0, "cooldown": 0,
                "lr": float(base_lr)}

    def __repr__(self) -> str:
        return super().__repr__().replace(", warmup=0 epochs", "")


def plateau_step(s: ReduceLROnPlateau, state: dict[str, float], metric: float) -> dict[str, float]:
    """torch ReduceLROnPlateau.step(metric): the state after one epoch (a new dict). A NaN metric is
    never better, as in torch."""
    state = dict(state)
    best = state["best"]
    if s.direction == "min":
        better = metric < (best * (1.0 - s.threshold_) if s.threshold_mode_ == "rel" else best - s.threshold_)
    else:
        better = metric > (best * (1.0 + s.threshold_) if s.threshold_mode_ == "rel" else best + s.threshold_)
    if better:
        state["best"], state["bad"] = float(metric), 0
    else:
        state["bad"] += 1
    if state["cooldown"] > 0:
        state["cooldown"] -= 1
        state["bad"] = 0
    if state["bad"] > s.patience_:
        new = max(state["lr"] * s.factor_, s.min_lr_)
        if state["lr"] - new > s.eps_:
            state["lr"] = new
        state["cooldown"], state["bad"] = s.cooldown_, 0
    return state

"""Learning-rate schedules compiled into a float32 table ``lr[t]``, one entry per batch.

Why a table: the engine never runs Python per step; it reads ``lr[t]`` for global
step ``t`` (0-based). ``lr[0]`` is the rate before any ``scheduler.step()`` and
``lr[t]`` the rate after ``t`` steps, with PyTorch's meaning and stepping once per batch.

Conventions (all documented choices, each PyTorch-expressible):

* Durations given by the user (``warmup``, ``step_size``, ``milestones``,
  ``total_iters``) are in *epochs* and become steps as ``round(epochs * steps_per_epoch)``
  (Python's round: halves go to the even integer).
* ``warmup(W epochs)`` is ``LinearLR(start_factor=warmup_start_factor, end_factor=1.0,
  total_iters=W_steps)`` chained with the main schedule by ``SequentialLR(milestones=[W_steps])``:
  the main schedule's step count restarts at 0 when warmup ends, so milestones and
  step sizes count from the end of warmup. ``warmup_start_factor`` defaults to 0.1.
* ``ExponentialLR(gamma)`` decays by ``gamma`` per epoch, applied per step as
  ``gamma ** (1 / steps_per_epoch)`` (equal to torch ExponentialLR with that per-step gamma).
* ``OneCycleLR`` cycles the learning rate only: the optimizer's betas/momentum are compiled
  constants, so it is torch's ``OneCycleLR(..., cycle_momentum=False)``, with ``max_lr`` = base_lr.
* ``ReduceLROnPlateau`` is the one schedule a table cannot hold ahead: its table is the constant
  base_lr, and at each epoch's end the task lowers the arena's copy from the next step on
  (``plateau_step``, torch's rule fed the monitored metric of that epoch's record): see plateau.py.
* Every table is computed in float64 and cast to float32 once.
* ``base_lr`` defaults to the optimizer's ``lr``, as in PyTorch, where a scheduler scales
  the rate the optimizer was built with; ``base_lr(v)`` sets another one explicitly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import numpy as np

from renaissance_nb.checks import as_flag
from renaissance_nb.errors import ConfigError, bad_argument
from renaissance_nb.train.schedule_checks import (check_count, check_nonneg, check_positive, check_real,
                                                  check_unit_interval)
from renaissance_nb.train.settings import LR_MAX, Settings

__all__ = [
    "Scheduler",
    "CosineAnnealingLR",
    "StepLR",
    "MultiStepLR",
    "ExponentialLR",
    "ConstantLR",
    "PolynomialLR",
    "LinearLR",
    "CosineAnnealingWarmRestarts",
    "OneCycleLR",
]

_S = TypeVar("_S", bound="Scheduler")
_EPOCH_PARAMS = frozenset({"warmup", "step_size", "milestones", "total_iters", "T_0"})


# --------------------------------------------------------------------------- step counts and reprs


DEFAULT_LR = 1e-3
"""The base of a table computed on its own, without an optimizer: torch.optim.Adam's default lr."""


_STEPS_CAP = 2**62
"""Durations longer than this many steps (1e20 epochs, say) act as this: far past any training, and
still an int64 for the table's arithmetic."""


def _steps(epochs: float, steps_per_epoch: int) -> int:
    """Epochs to whole steps: ``round(epochs * steps_per_epoch)``, at most _STEPS_CAP."""
    return int(round(min(epochs * steps_per_epoch, _STEPS_CAP)))


def _fmt_num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def _fmt_epochs(v: float) -> str:
    return f"{_fmt_num(v)} epoch" + ("" if v == 1 else "s")


# --------------------------------------------------------------------------- base


@dataclass(frozen=True, init=False, repr=False)
class Scheduler(Settings):
    """Base of all schedules: ``base_lr`` plus an optional linear warmup, compiled by :meth:`table`.

    Immutable builder: every setter returns a new object; the constructor (Settings')
    accepts the same names as keyword arguments, e.g. ``CosineAnnealingLR(base_lr=0.1, warmup=1)``.
    """

    base_lr_: float | None = None  # None: the optimizer's lr (table(..., lr=))
    warmup_: float = 0.0
    warmup_start_factor_: float = 0.1

    _OWN: ClassVar[tuple[str, ...]] = ()  # class-specific setting names, in repr order

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        return ("base_lr", *cls._OWN, "warmup", "warmup_start_factor")

    def _where(self, name: str) -> str:
        return f"{type(self).__name__}.{name}"

    def _check(self, name: str, value: Any) -> Any:
        return getattr(self, "_check_" + name)(value)

    # ---- setters (return a new object)
    def base_lr(self: _S, v: float) -> _S:
        """The learning rate the schedule scales (>= 0); by default the optimizer's lr."""
        return self._with("base_lr", v)

    def warmup(self: _S, epochs: float) -> _S:
        """Linear warmup length in epochs (0 = none)."""
        return self._with("warmup", epochs)

    def warmup_start_factor(self: _S, v: float) -> _S:
        """Warmup starts at ``base_lr * v`` (LinearLR's start_factor, in (0, 1])."""
        return self._with("warmup_start_factor", v)

    # ---- validators
    def _check_base_lr(self, v: Any) -> float | None:
        if v is None:
            return None
        return check_nonneg(self._where("base_lr"), "base_lr", v, "pass a learning rate such as 1e-3", high=LR_MAX)

    def _check_warmup(self, v: Any) -> float:
        return check_nonneg(self._where("warmup"), "warmup", v, "pass the warmup length in epochs, e.g. 1, or 0 for none")

    def _check_warmup_start_factor(self, v: Any) -> float:
        return check_unit_interval(self._where("warmup_start_factor"), "warmup_start_factor", v, True,
                              "pass a fraction of base_lr such as 0.1")

    # ---- compilation
    def warmup_steps(self, steps_per_epoch: int) -> int:
        """Warmup length in steps: ``round(warmup * steps_per_epoch)``."""
        return _steps(self.warmup_, steps_per_epoch)

    def table(self, steps_per_epoch: int, total_epochs: int, lr: float = DEFAULT_LR) -> np.ndarray:
        """The float32 learning rate of every step, shape ``(steps_per_epoch * total_epochs,)``;
        ``lr`` is the optimizer's, the base when ``base_lr`` is not set."""
        if self.base_lr_ is None:
            return self._with("base_lr", lr).table(steps_per_epoch, total_epochs)
        base = self.base_lr_
        spe = check_count(f"{type(self).__name__}.table", "steps_per_epoch", steps_per_epoch,
                     "pass the number of batches per epoch (>= 1)")
        epochs = check_count(f"{type(self).__name__}.table", "total_epochs", total_epochs,
                        "pass the number of training epochs (>= 1)")
        total = spe * epochs
        w = self.warmup_steps(spe)
        if w >= total:
            raise bad_argument(ConfigError, self._where("warmup"), "warmup", self.warmup_,
                               f"fewer than {total} steps ({epochs} epochs of {spe} steps); "
                               f"it is {w} steps: " + ("warmup as long as training, which would never reach "
                                                       "the base rate" if w == total else "warmup longer than training"),
                               "shorten the warmup or train for more epochs")
        lrs = np.empty(total, dtype=np.float64)
        if w:
            f = self.warmup_start_factor_
            lrs[:w] = base * (f + (1.0 - f) * np.arange(w, dtype=np.float64) / w)
        lrs[w:] = self._main(np.arange(total - w, dtype=np.int64), total - w, spe, base)
        big = np.flatnonzero(~(np.abs(lrs) <= LR_MAX))
        if big.size:  # e.g. ExponentialLR(gamma=2) over 200 steps
            k = int(big[0])
            raise ConfigError(f"{type(self).__name__}: the schedule reaches lr={lrs[k]:.3g} at step {k + 1} "
                              f"of {total}, past float32 (the step reads a float32 table). Fix: a smaller base_lr or "
                              "gamma, or fewer epochs.")
        return lrs.astype(np.float32)

    def _main(self, k: np.ndarray, horizon: int, spe: int, base: float) -> np.ndarray:
        """float64 lr at main-schedule steps ``k`` (0 = end of warmup); ``horizon`` steps in all;
        ``base`` is base_lr_, which table() has set."""
        raise NotImplementedError

    def __repr__(self) -> str:
        parts = []
        for name, value in self.settings().items():
            if name == "warmup_start_factor" and (self.warmup_ == 0 or value == 0.1):
                continue
            if name == "base_lr" and value is None:  # the optimizer's lr: the task shows it beside
                continue
            if value is None:
                text = "whole training" if name == "total_iters" else "None"
            elif name == "milestones":
                text = "[" + ", ".join(_fmt_num(m) for m in value) + "] epochs"
            elif name in _EPOCH_PARAMS:
                text = _fmt_epochs(value)
            else:
                text = repr(value)
            parts.append(f"{name}={text}")
        return f"{type(self).__name__}({', '.join(parts)})"


# --------------------------------------------------------------------------- schedules


@dataclass(frozen=True, init=False, repr=False)
class CosineAnnealingLR(Scheduler):
    """torch CosineAnnealingLR with ``T_max`` = the steps after warmup, decaying to ``eta_min``."""

    eta_min_: float = 0.0
    _OWN: ClassVar[tuple[str, ...]] = ("eta_min",)

    def eta_min(self: _S, v: float) -> _S:
        """The floor the cosine reaches at the end of training (>= 0)."""
        return self._with("eta_min", v)

    def _check_eta_min(self, v: Any) -> float:
        return check_nonneg(self._where("eta_min"), "eta_min", v, "pass a minimum learning rate such as 0.0")

    def _main(self, k: np.ndarray, horizon: int, spe: int, base: float) -> np.ndarray:
        return self.eta_min_ + (base - self.eta_min_) * (1.0 + np.cos(np.pi * k / horizon)) / 2.0


@dataclass(frozen=True, init=False, repr=False)
class StepLR(Scheduler):
    """torch StepLR: multiply by ``gamma`` every ``step_size`` epochs (counted after warmup)."""

    step_size_: float = 30.0
    gamma_: float = 0.1
    _OWN: ClassVar[tuple[str, ...]] = ("step_size", "gamma")

    def step_size(self: _S, epochs: float) -> _S:
        """Epochs between decays (> 0)."""
        return self._with("step_size", epochs)

    def gamma(self: _S, v: float) -> _S:
        """Multiplicative decay factor (> 0)."""
        return self._with("gamma", v)

    def _check_step_size(self, v: Any) -> float:
        return check_positive(self._where("step_size"), "step_size", v, "pass the decay period in epochs, e.g. 30")

    def _check_gamma(self, v: Any) -> float:
        return check_positive(self._where("gamma"), "gamma", v, "pass a decay factor such as 0.1")

    def _main(self, k: np.ndarray, horizon: int, spe: int, base: float) -> np.ndarray:
        size = _steps(self.step_size_, spe)
        if size < 1:
            raise bad_argument(ConfigError, self._where("step_size"), "step_size", self.step_size_,
                               f"at least one step ({spe} steps per epoch)", "use a longer step_size")
        return base * self.gamma_ ** (k // size).astype(np.float64)


@dataclass(frozen=True, init=False, repr=False)
class MultiStepLR(Scheduler):
    """torch MultiStepLR: multiply by ``gamma`` at each milestone (epochs, counted after warmup)."""

    milestones_: tuple[float, ...] = ()
    gamma_: float = 0.1
    _OWN: ClassVar[tuple[str, ...]] = ("milestones", "gamma")

    def milestones(self: _S, epochs: Any) -> _S:
        """Strictly increasing epochs (> 0) at which the rate is multiplied by gamma."""
        return self._with("milestones", epochs)

    def gamma(self: _S, v: float) -> _S:
        """Multiplicative decay factor (> 0)."""
        return self._with("gamma", v)

    def _check_milestones(self, v: Any) -> tuple[float, ...]:
        where, fix = self._where("milestones"), "pass increasing epochs such as [30, 60]"
        expected = "a non-empty, strictly increasing sequence of epochs > 0"
        try:
            items = tuple(v)
        except TypeError:
            raise bad_argument(ConfigError, where, "milestones", v, expected, fix) from None
        out = tuple(check_positive(where, "milestones", m, fix) for m in items)
        if not out or any(b <= a for a, b in zip(out, out[1:])):
            raise bad_argument(ConfigError, where, "milestones", v, expected, fix)
        return out

    def _check_gamma(self, v: Any) -> float:
        return check_positive(self._where("gamma"), "gamma", v, "pass a decay factor such as 0.1")

    def _main(self, k: np.ndarray, horizon: int, spe: int, base: float) -> np.ndarray:
        if not self.milestones_:
            raise bad_argument(ConfigError, self._where("milestones"), "milestones", self.milestones_,
                               "at least one milestone", "call .milestones([30, 60]) or use ConstantLR")
        steps = [_steps(m, spe) for m in self.milestones_]
        passed = np.searchsorted(steps, k, side="right").astype(np.float64)  # = bisect_right
        return base * self.gamma_**passed


@dataclass(frozen=True, init=False, repr=False)
class ExponentialLR(Scheduler):
    """torch ExponentialLR with ``gamma`` per epoch, applied per step as ``gamma ** (1/steps_per_epoch)``."""

    gamma_: float = 0.95
    _OWN: ClassVar[tuple[str, ...]] = ("gamma",)

    def gamma(self: _S, v: float) -> _S:
        """Decay factor per epoch (> 0)."""
        return self._with("gamma", v)

    def _check_gamma(self, v: Any) -> float:
        return check_positive(self._where("gamma"), "gamma", v, "pass a per-epoch decay factor such as 0.95")

    def _main(self, k: np.ndarray, horizon: int, spe: int, base: float) -> np.ndarray:
        return base * (self.gamma_ ** (1.0 / spe)) ** k.astype(np.float64)


@dataclass(frozen=True, init=False, repr=False)
class ConstantLR(Scheduler):
    """torch ConstantLR: ``base_lr * factor`` for ``total_iters`` epochs (after warmup), then ``base_lr``."""

    factor_: float = 1.0 / 3.0
    total_iters_: float = 5.0
    _OWN: ClassVar[tuple[str, ...]] = ("factor", "total_iters")

    def factor(self: _S, v: float) -> _S:
        """The constant multiplier, in [0, 1]."""
        return self._with("factor", v)

    def total_iters(self: _S, epochs: float) -> _S:
        """How many epochs the factor applies (> 0)."""
        return self._with("total_iters", epochs)

    def _check_factor(self, v: Any) -> float:
        return check_unit_interval(self._where("factor"), "factor", v, False, "pass a multiplier such as 1/3")

    def _check_total_iters(self, v: Any) -> float:
        # > 0: torch's ConstantLR(total_iters=0) keeps the factor forever in its chainable form
        # but not in its closed form, so 0 has no single PyTorch meaning.
        return check_positive(self._where("total_iters"), "total_iters", v, "pass a duration in epochs such as 5")

    def _main(self, k: np.ndarray, horizon: int, spe: int, base: float) -> np.ndarray:
        n = _steps(self.total_iters_, spe)
        if n < 1:
            raise bad_argument(ConfigError, self._where("total_iters"), "total_iters", self.total_iters_,
                               f"at least one step ({spe} steps per epoch)", "use a longer total_iters")
        return base * np.where(k < n, self.factor_, 1.0)


@dataclass(frozen=True, init=False, repr=False)
class PolynomialLR(Scheduler):
    """torch PolynomialLR: ``base_lr * (1 - min(k, N)/N) ** power``; N defaults to all steps after warmup."""

    total_iters_: float | None = None
    power_: float = 1.0
    _OWN: ClassVar[tuple[str, ...]] = ("total_iters", "power")

    def total_iters(self: _S, epochs: float | None) -> _S:
        """Decay length in epochs (> 0), or None for the whole training after warmup."""
        return self._with("total_iters", epochs)

    def power(self: _S, v: float) -> _S:
        """The polynomial exponent (>= 0)."""
        return self._with("power", v)

    def _check_total_iters(self, v: Any) -> float | None:
        if v is None:
            return None
        return check_positive(self._where("total_iters"), "total_iters", v, "pass epochs such as 10, or None")

    def _check_power(self, v: Any) -> float:
        return check_nonneg(self._where("power"), "power", v, "pass an exponent such as 1.0")

    def _main(self, k: np.ndarray, horizon: int, spe: int, base: float) -> np.ndarray:
        n = horizon if self.total_iters_ is None else _steps(self.total_iters_, spe)
        if n < 1:
            raise bad_argument(ConfigError, self._where("total_iters"), "total_iters", self.total_iters_,
                               f"at least one step ({spe} steps per epoch)", "use a longer total_iters")
        return base * (1.0 - np.minimum(k, n) / n) ** self.power_


def _whole_steps(where: str, name: str, epochs: float, spe: int, fix: str) -> int:
    """``round(epochs * spe)``, refused when it rounds to no step at all."""
    n = _steps(epochs, spe)
    if n < 1:
        raise bad_argument(ConfigError, where, name, epochs, f"at least one step ({spe} steps per epoch)", fix)
    return n


@dataclass(frozen=True, init=False, repr=False)
class LinearLR(Scheduler):
    """torch LinearLR: the factor moves linearly from ``start_factor`` to ``end_factor`` over
    ``total_iters`` epochs (after warmup), then stays at ``end_factor``."""

    start_factor_: float = 1.0 / 3.0
    end_factor_: float = 1.0
    total_iters_: float = 5.0
    _OWN: ClassVar[tuple[str, ...]] = ("start_factor", "end_factor", "total_iters")

    def start_factor(self: _S, v: float) -> _S:
        """The first step's multiplier, in (0, 1] (torch's bounds)."""
        return self._with("start_factor", v)

    def end_factor(self: _S, v: float) -> _S:
        """The multiplier after ``total_iters`` epochs, in [0, 1]; 0 decays linearly to zero."""
        return self._with("end_factor", v)

    def total_iters(self: _S, epochs: float) -> _S:
        """How many epochs the factor takes to move (> 0)."""
        return self._with("total_iters", epochs)

    def _check_start_factor(self, v: Any) -> float:
        return check_unit_interval(self._where("start_factor"), "start_factor", v, True, "pass a multiplier such as 1/3")

    def _check_end_factor(self, v: Any) -> float:
        return check_unit_interval(self._where("end_factor"), "end_factor", v, False, "pass a multiplier such as 1.0 or 0")

    def _check_total_iters(self, v: Any) -> float:
        return check_positive(self._where("total_iters"), "total_iters", v, "pass a duration in epochs such as 5")

    def _main(self, k: np.ndarray, horizon: int, spe: int, base: float) -> np.ndarray:
        n = _whole_steps(self._where("total_iters"), "total_iters", self.total_iters_, spe, "use a longer total_iters")
        s, e = self.start_factor_, self.end_factor_
        return base * (s + (e - s) * np.minimum(k, n) / n)


@dataclass(frozen=True, init=False, repr=False)
class CosineAnnealingWarmRestarts(Scheduler):
    """torch CosineAnnealingWarmRestarts (SGDR): a cosine from base_lr down to ``eta_min`` over ``T_0``
    epochs, restarted at base_lr, each cycle ``T_mult`` times longer than the last."""

    T_0_: float = 1.0
    T_mult_: int = 1
    eta_min_: float = 0.0
    _OWN: ClassVar[tuple[str, ...]] = ("T_0", "T_mult", "eta_min")

    def T_0(self: _S, epochs: float) -> _S:  # noqa: N802 (torch's name)
        """The first cycle's length in epochs (> 0)."""
        return self._with("T_0", epochs)

    def T_mult(self: _S, v: int) -> _S:  # noqa: N802 (torch's name)
        """Each cycle is ``T_mult`` times the one before (an integer >= 1, as in torch)."""
        return self._with("T_mult", v)

    def eta_min(self: _S, v: float) -> _S:
        """The floor each cosine reaches (>= 0)."""
        return self._with("eta_min", v)

    def _check_T_0(self, v: Any) -> float:  # noqa: N802
        return check_positive(self._where("T_0"), "T_0", v, "pass the first cycle's length in epochs, e.g. 10")

    def _check_T_mult(self, v: Any) -> int:  # noqa: N802
        n = check_count(self._where("T_mult"), "T_mult", v, "pass an integer factor such as 1 or 2")
        if n > 2**31 - 1:  # cycle lengths are step counts
            raise bad_argument(ConfigError, self._where("T_mult"), "T_mult", v, "an integer in [1, 2**31)",
                               "pass an integer factor such as 1 or 2")
        return n

    def _check_eta_min(self, v: Any) -> float:
        return check_nonneg(self._where("eta_min"), "eta_min", v, "pass a minimum learning rate such as 0.0")

    def _main(self, k: np.ndarray, horizon: int, spe: int, base: float) -> np.ndarray:
        t0 = _whole_steps(self._where("T_0"), "T_0", self.T_0_, spe, "use a longer T_0")
        starts, length = [0], [t0]  # cycle i starts at starts[i] and lasts length[i] steps
        while starts[-1] + length[-1] < horizon:
            starts.append(starts[-1] + length[-1])
            length.append(length[-1] * self.T_mult_)
        i = np.searchsorted(starts, k, side="right") - 1
        t_cur = (k - np.asarray(starts)[i]).astype(np.float64)
        t_i = np.asarray(length, dtype=np.float64)[i]
        return self.eta_min_ + (base - self.eta_min_) * (1.0 + np.cos(np.pi * t_cur / t_i)) / 2.0


_ANNEAL = ("cos", "linear")


@dataclass(frozen=True, init=False, repr=False)
class OneCycleLR(Scheduler):
    """torch OneCycleLR with ``max_lr`` = base_lr and ``total_steps`` = all training steps: up from
    ``max_lr / div_factor`` for ``pct_start`` of the steps, then down to that over ``final_div_factor``
    (``three_phase``: back to the start first, then down). The learning rate only: the optimizer's
    betas/momentum are compiled constants, so it is torch's ``cycle_momentum=False``."""

    pct_start_: float = 0.3
    anneal_strategy_: str = "cos"
    div_factor_: float = 25.0
    final_div_factor_: float = 1e4
    three_phase_: bool = False
    cycle_momentum_: bool = False
    _OWN: ClassVar[tuple[str, ...]] = ("pct_start", "anneal_strategy", "div_factor", "final_div_factor",
                                       "three_phase", "cycle_momentum")

    def pct_start(self: _S, v: float) -> _S:
        """The share of the steps spent rising to max_lr, in (0, 1)."""
        return self._with("pct_start", v)

    def anneal_strategy(self: _S, v: str) -> _S:
        """'cos' (default) or 'linear'."""
        return self._with("anneal_strategy", v)

    def div_factor(self: _S, v: float) -> _S:
        """The first lr is max_lr / div_factor (> 0)."""
        return self._with("div_factor", v)

    def final_div_factor(self: _S, v: float) -> _S:
        """The last lr is the first lr / final_div_factor (> 0)."""
        return self._with("final_div_factor", v)

    def three_phase(self: _S, v: bool = True) -> _S:
        """Fall back to the first lr before the final decay, as torch's ``three_phase=True``."""
        return self._with("three_phase", v)

    def cycle_momentum(self: _S, v: bool) -> _S:
        """Only False: the optimizer's momentum is compiled into the step (see the class docstring)."""
        return self._with("cycle_momentum", v)

    def _check_warmup(self, v: Any) -> float:
        w = super()._check_warmup(v)
        if w:
            raise bad_argument(ConfigError, self._where("warmup"), "warmup", v,
                               "0: OneCycleLR rises from max_lr / div_factor itself",
                               "drop warmup and set pct_start, the share of the steps spent rising")
        return w

    def _check_pct_start(self, v: Any) -> float:
        where, fix = self._where("pct_start"), "pass a share of the steps such as 0.3"
        f = check_real(where, "pct_start", v, "a number in (0, 1)", fix)
        if not 0 < f < 1:
            raise bad_argument(ConfigError, where, "pct_start", v, "a number in (0, 1)", fix)
        return f

    def _check_anneal_strategy(self, v: Any) -> str:
        if not isinstance(v, str) or v not in _ANNEAL:
            raise bad_argument(ConfigError, self._where("anneal_strategy"), "anneal_strategy", v,
                               "'cos' or 'linear'", "pass anneal_strategy='cos'")
        return str(v)

    def _check_div_factor(self, v: Any) -> float:
        return check_positive(self._where("div_factor"), "div_factor", v, "pass a divisor such as 25")

    def _check_final_div_factor(self, v: Any) -> float:
        return check_positive(self._where("final_div_factor"), "final_div_factor", v, "pass a divisor such as 1e4")

    def _check_three_phase(self, v: Any) -> bool:
        return as_flag(v, self._where("three_phase"), "three_phase", ConfigError, "pass three_phase=True")

    def _check_cycle_momentum(self, v: Any) -> bool:
        if v is not False and v is not np.False_:
            raise bad_argument(ConfigError, self._where("cycle_momentum"), "cycle_momentum", v,
                               "False: the optimizer's betas/momentum are constants of the compiled step",
                               "drop cycle_momentum (the lr still cycles), or set the optimizer's betas "
                               "or momentum to the value you want throughout")
        return False

    def _main(self, k: np.ndarray, horizon: int, spe: int, base: float) -> np.ndarray:
        first = base / self.div_factor_
        last = first / self.final_div_factor_
        rise = self.pct_start_ * horizon - 1.0  # torch's phase ends, in steps (floats, as torch keeps them)
        ends = [rise, 2.0 * self.pct_start_ * horizon - 2.0, horizon - 1.0] if self.three_phase_ \
            else [rise, horizon - 1.0]
        lrs = [first, base, first, last] if self.three_phase_ else [first, base, last]
        phase = np.full(k.shape, len(ends) - 1)  # torch's loop: the first phase with k <= its end, else the last
        for i in reversed(range(len(ends) - 1)):
            phase = np.where(k <= ends[i], i, phase)
        s0, e0 = np.asarray([0.0, *ends[:-1]])[phase], np.asarray(ends)[phase]
        if np.any(e0 == s0):  # torch: ZeroDivisionError
            raise bad_argument(ConfigError, self._where("pct_start"), "pct_start", self.pct_start_,
                               f"a share that leaves no phase of zero length over the {horizon} steps after warmup",
                               "change pct_start a little, or train for more steps")
        pct = (k - s0) / (e0 - s0)
        a, b = np.asarray(lrs[:-1])[phase], np.asarray(lrs[1:])[phase]
        if self.anneal_strategy_ == "cos":
            return b + (a - b) / 2.0 * (np.cos(np.pi * pct) + 1.0)
        return (b - a) * pct + a

    def __repr__(self) -> str:
        return super().__repr__().replace(", cycle_momentum=False", "").replace(", warmup=0 epochs", "")

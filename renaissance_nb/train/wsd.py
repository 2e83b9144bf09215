"""Warmup-stable-decay (WSD): warm up, hold base_lr, then decay over the last share of training.

Why a module of its own: schedulers.py holds PyTorch's schedules (each checked against torch) and is
near the 600-line limit; WSD has no torch class, so its reference is its formula, stated here.

WSD (MiniCPM, Hu et al. 2024; Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training Beyond
Fixed Training Durations") keeps the rate constant for most of training and anneals only at the end:
a run can be extended from its stable phase, and the cooldown alone brings the gain cosine gives.

Over ``T = steps_per_epoch * total_epochs`` steps, with ``W`` warmup steps (the base class's
``warmup``) and ``D = round(decay_fraction * T)`` decay steps (Python's round, as every duration here):

* steps ``[0, W)``: the base class's linear warmup from ``base_lr * warmup_start_factor``;
* steps ``[W, T - D)``: ``base_lr`` (the stable phase; empty when the decay takes every step after warmup);
* steps ``[T - D, T)``: ``eta_min + (base_lr - eta_min) * f(p)`` with ``p = (t - (T - D)) / D`` in
  ``[0, 1)``, and ``f`` = ``1 - p`` ('linear'), ``(1 + cos(pi p)) / 2`` ('cosine') or
  ``1 - sqrt(p)`` ('sqrt', Hägele et al.'s 1-sqrt).

The decay's first step is at base_lr and its last one step short of eta_min: ``eta_min`` is reached at
step ``T``, after training, as CosineAnnealingLR reaches its eta_min at ``T_max`` (and as the
``get_wsd_schedule`` of Hugging Face transformers counts its decay).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import numpy as np

from renaissance_nb.errors import ConfigError, bad_argument
from renaissance_nb.train.schedule_checks import check_nonneg, check_unit_interval
from renaissance_nb.train.schedulers import Scheduler

__all__ = ["WarmupStableDecayLR", "DECAY_SHAPES"]

_S = TypeVar("_S", bound="Scheduler")

DECAY_SHAPES = ("linear", "cosine", "sqrt")
"""The decay phase's shapes: f(p) = 1 - p, (1 + cos(pi p)) / 2, 1 - sqrt(p) for p from 0 to 1."""


def decay_factor(shape: str, p: np.ndarray) -> np.ndarray:
    """``f(p)`` of the decay ``shape`` (one of DECAY_SHAPES) at progress ``p`` in [0, 1], float64."""
    if shape == "linear":
        return 1.0 - p
    if shape == "cosine":
        return (1.0 + np.cos(np.pi * p)) / 2.0
    return 1.0 - np.sqrt(p)


@dataclass(frozen=True, init=False, repr=False)
class WarmupStableDecayLR(Scheduler):
    """WSD: linear warmup (``warmup`` epochs), ``base_lr`` held, then a decay to ``eta_min`` over the
    last ``decay_fraction`` of all training steps (see the module docstring for the formula).

    Defaults follow Hägele et al. 2024: a 20% cooldown (``decay_fraction=0.2``), which they find matches
    a cosine schedule of the same length (shorter ones, such as MiniCPM's 10%, fall a little short), and
    the 1-sqrt shape (``decay_shape='sqrt'``), which beats linear at the same cooldown length in their runs.
    ``eta_min`` (PyTorch's name for the floor, as in CosineAnnealingLR) defaults to 0.
    """

    decay_fraction_: float = 0.2
    decay_shape_: str = "sqrt"
    eta_min_: float = 0.0
    _OWN: ClassVar[tuple[str, ...]] = ("decay_fraction", "decay_shape", "eta_min")

    # ---- setters (return a new object)
    def decay_fraction(self: _S, v: float) -> _S:
        """The share of *all* training steps (warmup included) spent decaying, in (0, 1]; a share
        rather than epochs, as in the WSD papers, so one schedule fits any ``total_epochs``."""
        return self._with("decay_fraction", v)

    def decay_shape(self: _S, v: str) -> _S:
        """'linear', 'cosine' or 'sqrt' (1 - sqrt(p), Hägele et al. 2024)."""
        return self._with("decay_shape", v)

    def eta_min(self: _S, v: float) -> _S:
        """The floor the decay heads for (>= 0, at most base_lr), reached one step after training."""
        return self._with("eta_min", v)

    # ---- validators
    def _check_decay_fraction(self, v: Any) -> float:
        return check_unit_interval(self._where("decay_fraction"), "decay_fraction", v, True,
                                   "pass the share of training spent decaying, e.g. 0.2")

    def _check_decay_shape(self, v: Any) -> str:
        if not isinstance(v, str) or v not in DECAY_SHAPES:
            hint = " ('sqrt' is the 1-sqrt shape)" if isinstance(v, str) and "sqrt" in v else ""
            raise bad_argument(ConfigError, self._where("decay_shape"), "decay_shape", v,
                               "'linear', 'cosine' or 'sqrt'" + hint, "pass decay_shape='sqrt', 'linear' or 'cosine'")
        return str(v)

    def _check_eta_min(self, v: Any) -> float:
        return check_nonneg(self._where("eta_min"), "eta_min", v, "pass a minimum learning rate such as 0.0")

    def __post_init__(self) -> None:
        super().__post_init__()
        base = self.base_lr_
        if base is not None and self.eta_min_ > base:  # a "decay" that rises is a mix-up of the two rates
            raise bad_argument(ConfigError, self._where("eta_min"), "eta_min", self.eta_min_,
                               f"at most base_lr ({base!r}): the decay goes down from base_lr to eta_min",
                               "lower eta_min, or raise base_lr (or the optimizer's lr when base_lr is not set)")

    # ---- compilation
    def decay_steps(self, steps_per_epoch: int, total_epochs: int) -> int:
        """The decay's length in steps: ``round(decay_fraction * steps_per_epoch * total_epochs)``."""
        return int(round(self.decay_fraction_ * (steps_per_epoch * total_epochs)))

    def _main(self, k: np.ndarray, horizon: int, spe: int, base: float) -> np.ndarray:
        w = self.warmup_steps(spe)
        total = horizon + w  # table() makes it steps_per_epoch * total_epochs
        d = self.decay_steps(spe, total // spe)
        where = self._where("decay_fraction")
        if d < 1:
            raise bad_argument(ConfigError, where, "decay_fraction", self.decay_fraction_,
                               f"a share that is at least one of the {total} training steps",
                               "raise decay_fraction or train for more steps")
        if d > horizon:
            raise bad_argument(ConfigError, where, "decay_fraction", self.decay_fraction_,
                               f"at most the {horizon} steps left after the warmup's {w} of {total}; it is {d} steps: "
                               "the decay would overlap the warmup",
                               "lower decay_fraction or shorten the warmup")
        start = horizon - d  # the main schedule's step where the decay begins
        p = np.maximum(k - start, 0).astype(np.float64) / d
        return np.where(k < start, base, self.eta_min_ + (base - self.eta_min_) * decay_factor(self.decay_shape_, p))

"""TrainingResult: the per-epoch history of a run and its best epoch."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class EpochRecord:
    """Metrics of one epoch (top-k as fractions in [0, 1]). ``lr`` is the rate of the epoch's last
    step, ``seconds`` its wall time (validation included), ``steps`` the plan's count of finished
    updates at its end (a running total: the epoch's own are ``steps`` less the previous record's; an
    epoch started over after a stop inside it counts from its own start again, as its schedule does)."""

    epoch: int
    train_loss: float
    train_top1: float
    train_top5: float
    val_loss: float | None
    val_top1: float | None
    val_top5: float | None
    lr: float
    seconds: float
    steps: int
    ema_loss: float | None = None
    ema_top1: float | None = None
    ema_top5: float | None = None
    first_step_seconds: float = 0.0  # a run's first step, in its first epoch: it compiles or loads the kernels
    # (part of ``seconds``; 0.0 in every other epoch), so a view can tell step time from compile time
    tokens: bool = False  # a language model's epoch: losses are per token, and perplexity is what one reads

    @property
    def train_ppl(self) -> float:
        """Perplexity, exp of the mean per-token loss: the number of equally likely next tokens the
        model is as unsure as (a language model's usual figure; meaningful for token data)."""
        return _perplexity(self.train_loss)

    @property
    def val_ppl(self) -> float | None:
        return None if self.val_loss is None else _perplexity(self.val_loss)

    def __post_init__(self) -> None:
        for f in ("train_loss", "train_top1", "train_top5", "val_loss", "val_top1", "val_top5", "lr", "seconds",
                  "ema_loss", "ema_top1", "ema_top5", "first_step_seconds"):
            v = getattr(self, f)
            if v is not None:
                object.__setattr__(self, f, float(v))

    def line(self) -> str:
        if self.tokens:
            return self._token_line()
        val = "" if self.val_loss is None else (
            f"  val loss {self.val_loss:.4f} top1 {100 * self.val_top1:6.2f}% top5 {100 * self.val_top5:6.2f}%")
        ema = "" if self.ema_top1 is None else f"  ema top1 {100 * self.ema_top1:6.2f}%"
        first = ("" if self.first_step_seconds < FIRST_STEP_SHOWN_S else
                 f"  (first step {self.first_step_seconds:.1f}s: kernels compiled or loaded)")
        return (f"epoch {self.epoch:>3}  train loss {self.train_loss:.4f} top1 {100 * self.train_top1:6.2f}%"
                f"{val}{ema}  lr {self.lr:.2e}  {self.seconds:6.2f}s{first}")


    def _token_line(self) -> str:
        """A language model's epoch: loss per token, perplexity, next-token accuracy."""
        val = "" if self.val_loss is None else (
            f"  val loss {self.val_loss:.4f} ppl {self.val_ppl:8.2f} acc {100 * self.val_top1:6.2f}%")
        first = ("" if self.first_step_seconds < FIRST_STEP_SHOWN_S else
                 f"  (first step {self.first_step_seconds:.1f}s: kernels compiled or loaded)")
        return (f"epoch {self.epoch:>3}  train loss {self.train_loss:.4f} ppl {self.train_ppl:8.2f} acc "
                f"{100 * self.train_top1:6.2f}%{val}  lr {self.lr:.2e}  {self.seconds:6.2f}s{first}")


def _perplexity(loss: float) -> float:
    return float(np.exp(min(loss, 700.0))) if loss == loss else float("nan")


FIRST_STEP_SHOWN_S = 0.5
"""A run's first step longer than this is told apart in its epoch's line: numba compiled the kernels
(seconds, after an install) or loaded them from its cache; a step itself takes milliseconds."""


@dataclass
class TrainingResult:
    """What run() returns: history per epoch, the best validation epoch, per-step losses.

    ``step_losses`` holds one training loss per finished update, in order. Under
    ``options(nan_policy="skip")`` a skipped batch is no update: its loss is not kept there (the
    next update's takes its place), while the epoch's ``train_loss`` averages every batch run,
    skipped ones included: NaN when a skipped batch's loss was not finite (a batch skipped for a
    non-finite gradient alone can have a finite loss)."""

    history: list[EpochRecord] = field(default_factory=list)
    step_losses: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    interrupted: bool = False
    stopped: str | None = None  # why a callback ended the run early (StopTraining), e.g. EarlyStopping

    @property
    def _best(self) -> EpochRecord | None:
        """The epoch with the highest validation top-1 (train top-1 without val data); the earliest on a tie.
        Its top-5 is reported beside it: the best top-1 and the best top-5 of two epochs are no model."""
        if self.history and self.history[0].tokens:  # a language model: the lowest loss (perplexity) is best
            scored = [(-(r.val_loss if r.val_loss is not None else r.train_loss), -r.epoch, r) for r in self.history]
        else:
            scored = [(r.val_top1 if r.val_top1 is not None else r.train_top1, -r.epoch, r) for r in self.history]
        scored = [t for t in scored if t[0] == t[0]]  # a NaN loss is never best
        return max(scored, key=lambda t: t[:2])[2] if scored else None

    def best_by(self, field: str, mode: str) -> int:
        """The epoch whose record's ``field`` is lowest (``mode`` 'min') or highest ('max'), the earliest
        on a tie; NaN and missing values are never best; -1 when no record has one."""
        sign = -1.0 if mode == "min" else 1.0
        scored = [(sign * v, -r.epoch) for r in self.history
                  if (v := getattr(r, field)) is not None and v == v]
        return -max(scored)[1] if scored else -1

    @property
    def best_epoch(self) -> int:
        b = self._best
        return b.epoch if b else -1

    @property
    def best_top1(self) -> float:
        b = self._best
        return (b.val_top1 if b.val_top1 is not None else b.train_top1) if b else 0.0

    @property
    def best_top5(self) -> float:
        """Top-5 of the best epoch (not the highest top-5 of any epoch)."""
        b = self._best
        return (b.val_top5 if b.val_top5 is not None else b.train_top5) if b else 0.0

    @property
    def _best_ema(self) -> EpochRecord | None:
        scored = [(r.ema_top1, -r.epoch, r) for r in self.history if r.ema_top1 is not None]
        return max(scored, key=lambda t: t[:2])[2] if scored else None

    @property
    def best_ema_epoch(self) -> int:
        b = self._best_ema
        return b.epoch if b else -1

    @property
    def best_ema_top1(self) -> float | None:
        b = self._best_ema
        return b.ema_top1 if b else None

    @property
    def best_ema_top5(self) -> float | None:
        """EMA top-5 of the best EMA epoch."""
        b = self._best_ema
        return b.ema_top5 if b else None

    def as_rows(self) -> list[dict[str, float | int | None]]:
        return [r.__dict__.copy() for r in self.history]

    def __repr__(self) -> str:
        if not self.history:
            return "TrainingResult(no epochs" + (", interrupted)" if self.interrupted else ")")
        lines = [r.line() for r in self.history]
        best = self._best
        if best is not None and best.tokens:
            ppl = best.val_ppl if best.val_ppl is not None else best.train_ppl
            lines.append(f"best ppl {ppl:.2f}  acc {100 * self.best_top1:.2f}%  at epoch {self.best_epoch}"
                         + ("  (interrupted)" if self.interrupted else ""))
            return "TrainingResult:\n  " + "\n  ".join(lines + ([self.stopped] if self.stopped else []))
        lines.append(f"best top1 {100 * self.best_top1:.2f}%  top5 {100 * self.best_top5:.2f}%  "
                     f"at epoch {self.best_epoch}" + ("  (interrupted)" if self.interrupted else ""))
        if self.stopped:
            lines.append(self.stopped)
        if self.best_ema_top1 is not None:
            lines.append(f"best EMA top1 {100 * self.best_ema_top1:.2f}%  top5 {100 * self.best_ema_top5:.2f}%  "
                         f"at epoch {self.best_ema_epoch}")
        return "TrainingResult:\n  " + "\n  ".join(lines)

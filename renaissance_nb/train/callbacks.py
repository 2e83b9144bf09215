"""run() callbacks that steer training: stopping early.

A callback is any ``cb(kind, info)``; raising :class:`StopTraining` from one ends the run cleanly:
from an "epoch" callback after that epoch (its record, autosaves and every callback's turn done),
from a "step" callback at that step boundary, as Ctrl-C does, from "start" before the first step.
Either way ``run()`` returns its result, with the reason in ``result.stopped``, and a later ``run()``
continues where it stopped.
"""
from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Sequence

from ..checks import arguments_checked, as_flag, as_float, as_int
from ..errors import ConfigError, bad_argument
from .plateau import PLATEAU_METRICS, metric_direction


def _early_stopping(monitor: str = "val_loss", *, patience: int = 3, mode: str | None = None, min_delta: float = 0.0,
                    check_finite: bool = True) -> tuple[Any, Any, Any, Any, Any]:
    return monitor, patience, mode, min_delta, check_finite


_early_stopping.__name__ = "EarlyStopping"  # what a misspelt keyword's error names
_arguments = arguments_checked(ConfigError)(_early_stopping)


class StopTraining(Exception):
    """Raised by a callback to end ``run()`` early; its message becomes ``result.stopped``."""


class EarlyStopping:
    """Stop when the ``monitor`` field of the epochs' records (default the validation loss) has not
    improved by more than ``min_delta`` for ``patience`` epochs in a row (PyTorch Lightning's rule),
    or at once when it is NaN or infinite (``check_finite``, Lightning's default too).

    ``task.run(callbacks=[EarlyStopping(patience=5)])``; ``task.save_best(monitor="val_loss")`` keeps the
    weights of the epoch with the lowest val_loss (with no monitor, save_best keeps the best top-1
    epoch's). The callback keeps its count across ``run()`` calls of one task (a resumed run goes on
    counting) and starts afresh at a run from the first epoch.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """``EarlyStopping(monitor="val_loss", *, patience=3, mode=None, min_delta=0.0, check_finite=True)``;
        mode None picks by the monitor: 'min' for a loss, 'max' for a top-k."""
        where = "EarlyStopping"
        monitor, patience, mode, min_delta, check_finite = _arguments(*args, **kwargs)
        if not isinstance(monitor, str) or monitor not in PLATEAU_METRICS:
            raise bad_argument(ConfigError, where, "monitor", monitor, "one of " + ", ".join(map(repr, PLATEAU_METRICS)),
                               "pass monitor='val_loss'")
        if mode is None:
            mode = metric_direction(monitor)
        if not isinstance(mode, str) or mode not in ("min", "max"):
            raise bad_argument(ConfigError, where, "mode", mode, "'min' (a loss), 'max' (an accuracy) or None",
                               "pass mode='max' for a top-1, or leave it out")
        p = as_int(patience)
        if p is None or p < 1:
            raise bad_argument(ConfigError, where, "patience", patience, "a whole number of epochs >= 1",
                               "pass e.g. patience=3")
        d = as_float(min_delta)
        if d is None or d < 0:
            raise bad_argument(ConfigError, where, "min_delta", min_delta, "a number >= 0", "pass e.g. min_delta=1e-3")
        self.check_finite = as_flag(check_finite, where, "check_finite", ConfigError)
        self.monitor, self.mode, self.patience, self.min_delta = monitor, mode, p, d
        self.best, self.best_epoch, self.wait = self._worst(), 0, 0
        self._task: Any = None  # the task whose run it counts (run() says at "start")

    def check_fields(self, fields: Sequence[str]) -> None:
        """Refuses a run whose epoch records will not have the field this watches (run() asks before compiling)."""
        if self.monitor not in fields:
            raise lacking_field("EarlyStopping", self.monitor)

    def _worst(self) -> float:
        return math.inf if self.mode == "min" else -math.inf

    def __call__(self, kind: str, info: Any) -> None:
        if kind == "start":
            self.check_fields(info.get("fields", PLATEAU_METRICS))  # before any epoch is spent
            task, epoch = info.get("task"), info.get("epoch", 0)
            # count afresh for another task, a run from the start, or one rolled back before the best epoch
            if task is not self._task or epoch == 0 or epoch < self.best_epoch:
                self.best, self.best_epoch, self.wait, self._task = self._worst(), 0, 0, task
        if kind != "epoch":
            return
        value = getattr(info, self.monitor)
        if value is None:  # called by hand, outside run()
            raise lacking_field("EarlyStopping", self.monitor)
        if self.check_finite and not math.isfinite(value):
            raise StopTraining(f"early stopping: {self.monitor} is {value} at epoch {info.epoch}")
        better = value < self.best - self.min_delta if self.mode == "min" else value > self.best + self.min_delta
        if better:  # NaN is never better
            self.best, self.best_epoch, self.wait = float(value), info.epoch, 0
            return
        self.wait += 1
        if self.wait >= self.patience:
            raise StopTraining(f"early stopping: {self.monitor} has not improved for {self.wait} "
                               f"epoch{'s' if self.wait != 1 else ''} (best {self.best:.4g} at epoch {self.best_epoch})")

    def __repr__(self) -> str:
        return (f"EarlyStopping(monitor={self.monitor!r}, patience={self.patience}, mode={self.mode!r}, "
                f"min_delta={self.min_delta!r}" + ("" if self.check_finite else ", check_finite=False") + ")")


def lacking_field(who: str, field: str) -> ConfigError:
    """The error for a watcher (a schedule, save_best, EarlyStopping) of a field the task's epoch records
    will not have: val_ needs validation data, ema_ validation data and ema() (the EMA is scored there)."""
    why = ("the task has no validation data" if field.startswith("val_")
           else "the EMA is scored on validation data: the task needs val= (or val_fraction=) and ema()")
    return ConfigError(f"{who}: watches {field}, which the epoch records will not have ({why}). Fix: "
                       "monitor='train_loss', or give the task what it watches.")


def check_watchers(fields: Sequence[str], save_best_field: str | None, callbacks: Sequence[Any]) -> None:
    """save_best's field and each EarlyStopping's against the fields the epoch records will have: run() asks
    before it compiles, so a refused run leaves the task in the phase it was in (its fix still applies)."""
    if save_best_field is not None and save_best_field not in fields:
        raise lacking_field("save_best", save_best_field)
    for cb in callbacks:
        if isinstance(cb, EarlyStopping):
            cb.check_fields(fields)


def checked_callbacks(callbacks: Any) -> tuple[Callable[[str, Any], None], ...]:
    """run()'s callbacks: a sequence of callables ``cb(kind, info)``, checked before the run changes anything."""
    fix = "pass callbacks=[fn] with def fn(kind, info): ..."
    if callable(callbacks):
        raise bad_argument(ConfigError, "run", "callbacks", callbacks, "a list of callables", f"wrap it: {fix}")
    try:
        out = tuple(callbacks)
    except TypeError:
        raise bad_argument(ConfigError, "run", "callbacks", callbacks, "a list of callables", fix) from None
    for cb in out:
        if not callable(cb):
            raise bad_argument(ConfigError, "run", "callbacks", callbacks, f"a list of callables; {cb!r} is not one",
                               fix)
        if isinstance(cb, type):  # EarlyStopping, the class, not an instance
            raise bad_argument(ConfigError, "run", "callbacks", callbacks,
                               f"callables taking (kind, info); {cb.__name__} is a class",
                               f"{cb.__name__}() makes one")
        try:
            inspect.signature(cb).bind("start", {})
        except TypeError:  # lambda: ...
            raise bad_argument(ConfigError, "run", "callbacks", callbacks,
                               f"callables taking (kind, info); {cb!r} does not", fix) from None
        except ValueError:  # no signature to read (some builtins): called as it is
            pass
    return out


def call_each(callbacks: Sequence[Callable[[str, Any], None]], kind: str, info: Any) -> str | None:
    """Every callback, in order, even after one raised StopTraining (each sees the event); the first
    StopTraining's message, or None. Any other exception stops the calls and propagates."""
    why = None
    for cb in callbacks:
        try:
            cb(kind, info)
        except StopTraining as exc:
            why = (str(exc) or f"StopTraining from a {kind!r} callback") if why is None else why
    return why

"""Immutable builder settings: every setter returns a new object.

The original sets some options in a global registry as a side effect (its label
smoothing is global). Here a loss, optimizer or scheduler is a frozen value:
``AdamW().weight_decay(1e-4)`` builds a new AdamW and leaves the first untouched.
"""
from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

from ..checks import SuggestsNames, as_float, closest
from ..errors import ConfigError, bad_argument

S = TypeVar("S", bound="Settings")


class Settings(SuggestsNames):
    """Base of frozen ``@dataclass(init=False)`` settings whose fields end in '_' and whose setters share the name.

    The constructor takes the setters' names as keywords (``Adam(lr=1e-3)``,
    ``CosineAnnealingLR(base_lr=0.1)``) so that a misspelt name is a ConfigError
    listing the valid ones, not Python's bare TypeError. Subclasses validate one
    setting in ``_check`` and the whole in ``__post_init__``; both run on every
    construction, so setters need no checks of their own. A subclass must say
    ``init=False``: the dataclass's generated ``__init__`` would replace this one.
    """

    def __init__(self, *args: Any, **settings: Any) -> None:
        where = f"{type(self).__name__}()"
        names = self._names()
        if args:
            raise bad_argument(ConfigError, where, "positional argument", args[0], "settings by name",
                               f"name it, e.g. {type(self).__name__}({names[0]}=...)")
        for f in fields(self):  # type: ignore[arg-type]
            object.__setattr__(self, f.name, f.default)
        for name, value in settings.items():
            if name.endswith("_") and name[:-1] in names:  # dataclasses.replace passes the field names
                name = name[:-1]
            if name not in names:
                close = closest(name, names)
                raise bad_argument(ConfigError, where, name, value, f"one of the settings {', '.join(names)}",
                                   f"did you mean {close}=?" if close else f"remove {name}= or use one of those names")
            object.__setattr__(self, name + "_", self._check(name, value))
        self.__post_init__()

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        """The public setting names, in repr order."""
        return tuple(f.name.rstrip("_") for f in fields(cls))  # type: ignore[arg-type]

    def _check(self, name: str, value: Any) -> Any:
        """One setting's validated (normalised) value; the default leaves it to ``__post_init__``."""
        return value

    def __post_init__(self) -> None:
        """Checks across settings, run after every construction."""

    def _set(self, name: str, value: Any) -> None:
        """Store a normalised value from ``__post_init__`` (the object is frozen)."""
        object.__setattr__(self, name + "_", value)

    def _with(self: S, name: str, value: Any) -> S:
        return type(self)(**{**self.settings(), name: value})

    def settings(self) -> dict[str, Any]:
        """The settings as ``{name: value}``, the constructor's keywords."""
        return {n: getattr(self, n + "_") for n in self._names()}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.settings().items())
        return f"{type(self).__name__}({args})"


LR_MAX = 3.4028234663852886e38
"""The largest learning rate: the per-step table the step reads is float32 (np.finfo(np.float32).max)."""


def check_number(where: str, name: str, v: Any, *, low: float | None = 0.0, high: float | None = None,
                 low_open: bool = False, high_open: bool = False, fix: str = "") -> float:
    """A finite real number (Python or NumPy, not bool) in [low, high] (or open at either end), as a float."""
    f = as_float(v)
    in_range = f is not None and (low is None or (f > low if low_open else f >= low)) \
        and (high is None or (f < high if high_open else f <= high))
    if f is None or not in_range:
        lo = "" if low is None else ("(" if low_open else "[") + f"{low}"
        hi = "" if high is None else f"{high}" + (")" if high_open else "]")
        rng = f"in {lo or '(-inf'}, {hi or 'inf)'}"
        raise bad_argument(ConfigError, where, name, v, f"a finite number {rng}", fix or f"pass a valid {name}")
    return f

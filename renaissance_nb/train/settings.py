"""Immutable builder settings: every setter returns a new object.

The original sets some options in a global registry as a side effect (its label
smoothing is global). Here a loss, optimizer or scheduler is a frozen value:
``AdamW().weight_decay(1e-4)`` builds a new AdamW and leaves the first untouched.
"""
from __future__ import annotations

import math
from dataclasses import fields, replace
from typing import Any, TypeVar

from ..errors import ConfigError, bad_argument

S = TypeVar("S", bound="Settings")


class Settings:
    """Mixin for frozen dataclasses whose fields end in '_' and whose setters share the name."""

    def _with(self: S, name: str, value: Any) -> S:
        return replace(self, **{name + "_": value})

    def settings(self) -> dict[str, Any]:
        return {f.name.rstrip("_"): getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.settings().items())
        return f"{type(self).__name__}({args})"


def check_number(where: str, name: str, v: Any, *, low: float | None = 0.0, high: float | None = None,
                 low_open: bool = False, high_open: bool = False, fix: str = "") -> float:
    """A finite real number in [low, high] (or open at either end)."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if ok and low is not None:
        ok = v > low if low_open else v >= low
    if ok and high is not None:
        ok = v < high if high_open else v <= high
    if not ok:
        lo = "" if low is None else ("(" if low_open else "[") + f"{low}"
        hi = "" if high is None else f"{high}" + (")" if high_open else "]")
        rng = f"in {lo or '(-inf'}, {hi or 'inf)'}"
        raise bad_argument(ConfigError, where, name, v, f"a finite number {rng}", fix or f"pass a valid {name}")
    return float(v)

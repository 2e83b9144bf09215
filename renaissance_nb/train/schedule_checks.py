"""The checks a learning-rate schedule's settings go through, shared by schedulers.py and plateau.py.

Why a module of its own: every schedule validates its numbers the same way and words the refusal the
same way (ConfigError through ``bad_argument``: where, which setting, the value, what was expected, a
fix), and the table schedules and ReduceLROnPlateau live in different modules.
"""
from __future__ import annotations

from typing import Any

from renaissance_nb.checks import as_float, as_int
from renaissance_nb.errors import ConfigError, bad_argument


def check_real(where: str, name: str, value: Any, expected: str, fix: str) -> float:
    """``value`` as a finite float, else ConfigError at ``where`` saying ``expected`` and ``fix``."""
    v = as_float(value)
    if v is None:
        raise bad_argument(ConfigError, where, name, value, expected, fix)
    return v


def check_nonneg(where: str, name: str, value: Any, fix: str, high: float | None = None) -> float:
    """A finite float >= 0 (and <= ``high`` when given), else ConfigError."""
    expected = "a finite number >= 0" if high is None else f"a finite number in [0, {high}]"
    v = check_real(where, name, value, expected, fix)
    if v < 0 or (high is not None and v > high):
        raise bad_argument(ConfigError, where, name, value, expected, fix)
    return v


def check_positive(where: str, name: str, value: Any, fix: str) -> float:
    """A finite float > 0, else ConfigError."""
    v = check_real(where, name, value, "a finite number > 0", fix)
    if v <= 0:
        raise bad_argument(ConfigError, where, name, value, "a finite number > 0", fix)
    return v


def check_unit_interval(where: str, name: str, value: Any, lo_open: bool, fix: str) -> float:
    """A float in [0, 1], or in (0, 1] when ``lo_open``, else ConfigError."""
    expected = "a number in (0, 1]" if lo_open else "a number in [0, 1]"
    v = check_real(where, name, value, expected, fix)
    if v > 1 or v < 0 or (lo_open and v == 0):
        raise bad_argument(ConfigError, where, name, value, expected, fix)
    return v


def check_count(where: str, name: str, value: Any, fix: str) -> int:
    """An int >= 1 (a NumPy integer too, not a bool), else ConfigError."""
    v = as_int(value)
    if v is None or v < 1:
        raise bad_argument(ConfigError, where, name, value, "an integer >= 1", fix)
    return v

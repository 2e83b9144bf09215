"""Checking cells for the notebooks' exercises: a student's answer against the value the cell measured.

    from renaissance_nb.exercises import check
    check("arena at batch 64", my_guess, task64.memory.total_bytes, rel=0.05, hint="which regions scale with the batch?")

Prints one line and returns whether the answer was right, so an exercise can never pass silently with
the answer left at ``None``. What it prints is chosen so that the check teaches instead of telling:

* no answer yet (``None`` or ``...``): "not yet", and nothing else: no hint, no answer;
* a wrong answer: "not yet", what was said, and the hint; the answer itself only after ``REVEAL_AFTER``
  wrong tries of the same exercise (someone stuck can still move on);
* a right answer, in any of its forms: a number as an int, a float or a string ("4,096"), a name in
  any case, an enum member or its name, a class or its name, a tuple or a list, a set in any order.

``asked`` keeps the last expected value of each exercise (by name), so a test can run a notebook and
then try every correct form of every answer (``forms``).
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any, Callable

REVEAL_AFTER = 3
"""Wrong tries of one exercise after which its check also prints the answer."""


@dataclass(frozen=True)
class Asked:
    """One exercise as its check cell last posed it: the expected value and the tolerance."""

    want: Any
    rel: float
    abs: float
    accept: Callable[[Any], bool] | None = None

    def accepts(self, answer: Any) -> bool:
        """Whether the check would take ``answer`` (without printing or counting a try)."""
        return self.accept(answer) if self.accept is not None else same(answer, self.want, self.rel, self.abs)


asked: dict[str, Asked] = {}
"""Exercise name -> the last expected value its check compared with."""
_wrong: dict[str, int] = {}


def _number(value: Any) -> float | None:
    """A number from an int, a float, a NumPy scalar or a string such as "4,096" or "1.5e3"; None else."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        value = value.strip().replace(",", "").replace("_", "")
    try:
        g = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return g if math.isfinite(g) else None


def _word(value: Any) -> str:
    """A name as text, folded: case, surrounding quotes and spaces, and the separators "_", "-", " " ignored."""
    text = str(value).strip().strip("'\"").casefold()
    return text.replace("_", "").replace("-", "").replace(" ", "")


def _same_enum(got: Any, want: enum.Enum) -> bool:
    if isinstance(got, enum.Enum):
        return got is want
    if isinstance(got, str):
        name = got.strip().rsplit(".", 1)[-1]  # "StreamKind.UPDATE" or "UPDATE"
        return _word(name) == _word(want.name)
    return False


def _same_items(got: Any, want: Any, ordered: bool, rel: float, abs_: float) -> bool:
    if isinstance(got, (str, bytes)) or not hasattr(got, "__iter__") or getattr(got, "ndim", 1) == 0:
        return False
    if ordered and isinstance(got, (set, frozenset, dict)):  # no order of its own: {4, 1} is not the pair (1, 4)
        return False
    items = list(got)
    if len(items) != len(want):
        return False
    if ordered:
        return all(same(g, w, rel, abs_) for g, w in zip(items, want))
    left = list(want)
    for g in items:  # each answer item matches one expected item, whatever the order
        match = next((i for i, w in enumerate(left) if same(g, w, rel, abs_)), None)
        if match is None:
            return False
        left.pop(match)
    return True


def same(got: Any, want: Any, rel: float = 0.0, abs: float = 0.0) -> bool:  # noqa: A002
    """Whether ``got`` is ``want`` in one of its correct forms (numbers within ``rel``/``abs``)."""
    if isinstance(want, bool):
        if isinstance(got, str):
            return _word(got) in (("true", "yes") if want else ("false", "no"))
        return type(got).__name__ in ("bool", "bool_") and bool(got) is want  # NumPy's bool_ too
    if isinstance(want, enum.Enum):
        return _same_enum(got, want)
    if isinstance(want, type):
        return got is want or (isinstance(got, str) and _word(got.rsplit(".", 1)[-1]) == _word(want.__name__))
    if isinstance(want, (int, float)):
        g = _number(got)
        return g is not None and math.fabs(g - float(want)) <= max(abs, rel * math.fabs(float(want)))
    if isinstance(want, str):
        return isinstance(got, (str, enum.Enum)) and _word(getattr(got, "name", got)) == _word(want)
    if isinstance(want, (set, frozenset)):
        return _same_items(got, want, False, rel, abs)
    if isinstance(want, (tuple, list)):
        return _same_items(got, want, True, rel, abs)
    return bool(got == want)


def forms(want: Any) -> list[Any]:
    """Correct answers of other forms than ``want`` itself (what a student may type): a test runs them."""
    if isinstance(want, bool):
        return [want, "yes" if want else "no", str(want).lower()]
    if isinstance(want, enum.Enum):
        return [want, want.name, want.name.lower(), f"{type(want).__name__}.{want.name}"]
    if isinstance(want, type):
        return [want, want.__name__]
    if isinstance(want, int):
        return [want, float(want), str(want), f"{want:,}"]
    if isinstance(want, float):
        return [want, repr(want)]
    if isinstance(want, str):
        return [want, want.upper(), f" {want.title()} "]
    if isinstance(want, (set, frozenset)):
        items = sorted(want, key=repr)
        return [set(want), items, tuple(reversed(items))]
    if isinstance(want, (tuple, list)):
        return [tuple(want), list(want)]
    return [want]


def check(name: str, got: Any, want: Any, *, rel: float = 0.0, abs: float = 0.0,  # noqa: A002
          hint: str = "", accept: Callable[[Any], bool] | None = None) -> bool:
    """Whether ``got`` matches ``want`` in any correct form (numbers within ``rel``/``abs``; sets in any
    order). ``accept``, if given, decides instead, for exercises with more than one right answer."""
    asked[name] = Asked(want, rel, abs, accept)
    if got is None or got is Ellipsis:
        print(f"✗ {name}: not yet: no answer (replace the None with yours, then run the cell again).")
        return False
    ok = accept(got) if accept is not None else same(got, want, rel, abs)
    if ok:
        _wrong.pop(name, None)
        print(f"✓ {name}: right ({got!r}).")
        return True
    _wrong[name] = tries = _wrong.get(name, 0) + 1
    line = f"✗ {name}: not yet: you said {got!r}." + (f" Hint: {hint}" if hint else "")
    if tries >= REVEAL_AFTER:
        line += f" (After {tries} tries, the answer: {want!r}.)"
    print(line)
    return False

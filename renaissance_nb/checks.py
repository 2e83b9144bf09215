"""The plain numbers a user passes as settings, read the same way everywhere.

Why one place: every validator (layer builders, optimizers, losses, schedulers) must
accept Python and NumPy numbers alike, refuse bools, and treat an int too large for a
float as out of range instead of letting ``float()`` raise OverflowError. Each caller
keeps its own exception type and message; these helpers only say whether (and as what)
a value counts as a number.
"""
from __future__ import annotations

import difflib
import functools
import inspect
import math
from numbers import Integral, Real
from typing import Any, Callable, Mapping

import numpy as np

from .errors import RenaissanceError, bad_argument


def as_int(value: Any) -> int | None:
    """``value`` as a Python int when it is an int or a NumPy integer (not a bool), else None."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, Integral):
        return None
    return int(value)


def as_float(value: Any) -> float | None:
    """``value`` as a finite Python float when it is a real number (int, float or NumPy scalar,
    not a bool), else None: also for NaN, +-Inf and ints too large for a float (10**400)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, Real):
        return None
    try:
        v = float(value)
    except (OverflowError, ValueError, TypeError):
        return None
    return v if math.isfinite(v) else None


def as_flag(value: Any, where: str, argument: str, error: type[RenaissanceError], fix: str = "") -> bool:
    """``value`` as a bool when it is one (or a NumPy bool), else ``error`` naming it: a truthy string such
    as 'no' must not mean True."""
    if not isinstance(value, (bool, np.bool_)):
        raise bad_argument(error, where, argument, value, "True or False",
                           fix or f"pass {argument}=True or {argument}=False")
    return bool(value)


SYNONYMS = {"learning_rate": "lr", "num_epochs": "total_epochs", "max_epochs": "total_epochs", "epochs": "total_epochs",
            "momentum_decay": "betas", "random_seed": "seed", "manual_seed": "seed"}
"""Other libraries' names for ours, which difflib's spelling distance would not find (Keras's learning_rate)."""


def closest(name: str, names: Any) -> str | None:
    """The one of ``names`` nearest a misspelt ``name`` (a known synonym first, then difflib's ratio of
    at least 0.6), or None: ``epochs`` -> ``total_epochs``, ``batchsize`` -> ``batch_size``."""
    names = list(names)
    if SYNONYMS.get(name) in names:
        return SYNONYMS[name]
    match = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    if not match and "_" not in name:  # 'batchsize' against 'batch_size': compare without the underscores
        plain = {n.replace("_", ""): n for n in names}
        match = [plain[m] for m in difflib.get_close_matches(name, list(plain), n=1, cutoff=0.8)]
    return match[0] if match else None


def no_such_attribute(obj: Any, name: str, hints: Mapping[str, str] | None = None) -> AttributeError:
    """The AttributeError for ``obj.name`` (still an AttributeError, so hasattr and copy work), naming the
    nearest public method or property of its class: ``task.epochs(3)`` -> did you mean total_epochs;
    ``hints`` says where a setting of another home lives (``task.lr`` -> the optimizer's)."""
    cls = type(obj).__name__
    if name.startswith("_"):  # dunders and private probes (copy, IPython's _repr_*_): Python's own message
        return AttributeError(f"{cls!r} object has no attribute {name!r}")
    found = inspect.getattr_static(type(obj), name, None)
    if hasattr(found, "__get__"):  # a property that raised AttributeError itself: its own error, not "no such name"
        found.__get__(obj, type(obj))
    close = closest(name, [n for n in dir(type(obj)) if not n.startswith("_") and not n.endswith("_")])
    fix = (hints or {}).get(name) or (f"did you mean {close}?" if close else f"help({cls}) lists its methods.")
    return AttributeError(f"{cls} has no method or attribute {name!r}. Fix: {fix}")


class SuggestsNames:
    """A base whose instances answer a name their class lacks with the nearest one it has (``no_such_attribute``);
    ``_elsewhere`` maps names from other libraries to where that thing lives here."""

    _elsewhere: Mapping[str, str] = {}

    def __getattr__(self, name: str) -> Any:  # only for names the class lacks
        raise no_such_attribute(self, name, self._elsewhere)


def arguments_checked(error: type[RenaissanceError], call: str = "",
                      aliases: Mapping[str, str] | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a builder so that a misspelt keyword or too many positional arguments raise
    ``error`` naming the valid names, not Python's bare TypeError (checked before the builder runs,
    so nothing changes). ``aliases`` maps names users bring from PyTorch to this API's
    (``padding`` -> ``p``); ``call`` prefixes the example (``task.``)."""
    known = dict(aliases or {})

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn)
        params = [q for q in sig.parameters.values() if q.name != "self"]
        names = [q.name for q in params if q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD)]
        rest = next((q.name for q in params if q.kind == q.VAR_POSITIONAL), None)  # seq(*layers)
        where = fn.__name__
        takes = ", ".join(names) or (f"only {rest}, by position" if rest else "no arguments")

        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> Any:
            try:
                sig.bind(*args, **kwargs)
            except TypeError as exc:
                unknown = [k for k in kwargs if k not in names]
                if unknown:
                    k = unknown[0]
                    hint = known.get(k)  # our name for it, or a sentence saying why there is none
                    if hint is not None and hint.isidentifier() and hint not in names:
                        hint = None  # PyTorch's name for something this builder does not take
                    close = closest(k, names)
                    if hint is None and close:
                        fix = f"did you mean {close}=? Write {close}= instead of {k}="
                    elif hint is None:
                        fix = (f"remove {k}= or use one of those names" if names else
                               f"remove {k}= and pass {rest} by position" if rest else f"remove {k}=")
                    else:
                        fix = f"write {hint}= (PyTorch's {k}=)" if hint.isidentifier() else hint
                    expected = f"one of the names: {takes}" if names else f"{takes} ({where}() takes no keywords)"
                    raise bad_argument(error, where, k, kwargs[k], expected, fix) from None
                fix = (f"pass those arguments, settings by name, e.g. {call}{where}({names[0]}=...)" if names
                       else f"call {call}{where}() with no arguments")
                raise error(f"{where}: {exc} (it takes {takes}). Fix: {fix}.") from None
            return fn(*args, **kwargs)
        return checked
    return wrap

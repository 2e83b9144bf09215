"""The exception family of renaissance_nb.

Every error the library raises on purpose is a :class:`RenaissanceError`. Each
message names the argument, the value it got, the form it expected and the fix,
so that a notebook user never has to read a NumPy traceback to know what to do.
The subclasses also derive from the built-in type a Python user would expect
(``ValueError``, ``TypeError``, ``RuntimeError``) so ``except ValueError`` works.
"""
from __future__ import annotations

from typing import Any, TypeVar


class RenaissanceError(Exception):
    """Base class of every error renaissance_nb raises deliberately."""


class PhaseError(RenaissanceError, RuntimeError):
    """An operation was called in a phase that does not allow it."""

    def __init__(self, operation: str, current: Any, needed: Any, hint: str = "") -> None:
        self.operation = operation
        self.current = current
        self.needed = needed
        needed_s = needed if isinstance(needed, str) else " or ".join(str(n) for n in needed)
        msg = f"{operation}() needs phase {needed_s}, but the task is in phase {current}."
        if hint:
            msg += f" {hint}"
        super().__init__(msg)


class BluePrintError(RenaissanceError, ValueError):
    """A layer or container was declared with an invalid argument."""


class ConfigError(RenaissanceError, ValueError):
    """A task setting (loss, optimizer, scheduler, epochs, seed...) is invalid."""


class DataError(RenaissanceError, ValueError):
    """Training or evaluation data has the wrong shape, dtype, range or values."""


class PlanError(RenaissanceError, ValueError):
    """A memory plan or computation graph is inconsistent (unknown tensor, bad region...)."""


class ShapeError(PlanError):
    """Shapes do not fit together (a layer's input does not match what it needs)."""


class TraceError(RenaissanceError, TypeError):
    """A Python function cannot become a static graph as written (a branch on a computed value, an
    operand that is not traced, shapes that do not fit): renaissance_nb.tracing."""


class NumericalError(RenaissanceError, FloatingPointError):
    """Training produced a non-finite value (NaN or Inf)."""


class CheckpointError(RenaissanceError, ValueError):
    """A checkpoint file is missing, corrupted or belongs to a different plan."""


class DeviceError(RenaissanceError, RuntimeError):
    """A device was asked for that is not there, or a model has ops the device cannot run."""


class DownloadError(RenaissanceError, OSError):
    """A data set could not be downloaded or failed its checksum."""


class ExportError(RenaissanceError, ValueError):
    """A model or its weights could not be written in, or read from, another framework's format
    (safetensors, ONNX, PyTorch modules), or the package that format needs is missing."""


def describe(value: Any) -> str:
    """A short, safe rendering of a user's value for an error message."""
    try:
        import numpy as np

        if isinstance(value, np.ndarray):
            return f"array(shape={value.shape}, dtype={value.dtype})"
        if type(value).__name__ == "Tensor" and hasattr(value, "requires_grad"):  # torch's repr spans lines
            grad = ", requires_grad=True" if value.requires_grad else ""
            return f"tensor(shape={tuple(value.shape)}, dtype={value.dtype}, device={value.device}{grad})"
    except ImportError:  # pragma: no cover - numpy is a hard dependency
        pass
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


_E = TypeVar("_E", bound=RenaissanceError)


def bad_argument(cls: type[_E], where: str, argument: str, value: Any, expected: str, fix: str) -> _E:
    """Build an error that names the argument, the value, the expected form and the fix."""
    return cls(f"{where}: {argument}={describe(value)} is invalid; expected {expected}. Fix: {fix}")

"""The numeric settings of a DeepLearningTask: precision, the EMA and gradient clipping.

Why apart from task.py: they are a family (how the step's numbers are kept and updated), and the
task facade stays thin (tests/test_architecture.py). DeepLearningTask inherits them; each setter goes
through the task's ``_set``, which checks the phase and keeps the task as it was on a bad argument.
"""
from __future__ import annotations

from typing import Any, Callable

from . import config_checks as check
from .checks import arguments_checked
from .errors import ConfigError

_arguments_checked = arguments_checked(ConfigError, call="task.")


class NumericSettings:
    """Mixin: setters of DeepLearningTask whose fields live in TaskConfig."""

    _set: Callable[..., Any]

    @_arguments_checked
    def precision(self, name: str = "bf16") -> Any:
        """Mixed precision, with torch.autocast's rules and fp32 master weights: "bf16" keeps activations
        and the matrix products' operands in bfloat16 (fp32 accumulation), "fp16" in float16 with
        GradScaler's dynamic loss scaling (2^16, x2 every 2,000 clean steps, x0.5 and the step skipped on
        an overflow), "fp32" (the default) turns it off. The plan shows what moved (``memory_inspector.by_dtype()``, ``what_if(precision=...)``): working weights in A_,
        gradients in G_*_FP16, feature maps in F_*_FP16, and every cast's fp32 buffer (compiler/autocast.py)."""
        return self._set("precision", lambda: check.precision(name))

    @_arguments_checked
    def ema(self, decay: float = 0.999) -> Any:
        """Keep exponential-moving-average weights (E_ regions), evaluated each epoch next to the raw ones
        (``evaluate``/``predict*``/``state_dict(..., ema=True)`` use them). After each update ``E = d * E +
        (1 - d) * W``, ``d = min(decay, (1 + t) / (10 + t))`` for t finished updates (TensorFlow's EMA with
        ``num_updates``), weights and batch-norm statistics alike, from the initial weights: ``d`` reaches 0.9
        at t = 80 and 0.999 at t = 8,990, so short runs average faster than torch's plain-decay EMA would."""
        return self._set("ema", lambda: check.ema(decay))

    @_arguments_checked
    def clip_grad_norm(self, max_norm: float | None) -> Any:
        """Clip the gradients' total 2-norm to ``max_norm`` before every update, as
        ``torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)`` between ``backward()`` and
        ``step()``: one pass over the G range, compiled into the step; None turns it off."""
        return self._set("clip_grad_norm", lambda: check.clip_grad_norm(max_norm))

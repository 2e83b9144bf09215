"""What a tensor holds now: its values read from the arena, and for a weight its last update.

Why: the plan says where every tensor lives; after compile() the arena says what is there. The
tensor inspector (a widget, or plain Python: ``tensor_stats(task, name)``) shows a
histogram, the range and moments, NaN/Inf counts, and for a trained parameter the norm of its
gradient and the size of the last step's update against the weight, |dW| / |W|: the number people
watch to tell a learning rate that barely moves the weights from one that wrecks them.

Everything is read through the task's public ``read(name)`` (a copy of the tensor's bytes in the
train_base view); nothing here writes to the arena or runs a kernel.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config import TaskConfig
from ..errors import ConfigError, PlanError, bad_argument
from ..memory.plan import MemoryPlan
from ..optim import definition

if TYPE_CHECKING:
    from ..task import DeepLearningTask

Reader = Callable[[str], np.ndarray]

BINS = 30
"""The histogram's bins unless asked otherwise (enough to see a shape, few enough to draw small)."""


@dataclass(frozen=True)
class ValueStats:
    """The values of one tensor: counts, range and moments of its finite values, and their histogram
    (``counts`` over ``edges``: counts sum to ``finite``; ``finite + nan + inf == size``)."""

    size: int
    finite: int
    nan: int
    inf: int
    min: float | None
    max: float | None
    mean: float | None
    std: float | None
    counts: tuple[int, ...]
    edges: tuple[float, ...]

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class UpdateStats:
    """A parameter's last optimizer step: the gradient it used, the change it made, and their norms.

    ``update_norm`` is |W - W_old| between float32 values, the change the arena holds; ``intended_norm``
    the norm of the update the optimizer's formula asked for (larger where parts of it fall below
    float32's resolution at their weight and change nothing); ``changed`` counts the weights the step
    changed, of ``size``. ``ratio`` is |dW| / |W| (2-norms; W after the step); ``how`` says what it was
    derived from. ``grad_norm`` is G's norm as the update used it: after clipping, where clip_grad_norm
    is set; then ``clip_norm`` is the whole gradient's norm before clipping and ``clip_factor`` the scale
    clipping applied to every gradient (1.0: none), so this parameter's norm before it is
    grad_norm / clip_factor."""

    step: int
    lr: float
    grad_norm: float
    weight_norm: float
    update_norm: float | None
    ratio: float | None
    how: str
    intended_norm: float | None = None
    changed: int | None = None
    size: int = 0
    clip_norm: float | None = None
    clip_factor: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class TensorStats:
    """A tensor's values now, and for a trained parameter its last update (None for anything else)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    values: ValueStats
    update: UpdateStats | None

    def summary(self) -> str:
        v = self.values
        if v.finite:
            text = (f"{self.name} {self.shape} {self.dtype}: min {v.min:.4g}, max {v.max:.4g}, mean {v.mean:.4g}, "
                    f"std {v.std:.4g}")
        else:
            text = f"{self.name} {self.shape} {self.dtype}: no finite value"
        if v.nan or v.inf:
            text += f", {v.nan} NaN, {v.inf} Inf"
        u = self.update
        if u is not None:
            text += f"; step {u.step}: |grad| {u.grad_norm:.4g}"
            if u.ratio is not None:
                text += f", |dW|/|W| {u.ratio:.3g}"
        return text

    def __repr__(self) -> str:
        return f"<TensorStats {self.summary()}>"


def value_stats(values: np.ndarray, bins: int = BINS) -> ValueStats:
    """Counts, range, mean, standard deviation (population, ddof 0) and a ``bins``-bin histogram of the
    finite values (numpy.histogram over [min, max]); NaN and Inf are counted apart."""
    x = np.asarray(values).reshape(-1)
    xf = x.astype(np.float64) if x.dtype.kind in "biuf" else np.zeros(0)
    finite = np.isfinite(xf)
    good = xf[finite]
    nan = int(np.isnan(xf).sum())
    inf = int(xf.size - good.size - nan)
    if not good.size:
        return ValueStats(int(x.size), 0, nan, inf, None, None, None, None, (), ())
    counts, edges = histogram(good, bins)
    mean, std = _moments(good)
    return ValueStats(int(x.size), int(good.size), nan, inf, float(good.min()), float(good.max()), mean, std,
                      tuple(int(c) for c in counts), tuple(float(e) for e in edges))


def histogram(good: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """numpy.histogram of finite float64 values over [min, max], also where it refuses: values whose range
    overflows float64 (beyond ±9e307 on both sides) get ``bins`` edges spaced without that width; values
    too close for ``bins`` representable edges (a few ulps apart) get one bin."""
    lo, hi = float(good.min()), float(good.max())
    if not np.isfinite(hi - lo):
        f = np.linspace(0.0, 1.0, bins + 1)
        edges = lo * (1.0 - f) + hi * f
        edges[0], edges[-1] = lo, hi
        return np.histogram(good, bins=edges)[0], edges
    try:
        return np.histogram(good, bins=bins)
    except ValueError:  # "Too many bins for data range": fewer representable steps than bins
        return np.array([good.size]), np.array([lo, hi])


def _moments(good: np.ndarray) -> tuple[float, float]:
    """Mean and standard deviation; scaled by the largest magnitude when the plain sums overflow."""
    with np.errstate(over="ignore", invalid="ignore"):
        mean, std = float(good.mean()), float(good.std())
        if np.isfinite(mean) and np.isfinite(std):
            return mean, std
        scale = float(np.abs(good).max())
        y = good / scale
        return float(y.mean()) * scale, float(y.std()) * scale


def _norm(a: np.ndarray) -> float:
    return float(np.sqrt(np.sum(np.square(a, dtype=np.float64))))


def is_parameter(plan: MemoryPlan, name: str) -> bool:
    """A trained parameter: a tensor of a W region with a gradient of its own (``name@grad``)."""
    return plan[name].region.family == "W" and any(t.name == f"{name}@grad" for t in plan)


def not_applied_last(read: Reader, plan: MemoryPlan) -> str:
    """Why the last training step tried made no update ("" when it made the last one), from the arena.

    Every training step writes its loss to ``loss_log[t]`` (t: finished updates) after the NaN check and
    before the update; a step the check skips (nan_policy='skip', counted in ``nan.skipped``) leaves t as
    it was, so ``loss_log[t]`` is written (not +0.0) exactly when the last step was skipped. The check's
    own test, a non-finite value anywhere in the G range, also catches a skipped step whose loss was
    exactly 0 and a step the check stopped with an error (nan_policy='raise'; one stopped for its loss
    alone leaves no mark in the arena). G then holds that step's gradient, not the last update's."""
    names = {x.name for x in plan}
    if not {"loss_log", "nan.skipped"} <= names:
        return ""
    t, log = int(read("step")[0]), read("loss_log")
    written = t < log.size and bool(log.view(np.uint32)[t])
    if not written and all(np.isfinite(read(x.name)).all() for x in plan if x.region.family == "G"):
        return ""
    skipped = int(read("nan.skipped")[0])
    why = (f"skipped (nan_policy='skip'; {skipped:,} skipped so far)" if skipped
           else "stopped by the NaN check (nan_policy='raise')")
    return (f"unknown: the last step was {why}: a non-finite loss or gradient; G holds that step's gradient, "
            f"not the one of step {t}'s update")


def last_update(read: Reader, config: TaskConfig, name: str, plan: MemoryPlan | None = None) -> UpdateStats | None:
    """The last optimizer step's change to parameter ``name``, derived from what the arena holds now.

    How: the step counter ``step`` counts finished updates (t), and ``lr_table[t - 1]`` is the rate that
    step used. The gradient G (``name@grad``) is the one that step used: it is written by the backward
    pass and left in place until the next step's backward pass overwrites it (after clipping, if set:
    clipping scales G in place before the update). The weights before the step, W_old, follow from the
    kernels' formulas, inverted where the update depends on the old weight; each optimizer's definition
    holds its inverse (renaissance_nb/optim/: ``old_weights``). SGD with momentum and LARS: W_old = W +
    lr * M, the new momentum buffer; Adam: W_old = W + u with u from the new moments, AdamW also undoing
    its decay, W_old = (W + u) / (1 - lr * wd).

    W_old is computed in float64 and rounded to float32, the arena's precision, and |dW| is |W - W_old|
    between those float32 values: the change the step made, not the update it asked for, which differs
    where an update is below half a float32 step of its weight (that weight does not change; ``changed``
    counts those that did). None for a tensor that is not a trained parameter; ``update_norm`` None before
    the first step, after a step the NaN check skipped or stopped (``not_applied_last``, given the
    ``plan``), or when G or W holds NaN/Inf (nan_check off: training that diverged)."""
    w32 = read(name)
    w, g = w32.astype(np.float64), read(f"{name}@grad").astype(np.float64)
    t = int(read("step")[0])
    table = read("lr_table")
    lr = float(table[min(max(t - 1, 0), len(table) - 1)]) if len(table) else 0.0
    gn, wn = _norm(g), _norm(w)
    if t == 0:
        return UpdateStats(t, lr, gn, wn, None, None, "no step yet: the weights are the initial ones", size=w.size)
    not_applied = not_applied_last(read, plan) if plan is not None and config.nan_check else ""
    if not_applied:
        return UpdateStats(t, lr, gn, wn, None, None, not_applied, size=w.size)
    if not (np.isfinite(g).all() and np.isfinite(w).all()):
        what = "the gradient holds NaN/Inf" if not np.isfinite(g).all() else "the weights hold NaN/Inf"
        return UpdateStats(t, lr, gn, wn, None, None, f"{what}: training diverged (nan_check is off)"
                           if not config.nan_check else what, size=w.size)
    old, how = _old_weights(read, config, name, w, g, t, lr)
    dw = w - old.astype(w32.dtype).astype(np.float64)  # both float32 values: the change the arena holds
    changed = int(np.count_nonzero(dw))
    if changed < w.size:
        how += f"; {changed:,} of {w.size:,} weights changed (the rest by less than float32 resolves)"
    un = _norm(dw)
    clip = read("clip.norm").astype(np.float64) if config.clip_grad_norm is not None else None
    return UpdateStats(t, lr, gn, wn, un, un / wn if wn else None, how, _norm(w - old), changed, w.size,
                       None if clip is None else float(clip[0]), None if clip is None else float(clip[1]))


def _old_weights(read: Reader, config: TaskConfig, name: str, w: np.ndarray, g: np.ndarray, t: int,
                 lr: float) -> tuple[np.ndarray, str]:
    """W before the last step (float64) from the optimizer's state, and how: its definition's inverse
    (renaissance_nb/optim/, ``old_weights``)."""
    p = config.optimizer.graph_params()
    return definition(p["kind"], "tensor_stats").old_weights(read, name, w, g, t, lr, p)


def stats_from(read: Reader, plan: MemoryPlan, config: TaskConfig, name: Any, bins: Any = BINS) -> TensorStats:
    """The statistics of tensor ``name`` of ``plan``, its values read with ``read``; the last update for
    a trained parameter (``last_update``)."""
    if not isinstance(name, str) or not any(t.name == name for t in plan):
        raise bad_argument(PlanError, "tensor_stats", "name", name, "the name of a tensor of the plan",
                           "pass a name from task.memory, e.g. 'fc1.weight'")
    if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)) or not 1 <= bins <= 10_000:
        raise bad_argument(ConfigError, "tensor_stats", "bins", bins, "an int in [1, 10000]", "pass bins=30")
    t = plan[name]
    values = value_stats(read(name), int(bins))
    update = last_update(read, config, name, plan) if is_parameter(plan, name) else None
    return TensorStats(name, tuple(int(d) for d in t.shape), str(t.dtype), values, update)


def tensor_stats(task: DeepLearningTask, name: Any, bins: Any = BINS) -> TensorStats:
    """What tensor ``name`` of a compiled task holds now (read with ``task.read``, the train_base view):
    histogram, range, moments, NaN/Inf counts, and for a trained parameter its last update."""
    task.read("step")  # the phase check, with the task's own message, before anything else
    return stats_from(task.read, task.memory, task.config, name, bins)

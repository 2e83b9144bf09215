"""The training monitor's view: epoch records, the per-step loss and lr curves, the run's status.

Split from views.py (the other artifacts' views) to keep each module one job; views re-exports these names."""
from __future__ import annotations

import math
from typing import Any

import numpy as np


# ---- training --------------------------------------------------------------------------------------
def finite_or_none(v: Any) -> float | None:
    """A float for JSON: NaN and inf (a diverged run) become None, which JSON has and the widgets skip."""
    return None if v is None or not math.isfinite(v) else float(v)


def record_dict(rec: Any) -> dict[str, Any]:
    return {k: (finite_or_none(v) if isinstance(v, float) else v) for k, v in rec.__dict__.items()}


CURVE_POINTS = 2000
"""The most points a per-step curve has in a view: a run of a million steps would otherwise send
megabytes to the widget on every update and take seconds to draw; at this resolution the
curves keep their shape."""


def curve_every(total_steps: int) -> int:
    """Steps per point of a per-step curve: the smallest power of two that keeps ``total_steps``
    (the planned steps, fixed for a run, so points do not move as it grows) under CURVE_POINTS."""
    every = 1
    while -(-max(int(total_steps), 0) // every) > CURVE_POINTS:
        every *= 2
    return every


def _json_floats(a: np.ndarray) -> list[float | None]:
    """float64 values as JSON numbers, the non-finite ones as None (finite_or_none, vectorised)."""
    out: list[float | None] = a.tolist()
    for i in np.flatnonzero(~np.isfinite(a)):
        out[i] = None
    return out


def step_curve(values: np.ndarray, every: int, mean: bool = True) -> list[float | None]:
    """A per-step series at one point per ``every`` steps, each at its block's last step: the
    block's mean (losses; a block holding a non-finite value is a gap) or its last value (rates)."""
    v = np.asarray(values, np.float64)
    if every <= 1 or not v.size:
        return _json_floats(v)
    starts = np.arange(0, v.size, every)
    if mean:
        return _json_floats(np.add.reduceat(v, starts) / np.diff(np.append(starts, v.size)))
    return _json_floats(v[np.minimum(starts + every, v.size) - 1])


def learning_rates(task: Any) -> np.ndarray:
    """The rate of every planned step: the arena's table once compiled (the rates in force, which
    ReduceLROnPlateau lowers as epochs end), else the plan's; empty while the schedule does not fit."""
    try:
        if getattr(task, "splits", None) is None:
            return np.zeros(0)
        lr = task.lr_table()
        if getattr(task, "executor", None) is not None:
            lr = task.executor.view("train_base", "lr_table")[: len(lr)]
        return lr
    except Exception:  # a schedule that does not fit the data yet: no curve, no traceback
        return np.zeros(0)


def run_status(view: dict[str, Any]) -> str:
    """What a training view's run stands at: idle (no epoch yet), paused (epochs trained, more to run), done,
    or interrupted (the live monitor and its saved copy say the same)."""
    records = view["records"]
    if view["interrupted"]:
        return "interrupted"
    if not records:
        return "idle"
    return "done" if records[-1]["epoch"] >= view["total_epochs"] else "paused"


def training_view(task: Any) -> dict[str, Any]:
    """History so far, per-step losses and the learning-rate schedule (curves of at most
    CURVE_POINTS points: ``loss_every``/``lr_every`` steps a point, see step_curve)."""
    res = getattr(task, "result", None)
    records = [record_dict(r) for r in getattr(res, "history", [])]
    losses = getattr(res, "step_losses", None)
    lr = learning_rates(task)
    spe = int(getattr(task, "steps_per_epoch", 0) or 0)
    total = int(getattr(task, "settings", {}).get("total_epochs", 0) or 0)
    every = curve_every(max(spe * total, len(lr), 0 if losses is None else len(losses)))
    n = 0 if losses is None else len(losses)
    return {"records": records, "step_losses": step_curve(losses, every) if n else [], "loss_every": every,
            "loss_steps": n, "lr": step_curve(lr, every, mean=False), "lr_every": every, "lr_steps": len(lr),
            "total_epochs": total, "steps_per_epoch": spe, "interrupted": bool(getattr(res, "interrupted", False))}

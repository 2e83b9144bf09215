"""The learning-rate range test (fastai's ``lr_find``, Lightning's ``Tuner.lr_find``) on the compiled step.

Why here, and why it is cheap: the schedule is compiled into the step as a table the optimizer reads by its
step count (``lr_table``). A range test is the same compiled step replayed with another table: an
exponential ramp from ``start_lr`` to ``end_lr``, one value per step, the optimizer's state started afresh
(moments zero, step count 0) on the task's current weights. Each step's training loss is read from the
step's own result tensor. The table's last entry serves every step past its end (the optimizer reads
``lr_table[min(step, len - 1)]``), so the test may run more steps than the task's schedule holds. The arena is
restored afterwards (allocations.arena_restored), so the task trains on as
if nothing ran: no copy of the model, nothing re-planned or re-bound.

The suggestion is Lightning's: the learning rate where the smoothed loss falls fastest (its steepest
descent against log lr), the first ``SKIP_BEGIN`` steps and the last left out. It is a place to start
looking, not an answer: the plot says more.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigError, NumericalError, bad_argument
from ..progress import make_progress, progress_kind
from .allocations import arena_restored, check_steps, measurable_runner, not_distributed, step_sequence

if TYPE_CHECKING:
    from ..runtime.runner import Runner

SMOOTHING = 0.98
"""The loss's exponential moving average (with bias correction), as fastai's and Lightning's."""
DIVERGE = 4.0
"""The test stops when the smoothed loss passes this many times its lowest value (fastai's, Lightning's)."""
SKIP_BEGIN, SKIP_END = 10, 1
"""Steps left out at each end when the suggestion looks for the steepest descent (Lightning's defaults)."""
STATE_FAMILIES = ("M_", "V_")
"""Regions of the optimizer's running state, zeroed for the test: a fresh optimizer, as a new one has."""


@dataclass(frozen=True)
class LRRangeTest:
    """Each step's learning rate and training loss (the batch mean, as the step's loss log has it), the
    smoothed loss, and why the test ended."""

    lrs: np.ndarray
    losses: np.ndarray
    smoothed: np.ndarray
    stopped: str

    @property
    def suggestion(self) -> float | None:
        """The lr where the smoothed loss falls fastest against log lr (None for a test too short to say)."""
        s = self.smoothed[SKIP_BEGIN:len(self.smoothed) - SKIP_END]
        if s.size < 3:
            return None
        return float(self.lrs[SKIP_BEGIN + int(np.argmin(np.gradient(s)))])

    @property
    def best(self) -> tuple[float, float]:
        """(lr, smoothed loss) at the lowest finite smoothed loss (a test that ends on a non-finite loss
        records it last)."""
        finite = np.where(np.isfinite(self.smoothed), self.smoothed, np.inf)
        i = int(np.argmin(finite))
        return float(self.lrs[i]), float(self.smoothed[i])

    def rows(self) -> list[dict[str, float]]:
        return [{"lr": float(a), "loss": float(b), "smoothed": float(c)}
                for a, b, c in zip(self.lrs, self.losses, self.smoothed)]

    def summary(self) -> str:
        lo, hi = (f"{v:.3g}" for v in (self.lrs[0], self.lrs[-1]))
        lr, loss = self.best
        hint = "too few steps to suggest one" if self.suggestion is None else f"steepest descent at {self.suggestion:.3g}"
        return (f"{len(self.lrs)} steps from lr {lo} to {hi} ({self.stopped}); lowest smoothed loss {loss:.4f} at "
                f"lr {lr:.3g}; {hint}")

    def __repr__(self) -> str:
        return f"<LRRangeTest {self.summary()}>"

    def plot(self, ax: Any = None, suggest: bool = True) -> Any:
        """The smoothed loss against lr on a log axis (matplotlib, the notebook extra's), the raw losses faint,
        the suggestion marked; returns the figure (the axes' when ``ax`` is given)."""
        try:
            from matplotlib.figure import Figure
        except ImportError:
            raise ConfigError("LRRangeTest.plot: needs matplotlib. Fix: pip install 'renaissance_nb[notebook]', "
                              "or read .rows()") from None
        fig = None
        if ax is None:
            fig = Figure(figsize=(6, 3.5))
            ax = fig.add_subplot()
        ax.plot(self.lrs, self.losses, color="0.75", linewidth=0.8, label="loss of each step")
        ax.plot(self.lrs, self.smoothed, color="C0", label="smoothed")
        if suggest and self.suggestion is not None:
            i = int(np.searchsorted(self.lrs, self.suggestion))
            ax.plot([self.suggestion], [self.smoothed[i]], "o", color="C3", label=f"suggestion {self.suggestion:.2g}")
        finite = self.smoothed[np.isfinite(self.smoothed)]
        if finite.size:  # the smoothed curve's range: a diverging step's raw loss would flatten the rest
            raw = self.losses[np.isfinite(self.losses)]
            lo, hi = float(min(finite.min(), raw.min())), float(max(finite[0], finite[-1]))
            pad = 0.05 * (hi - lo) or 0.05 * abs(hi) or 0.05
            ax.set_ylim(lo - pad, hi + pad)
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel("training loss")
        ax.legend(frameon=False)
        if fig is not None:
            fig.tight_layout()
        return fig if fig is not None else ax.figure


def lr_ramp(start_lr: Any, end_lr: Any, steps: Any) -> np.ndarray:
    """The test's learning rates, one a step, after checking its arguments (task.lr_find checks them before it
    compiles anything)."""
    steps = check_steps("lr_find", steps)
    for name, v in (("start_lr", start_lr), ("end_lr", end_lr)):
        ok = not isinstance(v, bool) and isinstance(v, (int, float, np.integer, np.floating))
        with np.errstate(over="ignore"):
            if not ok or not 0 < float(np.float32(v)) < math.inf:  # the lr table holds float32
                raise bad_argument(ConfigError, "lr_find", name, v, "a number > 0 that float32 holds (the lr "
                                   "table's type)", "e.g. lr_find(1e-7, 10)")
    if not start_lr < end_lr:
        raise bad_argument(ConfigError, "lr_find", "end_lr", end_lr, f"a number above start_lr={start_lr!r}",
                           "e.g. lr_find(start_lr=1e-7, end_lr=10)")
    if steps < 2:
        raise bad_argument(ConfigError, "lr_find", "steps", steps, "an int >= 2", "pass steps=100")
    return (float(start_lr) * (float(end_lr) / float(start_lr)) ** (np.arange(steps) / (steps - 1))).astype(np.float32)


def check_lr_find(config: Any, start_lr: Any, end_lr: Any, steps: Any, progress: Any) -> None:
    """task.lr_find's arguments, and what measurable_runner refuses once compiled, checked before anything
    compiles (a refused call leaves the task in its phase)."""
    lr_ramp(start_lr, end_lr, steps)
    progress_kind(progress, "lr_find")
    replayable_here(config, "lr_find")


def replayable_here(config: Any, op: str) -> None:
    """What measurable_runner refuses once compiled, refused from the settings before anything compiles."""
    not_distributed(config, op)
    if config.device == "cuda":
        raise ConfigError(f"{op}: the task runs on cuda; this replays the CPU step. Fix: run it on a task built "
                          "with device('cpu'), then train on the GPU with the rate it suggests.")


def _fresh_optimizer(runner: "Runner") -> None:
    """Moments zeroed and the step count 0, in the arena (restored afterwards)."""
    plan = runner.compiled.plan
    for t in plan:
        if t.region.name.startswith(STATE_FAMILIES):
            runner.view(t.name)[...] = 0
    runner.view("step")[...] = 0


def lr_range_test(runner: "Runner | None", start_lr: Any = 1e-7, end_lr: Any = 10.0, steps: Any = 100,
                  progress: str = "auto") -> LRRangeTest:
    """Replay ``steps`` training steps (from batch 0, wrapping into the next pass) with the learning rate
    rising exponentially from ``start_lr`` to ``end_lr``, stopping early when the smoothed loss diverges or a
    loss is not finite; the arena is restored afterwards."""
    runner = measurable_runner(runner, "lr_find")
    table = runner.view("lr_table")
    ramp = lr_ramp(start_lr, end_lr, steps)
    n = len(ramp)
    losses: list[float] = []
    smoothed: list[float] = []
    stopped = "end_lr reached"
    bar = make_progress(progress_kind(progress, "lr_find"), n, "lr_find")
    order = runner.env.perms["train"]
    saved_order = order.copy()  # host state (checkpoints save it): put back as the arena is
    with arena_restored(runner):
        _fresh_optimizer(runner)
        runner.shuffle_into("train", 0)  # the first epoch's order, as run() draws it (a fresh task holds 0..n-1)
        step, result = runner.view("step"), runner.view("result")
        _, sequence = step_sequence(runner, n, packed=True)
        avg = 0.0
        try:
            for i, program in sequence:
                if i >= 0:  # the optimizer reads lr_table[step], the last entry past the table's end
                    table[min(int(step[0]), table.size - 1)] = ramp[len(losses)]
                try:
                    for kernel in program:
                        kernel()
                except NumericalError:  # nan_policy="raise": the step's NaN check stopped it, which ends the test
                    result[0] = np.nan
                if i < 0:  # the rewind and prologue of a pass
                    continue
                loss = float(result[0])  # the step's batch loss (its loss log ends with the task's steps)
                losses.append(loss)
                bar.update(1, loss)
                if not math.isfinite(loss):
                    smoothed.append(loss)
                    stopped = f"a loss or gradient was not finite at step {len(losses)}"
                    break
                avg = SMOOTHING * avg + (1 - SMOOTHING) * loss
                smoothed.append(avg / (1 - SMOOTHING ** len(losses)))
                if smoothed[-1] > DIVERGE * min(smoothed):
                    stopped = f"the smoothed loss passed {DIVERGE:g}x its lowest at step {len(losses)}"
                    break
        finally:
            bar.close()
            order[:] = saved_order
    k = len(losses)
    return LRRangeTest(ramp[:k].astype(np.float64), np.asarray(losses), np.asarray(smoothed), stopped)

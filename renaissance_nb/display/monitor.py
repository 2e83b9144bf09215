"""TrainingMonitor: live loss, top-1, learning-rate and step-time curves, as a run() callback.

    monitor = TrainingMonitor(task)
    display(monitor)
    task.run(callbacks=[monitor])      # the engine calls monitor("epoch", EpochRecord)

While a run reports to it, the monitor shows a stop button: the front end interrupts the kernel through
its own connection (a widget message would wait for run() to end), and the trainer turns that SIGINT
into a stop at the next step boundary, resumable as Ctrl-C's (runtime/interrupt.py).

The curves are drawn by the front end from a few synced lists; each epoch appends
to them, and the view updates its SVG paths in place (no flicker, no re-render).
The static copy a saved notebook keeps (nbconvert, GitHub) is read from the task when
the monitor is displayed, and replaced when a run ends, so it shows the curves too.
"""
from __future__ import annotations

import time
import warnings
from typing import Any

import traitlets

from ..text import plural
from . import static, views
from ._assets import esm
from ._base import ViewWidget


class TrainingMonitor(ViewWidget):
    """Curves of a task's training. Call it as ``monitor(event, payload)``, or use ``monitor.run()``."""

    _esm = esm("monitor.js")
    records = traitlets.List().tag(sync=True)
    step_losses = traitlets.List().tag(sync=True)  # one point per loss_every steps (views.step_curve)
    loss_every = traitlets.Int(1).tag(sync=True)
    loss_steps = traitlets.Int(0).tag(sync=True)  # the steps step_losses covers
    lr = traitlets.List().tag(sync=True)
    lr_every = traitlets.Int(1).tag(sync=True)
    lr_steps = traitlets.Int(0).tag(sync=True)  # the steps lr covers: all the planned ones
    total_epochs = traitlets.Int(0).tag(sync=True)
    steps_per_epoch = traitlets.Int(0).tag(sync=True)
    status = traitlets.Unicode("idle").tag(sync=True)
    controls = traitlets.Bool(False).tag(sync=True)
    error = traitlets.Dict().tag(sync=True)
    progress = traitlets.Dict().tag(sync=True)  # within a run: step_progress(); {} when no run reports

    def __init__(self, task: Any, controls: bool = False, **kwargs: Any) -> None:
        super().__init__(task, controls=controls, **kwargs)
        self.on_msg(self._on_msg)

    def make_view(self) -> dict[str, Any]:
        v = views.training_view(self.source)
        with self.hold_sync():  # one message: the front end never draws points with another's spacing
            self.records, self.lr, self.lr_every, self.lr_steps = v["records"], v["lr"], v["lr_every"], v["lr_steps"]
        self._set_losses(v["step_losses"], v["loss_every"], v["loss_steps"])
        self.total_epochs, self.steps_per_epoch = v["total_epochs"], v["steps_per_epoch"]
        self._run_status = views.run_status(v)
        if not getattr(self, "_in_run", False):  # read from the task: after reset(), a resume in code...
            if self.error and getattr(self, "_error_mark", None) != self.task_mark():
                self.error = {}
            if not self.error:
                self.status = self._run_status
        return {"task": getattr(self.source, "name", "task")}

    def static_html(self) -> str:
        """The task's history as it is now (not when this widget was made)."""
        return static.training_html(views.training_view(self.source), self.status)

    def one_line(self) -> str:
        v = views.training_view(self.source)
        stopped = " (interrupted)" if v["interrupted"] else ""
        if not v["records"]:
            done = "interrupted before its first epoch ended" if v["interrupted"] else "not trained yet"
            return f"{done}, {plural(v['total_epochs'], 'epoch')} planned"
        last = v["records"][-1]
        val = "" if last["val_top1"] is None else f", val top-1 {100 * last['val_top1']:.2f}%"
        return (f"epoch {last['epoch']}/{v['total_epochs']}{stopped}, train loss "
                f"{static.metric_text(last['train_loss'], '.4f')}{val}")

    # ---- the callback the engine calls ------------------------------------------------------------
    _last_push = 0.0
    _run_start: tuple[float, int] | None = None  # (time, step) when the run started reporting

    def __call__(self, event: str, payload: Any = None) -> None:
        if event == "epoch" and payload is not None:
            rec = views.record_dict(payload)
            self.status = "done" if self.total_epochs and rec["epoch"] >= self.total_epochs else "running"
            self.records = [*self.records, rec]
            self._losses_so_far(int(getattr(payload, "steps", 0)))
            self._rates_in_force()
        elif event == "step" and isinstance(payload, dict) and "step" in payload:
            now = time.monotonic()
            if now - self._last_push >= 0.5:  # at most two updates a second: no flicker, little traffic
                self._last_push = now
                self._losses_so_far(int(payload["step"]))
                self.progress = self.step_progress(int(payload["step"]), now)
        elif event == "start" and isinstance(payload, dict):
            self.status = "running"
            self._run_start = None
        elif event == "end":  # the run is over (done, stopped early or interrupted): read it all again
            self._run_start, self.progress = None, {}
            self.refresh()  # and the static copies (ViewWidget.update_copies)

    def step_progress(self, step: int, now: float) -> dict[str, Any]:
        """Where a run stands at global step ``step``: the epoch and the step within it, steps per second
        since the run's first report, and the time left at that rate (None until two reports)."""
        spe = max(int(self.steps_per_epoch or getattr(self.source, "steps_per_epoch", 0) or 1), 1)
        total = max(int(getattr(self.source, "total_steps", 0) or 0), self.total_epochs * spe)
        if self._run_start is None or step < self._run_start[1]:
            self._run_start = (now, step)
        t0, s0 = self._run_start
        rate = (step - s0) / (now - t0) if now > t0 and step > s0 else None
        return {"step": step, "total_steps": total, "epoch": min(step // spe + 1, max(self.total_epochs, 1)),
                "step_in_epoch": step - (step // spe) * spe, "steps_per_epoch": spe,
                "steps_per_s": rate, "seconds_left": (total - step) / rate if rate else None}

    def _rates_in_force(self) -> None:
        """The lr curve again: ReduceLROnPlateau lowers the arena's table as an epoch ends."""
        lr = views.learning_rates(self.source)
        every = views.curve_every(max(getattr(self.source, "total_steps", 0) or 0, len(lr)))
        with self.hold_sync():
            self.lr, self.lr_every, self.lr_steps = views.step_curve(lr, every, mean=False), every, len(lr)

    def _losses_so_far(self, steps: int) -> None:
        """Show the per-step losses the compiled step has logged into its arena so far (read-only),
        at the curve's fixed resolution (views.curve_every of the planned steps)."""
        ex = getattr(self.source, "executor", None)
        if ex is None or steps <= 0:
            return
        try:
            log = ex.view("train_base", "loss_log")[:steps]
        except Exception:  # the log is an engine detail: without it the curve shows epochs only
            return
        every = views.curve_every(max(getattr(self.source, "total_steps", 0) or 0, steps))
        self._set_losses(views.step_curve(log, every), every, int(log.size))

    def _set_losses(self, points: list[float | None], every: int, steps: int) -> None:
        with self.hold_sync():  # one message: the front end never sees points with the old spacing
            self.step_losses, self.loss_every, self.loss_steps = points, every, steps

    # ---- running from the widget ---------------------------------------------------------------------
    def run(self, epochs: int | None = None, **kwargs: Any) -> Any:
        """``task.run(...)`` with this monitor among the callbacks; errors shown in the widget."""
        callbacks = [self, *kwargs.pop("callbacks", ())]
        self.status, self.error = "running", {}
        result = None
        failed = False
        try:
            with warnings.catch_warnings(record=True) as caught:  # e.g. "nothing to run": shown, not logged
                warnings.simplefilter("always")
                result = self.source.run(epochs, callbacks=callbacks, **kwargs)
            notes = [w for w in caught if issubclass(w.category, UserWarning)]
            if notes:
                self.error = {"type": "UserWarning", "message": str(notes[-1].message)}
        except Exception as exc:
            self.error, failed = {"type": type(exc).__name__, "message": str(exc)}, True
        finally:
            self._error_mark = self.task_mark()
            self._in_run = True
            try:
                self.refresh()
            finally:
                self._in_run = False
            self.status = "error" if failed else self._run_status  # as the refresh just read the task
            self._changed()
            self.tell_peers()
        return result

    def _on_msg(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if isinstance(content, dict) and content.get("action") == "run":
            epochs = content.get("epochs")
            if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int)):
                self.error = {"type": "ValueError", "message": f"run: epochs={epochs!r} from the widget is not a "
                                                               "whole number; nothing was run."}
                return
            self.run(epochs, progress=False)

"""Progress for long runs: a tqdm.auto bar in notebooks, plain lines in terminals (one per epoch,
and one every LINE_EVERY_S seconds inside a long epoch).

The engine never imports Jupyter; tqdm.auto picks its notebook form by itself.
"""
from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

SLOW_START_S = 3.0
"""If a run's first step takes longer than this, the progress says why: a warm first step
loads its kernels in under a second, while after an install numba compiles them (about 14 s
for the MLP's on a 2-core machine), which looked like a hang."""
SLOW_START_NOTE = ("the first step is compiling the kernels: numba does this once after an install, "
                   "later runs load them from its disk cache")


LINE_EVERY_S = 20.0
"""Inside an epoch, a terminal gets a line at most this often: an epoch of the MLP over 540k
samples ran 86 s with nothing printed, a CLI run at batch 8 half a minute."""


def in_notebook() -> bool:
    """True inside a Jupyter kernel (ipykernel loaded and an IPython shell running)."""
    if "ipykernel" not in sys.modules:
        return False
    try:
        from IPython import get_ipython
        return get_ipython() is not None and "IPKernelApp" in get_ipython().config
    except Exception:  # pragma: no cover - any IPython oddity means "not a notebook"
        return False


class NoProgress:
    """Shows nothing; the base of the others. ``arm`` before a run's first step and ``disarm``
    after it time the slow-start notice."""

    _timer: threading.Timer | None = None

    def arm(self, seconds: float | None = None) -> None:
        """Call ``slow_start`` from a timer thread unless ``disarm`` comes within ``seconds``
        (default ``SLOW_START_S``)."""
        self.disarm()
        self._timer = threading.Timer(SLOW_START_S if seconds is None else seconds, self.slow_start)
        self._timer.daemon = True
        self._timer.start()

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    @contextmanager
    def armed(self, seconds: float | None = None) -> Iterator[None]:
        """``arm`` for the length of a block: an error in the first steps leaves no timer behind."""
        self.arm(seconds)
        try:
            yield
        finally:
            self.disarm()

    def slow_start(self) -> None:
        pass

    def update(self, steps: int, loss: float) -> None:
        pass

    def epoch(self, record: Any) -> None:
        pass

    def stopped(self, epoch: int, step: int, steps: int, why: str = "Ctrl-C") -> None:
        """The run was asked to stop (Ctrl-C, the notebook's stop button, a callback) and did, after ``step``."""

    def note(self, text: str) -> None:
        """A line about the run (an early stop after an epoch)."""

    def close(self) -> None:
        self.disarm()


def stopped_line(epoch: int, step: int, steps: int, why: str = "Ctrl-C") -> str:
    return f"stopped after step {step:,} of {steps:,} in epoch {epoch} ({why})"


class LineProgress(NoProgress):
    """One line per epoch on stdout, one if the first step is slow, and inside a long epoch one
    every LINE_EVERY_S seconds: the step, the loss, the time per step and the epoch's rest."""

    def __init__(self, steps_per_epoch: int = 0, epoch: int = 1, step: int = 0) -> None:
        self.spe, self.epoch_no, self.step = steps_per_epoch, epoch, step  # the epoch running, its steps done
        self._since, self._steps_since = time.monotonic(), 0

    def slow_start(self) -> None:
        print(f"... {SLOW_START_NOTE}", flush=True)

    def disarm(self) -> None:
        """After the run's first step: the time per step is timed from here, without the kernels'
        loading or compiling that the first step may have done."""
        super().disarm()
        self._since, self._steps_since = time.monotonic(), 0

    def update(self, steps: int, loss: float) -> None:
        self.step += steps
        self._steps_since += steps
        now = time.monotonic()
        if now - self._since < LINE_EVERY_S or not self._steps_since:
            return
        per = (now - self._since) / self._steps_since
        of = f"/{self.spe:,}" if self.spe else ""
        rest = f", epoch ends in about {_duration(per * (self.spe - self.step))}" if self.spe > self.step else ""
        print(f"  epoch {self.epoch_no}: step {self.step:,}{of}, loss {loss:.4f}, {1e3 * per:.2f} ms/step{rest}",
              flush=True)
        self._since, self._steps_since = now, 0

    def stopped(self, epoch: int, step: int, steps: int, why: str = "Ctrl-C") -> None:
        print(stopped_line(epoch, step, steps, why), flush=True)

    def note(self, text: str) -> None:
        print(text, flush=True)

    def epoch(self, record: Any) -> None:
        print(record.line(), flush=True)
        self.epoch_no, self.step = record.epoch + 1, 0
        self._since, self._steps_since = time.monotonic(), 0


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


class BarProgress(NoProgress):
    """A tqdm.auto bar over steps, the loss in its postfix, a line per epoch.

    In a notebook the bar is a widget whose text/plain was taken when it was shown (0%): a saved
    notebook, nbconvert's HTML and a notebook reopened after a restart (where the widget's model is
    gone) would show that forever. So the bar is shown here, under a display id, and ``close`` puts
    the bar as it ended (``final_bundle``: an HTML bar and tqdm's own line) in its place.
    """

    def __init__(self, total: int, desc: str, done: int = 0) -> None:
        """``total`` steps in the run, ``done`` of them already (a resume inside an epoch)."""
        from tqdm.auto import tqdm
        self.desc = desc
        self.noted = False
        self._lock = threading.Lock()  # the timer thread's note and the run thread's disarm, one at a time
        widget = in_notebook() and any(c.__module__ == "tqdm.notebook" for c in tqdm.__mro__)
        self.bar = tqdm(total=total, initial=done, desc=desc, unit="step", **({"display": False} if widget else {}))
        self.shown = None  # the display handle of a notebook's bar
        if widget:
            from IPython.display import display
            self.shown = display(self.bar.container, display_id=True)

    def slow_start(self) -> None:
        with self._lock:
            if self._timer is None:  # disarmed while the timer fired
                return
            self.noted = True
            self.bar.set_description_str(f"{self.desc}: {SLOW_START_NOTE}")

    def disarm(self) -> None:
        with self._lock:
            super().disarm()
            if self.noted:  # the first step is done: the bar's own name again
                self.noted = False
                self.bar.set_description_str(self.desc)

    def update(self, steps: int, loss: float) -> None:
        if steps:
            self.bar.update(steps)
            self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)

    def epoch(self, record: Any) -> None:
        self.bar.write(record.line())

    def stopped(self, epoch: int, step: int, steps: int, why: str = "Ctrl-C") -> None:
        self.bar.write(stopped_line(epoch, step, steps, why))

    def note(self, text: str) -> None:
        self.bar.write(text)

    def close(self) -> None:
        self.disarm()
        self.bar.close()
        if self.shown is not None:  # the final bar replaces the widget, which is released
            self.shown.update(final_bundle(self.bar), raw=True)
            self.shown = None
            self.bar.container.close()


def final_bundle(bar: Any) -> dict[str, str]:
    """A finished tqdm bar as an output: tqdm's own line (text/plain) and the same as HTML with a
    <progress> element (no style sheet or script needed), green when it ran to the end."""
    import html

    d = dict(bar.format_dict)  # read once: the line and the HTML say the same elapsed time
    line = bar.format_meter(**d)
    d["bar_format"] = (d.get("bar_format") or "{l_bar}<bar/>{r_bar}").replace("{bar}", "<bar/>")
    left, _, right = bar.format_meter(**d).partition("<bar/>")
    n, total = d["n"], d["total"] or d["n"] or 1
    colour = "#4f9d4a" if d["n"] >= total else "#cc4455"
    page = (f"<div class='rnb-progress-final' style='display:flex;gap:8px;align-items:center;"
            f"font-family:monospace;font-size:12px'><span>{html.escape(left.rstrip('|'))}</span>"
            f"<progress value='{n}' max='{total}' style='flex:0 1 40%;accent-color:{colour}'></progress>"
            f"<span>{html.escape(right.lstrip('|'))}</span></div>")
    return {"text/plain": line, "text/html": page}


def progress_kind(progress: Any, where: str = "run") -> str:
    """run()'s (or ``where``'s) progress argument as one of "auto", "bar", "lines", "none"."""
    import numpy as np

    from .errors import ConfigError, bad_argument
    if progress is None or (isinstance(progress, (bool, np.bool_, int, np.integer)) and progress in (0, 1)):
        return "auto" if progress else "none"
    if isinstance(progress, str) and progress in ("auto", "bar", "lines", "none"):
        return progress
    raise bad_argument(ConfigError, where, "progress", progress, "'auto' (or True), 'bar', 'lines', or False/None",
                       f"e.g. {where}(progress=False) for no output, {where}(progress='lines') for plain lines")


def make_progress(kind: str | bool, total: int, desc: str, steps_per_epoch: int = 0, epoch: int = 1,
                  step: int = 0) -> NoProgress:
    """'auto': a bar in notebooks, lines in terminals; 'bar', 'lines', or False for none. A run
    starts in ``epoch`` (1-based) with ``step`` of its ``steps_per_epoch`` steps done (a resume)."""
    if kind is False or kind == "none":
        return NoProgress()
    if kind == "bar" or (kind in ("auto", True) and in_notebook()):
        return BarProgress(total, desc, step)
    return LineProgress(steps_per_epoch, epoch, step)

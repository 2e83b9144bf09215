"""Progress for long runs: a tqdm.auto bar in notebooks, one plain line per epoch in terminals.

The engine never imports Jupyter; tqdm.auto picks its notebook form by itself.
"""
from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from typing import Any, Iterator

SLOW_START_S = 3.0
"""If a run's first step takes longer than this, the progress says why: a warm first step
loads its kernels in under a second, while after an install numba compiles them (about 14 s
for the MLP's on a 2-core machine), which looked like a hang."""
SLOW_START_NOTE = ("the first step is compiling the kernels: numba does this once after an install, "
                   "later runs load them from its disk cache")


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

    def close(self) -> None:
        self.disarm()


class LineProgress(NoProgress):
    """One line per epoch on stdout (and one if the first step is slow)."""

    def slow_start(self) -> None:
        print(f"... {SLOW_START_NOTE}", flush=True)

    def epoch(self, record: Any) -> None:
        print(record.line(), flush=True)


class BarProgress(NoProgress):
    """A tqdm.auto bar over steps, the loss in its postfix, a line per epoch."""

    def __init__(self, total: int, desc: str) -> None:
        from tqdm.auto import tqdm
        self.desc = desc
        self.noted = False
        self._lock = threading.Lock()  # the timer thread's note and the run thread's disarm, one at a time
        self.bar = tqdm(total=total, desc=desc, unit="step")

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

    def close(self) -> None:
        self.disarm()
        self.bar.close()


def make_progress(kind: str | bool, total: int, desc: str) -> NoProgress:
    """'auto': a bar in notebooks, lines in terminals; 'bar', 'lines', or False for none."""
    if kind is False or kind == "none":
        return NoProgress()
    if kind == "bar" or (kind in ("auto", True) and in_notebook()):
        return BarProgress(total, desc)
    return LineProgress()

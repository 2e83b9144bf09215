"""Progress for long runs: a tqdm.auto bar in notebooks, one plain line per epoch in terminals.

The engine never imports Jupyter; tqdm.auto picks its notebook form by itself.
"""
from __future__ import annotations

import sys
from typing import Any


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
    def update(self, steps: int, loss: float) -> None:
        pass

    def epoch(self, record: Any) -> None:
        pass

    def close(self) -> None:
        pass


class LineProgress(NoProgress):
    """One line per epoch on stdout."""

    def epoch(self, record: Any) -> None:
        print(record.line(), flush=True)


class BarProgress(NoProgress):
    """A tqdm.auto bar over steps, the loss in its postfix, a line per epoch."""

    def __init__(self, total: int, desc: str) -> None:
        from tqdm.auto import tqdm
        self.bar = tqdm(total=total, desc=desc, unit="step")

    def update(self, steps: int, loss: float) -> None:
        if steps:
            self.bar.update(steps)
            self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)

    def epoch(self, record: Any) -> None:
        self.bar.write(record.line())

    def close(self) -> None:
        self.bar.close()


def make_progress(kind: str | bool, total: int, desc: str) -> NoProgress:
    """'auto': a bar in notebooks, lines in terminals; 'bar', 'lines', or False for none."""
    if kind is False or kind == "none":
        return NoProgress()
    if kind == "bar" or (kind in ("auto", True) and in_notebook()):
        return BarProgress(total, desc)
    return LineProgress()

"""The Memory tab's allocation count: what replayed training steps allocate, measured on request.

Why on request: the count replays real steps (the arena restored afterwards), seconds of work that
a dashboard refresh must not repeat. The answer stays on screen until the task is compiled again.
"""
from __future__ import annotations

from typing import Any

import ipywidgets as w

from . import static

STEPS = 20


class AllocationsPanel(w.VBox):
    """A button that counts the allocations of ``STEPS`` replayed training steps, and the table it got."""

    def __init__(self, task: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.task = task
        self.add_class("rnb-allocations")
        self.button = w.Button(description=f"Count allocations ({STEPS} steps)",
                               tooltip="Replays training steps and counts numba's and Python's allocations; "
                                       "the weights are restored afterwards")
        self.button.on_click(lambda _: self.count())
        self.out = w.HTML(static.wrap("<div class='rnb-note'>Allocations per training step: not counted yet. "
                                      "The plan holds every buffer a kernel uses; the count checks it.</div>"))
        self.result: Any = None
        self.children = [self.button, self.out]

    def count(self) -> Any:
        """Measure now (``memory_inspector.allocations``) and show the table; errors are shown, not raised."""
        self.button.disabled = True
        self.out.value = static.wrap("<div class='rnb-note'>counting…</div>")
        try:
            self.result = self.task.memory_inspector.allocations(steps=STEPS)
        except Exception as exc:  # noqa: BLE001 - a GPU or MPI task, or a phase: the library's own message
            self.out.value = static.wrap(f"<div class='rnb-error'><b>{type(exc).__name__}</b>"
                                         f"{static.esc(str(exc))}</div>")
        else:
            self.out.value = static.wrap(allocations_html(self.result))
        finally:
            self.button.disabled = False
        return self.result


def allocations_html(result: Any) -> str:
    """The table of a StepAllocations and its one-sentence summary."""
    rows = "".join(f"<tr><td>{static.esc(k)}</td><td>{static.esc(v)}</td></tr>" for k, v in result.rows())
    return (f"<div class='rnb-allocations-result'><table class='rnb-table'>{rows}</table>"
            f"<p class='rnb-caption'>{static.esc(result.summary())}</p></div>")

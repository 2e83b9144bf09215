"""PhaseView: PLANNING -> MEMORY_LOCKED -> COMPILED, the history, and buttons that call the API."""
from __future__ import annotations

from typing import Any

import traitlets

from ..text import plural
from . import static, views
from ._assets import esm
from ._base import ViewWidget

ACTIONS = ("plan", "lock_memory", "compile", "reset", "finalize_memory")


class PhaseView(ViewWidget):
    """The task's phase machine. Each button makes the same call as the API; errors appear in the widget."""

    _esm = esm("phase.js")
    error = traitlets.Dict().tag(sync=True)
    busy = traitlets.Bool(False).tag(sync=True)

    def __init__(self, task: Any, **kwargs: Any) -> None:
        super().__init__(task, **kwargs)
        self.on_msg(self._on_msg)

    def make_view(self) -> dict[str, Any]:
        if self.error and getattr(self, "_error_mark", None) != self.task_mark():
            self.error = {}  # the task has moved on (another widget, or code) since that error
        v = views.phase_view(self.source)
        v["svg"] = static.phase_svg(v)
        return v

    def static_html(self) -> str:
        return static.phase_html(self.view, self.error)

    def one_line(self) -> str:
        v = self.view
        failed = f"; {self.error['action']}() failed: {self.error['type']}" if self.error.get("action") else ""
        return f"{v['kind']} {v['task']!r} in phase {v['current']}, {plural(len(v['history']), 'call')} so far{failed}"

    def act(self, action: str) -> None:
        """Run one phase operation on the task (what a button does); errors land in ``error``."""
        if action not in ACTIONS or not hasattr(self.source, action):
            self.error = {"type": "ValueError", "message": f"{action}() is not an operation of this task."}
            return
        self.busy = True
        try:
            getattr(self.source, action)()
            self.error = {}
        except Exception as exc:  # shown in the widget, not as a traceback
            self.error = {"type": type(exc).__name__, "message": str(exc), "action": action}
            self._error_mark = self.task_mark()
        finally:
            self.busy = False
            self.refresh()
            self._changed()
            self.tell_peers()

    def _on_msg(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if isinstance(content, dict) and content.get("action"):
            self.act(str(content["action"]))

"""The base of every anywidget here: one ES module per widget, one shared style sheet, a view dict."""
from __future__ import annotations

from typing import Any, Callable

import anywidget
import traitlets

from ._assets import css
from .static import wrap


class OneLine:
    """The text/plain of every view: one line saying what it shows.

    Jupyter puts ``repr(widget)`` in text/plain, where a terminal, a log or a text-only viewer
    would otherwise read an object address or a widget's whole HTML value.
    """

    def one_line(self) -> str:  # pragma: no cover - overridden by every view
        return ""

    def __repr__(self) -> str:
        try:
            text = self.one_line()
        except Exception as exc:  # a repr must never raise
            text = f"view failed ({type(exc).__name__})"
        return f"<{type(self).__name__}: {text}>" if text else f"<{type(self).__name__}>"


class ViewWidget(OneLine, anywidget.AnyWidget):
    """Holds a reference to an artifact and a JSON view of it; the ES module draws the view.

    Subclasses set ``_esm = asset("<name>.js")``, ``make_view()``, ``static_html()`` and ``one_line()``.
    """

    _css = css()
    view = traitlets.Dict().tag(sync=True)

    def __init__(self, source: Any, **kwargs: Any) -> None:
        self.source = source
        self._listeners: list[Callable[[Any], None]] = []
        super().__init__(**kwargs)
        self.refresh()

    def make_view(self) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def refresh(self) -> None:
        """Read the artifact again (after a phase change or a run)."""
        self.view = self.make_view()

    def task_mark(self) -> tuple:
        """What changes when the task moves on (its phase, phase calls, epochs trained, settings): an
        error shown since then is stale (a setting fixed in code clears the error it caused)."""
        s = self.source
        history = getattr(getattr(s, "result", None), "history", None) or ()
        settings = getattr(s, "settings", None)
        return (str(getattr(s, "phase", "")), len(getattr(s, "transitions", ()) or ()), len(history),
                repr(settings) if isinstance(settings, dict) else "")

    def static_html(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def _repr_html_(self) -> str:
        """The static fallback kept in the notebook next to the widget (nbconvert, GitHub)."""
        return wrap(self.static_html())

    def on_change(self, callback: Callable[[Any], None]) -> None:
        """Call ``callback(self)`` after this widget changed the task (a button was pressed)."""
        self._listeners.append(callback)

    def _changed(self) -> None:
        for cb in self._listeners:
            cb(self)

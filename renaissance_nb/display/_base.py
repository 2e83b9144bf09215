"""The base of every anywidget here: one ES module per widget, one shared style sheet, a view dict."""
from __future__ import annotations

from typing import Any, Callable

import anywidget
import traitlets

from . import peers
from ._assets import css
from .static import static_copy, wrap

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def live_bundle(widget: Any) -> dict[str, Any]:
    """The widget-view output of a displayed widget: the live view and one line of text, no HTML (the
    static copy is an output of its own, shown before it; see ``show_with_copy``)."""
    data = widget._repr_mimebundle_()
    data = data[0] if isinstance(data, tuple) else data
    return {k: v for k, v in (data or {}).items() if k in (WIDGET_VIEW, "text/plain")}


def show_with_copy(copy: dict[str, Any], live: dict[str, Any]) -> Any:
    """Display a view as two outputs: its static copy (under a display id, returned, so it can be kept
    true), then the live widget.

    Why two: a front end shows one mime type per output, and Jupyter's ones prefer the widget view
    whenever they can, even where its model is gone (a reopened notebook after a kernel restart: "model
    not found"; nbconvert's HTML with saved widget state, drawn only by a CDN script). Kept apart, the
    static copy is always in the page, and the style sheet both carry decides: the copy hides once the
    live view next to it has drawn (``.rnb-live``), the live output hides while it has not.
    """
    from IPython.display import display

    handle = display(copy, raw=True, display_id=True)
    display(live, raw=True)
    return handle


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


class _Same:
    """An object in a mark, equal to another only if it is the same object (a TaskConfig's own == would
    compare its data arrays; its id alone could be reused once it is freed)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.obj is self.obj

    __hash__ = None  # type: ignore[assignment]


class ViewWidget(OneLine, anywidget.AnyWidget):
    """Holds a reference to an artifact and a JSON view of it; the ES module draws the view.

    Subclasses set ``_esm = asset("<name>.js")``, ``make_view()``, ``static_html()`` and ``one_line()``.
    """

    _css = css()
    view = traitlets.Dict().tag(sync=True)
    poll_key = traitlets.Unicode().tag(sync=True)  # shared by every view of one task (peers.py)
    view_id = traitlets.Unicode().tag(sync=True)  # this view, as the front end names it in a poll

    def __init__(self, source: Any, **kwargs: Any) -> None:
        self.source = source
        self._listeners: list[Callable[[Any], None]] = []
        self._shown: list[Any] = []  # display handles of this view's static copies
        self._mark: tuple = ()
        super().__init__(poll_key=peers.poll_key(source), **kwargs)
        self.view_id = self.model_id or ""
        self.refresh()
        self.on_msg(self._on_poll)
        peers.join(self.poll_key, self)

    def make_view(self) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def refresh(self) -> None:
        """Read the artifact again (after a phase change or a run), and keep its static copies true."""
        self._mark = self.task_mark()
        self.view = self.make_view()
        self.update_copies()

    def stale(self) -> bool:
        """Whether the task moved on since this view last read it."""
        return self.task_mark() != self._mark

    def _on_poll(self, _widget: Any, content: Any, _buffers: Any) -> None:
        """The front end asks every 1.5 s, once for all the views of a task it shows (``shown``): they
        follow the task (phase calls, compile, run, reset, load, made in code or by another widget)
        without a refresh button."""
        if not (isinstance(content, dict) and content.get("poll")):
            return
        shown = content.get("shown")
        if isinstance(shown, list):
            peers.refresh_shown(self.poll_key, [str(x) for x in shown])
        else:  # one view's own poll
            self.follow()

    def follow(self) -> bool:
        """Re-read the task if it moved on, telling the listeners; whether it had. Called at each poll."""
        moved = self.stale()
        if moved:
            self.refresh()
            self._changed()
        self.polled()
        return moved

    def polled(self) -> None:
        """What a view does at every poll besides following its task (nothing here)."""

    def tell_peers(self) -> None:
        """After a button of this view changed the task: the other views of it shown follow at once."""
        peers.refresh_shown(self.poll_key, skip=self)

    def close(self) -> None:
        try:
            peers.leave(self.poll_key, self)
        except Exception:  # close() also runs from __del__ at interpreter exit, when modules may be gone
            pass
        super().close()

    def task_mark(self) -> tuple:
        """What changes when the task moves on (its phase, phase calls, epochs trained, settings): an
        error shown since then is stale (a setting fixed in code clears the error it caused)."""
        s = self.source
        history = getattr(getattr(s, "result", None), "history", None) or ()
        config = _Same(getattr(s, "config", None))  # frozen, replaced by every setting call
        return (str(getattr(s, "phase", "")), len(getattr(s, "transitions", ()) or ()), len(history),
                config, id(getattr(s, "result", None)),
                bool(getattr(getattr(s, "result", None), "interrupted", False)))

    def static_html(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def _repr_html_(self) -> str:
        """The static fallback kept in the notebook next to the widget (nbconvert, GitHub)."""
        return wrap(self.static_html())

    def copy_bundle(self) -> dict[str, Any]:
        """The static copy's output: the view as HTML, marked so the style sheet can swap it."""
        return {"text/plain": repr(self), "text/html": static_copy(self._repr_html_(), type(self).__name__)}

    def _ipython_display_(self) -> None:
        self._shown.append(show_with_copy(self.copy_bundle(), live_bundle(self)))

    def update_copies(self) -> None:
        """Put the view as it is now into every static copy shown (nbclient and nbconvert apply it to the
        saved notebook; a live front end keeps the widget in front of it)."""
        if self._shown:
            bundle = self.copy_bundle()
            for handle in self._shown:
                handle.update(bundle, raw=True)

    def on_change(self, callback: Callable[[Any], None]) -> None:
        """Call ``callback(self)`` after this widget changed the task (a button was pressed)."""
        self._listeners.append(callback)

    def _changed(self) -> None:
        for cb in self._listeners:
            cb(self)

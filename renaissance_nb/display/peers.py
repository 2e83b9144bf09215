"""The live views of one task, so that they share one poll and follow a button pressed in any of them.

Every view of a task carries the same ``poll_key``: the front end (widgets/dom.js, ``liveView``) sends one
poll per key and interval, naming the views it shows; ``refresh_shown`` re-reads the task into each of
those that is stale. A phase button or a run from one view calls ``refresh_shown`` at once, so the other
views show the result without waiting for the next poll.
"""
from __future__ import annotations

import os
import uuid
import weakref
from collections.abc import Iterable
from typing import Any, Protocol, cast

_RUN = uuid.uuid4().hex[:8]  # this kernel process: a key never matches a view of an earlier kernel


class Peer(Protocol):
    view_id: str

    def follow(self) -> bool: ...


_GROUPS: dict[str, weakref.WeakSet] = {}
_SHOWN: dict[str, set[str]] = {}  # the view ids the front end last said it shows, by key


def poll_key(source: Any) -> str:
    """The key every view of ``source`` shares (its object identity, in this kernel)."""
    return f"{os.getpid()}-{_RUN}-{id(source):x}"


def join(key: str, view: Any) -> None:
    """Count ``view`` among the views of the task of ``key``."""
    _GROUPS.setdefault(key, weakref.WeakSet()).add(view)


def leave(key: str, view: Any) -> None:
    group = _GROUPS.get(key)
    if group is not None:
        group.discard(view)
        if not group:
            _GROUPS.pop(key, None)
            _SHOWN.pop(key, None)


def views_of(key: str) -> list[Peer]:
    """The open views of the task of ``key`` (a closed widget has no comm)."""
    return [cast(Peer, v) for v in list(_GROUPS.get(key, ())) if getattr(v, "comm", None) is not None]


def refresh_shown(key: str, shown: Iterable[str] | None = None, skip: Any = None) -> int:
    """Re-read the task into every stale view of ``key`` that the front end shows (``shown``: view ids;
    None: those it named last). Returns how many were refreshed; ``skip`` is one refreshed already."""
    if shown is not None:
        _SHOWN[key] = set(shown)
    ids = _SHOWN.get(key, set())
    done = 0
    for view in views_of(key):
        if view is skip or view.view_id not in ids:
            continue
        done += bool(view.follow())
    return done

"""Ctrl-C as a request: the trainer stops at the next step boundary, resumable."""
from __future__ import annotations

import signal
import threading
from typing import Any


class StopFlag:
    """Turns Ctrl-C into a request to stop at the next step boundary (main thread only); a second
    Ctrl-C interrupts at once."""

    def __init__(self) -> None:
        self.requested = False
        self._old: Any = None

    def _handler(self, signum, frame) -> None:  # type: ignore[no-untyped-def]
        if self.requested:  # a second Ctrl-C interrupts at once
            signal.signal(signal.SIGINT, self._old)
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self) -> "StopFlag":
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)

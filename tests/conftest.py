"""Fixtures shared by several test modules.

The browser tests' JupyterLab server and Chromium context are session-scoped, so they are defined
once, here: imported into each module instead, every module would hold its own session fixture, and
a second Playwright started while the first still runs fails ("Sync API inside the asyncio loop").
They start only when a test asks for them (tests/browser_lab.py).
"""
from browser_lab import browser_context, lab

__all__ = ["browser_context", "lab"]

"""The dashboard's sections, listed once.

The live dashboard's tabs (dashboard.py) and the static page's foldable sections (static.py, what a
notebook saved without a kernel shows) are both this list, in this order: a view added to one and
not the other, or one left out of the static page, is a test failure (tests/test_display.py), not a
quiet difference. Each side keeps one maker per title; every section here can be drawn statically.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import views


@dataclass(frozen=True)
class Section:
    """One view of a task: its title (the tab's and the section's), whether only a DeepLearningTask has
    it, and whether the static page opens it."""

    title: str
    deep_only: bool = False  # a hand-built TaskBase has no BluePrint, variants, step to scrub or training run
    opened: bool = False


SECTIONS: tuple[Section, ...] = (
    Section("Phases", opened=True),
    Section("BluePrint", deep_only=True),
    Section("Variants", deep_only=True),
    Section("Memory"),
    Section("Inspector", deep_only=True),
    Section("Graph"),
    Section("Atlas"),
    Section("Training", deep_only=True),
)

INSPECTOR_WAITS = "The memory inspector reads the plan that lock_memory() fixes."
"""What the Inspector shows, live and static, before the plan it scrubs exists."""


def sections_of(task: Any) -> tuple[Section, ...]:
    """The sections ``task`` has, in the dashboard's order."""
    deep = views.is_deep(task)
    return tuple(s for s in SECTIONS if deep or not s.deep_only)

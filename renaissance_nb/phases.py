"""The phase machine both task kinds share: PLANNING -> MEMORY_LOCKED -> COMPILED.

A call in the wrong phase raises PhaseError naming the operation, the current phase and the
phase it needs, with the call that gets there. Every phase change is a Transition, kept for the
phase view's history.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum

from .errors import PhaseError


class Phase(Enum):
    """Where a task is in its life; each phase allows a fixed set of operations."""

    PLANNING = "PLANNING"
    MEMORY_LOCKED = "MEMORY_LOCKED"
    COMPILED = "COMPILED"

    def __str__(self) -> str:
        return self.value


PHASE_ALLOWS: dict[Phase, tuple[str, ...]] = {
    Phase.PLANNING: ("alloc", "finalize_memory"),
    Phase.MEMORY_LOCKED: ("add_graph", "compile"),
    Phase.COMPILED: ("run", "read", "write"),
}

_ORDER = {Phase.PLANNING: 0, Phase.MEMORY_LOCKED: 1, Phase.COMPILED: 2}
_STEP_TO = {Phase.MEMORY_LOCKED: "finalize_memory() (DeepLearningTask: lock_memory())",
            Phase.COMPILED: "compile()"}


def phase_fix(current: Phase, needed: Phase) -> str:
    """How to get from the current phase to the needed one, or why you cannot."""
    if _ORDER[current] < _ORDER[needed]:
        return f"Fix: call {_STEP_TO[needed]} first."
    return ("Fix: phases only move forward; build a new task (DeepLearningTask: task.reset()) "
            "to change what is already fixed.")


@dataclass(frozen=True)
class Transition:
    """One phase change (or a timed step within a phase, source == target), for the phase view."""

    source: Phase
    target: Phase
    operation: str
    at: float
    seconds: float


class PhaseMachine:
    """The current phase and the transitions so far; ``require`` guards each public call."""

    def __init__(self) -> None:
        self.phase = Phase.PLANNING
        self.transitions: list[Transition] = []

    def require(self, operation: str, *phases: Phase, hint: str = "") -> None:
        """PhaseError unless the task is in one of ``phases``; ``hint`` says why the call needs it."""
        if self.phase in phases:
            return
        names = [str(p) for p in phases]
        if "Fix" not in hint:
            forward = _ORDER[self.phase] < _ORDER[phases[0]]
            if forward and hint.startswith("Call "):  # the hint is the fix itself: say it once, as the fix
                hint = "Fix: c" + hint[1:]
            else:
                hint = (hint + " " + phase_fix(self.phase, phases[0])).strip()
        raise PhaseError(operation, self.phase, names[0] if len(names) == 1 else names, hint)

    def advance(self, target: Phase, operation: str, started: float) -> None:
        now = time.time()
        self.transitions.append(Transition(self.phase, target, operation, now, now - started))
        self.phase = target

    def note(self, operation: str, started: float) -> None:
        """A timed step that stays in the phase (plan() within PLANNING)."""
        self.advance(self.phase, operation, started)

    def snapshot(self) -> tuple[Phase, list[Transition]]:
        return self.phase, list(self.transitions)

    def restore(self, snap: tuple[Phase, list[Transition]]) -> None:
        self.phase, self.transitions = snap[0], list(snap[1])


class Phased:
    """``phase``, ``transitions`` and the ``_require`` guard of a task that holds its PhaseMachine as
    ``self.phases`` (TaskBase and DeepLearningTask both do)."""

    phases: PhaseMachine

    @property
    def phase(self) -> Phase:
        return self.phases.phase

    @property
    def transitions(self) -> list[Transition]:
        return self.phases.transitions

    def _require(self, operation: str, *phases: Phase, hint: str = "") -> None:
        self.phases.require(operation, *phases, hint=hint)

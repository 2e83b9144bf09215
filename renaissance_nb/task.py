"""TaskBase: the phase machine, and the low-level API the original's teaching examples use.

    PLANNING       alloc(shape, dtype, region), finalize_memory()
    MEMORY_LOCKED  add_graph(name, graph, stream), compile()
    COMPILED       run(name), read(tensor), write(tensor, value)

A call in the wrong phase raises PhaseError naming the operation, the current
phase and the phase it needs. Every call validates first and changes the task
only at the end, so a failed call leaves the task exactly as it was.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum
from typing import Any, Sequence

import numpy as np

from .errors import PhaseError, PlanError, bad_argument
from .compiler.graph import ComputationGraph, GraphNode
from .compiler.ids import StreamKind
from .kernels.cpu import BindEnv
from .memory.dtensor import DTensor
from .memory.liveness import Lifetimes
from .memory.plan import MemoryPlan
from .text import plural
from .runtime.arena import Arena
from .runtime.bind import BoundGraph, bind, check_nodes


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


def _phase_fix(current: Phase, needed: Phase) -> str:
    """How to get from the current phase to the needed one, or why you cannot."""
    if _ORDER[current] < _ORDER[needed]:
        return f"Fix: call {_STEP_TO[needed]} first."
    return ("Fix: phases only move forward; build a new task (DeepLearningTask: task.reset()) "
            "to change what is already fixed.")


@dataclass(frozen=True)
class Transition:
    """One phase change, for the phase view's history."""

    source: Phase
    target: Phase
    operation: str
    at: float
    seconds: float


def _exact_values(value: Any, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray | None:
    """``value`` as ``dtype`` when it broadcasts to ``shape`` and converts without changing: no None or
    strings, and for integer tensors no fractions, no NaN and nothing out of range (300 is not 44)."""
    try:
        raw = np.asarray(value)
        np.broadcast_to(raw, shape)
    except (ValueError, TypeError):
        return None
    if raw.dtype.kind not in "biuf":
        return None
    if dtype.kind in "iu" and raw.size:
        info = np.iinfo(dtype)
        as_float = raw.astype(np.float64)
        if not (np.isfinite(as_float).all() and (as_float == np.round(as_float)).all()
                and info.min <= raw.min() and raw.max() <= info.max):
            return None
    return raw.astype(dtype)


class TaskBase:
    """A task driven by hand: allocate tensors, lock memory, add graphs, compile, run."""

    def __init__(self, name: str = "task") -> None:
        self.name = name
        self._phase = Phase.PLANNING
        self.memory = MemoryPlan(name)
        self._graphs: dict[str, tuple[list[GraphNode], StreamKind]] = {}
        self._bound: dict[str, BoundGraph] = {}
        self._arena: Arena | None = None
        self._views: list[np.ndarray] = []
        self.transitions: list[Transition] = []

    # ---- the phase machine ----------------------------------------------------------
    @property
    def phase(self) -> Phase:
        return self._phase

    def _require(self, operation: str, *phases: Phase, hint: str = "") -> None:
        if self._phase not in phases:
            names = [str(p) for p in phases]
            if "Fix" not in hint:
                forward = _ORDER[self._phase] < _ORDER[phases[0]]
                if forward and hint.startswith("Call "):  # the hint is the fix itself: say it once, as the fix
                    hint = "Fix: c" + hint[1:]
                else:
                    hint = (hint + " " + _phase_fix(self._phase, phases[0])).strip()
            raise PhaseError(operation, self._phase, names[0] if len(names) == 1 else names, hint)

    def _advance(self, target: Phase, operation: str, started: float) -> None:
        now = time.time()
        self.transitions.append(Transition(self._phase, target, operation, now, now - started))
        self._phase = target

    # ---- PLANNING -----------------------------------------------------------------
    def alloc(self, shape: Sequence[int], dtype: Any = "float32", region: Any = None, name: str | None = None) -> DTensor:
        """Reserve a tensor in a named region; its offset is fixed by finalize_memory()."""
        self._require("alloc", Phase.PLANNING,
                      hint="Memory is laid out once: allocate every tensor before finalize_memory().")
        if region is None:
            raise bad_argument(PlanError, "alloc", "region", None, "a Region member such as Region.T_TEMP_FP32",
                               "every tensor must be placed in a named region; pass region=Region.<NAME>")
        return self.memory.alloc(shape, dtype, region, name)

    def finalize_memory(self, lifetimes: Lifetimes | None = None) -> MemoryPlan:
        """Fix every offset (256-byte aligned) and move to MEMORY_LOCKED."""
        self._require("finalize_memory", Phase.PLANNING)
        if len(self.memory) == 0:
            raise PlanError("finalize_memory: the plan holds no tensors. Fix: alloc() at least one tensor first.")
        started = time.time()
        self.memory.finalize(lifetimes)
        self._advance(Phase.MEMORY_LOCKED, "finalize_memory", started)
        return self.memory

    # ---- MEMORY_LOCKED -------------------------------------------------------------
    def add_graph(self, name: str, graph: ComputationGraph | Sequence[GraphNode],
                  stream: StreamKind = StreamKind.COMP_1) -> None:
        """Register a graph (its nodes refer to tensor ids of this task's plan).

        Each node is checked now: known op, existing tensors, and operands whose shapes and
        parameters fit the op (kernels/operands.py), so a graph that could not run is never
        registered. A ComputationGraph is flattened in GraphId order onto ``stream``.
        """
        self._require("add_graph", Phase.MEMORY_LOCKED,
                      hint="Graphs are registered after memory is locked and before compile().")
        if not isinstance(name, str) or not name:
            raise bad_argument(PlanError, "add_graph", "name", name, "a non-empty str", "name the graph, e.g. 'forward'")
        if name in self._graphs:
            raise bad_argument(PlanError, "add_graph", "name", name, "a name not registered yet",
                               "pick another name for this graph")
        if not isinstance(stream, StreamKind):
            raise bad_argument(PlanError, "add_graph", "stream", stream, "a StreamKind such as StreamKind.COMP_1",
                               "pass stream=StreamKind.<NAME>")
        nodes = ([n for _, n in graph] if isinstance(graph, ComputationGraph)
                 else list(graph) if isinstance(graph, (list, tuple)) else [])
        if not nodes or not all(isinstance(n, GraphNode) for n in nodes):
            raise bad_argument(PlanError, "add_graph", "graph", graph, "a ComputationGraph or a list of nodes",
                               "build nodes with renaissance_nb.node(op, inputs, outputs)")
        check_nodes(nodes, len(self.memory), f"add_graph({name!r})", [t.shape for t in self.memory])
        self._graphs[name] = (nodes, stream)

    def remove_graph(self, name: str) -> None:
        """Unregister a graph before compile() (to replace one that compile() could not bind)."""
        self._require("remove_graph", Phase.MEMORY_LOCKED, hint="Graphs are bound at compile().")
        if not isinstance(name, str) or name not in self._graphs:
            raise bad_argument(PlanError, "remove_graph", "name", name, f"one of {sorted(self._graphs)}",
                               "pass the name given to add_graph()")
        del self._graphs[name]

    def compile(self) -> "TaskBase":
        """Create the arena and bind ('capture') every registered graph; nothing changes if one fails
        (task.remove_graph(name) then lets it be registered again)."""
        self._require("compile", Phase.MEMORY_LOCKED)
        started = time.time()
        arena = Arena(self.memory)
        views = arena.views(self.memory)
        env = BindEnv(range_view=arena.range_view, locate=arena.locate)
        bound = {name: bind(name, nodes, views, env) for name, (nodes, _) in self._graphs.items()}
        self._arena, self._views, self._bound = arena, views, bound
        self._advance(Phase.COMPILED, "compile", started)
        return self

    # ---- COMPILED ---------------------------------------------------------------------
    def run(self, name: str) -> None:  # type: ignore[override]
        """Replay one bound graph."""
        self._require("run", Phase.COMPILED, hint="Graphs run once compile() has bound them.")
        if not isinstance(name, str) or name not in self._bound:
            raise bad_argument(PlanError, "run", "name", name, f"one of {sorted(self._bound)}",
                               "register the graph with add_graph() before compile()")
        self._bound[name]()

    def _tensor(self, op: str, tensor: DTensor | int | str) -> DTensor:
        """This plan's record of a handle, an id or a name; a handle from another task's plan is refused
        (its id would name some other tensor here)."""
        if isinstance(tensor, DTensor):
            if tensor.plan is not None and tensor.plan is not self.memory:
                raise bad_argument(PlanError, op, "tensor", tensor, f"a tensor of this task's plan {self.memory.name!r}",
                                   "use the handles this task's alloc() returned")
            return self.memory[tensor.id]
        if isinstance(tensor, (bool, np.bool_)):
            raise bad_argument(PlanError, op, "tensor", tensor, "a DTensor, an int id or a tensor name",
                               "pass the DTensor alloc() returned")
        return self.memory[tensor]

    def read(self, tensor: DTensor | int | str) -> np.ndarray:
        """A copy of the bytes at a tensor's place in the arena (train_base's view), now.

        State (weights, gradients, moments, BN statistics, EMA, scalars) is always the tensor's own.
        A temporary (activations, their gradients, im2col buffers) holds its value only while it is
        live in the step: with liveness reuse (the default) its bytes are shared with tensors whose
        lifetimes do not overlap, so after a step a dead temporary reads as whichever of them wrote
        last (the lifetimes view marks the tensors that share bytes). Build with
        ``options(liveness=False)`` to inspect every temporary after a step."""
        self._require("read", Phase.COMPILED, hint="Tensors hold values only once the arena exists (compile()).")
        t = self._tensor("read", tensor)
        return self._views[t.id].copy()

    def write(self, tensor: DTensor | int | str, value: Any) -> None:
        """Set a tensor's value (broadcast like NumPy; the shape is the plan's)."""
        self._require("write", Phase.COMPILED, hint="Tensors hold values only once the arena exists (compile()).")
        t = self._tensor("write", tensor)
        arr = _exact_values(value, np.dtype(t.dtype), t.shape)
        if arr is None:
            raise bad_argument(PlanError, "write", "value", value,
                               f"numbers broadcastable to {t.shape} that {t.dtype} holds exactly (whole numbers in its "
                               "range for an integer tensor)", f"pass values shaped like {t.name}")
        self._views[t.id][...] = arr

    @property
    def registered_graphs(self) -> dict[str, tuple[list[GraphNode], StreamKind]]:
        """The graphs registered with add_graph (or built by a DeepLearningTask): name -> (nodes, stream)."""
        return dict(self._graphs)

    @property
    def arena_bytes(self) -> int:
        return self.memory.total_bytes if self.memory.finalized else 0

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} {self.name!r}: phase {self._phase}, {plural(len(self.memory), 'tensor')}, "
                f"{plural(len(self._graphs), 'graph')}>")

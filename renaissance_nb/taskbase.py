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
from typing import Any, Sequence

import numpy as np

from .compiler.graph import ComputationGraph, GraphNode
from .compiler.ids import StreamKind
from .errors import PlanError, bad_argument
from .kernels import native
from .kernels.cpu import BindEnv
from .memory.dtensor import DTensor
from .memory.liveness import Lifetimes
from .memory.plan import MemoryPlan
from .phases import PHASE_ALLOWS, Phase, Phased, PhaseMachine, Transition
from .runtime.arena import Arena
from .runtime.bind import BoundGraph, bind, check_nodes
from .runtime.tensors import TensorIO
from .text import plural

__all__ = ["TaskBase", "Phase", "PHASE_ALLOWS", "Transition"]


class TaskBase(Phased):
    """A task driven by hand: allocate tensors, lock memory, add graphs, compile, run."""

    def __init__(self, name: str = "task") -> None:
        self.name = name
        self.phases = PhaseMachine()
        self.memory = MemoryPlan(name)
        self._graphs: dict[str, tuple[list[GraphNode], StreamKind]] = {}
        self._bound: dict[str, BoundGraph] = {}
        self.arena: Arena | None = None
        self._tensors: TensorIO | None = None

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
        self.phases.advance(Phase.MEMORY_LOCKED, "finalize_memory", started)
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
        check_nodes(nodes, len(self.memory), f"add_graph({name!r})", [t.shape for t in self.memory],
                    [t.dtype for t in self.memory])
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
        with native.chosen_for({n.op for nodes, _ in self._graphs.values() for n in nodes}):
            bound = {name: bind(name, nodes, views, env) for name, (nodes, _) in self._graphs.items()}
        self.arena, self._tensors, self._bound = arena, TensorIO(self.memory, views), bound
        self.phases.advance(Phase.COMPILED, "compile", started)
        return self

    # ---- COMPILED ---------------------------------------------------------------------
    def run(self, name: str) -> None:
        """Replay one bound graph."""
        self._require("run", Phase.COMPILED, hint="Graphs run once compile() has bound them.")
        if not isinstance(name, str) or name not in self._bound:
            raise bad_argument(PlanError, "run", "name", name, f"one of {sorted(self._bound)}",
                               "register the graph with add_graph() before compile()")
        self._bound[name]()

    def read(self, tensor: DTensor | int | str) -> np.ndarray:
        """A copy of the bytes at a tensor's place in the arena (train_base's view), now.

        State (weights, gradients, moments, BN statistics, EMA, scalars) is always the tensor's own.
        A temporary (activations, their gradients, im2col buffers) holds its value only while it is
        live in the step: with liveness reuse (the default) its bytes are shared with tensors whose
        lifetimes do not overlap, so after a step a dead temporary reads as whichever of them wrote
        last (the lifetimes view marks the tensors that share bytes). Build with
        ``options(liveness=False)`` to inspect every temporary after a step (it also keeps the outputs a
        max pool would otherwise make itself: a batch norm's before a pool, ops/pool.py)."""
        self._require("read", Phase.COMPILED, hint="Tensors hold values only once the arena exists (compile()).")
        assert self._tensors is not None  # compile() made it
        return self._tensors.read(tensor)

    def write(self, tensor: DTensor | int | str, value: Any) -> None:
        """Set a tensor's value (broadcast like NumPy; the shape is the plan's)."""
        self._require("write", Phase.COMPILED, hint="Tensors hold values only once the arena exists (compile()).")
        assert self._tensors is not None  # compile() made it
        self._tensors.write(tensor, value)

    @property
    def registered_graphs(self) -> dict[str, tuple[list[GraphNode], StreamKind]]:
        """The graphs registered with add_graph (or built by a DeepLearningTask): name -> (nodes, stream)."""
        return dict(self._graphs)

    @property
    def bound_graphs(self) -> dict[str, BoundGraph]:
        """The graphs compile() bound: name -> BoundGraph (its kernels)."""
        return dict(self._bound)

    @property
    def arena_bytes(self) -> int:
        return self.memory.total_bytes if self.memory.finalized else 0

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} {self.name!r}: phase {self.phase}, {plural(len(self.memory), 'tensor')}, "
                f"{plural(len(self._graphs), 'graph')}>")

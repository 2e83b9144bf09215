"""Binding ('capture' on the CPU): each node becomes a kernel with pre-resolved views."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import PlanError
from ..compiler.graph import GraphNode
from ..kernels.cpu import BindEnv
from ..kernels.cpu import KERNELS as SHARED_KERNELS
from ..kernels.operands import dtype_problem, operand_problem
from ..ops import registry
from ..text import plural


KERNELS = {**SHARED_KERNELS, **registry.cpu_kernels()}
"""Every CPU kernel: the shared table (kernels/cpu.py) and the kernels the ops define themselves."""


@dataclass
class BoundGraph:
    """A captured graph: its nodes and the zero-argument kernels that replay them."""

    name: str
    nodes: list[GraphNode]
    kernels: list[Callable[[], None]]

    def __call__(self) -> None:
        for k in self.kernels:
            k()

    def __repr__(self) -> str:
        return f"<BoundGraph {self.name}: {plural(len(self.kernels), 'kernel')}>"


def check_nodes(nodes: Sequence[GraphNode], n_tensors: int, where: str,
                shapes: Sequence[tuple[int, ...]] | None = None, dtypes: Sequence[Any] | None = None) -> None:
    """Every op must be known, every tensor id must exist in the plan and, given the tensors'
    shapes, every node's operands must fit its op (kernels/operands.py)."""
    for i, n in enumerate(nodes):
        if n.op not in KERNELS:
            raise PlanError(f"{where}: node #{i} has op {n.op!r}, which has no kernel. "
                            f"Fix: use one of {sorted(KERNELS)}.")
        for tid in (*n.inputs, *n.outputs):
            if not isinstance(tid, (int, np.integer)) or not 0 <= tid < n_tensors:
                raise PlanError(f"{where}: node #{i} ({n.op}) refers to tensor id {tid!r}, but the plan holds "
                                f"ids 0..{n_tensors - 1}. Fix: use ids of DTensors returned by alloc().")
        problem = None if shapes is None else operand_problem(
            n.op, [shapes[t] for t in n.inputs], [shapes[t] for t in n.outputs], n.p)
        if problem is None and dtypes is not None:
            kinds = [[np.dtype(dtypes[t]) for t in ids] for ids in (n.inputs, n.outputs)]
            problem = dtype_problem(n.op, kinds[0], kinds[1], n.p)
        if problem:
            fix = ("set the parameter as shown" if problem.startswith("parameter ")
                   else "build the node from tensors of the shapes and dtypes it needs")
            raise PlanError(f"{where}: node #{i} {n.op}{tuple(n.inputs)} -> {tuple(n.outputs)}: {problem}. Fix: {fix}.")


def bind(name: str, nodes: Sequence[GraphNode], views: Sequence[np.ndarray], env: BindEnv) -> BoundGraph:
    """Resolve each node's tensor ids to views and build its kernel."""
    check_nodes(nodes, len(views), name, [v.shape for v in views], [v.dtype for v in views])
    kernels = []
    for n in nodes:
        ins = [views[i] for i in n.inputs]
        outs = [views[i] for i in n.outputs]
        try:
            kernels.append(KERNELS[n.op](outs, ins, n.p, env))
        except KeyError as exc:
            raise PlanError(f"{name}: cannot bind node {n!r}: it needs the parameter {exc}. Fix: pass it to "
                            f"node(), e.g. node({n.op!r}, inputs, outputs, {exc.args[0]}=...).") from exc
        except (ValueError, IndexError, TypeError) as exc:
            raise PlanError(f"{name}: cannot bind node {n!r}: {exc}. Fix: check the node's inputs and outputs.") from exc
    return BoundGraph(name, list(nodes), kernels)

"""What every optimizer definition has, and the operands its update is bound to.

An optimizer is two things. Its *settings* (lr, betas, momentum...) are a frozen builder of
train/optimizers.py, the object a user passes to ``task.optimizer(...)``, stored in checkpoints.
Its *rules* are an ``OptimizerDefinition`` here, one module each (sgd.py, adam.py, lars.py): the
state families it needs (through its builder's ``state``), the graph nodes of its update, its
update on the CPU (the C kernel of kernels/native.c where one exists, else the numba one of
kernels/fused.py) and on the GPU (a CUDA kernel of gpu/src), and the inverse the tensor inspector
uses to show a weight's last change. The kernel tables, the emitter and the inspector look the
definition up by the node's ``kind`` (optim/__init__.py); none of them compares optimizer names.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import PlanError
from ..kernels import blas
from ..kernels.operands import optimizer_ranges

if TYPE_CHECKING:  # pragma: no cover
    from ..train.optimizers import Optimizer

Reader = Callable[[str], np.ndarray]
"""``task.read``: a tensor's values by name."""
NodeSpec = tuple[str, str, list[int], list[int], dict[str, Any]]
"""A node an optimizer adds to the training graph: (GraphId name, op, input ids, output ids, params); the
emitter (compiler/emit.py) builds it, so the definitions need not import the compiler."""


@dataclass(frozen=True)
class MenuEntry:
    """One choice of the memory inspector's optimizer menu: the value the widget sends, its label,
    and the optimizer it stands for."""

    value: str
    label: str
    make: Callable[[], "Optimizer"]


@dataclass(frozen=True)
class CpuOperands:
    """What an update binds on the CPU: the flat W/G/M/V ranges (kernels/operands.py), the lr table,
    the step counter, the node's further inputs (LARS: its tensors), and the threads of a pass."""

    w: np.ndarray
    g: np.ndarray
    m: np.ndarray
    v: np.ndarray
    lr_table: np.ndarray
    step: np.ndarray
    extra: Sequence[np.ndarray]
    threaded: bool
    threads: int


def cpu_operands(outs: Sequence[Any], ins: Sequence[Any], env: Any) -> CpuOperands:
    """The operands of an ``optimizer`` node: ins = (lr_table, nan.flag, *extra), outs = (step,)."""
    w, g, m, v = optimizer_ranges(env.range_view)
    return CpuOperands(w, g, m, v, ins[0], outs[0], tuple(ins[2:]), blas.THREADED, blas.pass_threads(blas.THREADED))


def element_offset(tensor: np.ndarray, flat: np.ndarray) -> int:
    """Where ``tensor`` (a view of the arena) starts inside the flat range ``flat``, in elements."""
    start = tensor.__array_interface__["data"][0] - flat.__array_interface__["data"][0]
    assert 0 <= start < flat.nbytes and start % flat.itemsize == 0, "the tensor lies outside the range"
    return start // flat.itemsize


def update_node(ids: Mapping[str, int], p: Mapping[str, Any], extra: Sequence[int] = ()) -> NodeSpec:
    """The OPTIMIZER node: reads the lr table and the NaN flag (and ``extra``), counts the step."""
    return ("OPTIMIZER", "optimizer", [ids["lr_table"], ids["nan.flag"], *extra], [ids["step"]], dict(p))


class OptimizerDefinition:
    """The rules of one optimizer kind; subclasses fill in their update and its inverse."""

    kind = ""
    label = ""
    menu: tuple[MenuEntry, ...] = ()
    """Its choices in the memory inspector's what-if menu (the first is the one it shows as)."""

    def __repr__(self) -> str:
        return f"<optimizer definition {self.kind!r}>"

    def menu_value(self, p: Mapping[str, Any]) -> str:
        """The menu choice an optimizer of these graph params shows as."""
        return self.menu[0].value

    def update_nodes(self, ids: Mapping[str, int], p: Mapping[str, Any]) -> list[NodeSpec]:
        """The nodes of one update, in the order they run (compiler/emit.py appends them): by default the
        one OPTIMIZER node; an optimizer with work of its own before the update adds it here."""
        return [update_node(ids, p)]

    def bind_cpu(self, outs: Sequence[Any], ins: Sequence[Any], p: Mapping[str, Any], env: Any) -> Callable[[], None]:
        """The update as a zero-argument kernel (kernels/cpu.py skips it on a step the NaN check flags)."""
        raise NotImplementedError

    def bind_gpu(self, outs: Sequence[Any], ins: Sequence[Any], p: Mapping[str, Any], env: Any) -> Callable[[Any], None]:
        """The update as a launcher(stream); it must leave a flagged step alone (gpu/kernels.py counts the step)."""
        raise NotImplementedError

    def bind_cpu_norms(self, outs: Sequence[Any], ins: Sequence[Any], p: Mapping[str, Any],
                       env: Any) -> Callable[[], None]:
        """The ``optimizer_norms`` node's kernel, for an optimizer whose update_nodes emit one."""
        raise PlanError(f"optimizer_norms: the {self.label} optimizer has no norms node. Fix: emit the node only "
                        "for an optimizer whose update_nodes add it (LARS).")

    def bind_gpu_norms(self, outs: Sequence[Any], ins: Sequence[Any], p: Mapping[str, Any],
                       env: Any) -> Callable[[Any], None]:
        return self.bind_cpu_norms(outs, ins, p, env)  # type: ignore[return-value]  # the same refusal

    def old_weights(self, read: Reader, name: str, w: np.ndarray, g: np.ndarray, t: int, lr: float,
                    p: Mapping[str, Any]) -> tuple[np.ndarray, str]:
        """W before the last step (float64), from W, G (both float64), the state ``read`` gives, the step
        count t and that step's lr; and a line saying how (inspector/tensorstats.py ``last_update``)."""
        raise NotImplementedError

"""What every CPU kernel module shares: the bind environment, the factory type and a registrar.

A kernel module (cpu.py, conv.py, transfer.py) fills a table of its own with ``registrar``;
cpu.py joins them into ``KERNELS``, the table the runtime binds with. Nothing here imports
a kernel module, so the modules import this one and never each other's tables.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence, TypeVar

import numpy as np

Kernel = Callable[[], None]
Factory = Callable[[Sequence[np.ndarray], Sequence[np.ndarray], dict, "BindEnv"], Kernel]
EMPTY_F32 = np.zeros(0, np.float32)
EMPTY_F32_2D = np.zeros((0, 0), np.float32)


@dataclass(frozen=True)
class BindBuffer:
    """A buffer a kernel allocated at bind time outside the arena: what it is for, its size."""

    what: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


@dataclass
class BindEnv:
    """What kernels may need besides their tensors: data sources, ranges, the seed."""

    seed: int = 0
    sources: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    perms: dict[str, np.ndarray] = field(default_factory=dict)
    range_view: Callable[[str, str, str], np.ndarray] | None = None
    locate: Callable[[str, int], str] | None = None
    batch: int = 0
    outside_arena: list[BindBuffer] = field(default_factory=list)
    comm: Any = None  # an mpi4py communicator on a distributed task (kernels/comm.py), else None
    rank: int = 0
    ranks: int = 1
    requests: dict[str, list[Any]] = field(default_factory=dict)  # bucket -> [its in-flight MPI requests]

    def scratch(self, what: str, shape: tuple[int, ...], dtype: object) -> np.ndarray:
        """A kernel's working buffer for a node whose graph gives it none (a hand-built graph):
        allocated once, here at bind time, outside the arena, and listed in ``outside_arena``
        so the runner can say so. The compiler's graphs give every kernel its scratch as arena
        tensors, so a compiled task lists none."""
        buf = np.zeros(shape, dtype)
        if buf.nbytes:
            self.outside_arena.append(BindBuffer(what, tuple(buf.shape), buf.dtype.name, buf.nbytes))
        return buf


F = TypeVar("F", bound=Callable[..., object])


def registrar(table: dict[str, F]) -> Callable[[str], Callable[[F], F]]:
    """The decorator ``@kernel("op")`` that puts a factory into ``table`` under ``op`` (GPU tables too)."""
    def kernel(name: str) -> Callable[[F], F]:
        def register(f: F) -> F:
            table[name] = f
            return f
        return register
    return kernel


def join_tables(*tables: Mapping[str, F]) -> dict[str, F]:
    """One table from the modules' own, in order; an op in two of them is a programming error."""
    joined: dict[str, F] = {}
    for t in tables:
        both = joined.keys() & t.keys()
        if both:
            raise RuntimeError(f"kernel tables: {sorted(both)} registered twice")
        joined.update(t)
    return joined

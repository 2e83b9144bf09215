"""The MPI world of a data-parallel run: mpi4py imported only when distribution is asked for.

Why a module of its own: ``import renaissance_nb`` must not load MPI (a single-process user never
pays for it, nor needs the wheel), and the config checks, the runner, the checkpoint and the command
line all ask the same few questions (which rank, how many, is this process under mpiexec, where is
mpiexec). Everything here imports mpi4py lazily, inside the functions that need it.
"""
from __future__ import annotations

import os
import shutil
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import ConfigError

BACKENDS = ("mpi",)
# Seconds an aborting rank waits after writing its traceback: MPICH's launcher relays each rank's stderr
# through a pipe, and MPI_Abort at once could kill the relay first (seen once in CI: exit 130, stderr empty).
FORWARD_GRACE_S = 0.5


def under_mpiexec() -> bool:
    """True when a launcher started this process (its environment says so; MPI itself is not loaded):
    MPICH's hydra sets PMI_SIZE, Open MPI OMPI_COMM_WORLD_SIZE, PMIx launchers PMIX_RANK."""
    size = os.environ.get("PMI_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE")
    return (size is not None and size != "1") or "PMIX_RANK" in os.environ


def mpiexec_path() -> str | None:
    """The mpiexec next to this Python (the mpich wheel's bin/), else the first on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.access(here, os.X_OK) else shutil.which("mpiexec")


def launch_command(nproc: int, argv: list[str]) -> list[str]:
    """``mpiexec -n N python ...argv``; Open MPI also gets the flags it needs as root and on few cores."""
    exe = mpiexec_path()
    if exe is None:
        raise ConfigError(f"--nproc {nproc}: no mpiexec was found next to {sys.executable} or on PATH. "
                          "Fix: pip install 'renaissance_nb[mpi]' (mpi4py and the mpich wheel).")
    flags: list[str] = []
    if _is_open_mpi(exe):
        flags = ["--oversubscribe"] + (["--allow-run-as-root"] if hasattr(os, "geteuid") and os.geteuid() == 0
                                       else [])
    return [exe, "-n", str(nproc), *flags, sys.executable, *argv]


def _is_open_mpi(exe: str) -> bool:
    real = os.path.realpath(exe)
    return "orterun" in real or "prterun" in real or os.path.exists(os.path.join(os.path.dirname(real), "ompi_info"))


@dataclass
class World:
    """COMM_WORLD of this process: its rank and size, and the few collectives the trainer needs."""

    comm: Any
    rank: int
    size: int

    def sum_(self, array: np.ndarray) -> np.ndarray:
        """Sum ``array`` over the ranks, in place (every rank gets the same bytes)."""
        from mpi4py import MPI
        self.comm.Allreduce(MPI.IN_PLACE, array, op=MPI.SUM)
        return array

    def agree(self, flag: bool, reason: str | None) -> tuple[bool, str | None]:
        """(True on every rank when ``flag`` is True on one, the reason of the lowest rank that gave one):
        a stop taken at one step boundary, for the same reason, on every rank."""
        votes = self.comm.allgather((bool(flag), reason))
        return any(f for f, _ in votes), next((r for _, r in votes if r is not None), None)

    def bcast_(self, array: np.ndarray) -> np.ndarray:
        """Rank 0's bytes of ``array`` on every rank, in place."""
        self.comm.Bcast(array, root=0)
        return array

    def digests(self, array: np.ndarray) -> list[str]:
        """Every rank's SHA-256 of ``array``'s bytes, in rank order (the tests' weight check)."""
        import hashlib
        return list(self.comm.allgather(hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()))

    def barrier(self) -> None:
        self.comm.Barrier()

    def abort(self, code: int = 1) -> None:
        self.comm.Abort(code)


_WORLD: World | None = None
_HOOKED = False


def world() -> World:
    """COMM_WORLD, MPI started on first use; a ConfigError when mpi4py or its MPI library is missing."""
    global _WORLD
    if _WORLD is None:
        try:
            from mpi4py import MPI
        except ImportError as exc:
            raise ConfigError(f"distributed('mpi'): mpi4py cannot be imported ({exc}). Fix: pip install "
                              "'renaissance_nb[mpi]' (mpi4py and the mpich wheel), then start the script with "
                              "mpiexec -n 2 python script.py.") from None
        comm = MPI.COMM_WORLD
        _WORLD = World(comm, comm.Get_rank(), comm.Get_size())
        install_abort_hook(_WORLD)
    return _WORLD


def install_abort_hook(w: World) -> None:
    """An uncaught exception on one rank prints its traceback, tagged with the rank, and aborts every
    rank (``python -m mpi4py``'s rule): the others would otherwise wait in an all-reduce forever."""
    global _HOOKED
    if w.size < 2 or _HOOKED:
        return
    previous = sys.excepthook

    def hook(kind, value, tb) -> None:  # type: ignore[no-untyped-def]
        if issubclass(kind, KeyboardInterrupt):
            previous(kind, value, tb)
        abort_with(w, value if isinstance(value, BaseException) else kind())

    sys.excepthook = hook
    _HOOKED = True


def abort_with(w: World, exc: BaseException) -> None:
    """Print ``exc``'s traceback with ``[rank k]`` on every line, then ``MPI_Abort`` every rank (130 for
    Ctrl-C, else 1) and end this process at once. Written to ``sys.stderr`` and, where IPython replaced it (an ipyparallel engine), to
    the process's own stderr too, so the message is in the engine's log even if the abort beats its
    forwarding."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    tagged = "".join(f"[rank {w.rank}] {line}\n" for line in text.rstrip().splitlines())
    streams = [sys.stderr] + ([sys.__stderr__] if sys.__stderr__ is not sys.stderr else [])
    for stream in streams:
        try:
            stream.write(tagged)
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream must not stop the abort
            pass
    code = 130 if isinstance(exc, KeyboardInterrupt) else 1
    time.sleep(FORWARD_GRACE_S)  # the launcher relays stderr through a pipe; an abort at once can lose the traceback
    w.abort(code)
    os._exit(code)  # MPICH's MPI_Abort may return before the launcher's kill arrives: run nothing more


ALLREDUCE = ("buckets", "slab")


def check_ranks(ranks: Any) -> int:
    """``distributed(ranks=...)``: a whole number of ranks, at least 1."""
    from .checks import as_int
    n = as_int(ranks)
    if n is None or n < 1:
        from .errors import bad_argument
        raise bad_argument(ConfigError, "distributed", "ranks", ranks, "a whole number >= 1, or None (COMM_WORLD's size)",
                           "pass the -n of the mpiexec that will run the task, e.g. ranks=2")
    return n


def check_allreduce(how: Any) -> str:
    """``distributed(allreduce=...)``: 'buckets' or 'slab'."""
    if how in ALLREDUCE:
        return str(how)
    from .errors import bad_argument
    raise bad_argument(ConfigError, "distributed", "allreduce", how, f"one of {ALLREDUCE}",
                       "'buckets' overlaps the reduction with backward; 'slab' reduces the whole gradient region once")


def check_backend(backend: Any) -> str | None:
    """``distributed(backend)``'s argument: 'mpi' or None (one process)."""
    if backend is None or backend in BACKENDS:
        return backend
    from .errors import bad_argument
    raise bad_argument(ConfigError, "distributed", "backend", backend, f"one of {BACKENDS} or None",
                       "pass 'mpi' and start the script with mpiexec -n N python script.py")

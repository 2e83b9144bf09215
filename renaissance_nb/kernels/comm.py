"""Data-parallel kernels: the gradient all-reduce, and each rank's shard of a batch and of its random draws.

``allreduce_start`` / ``allreduce_wait``
    ins: one bucket's gradient tensors (a layer's weight and bias gradients), reduced in place; outs
    ``[]``. Params: ``bucket`` (the layer), ``ranks``. The start, placed right after the layer's
    backward, issues one ``Iallreduce(IN_PLACE, SUM)`` per tensor and returns; the wait, in DEEP_COMM
    before the NaN check and the optimizer, completes them and scales by 1/ranks. The requests pass
    from one to the other through ``env.requests[bucket]``; a start refuses (PlanError) while its bucket
    still holds requests, which only a step stopped between the two leaves (the trainer aborts every rank
    on an exception inside a step of a distributed run, so this guards other replays). On 2 ranks an
    element's sum is a + b however the buffers are split, so the buckets give the slab's bytes
    (tests/test_distributed.py).

``allreduce_mean``
    ins ``[]``, outs ``[]``. Params: ``first``, ``last`` (the region range, the whole G range),
    ``ranks``. One in-place ``Allreduce(IN_PLACE, SUM)`` of the float32 view of the range, then a
    scale by 1/ranks: the mean of the ranks' mean gradients, which is the global batch's mean
    gradient because every rank holds an equal share of it (compiler/pipeline.py local_sizes).
    The bytes outside the range are not touched. Needs ``env.comm``.

``sharded(factory)`` wraps the training transfers and dropout so that on rank k of R, with a local
batch of b rows, the kernel sees exactly what a single process with the global batch sees for those
rows: the rows ``perm[cursor + k*b : cursor + (k+1)*b]`` of one global permutation (a view of it,
so an in-place reshuffle reaches it), augmentation blocks keyed by the global sample position, and
the dropout mask's blocks at the global row offset; the cursor and the RNG offset then advance by the
whole global batch, so their values are the same on every rank (and in a checkpoint). On one
process (``env.ranks == 1``) the factory's kernel is returned unwrapped: nothing changes.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..errors import PlanError
from .base import BindEnv, Factory, registrar

COMM_KERNELS: dict[str, Factory] = {}
"""This module's kernels: allreduce_start, allreduce_wait (the buckets), allreduce_mean (the slab)."""
kernel = registrar(COMM_KERNELS)


def _comm(op: str, p: dict, env: BindEnv):  # type: ignore[no-untyped-def]
    """The communicator a COMM kernel binds to, checked against the plan's rank count."""
    if env.comm is None:
        raise PlanError(f"{op}: bound without a communicator. Fix: task.distributed('mpi') before plan(), "
                        "under mpiexec.")
    ranks = int(p["ranks"])
    if ranks != env.comm.Get_size():
        raise PlanError(f"{op}: planned for {ranks} ranks, run on {env.comm.Get_size()}.")
    return env.comm


def _flat(view: np.ndarray) -> np.ndarray:
    """A gradient's storage as one contiguous float32 vector: MPI reduces contiguous buffers. A tensor
    with padded rows includes its padding (zeros on every rank, so they stay zeros)."""
    if view.flags.c_contiguous:
        return view.reshape(-1)
    assert view.ndim == 2 and view.strides[1] == view.itemsize, (view.shape, view.strides)
    n = (view.shape[0] - 1) * view.strides[0] // view.itemsize + view.shape[1]
    return np.lib.stride_tricks.as_strided(view, shape=(n,), strides=(view.itemsize,))


@kernel("allreduce_start")
def allreduce_start(outs, ins, p, env):
    """Start the non-blocking sum of one bucket's gradients over the ranks (``Iallreduce`` in place,
    one request per tensor), as soon as backward has written them; DEEP_COMM's wait completes it."""
    from mpi4py import MPI
    comm = _comm("allreduce_start", p, env)
    bufs = [_flat(v) for v in ins]
    held = env.requests.setdefault(str(p["bucket"]), [None])  # shared with the wait (and the other variants)
    iallreduce, inplace, total, testall = comm.Iallreduce, MPI.IN_PLACE, MPI.SUM, MPI.Request.Testall

    def run() -> None:
        if held[0] is not None:
            raise _still_in_flight(str(p["bucket"]), len(held[0]))
        reqs = [iallreduce(inplace, b, op=total) for b in bufs]
        testall(reqs)  # a turn of MPI's progress engine: the buckets started before move on too
        held[0] = reqs
    return run


def _still_in_flight(bucket: str, n: int) -> PlanError:
    """A bucket started again before its last start was waited: the step that started it stopped between the
    two (a second Ctrl-C, an error in a kernel), so MPI may still write these buffers and this rank's
    collectives no longer line up with the other ranks'. The trainer aborts every rank before that can
    happen (DataParallel.failed); this stops anything else that replays the step's kernels."""
    return PlanError(f"allreduce_start: bucket {bucket!r} still has {n} all-reduce request(s) in flight from a step "
                     "that stopped between this bucket's start and its wait (DEEP_COMM); starting it again would "
                     "let MPI write buffers the step is using and pair this rank's collectives with the wrong ones "
                     "of the other ranks. Fix: end every rank (the MPI job) and resume from a checkpoint with "
                     "task.load_state(path).")


@kernel("allreduce_wait")
def allreduce_wait(outs, ins, p, env):
    """Wait for one bucket's all-reduce, then scale it by 1/ranks: the global batch's mean gradient."""
    from mpi4py import MPI
    _comm("allreduce_wait", p, env)
    bufs = [_flat(v) for v in ins]
    bucket = str(p["bucket"])
    held = env.requests.setdefault(bucket, [None])
    waitall, scale = MPI.Request.Waitall, np.float32(1.0 / int(p["ranks"]))

    def run() -> None:
        reqs = held[0]
        if reqs is None:
            raise PlanError(f"allreduce_wait: bucket {bucket!r} was not started in this step (its allreduce_start "
                            "must run after the layer's backward, before DEEP_COMM).")
        waitall(reqs)
        held[0] = None
        for b in bufs:
            np.multiply(b, scale, out=b)
    return run


@kernel("allreduce_mean")
def allreduce_mean(outs, ins, p, env):
    """Sum the range over the ranks in place, then scale it by 1/ranks."""
    from mpi4py import MPI
    comm = _comm("allreduce_mean", p, env)
    view = env.range_view(p["first"], p["last"], "float32")
    allreduce, inplace, total = comm.Allreduce, MPI.IN_PLACE, MPI.SUM
    scale = np.float32(1.0 / int(p["ranks"]))

    def run() -> None:
        allreduce(inplace, view, op=total)
        np.multiply(view, scale, out=view)
    return run


def sharded_transfer(factory: Factory) -> Factory:
    """A training transfer reading this rank's shard of each global batch (see the module's doc)."""
    def bind(outs, ins, p, env: BindEnv):  # type: ignore[no-untyped-def]
        if env.ranks == 1 or p.get("source") != "train" or p.get("source") not in env.perms:
            return factory(outs, ins, p, env)
        b, k, ranks = int(outs[1].shape[0]), env.rank, env.ranks
        perms = dict(env.perms, train=env.perms["train"][k * b:])  # a view: reshuffles in place reach it
        cursor = ins[0]
        if len(ins) < 2:
            run = factory(outs, ins, p, replace(env, perms=perms))
        else:
            aug, mine = ins[1], np.zeros(1, np.int64)  # augmentation keyed by the global sample position
            run = factory(outs, [cursor, mine, *ins[2:]], p, replace(env, perms=perms))

            def at_rank() -> None:
                mine[0] = aug[0] + k * b
                run()
                cursor[0] += (ranks - 1) * b
            return at_rank
        rest = (ranks - 1) * b

        def advance() -> None:
            run()
            cursor[0] += rest
        return advance
    return bind


def sharded_dropout(factory: Factory) -> Factory:
    """Dropout drawing the global batch's mask blocks of this rank's rows (see the module's doc)."""
    def bind(outs, ins, p, env: BindEnv):  # type: ignore[no-untyped-def]
        if env.ranks == 1:
            return factory(outs, ins, p, env)
        x, offset = ins
        blocks, k, ranks = (outs[1].size + 3) // 4, env.rank, env.ranks
        mine = np.zeros(1, np.int64)
        run = factory(outs, [x, mine], p, env)

        def at_rank() -> None:
            mine[0] = offset[0] + k * blocks
            run()
            offset[0] += ranks * blocks
        return at_rank
    return bind


def shard_table(table: dict[str, Factory]) -> dict[str, Factory]:
    """``table`` with its training transfers and dropout sharded by rank."""
    out = dict(table)
    for op in ("transfer", "transfer_image", "transfer_image_async"):
        if op in out:
            out[op] = sharded_transfer(out[op])
    if "dropout_fwd" in out:
        out["dropout_fwd"] = sharded_dropout(out["dropout_fwd"])
    return out

"""What the trainer and checkpoints do besides the step on a distributed task (MPI ranks).

The step itself needs nothing from here: its DEEP_COMM node all-reduces the gradients, and the
sharded transfers keep the data cursor and RNG offsets equal on every rank. What stays local to
a rank is its metric sums and loss log (its own shard's loss) and its prefetched next batch. This
module makes those global where they are read (epoch records, ``step_losses``, a checkpoint), gives
every rank rank 0's batch-norm running statistics where they are read, agrees on a stop (and its
reason) at one step boundary, aborts every rank when one fails, and re-gathers each rank's batch after
a resume, so that a checkpoint written by rank 0 resumes every rank byte-identically.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..compiler.ids import GraphId
from ..mpi import World, abort_with
from .interrupt import StopFlag

if TYPE_CHECKING:  # pragma: no cover
    from .replay import EpochSchedule
    from .runner import Runner


class DataParallel:
    """One rank's side of the collectives outside the step."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.logged = 0  # the loss log holds the global mean loss of the steps before this one
        self.metrics_global = False  # the metric sums are the global ones (an epoch's end reduced them)

    @property
    def rank(self) -> int:
        return self.world.rank

    def stop_agreed(self, stop: StopFlag, reason: str | None) -> tuple[bool, str | None]:
        """(stop, why): a stop every rank takes at this same step boundary when any rank asked for one
        (Ctrl-C or a step callback), with the lowest asking rank's callback reason (None for Ctrl-C) on
        every rank. ``stop.requested`` is read once, before the agreement, and only ever set here: a
        Ctrl-C handled while the agreement runs stays asked for, and is agreed at the next boundary."""
        agreed, why = self.world.agree(stop.requested, reason)
        if agreed:
            stop.requested = True
        return agreed, why

    def reason_agreed(self, reason: str | None) -> str | None:
        """A callback's stop ("start" or "epoch") taken on every rank: the lowest rank's reason, None when
        no rank's callback stopped (a rank going on alone would wait for the others forever)."""
        return self.world.agree(reason is not None, reason)[1]

    def failed(self, exc: BaseException) -> None:
        """An exception is leaving run() on this rank: with other ranks, abort them all with its message.
        The others are in, or on their way to, a collective this rank will never join (a bucket's all-reduce,
        the next stop agreement); its own all-reduce requests may be in flight. sys.excepthook does this for
        a script, but an IPython kernel (an ipyparallel engine) catches the exception first."""
        if self.world.size > 1:
            abort_with(self.world, exc)

    def share_bn_stats(self, runner: "Runner") -> None:
        """Rank 0's batch-norm running statistics (and the EMA's, region B) on every rank: PyTorch DDP's
        broadcast_buffers, taken after the steps. Training reads batch statistics only, so a rank's own
        running statistics matter nowhere but where this is called: every 16-step check (callbacks), before
        validation, before a save, at run()'s end."""
        stats = runner.arena.range_view("B_PREV_MEAN", "B_NEXT_VAR", "uint8")
        if stats.size:
            self.world.bcast_(stats)

    def global_sums(self, runner: "Runner") -> np.ndarray:
        """The epoch's metric sums over every rank (loss sum, top-1, top-5, count), also left in the arena."""
        acc = runner.view("metrics.sum")
        if not self.metrics_global:
            self.world.sum_(acc)
            self.metrics_global = True
        self.sync_log(runner)
        return acc.copy()

    def epoch_began(self) -> None:
        self.metrics_global = False

    def mean_loss(self, loss: float) -> float:
        """This rank's batch loss averaged over the ranks, as sync_log averages the log (equal shards: the
        global batch's mean loss), the same on every rank: what the step callbacks and the progress show."""
        part = np.array([loss], np.float32)
        self._mean_(part)
        return float(part[0])

    def _mean_(self, part: np.ndarray) -> None:
        """float32 values averaged over the ranks in place: summed, then times 1/size (one rounding each)."""
        self.world.sum_(part)
        np.multiply(part, np.float32(1.0 / self.world.size), out=part)

    def sync_log(self, runner: "Runner") -> None:
        """The loss log's entries since the last sync: the ranks' mean losses averaged (equal shards:
        the global batch's mean loss), the same bytes on every rank."""
        log, step = runner.view("loss_log"), int(runner.view("step")[0])
        if step > self.logged:
            self._mean_(log[self.logged:step])
        self.logged = step

    def before_save(self, runner: "Runner") -> bool:
        """Make the state rank 0 writes global (metric sums so far on rank 0, zero elsewhere, so that the
        epoch's end still sums to the global ones); True on the rank that writes."""
        self.sync_log(runner)
        self.share_bn_stats(runner)
        if not self.metrics_global:
            acc = runner.view("metrics.sum")
            self.world.sum_(acc)  # rank 0 now holds the global sums so far, which is what it writes
            if self.rank:
                acc[...] = 0.0    # and the others none, so that the epoch's end still sums to the global ones
        return self.rank == 0

    def after_save(self) -> None:
        self.world.barrier()  # the file is complete before any rank reads it

    def after_load(self, runner: "Runner") -> None:
        """Rank 0's file loaded on every rank: its metric sums count once, its loss log is global."""
        if self.rank:
            runner.view("metrics.sum")[...] = 0.0
        self.logged = int(runner.view("step")[0])
        self.metrics_global = False

    def regather(self, runner: "Runner", sched: "EpochSchedule", start: int, global_batch: int) -> None:
        """Load this rank's shard of batch ``start`` again into the buffer step ``start`` reads (the
        checkpoint holds rank 0's), leaving the cursor where it was."""
        if sched.variants is None or start >= sched.batches:
            return
        runner.drain_transfers()
        cursor = runner.view("cursor")
        cursor[0] = start * global_batch
        gid = GraphId.TRANSFER_A if start % 2 == 0 else GraphId.TRANSFER_B
        for k in runner.replay.kernels(sched.variants[start], gid):
            k()
        runner.drain_transfers()

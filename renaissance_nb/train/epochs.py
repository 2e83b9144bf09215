"""How an epoch falls into batches: the one owner of steps per epoch and the last batch.

Here, in the lowest layer that the config, the compiler and the runtime all import (docs/architecture.md's
table), so that each of them asks this value instead of dividing on its own.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EpochBatches:
    """One pass over ``n`` samples in batches of ``batch``: full batches, then a partial last one where
    ``batch`` does not divide ``n`` (PyTorch's DataLoader with ``drop_last=False``). The one owner of
    that arithmetic: the steps per epoch (config.py ``TaskConfig.train_batches``), each rank's share
    (compiler/pipeline.py ``local_sizes``), the variants' batch sizes (compiler/stages.py
    ``variant_specs``) and each step's variant (runtime/replay.py ``run_schedules``, ``batch_variants``)
    all read it, so they cannot drift apart."""

    n: int
    batch: int

    @property
    def steps(self) -> int:
        """The batches of one pass, a partial last one counted: ``ceil(n / batch)``."""
        return -(-self.n // self.batch)

    @property
    def remainder(self) -> int:
        """The samples of a partial last batch; 0 when every batch is full."""
        return self.n % self.batch

    @property
    def last(self) -> int:
        """The last batch's size: the remainder, or ``batch`` when every batch is full (or there are no
        samples: the variant is then planned at full size and never runs)."""
        return self.remainder or self.batch

    def sizes(self) -> list[int]:
        """Every batch's size, in order."""
        return [self.batch] * (self.steps - 1) + [self.last] if self.steps else []

    def labels(self, full: str, partial: str) -> list[str]:
        """``full`` for each batch, the last one ``partial`` when it is partial (the variant of each step)."""
        return [full] * (self.steps - 1) + [partial if self.remainder else full] if self.steps else []

    def splits_over(self, ranks: int) -> bool:
        """Whether every batch, a partial last one too, splits into ``ranks`` equal shards."""
        return self.batch % ranks == 0 and self.remainder % ranks == 0

    def shard(self, ranks: int) -> "EpochBatches":
        """One rank's pass: the equal contiguous shard of each global batch, so every rank takes as many
        steps as the global pass, partial where it is partial. Exact where ``splits_over(ranks)``
        (plan() refuses the others: compiler/pipeline.py ``local_sizes``)."""
        return EpochBatches(self.n // ranks, self.batch // ranks)

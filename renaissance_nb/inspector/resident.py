"""Planned against measured on the CPU: the process's resident memory during a run, beside the plan.

Why: the plan says what the arena and the data take; the operating system says what the process
holds. ``ResidentMemory`` is a run() callback that reads /proc/self/statm (resident pages) at the
start, every ``every`` steps and at each epoch's end, and keeps the arena's and the data's bytes
beside the samples, so one chart draws both (``rows()``). The difference is what the plan does
not own: the interpreter, NumPy, numba's compiled code, OpenBLAS/MKL buffers, the widgets.
"""
from __future__ import annotations

import os
import resource
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError, bad_argument
from ..text import human_bytes

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int:
    """This process's resident memory now (Linux: /proc/self/statm; elsewhere the peak so far)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


@dataclass
class ResidentMemory:
    """A run() callback sampling resident memory; ``every``: also at the step boundaries run() calls
    callbacks at (every 16 steps and an epoch's last) whose step count it divides (None: epochs only)."""

    every: int | None = None
    samples: list[dict[str, int]] = field(default_factory=list)
    arena_bytes: int = 0
    data_bytes: int = 0

    def __post_init__(self) -> None:
        if self.every is not None and (isinstance(self.every, bool) or not isinstance(self.every, int)
                                       or self.every < 1):
            raise bad_argument(ConfigError, "ResidentMemory", "every", self.every, "an int >= 1 or None",
                               "pass every=50 to sample every 50 steps, or None for epoch ends only")

    def __call__(self, kind: str, info: dict[str, Any]) -> None:
        if kind == "start":
            task = info.get("task")
            runner = getattr(task, "runner", None)
            if runner is not None:
                self.arena_bytes = runner.arena.nbytes
                data = runner.config.data
                self.data_bytes = sum(a.nbytes for s in (data.train, data.val) if s is not None for a in (s.x, s.y))
            self._sample(info.get("epoch", 0), -1)
        elif kind == "step" and self.every and info["step"] % self.every == 0:
            self._sample(info["epoch"], info["step"])
        elif kind == "epoch":
            self._sample(int(getattr(info, "epoch", 0)), -1)  # an EpochRecord

    def _sample(self, epoch: int, step: int) -> None:
        self.samples.append({"epoch": int(epoch), "step": int(step), "resident": resident_bytes()})

    def rows(self) -> list[dict[str, int]]:
        """One row per sample: resident bytes, the planned arena and data, and what neither holds."""
        planned = self.arena_bytes + self.data_bytes
        return [{**s, "arena": self.arena_bytes, "data": self.data_bytes, "other": s["resident"] - planned}
                for s in self.samples]

    def summary(self) -> str:
        if not self.samples:
            return "ResidentMemory: no samples (pass it to run(callbacks=[...]))"
        peak = max(s["resident"] for s in self.samples)
        growth = self.samples[-1]["resident"] - self.samples[0]["resident"]
        return (f"resident {human_bytes(peak)} at most over {len(self.samples)} samples (grew "
                f"{human_bytes(max(growth, 0))} from the start); planned: arena {human_bytes(self.arena_bytes)}"
                f" + data {human_bytes(self.data_bytes)}")

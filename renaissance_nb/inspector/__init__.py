"""Questions about a task's memory, answered from its plan (and, after compile, its arena).

``MemoryInspector`` (planview.py): what is live at the peak and why, what a change of setting
would cost (``what_if``, ``diff``), the largest batch that fits a budget (``fit``). export.py writes
the plan as a PyTorch memory_viz snapshot and a Chrome/Perfetto trace; allocations.py counts what
a replayed step allocates; resident.py samples the process's resident memory during a run;
tensorstats.py reads a tensor's values from a compiled task's arena (histogram, range, moments,
NaN/Inf) and a weight's last update (gradient norm, |dW|/|W|).
Everything here returns plain Python values a widget can draw; nothing here draws.
"""
from __future__ import annotations

from .planview import CATEGORIES, LiveTensor, MemoryInspector, PeakReport, PlanDiff, category_of
from .tensorstats import TensorStats, UpdateStats, ValueStats, tensor_stats

__all__ = ["CATEGORIES", "LiveTensor", "MemoryInspector", "PeakReport", "PlanDiff", "category_of", "TensorStats",
           "UpdateStats", "ValueStats", "tensor_stats"]

"""What every benchmark result states: the machine it ran on (CPU model, logical CPUs, Python)."""
from __future__ import annotations

import os
import platform


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform knows."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def machine_line() -> str:
    return f"{platform.node()} · {cpu_model()} · {os.cpu_count()} logical CPUs · Python {platform.python_version()}"

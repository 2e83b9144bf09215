"""Kernel compilation on a second core: the first run after an install compiles from both ends.

(Where the C kernels are built, kernels/native.py, a plan they cover, such as the MLP's, has no
numba kernel to compile, and no helper is started.)

Why: numba compiles a plan's kernels the first time they run (about 12 s of one core for the
seed MLP, most of a first run), one after another on the thread that trains, while the other
cores idle. When ``compile()`` finds numba's disk cache cold (kernels/cacheprobe.py), it starts
one helper process: the same plan, rebuilt around zero data of the same shapes, whose bound
kernels it calls in *reverse* order (optimizer first), so that numba compiles them into the disk
cache. The training thread goes forwards; a kernel it reaches after the helper has cached it is
loaded in milliseconds. Nothing is handed between the two but numba's cache: the helper changes
no byte of the task (its own arena; cached code is the code the task would have compiled), and a
helper that fails or is killed costs nothing but its work. The helper itself is
runtime/warmup_helper.py.

In a notebook the helper usually finishes between ``compile()`` and ``run()``. It runs at a low
priority, is not started with fewer than two usable cores, on a GPU or MPI task, or when
``RNB_WARMUP=0``, and is ended when the process that started it exits. It holds an arena of its
own (the task's size) while it runs; when it has called every kernel it marks the cache warm.
"""
from __future__ import annotations

import atexit
import os
import pickle
import subprocess
import sys
import threading
from typing import Any

from ..config import TaskConfig

_started: list[subprocess.Popen] = []  # the helpers this process started (one at most)


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, which containers and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cache_was_cold() -> bool:
    """Whether numba's disk cache lacks the package's kernels as they are now (no helper has filled it)."""
    from ..kernels.cacheprobe import package_cache_was_cold
    return package_cache_was_cold()


def wanted(config: TaskConfig, device_kind: str, numba_free: bool = False) -> str | None:
    """Why no helper is started for this task (None: start one). ``numba_free``: binding the task's
    kernels bound no numba code (kernels/native.py ``covers``)."""
    if os.environ.get("RNB_WARMUP", "1") == "0":
        return "RNB_WARMUP=0"
    if numba_free:
        return "the C kernels cover the plan: numba compiles nothing"
    if os.environ.get("NUMBA_DISABLE_JIT", "0") not in ("", "0"):
        return "numba's JIT is disabled"
    if _started:
        return "this process started one already"
    if device_kind != "cpu" or config.distributed:
        return "a GPU or MPI task"
    if usable_cores() < 2:
        return "one usable core"
    from ..kernels.cacheprobe import marker_path
    if marker_path() is None:
        return "numba caches nothing here"
    if not cache_was_cold():
        return "numba's cache is warm"
    return None


def _data_spec(config: TaskConfig) -> dict[str, Any]:
    """Shapes and classes of the task's data: the helper builds zeros of the same (the plan follows them)."""
    s = config.data
    assert s is not None

    def one(d: Any) -> tuple[tuple[int, ...], int, str] | None:
        return None if d is None else (tuple(d.x.shape), int(d.num_classes), d.name)
    return {"train": one(s.train), "val": one(s.val), "name": s.name}


def start_warmup(config: TaskConfig, device_kind: str, numba_free: bool = False) -> subprocess.Popen | None:
    """Start the helper for a just-compiled task, where ``wanted`` allows; None where not or if it fails."""
    if wanted(config, device_kind, numba_free) is not None:
        return None
    try:
        message = pickle.dumps((config.with_(data=None), _data_spec(config)))
    except Exception:  # noqa: BLE001 - a setting that does not pickle (a lambda schedule): compile here
        return None
    try:
        proc = subprocess.Popen([sys.executable, "-m", "renaissance_nb.runtime.warmup_helper"], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True,
                                env={**os.environ, "RNB_WARMUP": "0"})  # the helper's own runner starts none
    except OSError:
        return None
    if not _started:
        atexit.register(_stop_all)
    _started.append(proc)  # before anything else can fail: it is killed at exit whatever happens next
    threading.Thread(target=proc.wait, name="rnb-warmup-reaper", daemon=True).start()  # no zombie left
    try:
        assert proc.stdin is not None
        proc.stdin.write(message)
        proc.stdin.close()
    except OSError:  # it died before reading: nothing to wait for
        proc.kill()
    return proc


def _stop_all() -> None:
    """End the helpers still compiling when this process exits (the cache keeps what they finished)."""
    for proc in _started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

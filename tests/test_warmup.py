"""The compile helper of a first run (runtime/warmup.py): started by compile() on a cold cache, it caches
every kernel the task then runs and marks the cache warm; it is started only where it can help and
leaves no process behind."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from renaissance_nb import DeepLearningTask, datasets, fc, relu, seq
from renaissance_nb.kernels import cacheprobe
from renaissance_nb.runtime import warmup

ROOT = Path(__file__).resolve().parents[1]

# a conv net with batch norm (its folding kernel runs before validation), EMA, held-out data, and a hardswish:
# its kernels are numba's only (a conv net without it binds C kernels alone, and needs no warm-up helper)
_TASK = """
import os, sys, gc, json, time
import numpy as np
from renaissance_nb import DeepLearningTask, AdamW, fc
from renaissance_nb.blueprint import cbr, gap, hardswish, seq
from renaissance_nb.runtime import warmup
from renaissance_nb.kernels import cacheprobe
rng = np.random.default_rng(0)
x, y = rng.standard_normal((70, 3, 8, 8)).astype(np.float32), rng.integers(0, 4, 70).astype(np.int32)
task = (DeepLearningTask('w').model(seq(cbr(4, 3, 1, 1), hardswish(), gap(), fc(4)))
        .data(train=(x[:50], y[:50]), val=(x[50:], y[50:]), batch_size=16)
        .optimizer(AdamW().lr(1e-3)).total_epochs(1).seed(5).ema(0.9))
"""

_START = _TASK + """
warmup.usable_cores = lambda: 2
cold = cacheprobe.package_cache_was_cold()
task.compile()
helper = task.runner.warmup
print(json.dumps({"cold": cold, "started": helper is not None, "code": helper and helper.wait(timeout=500),
                  "warm_after": not cacheprobe.package_cache_was_cold()}))
"""

_RUN = _TASK + """
from numba.core.dispatcher import Dispatcher
task.run(progress=False)
compiled = sorted(o.py_func.__name__ for o in gc.get_objects() if isinstance(o, Dispatcher)
                  and o.py_func.__module__.startswith('renaissance_nb') and sum(o.stats.cache_misses.values()))
print(json.dumps({"compiled": compiled, "helper": task.runner.warmup is not None}))
"""


def _python(code: str, cache: Path, **env: str) -> dict:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                         timeout=900, env={**os.environ, "NUMBA_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT),
                                           **env})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_compile_on_a_cold_cache_starts_a_helper_that_caches_every_kernel_the_run_calls(tmp_path: Path) -> None:
    """The real path (config pickled, zero data, ``python -m`` helper): on an empty cache compile() starts
    the helper, which exits cleanly and marks the cache warm; a fresh process then trains, validates
    (batch norm folded, EMA weights scored) and compiles nothing: every kernel loads from the cache."""
    cache = tmp_path / "numba"
    started = _python(_START, cache, RNB_WARMUP="1")
    assert started == {"cold": True, "started": True, "code": 0, "warm_after": True}, started
    after = _python(_RUN, cache, RNB_WARMUP="1")
    assert after == {"compiled": [], "helper": False}, after  # warm: nothing compiled, no second helper


def test_started_only_where_it_helps(monkeypatch: pytest.MonkeyPatch) -> None:
    task = (DeepLearningTask("w").model(seq(fc(16), relu(), fc(10)))
            .data(datasets.default_mnist(), batch_size=64).total_epochs(1).seed(1))
    task.compile()
    config = task.runner.config
    monkeypatch.setattr(warmup, "cache_was_cold", lambda: True)
    monkeypatch.setattr(warmup, "usable_cores", lambda: 2)
    monkeypatch.setattr(warmup, "_started", [])
    monkeypatch.delenv("RNB_WARMUP", raising=False)
    assert warmup.wanted(config, "cpu") is None
    assert warmup.wanted(config, "cuda") == "a GPU or MPI task"
    assert warmup.wanted(config.with_(distributed="mpi", ranks=2), "cpu") == "a GPU or MPI task"
    monkeypatch.setenv("RNB_WARMUP", "0")
    assert warmup.wanted(config, "cpu") == "RNB_WARMUP=0"
    monkeypatch.delenv("RNB_WARMUP")
    monkeypatch.setattr(warmup, "usable_cores", lambda: 1)
    assert warmup.wanted(config, "cpu") == "one usable core"
    monkeypatch.setattr(warmup, "usable_cores", lambda: 2)
    monkeypatch.setattr(warmup, "cache_was_cold", lambda: False)
    assert warmup.wanted(config, "cpu") == "numba's cache is warm"


def test_the_marker_names_this_package_state(tmp_path: Path) -> None:
    """The warm marker lives in numba's cache folder for the package and changes with the sources."""
    path = cacheprobe.marker_path()
    assert path is not None and path.parent == Path(cacheprobe.cache_probe.stats.cache_path)
    assert path.name.startswith("rnb-kernels-cached-")


def test_a_helper_is_reaped_when_it_ends_and_killed_when_its_process_exits(tmp_path: Path) -> None:
    """A finished helper leaves no zombie in a long-lived process (a notebook kernel); one still compiling
    when its process exits is killed (it would otherwise outlive a CLI run)."""
    code = _TASK + """
warmup.usable_cores = lambda: 2
warmup.cache_was_cold = lambda: True
task.compile()
pid = task.runner.warmup.pid
def state():
    try:
        return open(f"/proc/{pid}/stat").read().split()[2]
    except FileNotFoundError:
        return "gone"
if sys.argv[-1] == "wait":
    deadline = time.time() + 500
    while state() not in ("gone",) and time.time() < deadline:
        time.sleep(0.2)
print(json.dumps({"pid": pid, "state": state()}))
"""
    finished = _python(code.replace("sys.argv[-1] == \"wait\"", "True"), tmp_path / "a", RNB_WARMUP="1")
    assert finished["state"] == "gone", finished  # reaped by the process that started it, while it lives
    exited = _python(code, tmp_path / "b", RNB_WARMUP="1")
    try:
        state = Path(f"/proc/{exited['pid']}/stat").read_text().split()[2]
    except (FileNotFoundError, ProcessLookupError):
        state = "gone"
    assert state in ("gone", "Z"), state  # killed at exit (a zombie of init's at most, for an instant)

"""The compile helper of a first run (runtime/warmup.py): it caches every kernel the task then runs,
and it is started only where it can help."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from renaissance_nb import DeepLearningTask, datasets, fc, relu, seq
from renaissance_nb.runtime import warmup

ROOT = Path(__file__).resolve().parents[1]

_TASK = """
import os, sys, gc, json
from renaissance_nb import DeepLearningTask, datasets, fc, relu, seq, AdamW
from renaissance_nb.runtime import warmup, warmup_helper
task = (DeepLearningTask('w').model(seq(fc(64), relu(), fc(10))).data(datasets.default_mnist(), batch_size=96)
        .optimizer(AdamW().lr(1e-3)).total_epochs(1).seed(5).ema(0.9))
"""

_HELPER = _TASK + """
task.compile()
print(json.dumps({"ran": warmup_helper.compile_in_reverse(task.runner.config)}))
"""

_RUN = _TASK + """
from numba.core.dispatcher import Dispatcher
task.run(progress=False)
compiled = sorted(o.py_func.__name__ for o in gc.get_objects() if isinstance(o, Dispatcher)
                  and o.py_func.__module__.startswith('renaissance_nb') and sum(o.stats.cache_misses.values()))
print(json.dumps({"compiled": compiled, "loss": float(task.result.history[-1].train_loss)}))
"""


def _python(code: str, cache: Path, **env: str) -> dict:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, env={**os.environ, "NUMBA_CACHE_DIR": str(cache), "RNB_WARMUP": "0",
                                           "PYTHONPATH": str(ROOT), **env})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_helper_caches_every_kernel_the_run_calls(tmp_path: Path) -> None:
    """On an empty cache, the helper's reverse pass alone leaves nothing for the run to compile: a fresh
    process then loads every kernel of its training and validation passes (EMA's included)."""
    cache = tmp_path / "numba"
    assert _python(_HELPER, cache)["ran"] > 20
    after = _python(_RUN, cache)
    assert after["compiled"] == ["cache_probe"] or after["compiled"] == [], after  # all loaded
    reference = _python(_RUN, tmp_path / "cold")  # the same run compiling everything itself
    assert len(reference["compiled"]) > 5
    assert after["loss"] == reference["loss"]  # cached code is the code: the same bytes


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
    monkeypatch.setenv("RNB_WARMUP", "0")
    assert warmup.wanted(config, "cpu") == "RNB_WARMUP=0"
    monkeypatch.delenv("RNB_WARMUP")
    monkeypatch.setattr(warmup, "usable_cores", lambda: 1)
    assert warmup.wanted(config, "cpu") == "one usable core"
    monkeypatch.setattr(warmup, "usable_cores", lambda: 2)
    monkeypatch.setattr(warmup, "cache_was_cold", lambda: False)
    assert warmup.wanted(config, "cpu") == "numba's cache is warm"


def test_a_cold_cache_starts_one_helper_that_ends_with_its_process(tmp_path: Path) -> None:
    """On an empty cache compile() starts the helper (given two cores); a process that exits first
    kills it at exit (it would otherwise outlive a CLI run)."""
    code = _TASK + """
warmup.usable_cores = lambda: 2
task.compile()
print(json.dumps({"pid": task.runner.warmup.pid, "cold": warmup.cache_was_cold()}))
"""
    got = _python(code, tmp_path / "numba", RNB_WARMUP="1")
    assert got["cold"] is True
    try:  # reaped by its parent's exit handler: no such process, or at most a zombie of init's
        state = Path(f"/proc/{got['pid']}/stat").read_text().split()[2]
    except (FileNotFoundError, ProcessLookupError):
        state = "gone"
    assert state in ("gone", "Z"), state

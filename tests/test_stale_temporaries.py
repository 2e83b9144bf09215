"""A save killed mid-write leaves its ``.rnb-<pid>-*.tmp``; the next write into the folder removes it,
never the file of a writer still at work."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from renaissance_nb import files
from renaissance_nb.errors import CheckpointError

pytestmark = pytest.mark.skipif(files.fcntl is None, reason="POSIX locks (fcntl)")

WRITER = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("rnb_files", sys.argv[1])
files = importlib.util.module_from_spec(spec); spec.loader.exec_module(files)
def write(f):
    f.write(b"half a checkpoint"); f.flush()
    print("writing", flush=True)
    time.sleep(float(sys.argv[3]))
    f.write(b" and the rest")
files.write_atomically(sys.argv[2], write, op="save", error=OSError, example="run.npz")
print("done", flush=True)
"""
"""A writer that stops half-way through its file for argv[3] seconds (files.py loaded alone: no numba start-up)."""


def _writer(path: Path, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, files.__file__, str(path), str(seconds)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "writing\n"
    return proc


def _temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob(".rnb-*.tmp"))


def _save(path: Path) -> None:
    files.write_atomically(path, lambda f: f.write(b"ok"), op="save", error=CheckpointError, example="run.npz")


def test_a_writer_killed_mid_write_leaves_litter_that_the_next_save_removes(tmp_path: Path) -> None:
    proc = _writer(tmp_path / "run.npz", 60)
    left = _temporaries(tmp_path)
    assert left == [name for name in left if name.startswith(f".rnb-{proc.pid}-")] and len(left) == 1
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _temporaries(tmp_path) == left and not (tmp_path / "run.npz").exists()  # SIGKILL: no cleanup ran
    _save(tmp_path / "other.npz")
    assert _temporaries(tmp_path) == [] and (tmp_path / "other.npz").read_bytes() == b"ok"


def test_a_live_writers_file_is_left_alone_and_lands(tmp_path: Path) -> None:
    proc = _writer(tmp_path / "run.npz", 1.5)
    try:
        left = _temporaries(tmp_path)
        _save(tmp_path / "other.npz")  # the other writer is mid-write: its file stays
        assert _temporaries(tmp_path) == left and len(left) == 1
        assert files.remove_stale_temporaries(str(tmp_path)) == []
    finally:
        out, _ = proc.communicate(timeout=60)
    assert out == "done\n" and (tmp_path / "run.npz").read_bytes() == b"half a checkpoint and the rest"
    assert _temporaries(tmp_path) == []


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_locked_file_is_a_live_writer_even_when_its_pid_is_not_one_here(tmp_path: Path) -> None:
    """A writer on another machine sharing the folder: its pid means nothing here, its lock does."""
    name = tmp_path / f".rnb-{_dead_pid()}-abc123.tmp"
    name.write_bytes(b"theirs")
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time\n"
                               "fd = os.open(sys.argv[1], os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_EX)\n"
                               "print('held', flush=True); time.sleep(60)", str(name)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert files.remove_stale_temporaries(str(tmp_path)) == [] and name.exists()
    finally:
        holder.kill()
        holder.wait()
    assert files.remove_stale_temporaries(str(tmp_path)) == [name.name] and not name.exists()


def test_only_our_temporary_names_are_removed_and_pidless_ones_after_an_hour(tmp_path: Path) -> None:
    mine = tmp_path / f".rnb-{os.getpid()}-live01.tmp"  # this process is alive: kept
    legacy_old, legacy_new = tmp_path / ".rnb-oldxyz.tmp", tmp_path / ".rnb-newxyz.tmp"
    strangers = [tmp_path / ".rnb-1-x.txt", tmp_path / "rnb-1-x.tmp", tmp_path / ".download-1.part"]
    for p in (mine, legacy_old, legacy_new, *strangers):
        p.write_bytes(b"x")
    hour_ago = time.time() - files.LEGACY_AGE - 10
    os.utime(legacy_old, (hour_ago, hour_ago))
    assert files.remove_stale_temporaries(str(tmp_path)) == [legacy_old.name]
    assert all(p.exists() for p in (mine, legacy_new, *strangers))

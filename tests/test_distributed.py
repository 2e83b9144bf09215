"""Data-parallel training on 2 MPI ranks (mpiexec from the mpich wheel) on this machine.

Each test launches real processes: tests/distributed/worker.py is one rank (or the single
process it is compared with). Every wait is bounded; a test that cannot start mpiexec at all
skips, saying why.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from renaissance_nb import ConfigError, DeepLearningTask, fc, relu, seq
from renaissance_nb.mpi import mpiexec_path

WORKER = str(Path(__file__).parent / "distributed" / "worker.py")
LIMIT = 240  # seconds any launch may take on the 2-core CI machine


def _mpiexec() -> str:
    pytest.importorskip("mpi4py", reason="mpi4py is in the test extra; without it there is no MPI to test")
    exe = mpiexec_path()
    if exe is None:
        pytest.skip("no mpiexec next to this Python or on PATH (the mpich wheel provides one)")
    probe = subprocess.run([exe, "-n", "2", sys.executable, "-c", "from mpi4py import MPI; "
                            "assert MPI.COMM_WORLD.Get_size() == 2"], capture_output=True, text=True, timeout=60)
    if probe.returncode:
        pytest.skip(f"mpiexec cannot start 2 ranks here: {probe.stderr.strip()[-300:]}")
    return exe


def _env() -> dict[str, str]:
    return {**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def _run(args: list[str], ranks: int) -> subprocess.CompletedProcess:
    cmd = ([_mpiexec(), "-n", str(ranks)] if ranks > 1 else []) + [sys.executable, WORKER, *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=LIMIT, env=_env())
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The seed MLP for 224 steps: 1 process x batch 128, and 2 ranks x 64 (the global batch 128)."""
    d = tmp_path_factory.mktemp("dp")
    _run(["train", str(d / "one.npz")], 1)
    _run(["train", str(d / "two.npz")], 2)
    return {"one": d / "one.npz", "two": d / "two.npz", "dir": d}


BUCKETS = ["allreduce_start:fc4", "allreduce_start:fc3", "allreduce_start:fc2", "allreduce_start:fc1",
           "allreduce_start:fc1", "allreduce_wait:fc4", "allreduce_wait:fc3", "allreduce_wait:fc2", "allreduce_wait:fc1"]
"""The plan's all-reduce nodes by GraphId: a start after each layer's backward (DEEP_FWD_BWD late layers
first, then FIRST_LAYER_BWD_A and _B), then DEEP_COMM's waits in the same order."""


def test_two_ranks_follow_one_process_step_by_step(runs) -> None:
    one, two = np.load(runs["one"]), np.load(runs["two"])
    la, lb = one["losses"], two["losses"]
    assert len(la) == len(lb) == 224
    assert la[199] < 0.4 * la[0]  # it learns (2.30 -> 0.79)
    rel = np.abs(la - lb) / np.abs(la)
    assert rel[:200].max() <= 1e-5, (rel.argmax(), rel.max())
    for k in one.files:
        if k.startswith("w_"):
            assert np.linalg.norm(one[k] - two[k]) / np.linalg.norm(one[k]) <= 1e-4, k
    np.testing.assert_allclose(two["train_loss"], one["train_loss"], rtol=1e-5)
    np.testing.assert_allclose(two["val_loss"], one["val_loss"], rtol=1e-5)
    # every step ended with the same weight bytes on both ranks (a SHA-256 all-gather after each step)
    assert int(two["checked"]) == 224 and int(two["mismatched"]) == 0
    assert list(two["comm"]) == BUCKETS and list(one["comm"]) == []  # the bucketed, overlapping all-reduce


def test_the_bucketed_all_reduce_gives_the_bytes_of_the_one_slab(runs) -> None:
    """allreduce='slab' (one blocking Allreduce of the whole G range after backward) against the default
    buckets (an Iallreduce per layer as backward writes it): the same sums, so the same weight bytes."""
    slab = runs["dir"] / "slab.npz"
    _run(["train", str(slab), "slab"], 2)
    a, b = np.load(runs["two"]), np.load(slab)
    assert list(b["comm"]) == ["allreduce_mean:grads"]
    assert int(b["checked"]) == 224 and int(b["mismatched"]) == 0
    np.testing.assert_array_equal(a["losses"], b["losses"])
    for k in a.files:
        if k.startswith("w_"):
            assert a[k].tobytes() == b[k].tobytes(), k


def test_a_checkpoint_of_two_ranks_resumes_on_two_byte_identically(runs) -> None:
    d = runs["dir"]
    out = _run(["stop", str(d / "cut"), "40"], 2)
    assert "stopped at (1, 16)" in out.stdout, out.stdout  # the check after step 40: epoch 2, its step 16
    _run(["resume", str(d / "cut")], 2)
    whole, cut = np.load(runs["two"]), np.load(d / "cut.npz")
    for k in whole.files:
        if k.startswith("w_"):
            assert whole[k].tobytes() == cut[k].tobytes(), k
    np.testing.assert_array_equal(cut["losses"], whole["losses"])
    # another rank count is refused with the library's error, naming both counts
    one = subprocess.run([sys.executable, WORKER, "resume", str(d / "cut")], capture_output=True, text=True,
                         timeout=LIMIT, env=_env())
    assert one.returncode != 0 and "CheckpointError" in one.stderr and "2 rank(s)" in one.stderr, one.stderr[-800:]


def test_an_exception_on_one_rank_ends_every_rank_with_its_message(tmp_path) -> None:
    exe = _mpiexec()
    t = time.monotonic()
    out = subprocess.run([exe, "-n", "2", sys.executable, WORKER, "raise", str(tmp_path / "x")], capture_output=True,
                         text=True, timeout=LIMIT, env=_env())
    assert out.returncode != 0
    assert "[rank 1] RuntimeError: rank 1 fails on purpose" in out.stderr, out.stderr[-2000:]
    assert time.monotonic() - t < LIMIT


def test_a_stop_asked_on_one_rank_stops_both_at_the_same_step_and_resumes(tmp_path) -> None:
    """What Ctrl-C does once it reaches a rank (StopFlag.requested): the ranks agree at the next 16-step
    check (the SIGINT itself: the two tests below)."""
    out = _run(["stop_one", str(tmp_path / "s")], 2)
    line = next(s for s in out.stdout.splitlines() if s.startswith("interrupted="))
    assert line == "interrupted=True at=[(0, 16), (0, 16)]", line
    _run(["resume", str(tmp_path / "s")], 2)
    assert len(np.load(tmp_path / "s.npz")["losses"]) == 224


def _interrupt(cmd: list[str], ready: Callable[[str], bool], group: bool) -> tuple[subprocess.Popen, str, str, float]:
    """Start ``cmd`` in a session of its own, read its stdout until ``ready(line)``, then send SIGINT as Ctrl-C
    in a terminal does: to the whole process group (``group``) or to mpiexec alone. MPICH's mpiexec starts
    each rank in a session of its own, so the ranks get the signal only by mpiexec forwarding it."""
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(), cwd=tempfile.gettempdir())
    try:
        seen = []
        for line in proc.stdout:  # type: ignore[union-attr]
            seen.append(line)
            if ready(line):
                break
        assert seen and ready(seen[-1]), "".join(seen)[-2000:] + proc.stderr.read()[-2000:]  # type: ignore[union-attr]
        sent = time.monotonic()
        (os.killpg if group else os.kill)(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=LIMIT)
        return proc, "".join(seen) + out, err, time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def test_ctrl_c_forwarded_by_mpiexec_stops_both_ranks_at_one_step_boundary_and_the_run_resumes(runs) -> None:
    """SIGINT to mpiexec (what Ctrl-C sends it): hydra forwards it to every rank; each rank's handler asks
    for a stop, agreed at the next 16-step check (one all-reduce), and the checkpoint resumes."""
    d = runs["dir"]
    proc, out, err, after = _interrupt([_mpiexec(), "-n", "2", sys.executable, WORKER, "sigint", str(d / "c")],
                                       lambda line: line == "at step 16\n", group=False)
    assert proc.returncode == 0, err[-3000:]
    line = out.splitlines()[-1]
    assert line in ("interrupted=True at=[(0, 16), (0, 16)]", "interrupted=True at=[(0, 32), (0, 32)]"), out + err
    assert after < 60
    _run(["resume", str(d / "c")], 2)
    whole, cut = np.load(runs["two"]), np.load(d / "c.npz")
    np.testing.assert_array_equal(cut["losses"], whole["losses"])
    for k in whole.files:
        if k.startswith("w_"):
            assert whole[k].tobytes() == cut[k].tobytes(), k


def test_ctrl_c_in_a_terminal_stops_train_nproc_2_on_every_rank() -> None:
    """``python -m renaissance_nb train --nproc 2`` and Ctrl-C: the launcher waits for mpiexec (it does not
    kill it), mpiexec forwards the signal, both ranks stop at one step boundary and the job exits 130."""
    _mpiexec()
    proc, out, err, after = _interrupt([sys.executable, "-m", "renaissance_nb", "train", "--nproc", "2",
                                        "--epochs", "30"], lambda line: line.startswith("epoch   1 "), group=True)
    assert proc.returncode == 130, out[-2000:] + err[-2000:]
    assert re.search(r"stopped after step (16|32) of 32 in epoch \d+ \(Ctrl-C\)", out), out[-2000:]
    done = re.findall(r"interrupted by Ctrl-C after (\d+) of 30 epochs", err)
    assert len(done) == 2 and len(set(done)) == 1, err[-2000:]  # rank 0 and rank 1, at the same point
    assert after < 60


def test_a_batch_that_does_not_split_over_the_ranks_is_refused_at_plan() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((99, 8)).astype(np.float32), rng.integers(0, 3, 99)
    built = DeepLearningTask("dp").model(seq(fc(8), relu(), fc(3))).data(train=(x, y), batch_size=32)
    task = DeepLearningTask(config=built.config.with_(distributed="mpi", ranks=3))  # as under mpiexec -n 3
    with pytest.raises(ConfigError, match="does not split evenly over 3 ranks.*e.g. 33"):
        task.plan()


def test_importing_the_library_loads_no_mpi() -> None:
    code = "import sys, renaissance_nb; print('mpi4py' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120).stdout.strip() == "False"


def _conv_bn_task() -> DeepLearningTask:
    from renaissance_nb import bn, conv, flatten
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((64, 1, 8, 8)).astype(np.float32), rng.integers(0, 3, 64)
    return DeepLearningTask("buckets").model(seq(conv(4, 3, 1, 1), bn(), relu(), flatten(), fc(16), relu(),
                                                 fc(3))).data(train=(x, y), batch_size=16)


def test_a_bucket_starts_right_after_the_backward_that_writes_it_and_is_waited_before_the_optimizer() -> None:
    from renaissance_nb.compiler.ids import GraphId
    from renaissance_nb.compiler.touches import reduced_ids
    task = _conv_bn_task().distributed("mpi", ranks=2).lock_memory()  # planned for 2 ranks, MPI not started
    g, plan = task.graphs.train, task.memory
    grads = {t.id for t in plan if t.region.family == "G"}
    deep = g.nodes(GraphId.DEEP_FWD_BWD)
    for gid in (GraphId.DEEP_FWD_BWD, GraphId.FIRST_LAYER_BWD_A, GraphId.FIRST_LAYER_BWD_B):
        nodes = g.nodes(gid)
        for i, n in enumerate(nodes):
            if n.op == "allreduce_start":  # the node just before it wrote exactly this bucket; no later one does
                assert set(n.inputs) <= set(nodes[i - 1].outputs) and nodes[i - 1].layer == n.layer, n
                assert not any(set(n.inputs) & set(m.outputs) for m in nodes[i + 1:]), n
    started = [n.layer for n in deep if n.op == "allreduce_start"]
    assert started == ["fc2", "fc1", "bn1"]  # late layers first (layers named by kind, as PyTorch would)
    waits = g.nodes(GraphId.DEEP_COMM)
    assert [n.layer for n in waits] == [*started, "conv1"] and {n.op for n in waits} == {"allreduce_wait"}
    assert set().union(*(n.inputs for n in waits)) == grads  # every gradient is in one bucket
    assert reduced_ids(g, plan) == grads
    slab = _conv_bn_task().distributed("mpi", ranks=2, allreduce="slab").lock_memory()
    assert reduced_ids(slab.graphs.train, slab.memory) == {t.id for t in slab.memory if t.region.family == "G"}
    assert not reduced_ids(_conv_bn_task().lock_memory().graphs.train, plan)  # one process reduces nothing


def test_distributed_arguments_are_checked() -> None:
    with pytest.raises(ConfigError, match="ranks=0.*whole number >= 1"):
        _conv_bn_task().distributed("mpi", ranks=0)
    with pytest.raises(ConfigError, match="allreduce='ring'.*'buckets', 'slab'"):
        _conv_bn_task().distributed("mpi", ranks=2, allreduce="ring")


def test_planning_for_ranks_loads_no_mpi() -> None:
    code = ("import sys; from renaissance_nb import DeepLearningTask, datasets, fc, seq; "
            "DeepLearningTask().model(seq(fc(10))).data(datasets.default_mnist(), batch_size=128)"
            ".distributed('mpi', ranks=2).lock_memory(); print('mpi4py' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


def test_the_region_map_marks_what_is_all_reduced() -> None:
    from renaissance_nb.display import static, views
    task = _conv_bn_task().distributed("mpi", ranks=2).lock_memory()
    v = views.region_view(task)
    marked = {r["region"] for r in v["regions"] if r["reduced"]}
    assert marked == {r["region"] for r in v["regions"] if r["family"] == "G"} == {
        "G_BN_BIAS", "G_BN_WEIGHT", "G_FC_BIAS", "G_FC_WEIGHT", "G_FIRST_CONV"}
    grads = [t for t in task.memory if t.region.family == "G"]
    assert {t["id"] for t in v["tensors"] if t["reduced"]} == {t.id for t in grads}
    nbytes = sum(t.storage_bytes for t in grads)
    from renaissance_nb.text import human_bytes
    assert v["reduced_text"].startswith(f"⇄ all-reduced over 2 ranks every step: {len(grads)} gradient tensors, "
                                        f"{human_bytes(nbytes)} in G_BN_BIAS")
    assert v["reduced_text"] in static.regions_html(v).replace("&#x27;", "'")
    one = views.region_view(_conv_bn_task().lock_memory())
    assert one["reduced_text"] == "" and not any(r["reduced"] for r in one["regions"])

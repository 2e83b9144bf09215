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
    """One thread per rank; RNB_PROGRAM=0: the worker appends Python checks to the step programs after compile
    (watch_weights, inside_step), which a step captured as a native program would not run."""
    return {**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
            "RNB_PROGRAM": "0"}


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
    # DeepLearningTask.load under the same rank count rebuilds a task on those ranks (it built a one-process
    # task, which the checkpoint's rank check then refused on every rank count)
    _run(["load", str(d / "cut")], 2)
    loaded = np.load(d / "cut.npz")
    for k in whole.files:
        if k.startswith("w_"):
            assert whole[k].tobytes() == loaded[k].tobytes(), k
    # another rank count is refused with the library's error, naming both counts
    one = subprocess.run([sys.executable, WORKER, "resume", str(d / "cut")], capture_output=True, text=True,
                         timeout=LIMIT, env=_env())
    assert one.returncode != 0 and "CheckpointError" in one.stderr and "2 rank(s)" in one.stderr, one.stderr[-800:]


def test_a_conv_bn_net_holds_the_same_weights_and_statistics_on_every_rank_and_resumes_byte_identically(
        tmp_path) -> None:
    """Batch norm normalizes with each rank's own shard statistics (as DDP without SyncBatchNorm), so the
    running statistics each rank would accumulate differ; every rank takes rank 0's (DDP's broadcast_buffers)
    at each 16-step check, before validation, before a save and at the end. Then the state dicts (running
    statistics included), the arena's B region (the EMA's statistics too) and the validation losses of
    every epoch are the same bytes on both ranks, every step's weights too, and a checkpoint cut at step 40
    resumes both ranks to the uninterrupted run's bytes. (Before: bn running_mean/var and validation losses
    differed between the ranks, and rank 1 resumed on rank 0's statistics.)"""
    import json
    _run(["train", str(tmp_path / "whole"), "--bn"], 2)
    out = _run(["stop", str(tmp_path / "cut"), "40", "--bn"], 2)
    assert "rank 1 stopped at (1, 16)" in out.stdout, out.stdout
    _run(["resume", str(tmp_path / "cut"), "--bn"], 2)
    whole, cut = np.load(tmp_path / "whole.npz"), np.load(tmp_path / "cut.npz")
    digests = json.loads(str(whole["digests"]))
    assert {"bn1.running_mean", "bn2.running_var", "arena B"} <= set(digests[0])
    assert digests[0] == digests[1]
    assert int(whole["checked"]) == 96 and int(whole["mismatched"]) == 0
    assert whole["val_by_rank"].shape == (2, 3) and (whole["val_by_rank"][0] == whole["val_by_rank"][1]).all()
    assert json.loads(str(cut["digests"])) == digests  # rank 0's and rank 1's
    np.testing.assert_array_equal(cut["val_by_rank"], whole["val_by_rank"])
    np.testing.assert_array_equal(cut["losses"], whole["losses"])


def test_an_exception_on_one_rank_ends_every_rank_with_its_message(tmp_path) -> None:
    exe = _mpiexec()
    t = time.monotonic()
    out = subprocess.run([exe, "-n", "2", sys.executable, WORKER, "raise", str(tmp_path / "x")], capture_output=True,
                         text=True, timeout=LIMIT, env=_env())
    assert out.returncode != 0
    assert "[rank 1] RuntimeError: rank 1 fails on purpose" in out.stderr, out.stderr[-2000:]
    assert time.monotonic() - t < LIMIT


def test_an_exception_caught_as_ipython_does_still_ends_every_rank(tmp_path) -> None:
    """In an ipyparallel engine IPython catches the exception, so sys.excepthook never aborts: run() itself
    aborts every rank (before the fix rank 0 waited in the next stop agreement forever)."""
    exe = _mpiexec()
    t = time.monotonic()
    out = subprocess.run([exe, "-n", "2", sys.executable, WORKER, "raise_caught", str(tmp_path / "x")],
                         capture_output=True, text=True, timeout=LIMIT, env=_env())
    assert out.returncode == 1, out.stdout[-1000:] + out.stderr[-2000:]
    assert "[rank 1] RuntimeError: rank 1 fails on purpose" in out.stderr, out.stderr[-2000:]
    assert "caught" not in out.stdout  # the abort came first: the workers wait 120 s after catching
    assert time.monotonic() - t < 100


def test_an_interrupt_between_a_buckets_start_and_wait_ends_every_rank(tmp_path) -> None:
    """A second Ctrl-C inside a step on rank 1, after its first bucket's Iallreduce started and before
    DEEP_COMM waits for it, caught as IPython does: every rank ends (MPI_Abort, 130) instead of rank 0
    waiting for buckets rank 1 never starts."""
    exe = _mpiexec()
    t = time.monotonic()
    out = subprocess.run([exe, "-n", "2", sys.executable, WORKER, "interrupt_inside", str(tmp_path / "x")],
                         capture_output=True, text=True, timeout=LIMIT, env=_env())
    assert out.returncode == 130, out.stdout[-1000:] + out.stderr[-2000:]
    assert "[rank 1] KeyboardInterrupt" in out.stderr and "caught" not in out.stdout, out.stderr[-2000:]
    assert time.monotonic() - t < 100


def test_a_bucket_started_again_before_its_wait_is_refused() -> None:
    """What an interrupted step leaves: a bucket's requests in flight. Starting the bucket again would
    overwrite them while MPI may still write the buffer; the start refuses (one process, MPI's singleton)."""
    pytest.importorskip("mpi4py", reason="mpi4py is in the test extra")
    code = """if True:
        import numpy as np
        from mpi4py import MPI
        from renaissance_nb.errors import PlanError
        from renaissance_nb.kernels.base import BindEnv
        from renaissance_nb.kernels.comm import COMM_KERNELS
        env, g, p = BindEnv(comm=MPI.COMM_WORLD, ranks=1), np.ones(6, np.float32), {"bucket": "fc1", "ranks": 1}
        start, wait = (COMM_KERNELS[op]([], [g], p, env) for op in ("allreduce_start", "allreduce_wait"))
        start(); wait(); start()  # a whole step, then a step stopped after this start
        try:
            start()
        except PlanError as exc:
            print("refused:", exc)
        wait()
        print("then", g.sum())
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_env())
    assert out.returncode == 0, out.stderr[-2000:]
    assert "refused: allreduce_start: bucket 'fc1' still has 1 all-reduce request(s) in flight" in out.stdout, out.stdout
    assert "then 6.0" in out.stdout


def test_a_stop_asked_on_one_rank_stops_both_at_the_same_step_and_resumes(tmp_path) -> None:
    """What Ctrl-C or a step callback does once it reaches a rank (StopFlag.requested): the ranks agree at
    the next 16-step check, for rank 1's reason on both (the SIGINT itself: the tests below)."""
    out = _run(["stop_one", str(tmp_path / "s")], 2)
    line = next(s for s in out.stdout.splitlines() if s.startswith("interrupted="))
    assert line == "interrupted=True at=[(0, 16), (0, 16)] why=['rank 1 asked to stop', 'rank 1 asked to stop']", line
    _run(["resume", str(tmp_path / "s")], 2)
    assert len(np.load(tmp_path / "s.npz")["losses"]) == 224


def _descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (from /proc): mpiexec in its own session, its proxies and the ranks."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _interrupt(cmd: list[str], ready: Callable[[str], bool], group: bool) -> tuple[subprocess.Popen, str, str, float]:
    """Start ``cmd`` in a session of its own, read its stdout until ``ready(line)``, then send SIGINT as Ctrl-C
    in a terminal does: to the whole process group (``group``) or to the process alone. MPICH's mpiexec starts
    each rank in a session of its own, so the ranks get the signal only by mpiexec forwarding it; ``train
    --nproc`` starts mpiexec in a session of its own, so mpiexec gets it only by the launcher forwarding it."""
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
        for pid in [*_descendants(proc.pid), proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc.returncode is None:
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


def _stops_train_nproc_2(group: bool) -> None:
    _mpiexec()
    proc, out, err, after = _interrupt([sys.executable, "-m", "renaissance_nb", "train", "--nproc", "2",
                                        "--epochs", "30"], lambda line: line.startswith("epoch   1 "), group=group)
    assert proc.returncode == 130, out[-2000:] + err[-2000:]
    assert ("ranks: 2 MPI processes started by mpiexec, data-parallel: each trains on 64 of every global batch of "
            "128 samples") in out, out[:3000]  # the output used to never say it ran on 2 ranks
    assert re.search(r"stopped after step (16|32) of 32 in epoch \d+ \(Ctrl-C\)", out), out[-2000:]
    done = re.findall(r"interrupted by Ctrl-C after (\d+) of 30 epochs", err)
    assert len(done) == 2 and len(set(done)) == 1, err[-2000:]  # rank 0 and rank 1, at the same point
    assert after < 60


def test_ctrl_c_in_a_terminal_stops_train_nproc_2_on_every_rank() -> None:
    """``python -m renaissance_nb train --nproc 2`` and Ctrl-C (SIGINT to the terminal's process group): the
    launcher passes it to mpiexec once, mpiexec to the ranks, both stop at one step boundary, the job exits 130."""
    _stops_train_nproc_2(group=True)


def test_sigint_to_the_launcher_alone_stops_train_nproc_2_on_every_rank() -> None:
    """``kill -INT <launcher>`` (or a supervisor signalling only its child) never reached mpiexec before: the
    launcher swallowed it and the job trained on. Now it passes it on, and the job stops as after Ctrl-C."""
    _stops_train_nproc_2(group=False)


def test_the_launcher_passes_each_signal_on_once_and_kills_mpiexec_at_the_third_ctrl_c() -> None:
    from renaissance_nb.__main__ import _Forward

    class Proc:
        def __init__(self) -> None:
            self.got: list[object] = []

        def send_signal(self, sig: int) -> None:
            self.got.append(sig)

        def kill(self) -> None:
            self.got.append("kill")
    forward, proc = _Forward(), Proc()
    forward(signal.SIGINT, None)  # before mpiexec started: passed on once it has
    forward.started(proc)  # type: ignore[arg-type]
    forward(signal.SIGTERM, None)
    forward(signal.SIGINT, None)
    forward(signal.SIGINT, None)
    assert proc.got == [signal.SIGINT, signal.SIGTERM, signal.SIGINT, "kill"]


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


# ---- the trainer's agreements with a fake world (no MPI): another rank simulated by its votes ----------
class _MirrorWorld:
    """A World of 2 ranks where this process is rank 0 and rank 1 holds the same numbers (sums double,
    broadcasts keep them); ``others[k]`` is rank 1's vote (stop?, reason) in the k-th agreement (1-based),
    and in agreement ``signal_at`` a SIGINT reaches this process while the agreement runs."""

    rank, size = 0, 2

    def __init__(self, others: dict[int, tuple[bool, str | None]] | None = None, signal_at: int = 0) -> None:
        self.others, self.signal_at, self.calls = others or {}, signal_at, 0

    def agree(self, flag: bool, reason: str | None) -> tuple[bool, str | None]:
        self.calls += 1
        if self.calls == self.signal_at:  # handled now, after this rank's vote was read: as in the LOR/allgather
            signal.raise_signal(signal.SIGINT)
        other, why = self.others.get(self.calls, (False, None))
        return flag or other, reason if reason is not None else why

    def sum_(self, array: np.ndarray) -> np.ndarray:
        array *= 2
        return array

    def bcast_(self, array: np.ndarray) -> np.ndarray:
        return array

    def barrier(self) -> None:
        pass

    def abort(self, code: int = 1) -> None:
        raise AssertionError(f"aborted with {code}")


def _mirrored(world: _MirrorWorld) -> DeepLearningTask:
    """A 64-step epoch on one process whose trainer talks to ``world`` as rank 0 of a data-parallel run
    (agreements: 1 at the start, then at steps 16, 32, 48, 64 of each epoch, then the epoch's end)."""
    from renaissance_nb.runtime.data_parallel import DataParallel
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((512, 8)).astype(np.float32), rng.integers(0, 3, 512)
    task = (DeepLearningTask("fake").model(seq(fc(8), relu(), fc(3))).data(train=(x, y), batch_size=8)
            .total_epochs(2).seed(0).compile())
    task.runner.dp = DataParallel(world)  # type: ignore[arg-type]
    return task


def test_a_ctrl_c_handled_while_the_ranks_agree_is_agreed_at_the_next_check() -> None:
    """The SIGINT arrives inside the agreement at step 16, which was taken on the flag read before it (the
    other rank had none): the run must stop at the next check, step 32. Storing the agreement's False
    over the flag (the old code) lost it and the run trained on to its end."""
    from renaissance_nb.runtime.data_parallel import DataParallel
    from renaissance_nb.runtime.interrupt import StopFlag
    world = _MirrorWorld(signal_at=2)
    result = _mirrored(world).run(progress="none")
    assert result.interrupted and result.stopped is None
    assert len(result.history) == 0 and len(result.step_losses) == 32, len(result.step_losses)
    with StopFlag() as stop:  # the same at the level of one agreement
        dp = DataParallel(_MirrorWorld(signal_at=1))  # type: ignore[arg-type]
        assert dp.stop_agreed(stop, None) == (False, None) and stop.requested
        assert dp.stop_agreed(stop, None) == (True, None)


def test_a_stop_asked_by_another_ranks_step_callback_is_told_with_its_reason() -> None:
    task = _mirrored(_MirrorWorld(others={3: (True, "rank 1's callback")}))
    result = task.run(progress="none")
    assert result.interrupted and result.stopped == "rank 1's callback"
    assert task.run_state.resume_at == (0, 32)


def test_a_stop_by_another_ranks_epoch_or_start_callback_is_taken_on_this_rank_too() -> None:
    result = _mirrored(_MirrorWorld(others={6: (True, "rank 1 stops after epoch 1")})).run(progress="none")
    assert result.stopped == "rank 1 stops after epoch 1" and len(result.history) == 1 and not result.interrupted
    result = _mirrored(_MirrorWorld(others={1: (True, "rank 1 refuses")})).run(progress="none")
    assert result.stopped == "rank 1 refuses" and len(result.step_losses) == 0


def test_train_resume_of_a_two_rank_run_runs_on_two_ranks(tmp_path) -> None:
    """``train --resume`` takes the rank count from the checkpoint, as it takes epochs and batch size (the
    printed command, without --nproc 2, failed with "written by a run on 2 rank(s)"); a --nproc that differs is
    refused in the command line's words; the printed evaluate command runs on the ranks the checkpoint needs."""
    _mpiexec()
    run = tmp_path / "run.npz"
    cmd = [sys.executable, "-m", "renaissance_nb", "train", "--epochs", "1", "--checkpoint", str(run)]
    first = subprocess.run([*cmd, "--nproc", "2"], capture_output=True, text=True, timeout=LIMIT, env=_env())
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert re.search(r"mpiexec -n 2 python3 -c .*DeepLearningTask\.load", first.stdout), first.stdout[-1500:]
    again = subprocess.run([*cmd[:4], "--resume", str(run)], capture_output=True, text=True, timeout=LIMIT,
                           env=_env())
    assert again.returncode == 0 and "ranks: 2 MPI processes" in again.stdout, again.stdout[-2000:] + again.stderr
    one = subprocess.run([*cmd[:4], "--resume", str(run), "--nproc", "1"], capture_output=True, text=True,
                         timeout=LIMIT, env=_env())
    assert one.returncode == 1 and "--nproc 1 differs from the 2 the run in" in one.stderr, one.stderr[-1000:]

"""One rank of tests/test_distributed.py (or the single process it is compared with).

    python worker.py MODE OUT [ARGS...] [--bn]    (under mpiexec -n 2 for a distributed run)

Modes: ``train [buckets|slab]`` (E epochs, step losses, weights, the per-step weight digests of every
rank and the plan's all-reduce nodes into OUT.npz), ``stop`` (stop at the first 16-step check after step S, save a checkpoint OUT.ckpt),
``resume`` (load OUT.ckpt and finish), ``raise`` (rank 1's step callback raises), ``stop_one`` (rank 1 alone asks
to stop; print where every rank stopped and why), ``sigint`` (run until a SIGINT forwarded by mpiexec stops it;
print where every rank stopped, save OUT.ckpt), ``raise_caught`` (as ``raise``, and the worker catches the
error, as an IPython engine does), ``interrupt_inside`` (rank 1 gets a KeyboardInterrupt inside step 5, between
its first bucket's all-reduce start and wait, caught by the worker). ``--bn``: a conv + batch-norm net with
validation, EMA and augmentation on small random images instead of the MLP; ``train`` and ``resume`` then also
save every rank's digests of its state dict, EMA statistics included, and validation losses.
"""
from __future__ import annotations

import json
import sys
import time

import numpy as np

from renaissance_nb import SGD, AdamW, DeepLearningTask, StopTraining, datasets, fc, relu, seq
from renaissance_nb.mpi import under_mpiexec

BN = "--bn" in sys.argv
ARGS = [a for a in sys.argv if a != "--bn"]
MODE, OUT = ARGS[1], ARGS[2]
EPOCHS = 7  # 7 x 32 steps of MNIST-5k at batch 128: 224 steps
OPTIMIZER = SGD().lr(0.002).momentum(0.9)
"""AdamW at lr 1e-3 fits these 4,000 samples to a loss near 0.01 within 150 steps, where it amplifies
the float32 rounding of a 64 + 64 row sum against a 128 row one chaotically (1e-7 at step 100, 4e-2 at
step 220); SGD with momentum follows the same data-parallel arithmetic without that amplification."""


ALLREDUCE = ARGS[3] if MODE == "train" and len(ARGS) > 3 else "buckets"


def build() -> DeepLearningTask:
    if BN:  # 512 images, global batch 16: 32 steps per epoch, 3 epochs
        from renaissance_nb import bn, conv, flatten
        rng = np.random.default_rng(3)
        x, y = rng.standard_normal((640, 3, 8, 8)).astype(np.float32), rng.integers(0, 4, 640)
        task = (DeepLearningTask("dpbn").model(seq(conv(8, 3, 1, 1), bn(), relu(), conv(8, 3, 1, 1), bn(), relu(),
                                                    flatten(), fc(4)))
                .data(train=(x[:512], y[:512]), val=(x[512:], y[512:]), batch_size=16).augment(crop_pad=1, flip=True)
                .ema(0.9).optimizer(AdamW()).total_epochs(3).seed(1))
    else:
        task = (DeepLearningTask("dp").model(seq(fc(1024), relu(), fc(512), relu(), fc(256), relu(), fc(10)))
                .data(datasets.default_mnist(), batch_size=128).optimizer(OPTIMIZER).total_epochs(EPOCHS)
                .seed(7))
    if under_mpiexec():
        task.distributed("mpi", allreduce=ALLREDUCE)
    return task.compile()


def watch_weights(task: DeepLearningTask) -> list[int]:
    """Append to every training step program a kernel that all-gathers each rank's digest of the
    weights and counts the steps where they differ (the programs are shared lists: the trainer
    replays these very lists)."""
    runner, bad = task.runner, [0, 0]
    dp = runner.dp
    if dp is None:
        return bad
    w = runner.view("fc1.weight")  # the W range: every weight, one digest
    from renaissance_nb.memory.region import Region
    a, b = task.compiled.plan.region_range(Region.W_EQ_BIAS, Region.W_DEEP_CONV)
    weights = runner.arena.bytes[a:b]
    del w

    def check() -> None:
        digests = dp.world.digests(weights)
        bad[0] += 1
        bad[1] += len(set(digests)) != 1
    from renaissance_nb.runtime.replay import batch_variants
    n, batch = len(task.splits.train), task.config.batch_size
    sched = runner.replay.train_schedule(batch_variants(n, batch, "train_base", "train_last"))
    for prog in {id(p): p for p in sched.steps}.values():
        prog.append(check)
    return bad


def rank() -> int:
    if not under_mpiexec():
        return 0
    from renaissance_nb.mpi import world
    return world().rank


def world_size() -> int:
    if not under_mpiexec():
        return 1
    from renaissance_nb.mpi import world
    return world().size


def gathered(value: object) -> list:
    """``value`` of every rank, in rank order ([value] on one process)."""
    if not under_mpiexec():
        return [value]
    from renaissance_nb.mpi import world
    return world().comm.allgather(value)


def state_digests(task: DeepLearningTask) -> dict[str, str]:
    """SHA-256 of each state-dict tensor (batch-norm running statistics included) and of the arena's B region
    (the running statistics and the EMA's)."""
    import hashlib
    out = {k: hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest() for k, v in task.state_dict().items()}
    b = task.runner.arena.range_view("B_PREV_MEAN", "B_NEXT_VAR", "uint8")
    out["arena B"] = hashlib.sha256(b.tobytes()).hexdigest()
    return out


def per_rank(task: DeepLearningTask, result: object) -> dict:
    """What every rank holds at the end, gathered: its state digests and its epoch records' validation losses."""
    if not BN:
        return {}
    return {"digests": np.array(json.dumps(gathered(state_digests(task)))),
            "val_by_rank": np.array(gathered([h.val_loss for h in result.history]), dtype=np.float64)}


def inside_step(task: DeepLearningTask, at: int) -> None:
    """Rank 1 only: a KeyboardInterrupt (a second Ctrl-C) in step ``at``, right after the step's first
    all-reduce start, before DEEP_COMM waits for it (the kernel is put into the very lists the trainer replays)."""
    from renaissance_nb.runtime.replay import batch_variants
    runner, count = task.runner, [0]
    starts = {id(k) for b in runner.executor.bound for n, k in zip(b.nodes, b.kernels) if n.op == "allreduce_start"}

    def interrupt() -> None:
        count[0] += 1
        if count[0] == at:
            raise KeyboardInterrupt
    sched = runner.replay.train_schedule(batch_variants(len(task.splits.train), task.config.batch_size,
                                                        "train_base", "train_last"))
    for prog in {id(p): p for p in sched.steps}.values():
        first = next(i for i, k in enumerate(prog) if id(k) in starts)
        prog.insert(first + 1, interrupt)


def caught(task: DeepLearningTask, callbacks: list) -> None:
    """run() with its exception caught, as an IPython engine does (sys.excepthook never sees it); then this
    rank waits, so only the library's own abort can end the job early."""
    try:
        task.run(progress="none", callbacks=callbacks)
    except BaseException as exc:  # noqa: BLE001 - what IPython does
        print(f"rank {rank()} caught {type(exc).__name__}", flush=True)
    time.sleep(120)


def main() -> None:
    task = build()
    r = rank()
    if MODE == "train":
        bad = watch_weights(task)
        result = task.run(progress="none")
        extra = per_rank(task, result)
        if r == 0:
            from renaissance_nb.compiler.ids import GraphId
            comm = [f"{n.op}:{n.layer}" for gid in GraphId for n in task.graphs.train.nodes(gid) if n.op.startswith("allreduce")]
            np.savez(OUT, losses=result.step_losses, checked=bad[0], mismatched=bad[1], comm=comm,
                     train_loss=[h.train_loss for h in result.history], val_loss=[h.val_loss for h in result.history],
                     **extra, **{f"w_{k}": v for k, v in task.state_dict().items()})
    elif MODE == "stop":
        at, seen = int(ARGS[3]), []

        def stop(event: str, info: object) -> None:
            if event == "step":
                seen.append((info["step"], info["loss"]))
            if event == "step" and info["step"] >= at:
                raise StopTraining(f"stopped at step {info['step']}")
        result = task.run(progress="none", callbacks=[stop])
        assert result.interrupted or result.stopped, result
        task.save(OUT + ".ckpt")
        log = {s: float(result.step_losses[s - 1]) for s, _ in seen}  # the global loss log
        print(f"rank {r} stopped at {task.run_state.resume_at}; step losses {seen} log {log}", flush=True)
        assert all(loss == log[s] for s, loss in seen), (seen, log)  # what callbacks see is the global loss
    elif MODE in ("resume", "load"):
        if MODE == "resume":
            task.load_state(OUT + ".ckpt")
        else:  # DeepLearningTask.load rebuilds the task on the ranks that wrote the checkpoint
            task = DeepLearningTask.load(OUT + ".ckpt", task.splits)
            assert task.config.ranks == world_size(), task.config.ranks
        result = task.run(progress="none")
        extra = per_rank(task, result)
        if r == 0:
            np.savez(OUT, losses=result.step_losses, train_loss=[h.train_loss for h in result.history],
                     **extra, **{f"w_{k}": v for k, v in task.state_dict().items()})
    elif MODE in ("raise", "raise_caught"):
        def fail(event: str, info: object) -> None:
            if event == "step" and r == 1:
                raise RuntimeError("rank 1 fails on purpose")
        if MODE == "raise":
            task.run(progress="none", callbacks=[fail])
        else:
            caught(task, [fail])
    elif MODE == "interrupt_inside":
        if r == 1:
            inside_step(task, 5)
        caught(task, [])
    elif MODE == "stop_one":  # a stop asked on rank 1 only (as a Ctrl-C reaching one rank)
        def stop_here(event: str, info: object) -> None:
            if event == "step" and r == 1 and info["step"] >= 16:
                raise StopTraining("rank 1 asked to stop")
        result = task.run(progress="none", callbacks=[stop_here])
        where, why = gathered(task.run_state.resume_at), gathered(result.stopped)
        task.save(OUT + ".ckpt")
        if r == 0:
            print(f"interrupted={result.interrupted} at={where} why={why}", flush=True)
    elif MODE == "sigint":  # stop by a SIGINT that mpiexec forwards (the test sends it once step 16 is reported)
        def report(event: str, info: object) -> None:
            if event == "step" and r == 0 and info["step"] == 16:
                print("at step 16", flush=True)
        result = task.run(progress="none", callbacks=[report])
        where = gathered(task.run_state.resume_at)
        task.save(OUT + ".ckpt")
        if r == 0:
            print(f"interrupted={result.interrupted} at={where}", flush=True)


if __name__ == "__main__":
    main()

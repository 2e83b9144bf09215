"""One rank of tests/test_distributed.py (or the single process it is compared with).

    python worker.py MODE OUT [ARGS...]    (under mpiexec -n 2 for a distributed run)

Modes: ``train [buckets|slab]`` (E epochs, step losses, weights, the per-step weight digests of every
rank and the plan's all-reduce nodes into OUT.npz), ``stop`` (stop at the first 16-step check after step S, save a checkpoint OUT.ckpt),
``resume`` (load OUT.ckpt and finish), ``raise`` (rank 1's step callback raises), ``stop_one`` (rank 1 alone asks
to stop; print where every rank stopped), ``sigint`` (run until a SIGINT forwarded by mpiexec stops it; print
where every rank stopped, save OUT.ckpt).
"""
from __future__ import annotations

import sys

import numpy as np

from renaissance_nb import SGD, AdamW, DeepLearningTask, StopTraining, datasets, fc, relu, seq
from renaissance_nb.mpi import under_mpiexec

MODE, OUT = sys.argv[1], sys.argv[2]
EPOCHS = 7  # 7 x 32 steps of MNIST-5k at batch 128: 224 steps
OPTIMIZER = SGD().lr(0.002).momentum(0.9)
"""AdamW at lr 1e-3 fits these 4,000 samples to a loss near 0.01 within 150 steps, where it amplifies
the float32 rounding of a 64 + 64 row sum against a 128 row one chaotically (1e-7 at step 100, 4e-2 at
step 220); SGD with momentum follows the same data-parallel arithmetic without that amplification."""


ALLREDUCE = sys.argv[3] if MODE == "train" and len(sys.argv) > 3 else "buckets"


def build() -> DeepLearningTask:
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


def main() -> None:
    task = build()
    r = rank()
    if MODE == "train":
        bad = watch_weights(task)
        result = task.run(progress="none")
        if r == 0:
            from renaissance_nb.compiler.ids import GraphId
            comm = [f"{n.op}:{n.layer}" for gid in GraphId for n in task.graphs.train.nodes(gid) if n.op.startswith("allreduce")]
            np.savez(OUT, losses=result.step_losses, checked=bad[0], mismatched=bad[1], comm=comm,
                     train_loss=[h.train_loss for h in result.history], val_loss=[h.val_loss for h in result.history],
                     **{f"w_{k}": v for k, v in task.state_dict().items()})
    elif MODE == "stop":
        at = int(sys.argv[3])

        def stop(event: str, info: object) -> None:
            if event == "step" and info["step"] >= at:
                raise StopTraining(f"stopped at step {info['step']}")
        result = task.run(progress="none", callbacks=[stop])
        assert result.interrupted or result.stopped, result
        task.save(OUT + ".ckpt")
        print(f"rank {r} stopped at {task.run_state.resume_at}", flush=True)
    elif MODE == "resume":
        task.load_state(OUT + ".ckpt")
        result = task.run(progress="none")
        if r == 0:
            np.savez(OUT, losses=result.step_losses, train_loss=[h.train_loss for h in result.history],
                     **{f"w_{k}": v for k, v in task.state_dict().items()})
    elif MODE == "raise":
        def fail(event: str, info: object) -> None:
            if event == "step" and r == 1:
                raise RuntimeError("rank 1 fails on purpose")
        task.run(progress="none", callbacks=[fail])
    elif MODE == "stop_one":  # a stop asked on rank 1 only (as a Ctrl-C reaching one rank)
        def stop_here(event: str, info: object) -> None:
            if event == "step" and r == 1 and info["step"] >= 16:
                raise StopTraining("rank 1 asked to stop")
        result = task.run(progress="none", callbacks=[stop_here])
        from renaissance_nb.mpi import world
        where = world().comm.allgather(task.run_state.resume_at)
        task.save(OUT + ".ckpt")
        if r == 0:
            print(f"interrupted={result.interrupted} at={where}", flush=True)
    elif MODE == "sigint":  # stop by a SIGINT that mpiexec forwards (the test sends it once step 16 is reported)
        def report(event: str, info: object) -> None:
            if event == "step" and r == 0 and info["step"] == 16:
                print("at step 16", flush=True)
        result = task.run(progress="none", callbacks=[report])
        from renaissance_nb.mpi import world
        where = world().comm.allgather(task.run_state.resume_at)
        task.save(OUT + ".ckpt")
        if r == 0:
            print(f"interrupted={result.interrupted} at={where}", flush=True)


if __name__ == "__main__":
    main()

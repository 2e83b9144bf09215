"""The Trainer: the run state of a compiled task and the epoch loop over its replayed step.

RunState is what a checkpoint keeps besides the arena: the epochs finished, where an
interrupted epoch resumes, a step left half done, ReduceLROnPlateau's state, the timers and
the history. The loop is split as it reads: start (callbacks, resume rules), per epoch a
beginning (data order, prologue), the step loop (``for kernel in program: kernel()``, a
check every 16 steps), an end (validation, the record, the schedule, autosave), and the
handling of an interrupt (Ctrl-C, a callback's exception, a kernel's error).
"""
from __future__ import annotations

import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..config import TaskConfig
from ..errors import NumericalError, PhaseError
from ..kernels import blas
from ..progress import make_progress
from ..result import EpochRecord, TrainingResult
from ..train.callbacks import call_each, check_watchers
from ..train.plateau import ReduceLROnPlateau, plateau_step
from .interrupt import StopFlag
from .replay import EpochSchedule, run_schedules
from .runner import Runner

Callback = Callable[[str, Any], None]


@dataclass
class RunState:
    """Where training stands: what a checkpoint saves besides the arena, and what run() resumes from."""

    epoch: int = 0  # epochs finished
    resume_at: tuple[int, int] | None = None  # (epoch, next step) after an interrupt
    live_at: tuple[int, int] | None = None  # (epoch, next step) while run() calls a step callback
    epoch_t0: float = 0.0  # perf_counter() when the running epoch started, less the seconds carried into it
    partial_seconds: float = 0.0  # the seconds the epoch resume_at points into ran before it stopped
    torn_at: tuple[int, int] | None = None  # (epoch, step) a run stopped inside of: not resumable
    plateau: dict[str, float] | None = None  # ReduceLROnPlateau's state (best, bad, cooldown, lr)
    running: bool = False  # run() is on the stack: no second run() or reset() from a callback
    result: TrainingResult = field(default_factory=TrainingResult)

    def check_not_running(self, operation: str, phase: Any) -> None:
        """run() and reset() from inside a run (a callback, a widget message pumped by one) would
        interleave two loops over one arena."""
        if self.running:
            raise PhaseError(operation, f"{phase} (running)", f"{phase} (not running)",
                             f"{operation}() was called while run() is training (from a callback?). Fix: call it "
                             "after run() returns, or stop the run first (Ctrl-C / the stop button).")

    def seconds_into_epoch(self) -> float:
        """Wall seconds the epoch a resume would continue has run: after a stop, or from a step
        callback inside run() (what a checkpoint keeps, so a resumed epoch reports its whole time)."""
        if self.resume_at is not None:
            return self.partial_seconds
        return time.perf_counter() - self.epoch_t0 if self.live_at is not None else 0.0

    def steps_before(self, epoch: int, now: int) -> int:
        """The finished updates before ``epoch`` (0-based): the last record's running total, or ``now``
        when the history does not end just before it (edited by hand)."""
        h = self.result.history
        if not h:
            return 0 if epoch == 0 else now
        return h[-1].steps if h[-1].epoch == epoch else now


def plateau_start(config: TaskConfig, lr: float | None = None) -> dict[str, float]:
    """ReduceLROnPlateau's first state: the rate in force ``lr``, by default the schedule's base."""
    sched = config.scheduler
    assert isinstance(sched, ReduceLROnPlateau)
    return sched.initial_state(config.base_lr if lr is None else lr)


class Trainer:
    """Runs epochs of a Runner's step and keeps the RunState; ``save`` writes a checkpoint (autosave)."""

    def __init__(self, runner: Runner, state: RunState, save: Callable[[str], str]) -> None:
        self.runner, self.state, self.save = runner, state, save

    def run(self, config: TaskConfig, more: int | None, progress: str, resume: bool,
            callbacks: Sequence[Callback], owner: Any) -> TrainingResult:
        """Train to ``config.total_epochs`` (or ``more`` epochs); ``owner`` is what "start" callbacks see.
        On more than one rank an exception leaving it aborts every rank (DataParallel.failed)."""
        dp = self.runner.dp
        check_watchers(config.record_fields(), config.save_best_field, callbacks)  # every rank, before collectives
        try:
            end = self._start(config, more, resume, callbacks, owner)
            if dp is not None and dp.rank:
                progress = "none"  # only rank 0 prints
            _EpochLoop(self, config, callbacks, progress, end).run()
        except BaseException as exc:
            if dp is not None:
                dp.failed(exc)
            raise
        return self.state.result

    def _start(self, config: TaskConfig, more: int | None, resume: bool, callbacks: Sequence[Callback],
               owner: Any) -> int:
        """The "start" callbacks, which may refuse or stop before anything changes; then the resume rules.
        Returns the epoch the run ends at."""
        st = self.state
        stopped = call_each(callbacks, "start", {"epoch": st.epoch, "total_epochs": config.total_epochs,
                                                 "steps_per_epoch": config.steps_per_epoch,
                                                 "fields": config.record_fields(), "task": owner})
        if self.runner.dp is not None:  # every rank starts, or none
            stopped = self.runner.dp.reason_agreed(stopped)
        if stopped is None:  # a run refused or stopped at "start" leaves an interrupted one interrupted
            st.result.interrupted = False
        st.result.stopped = stopped
        if not resume:
            st.resume_at = None
        if st.torn_at is not None:
            e, i = st.torn_at
            st.torn_at = None
            warnings.warn(f"run: the last run stopped inside step {i + 1} of epoch {e + 1} (a second Ctrl-C, or an "
                          "error raised by a kernel such as the NaN check), so that step is half done; epoch "
                          f"{e + 1} starts over from its first batch on the weights as they are, and this run will "
                          "not reproduce an uninterrupted one. Fix: task.load_state(path) from a checkpoint to "
                          "continue exactly, or task.reset() to train from the start.", stacklevel=5)
        end = config.total_epochs if more is None else min(config.total_epochs, st.epoch + more)
        if stopped is not None:  # a callback stopped the run before its first step
            return st.epoch
        if end <= st.epoch and st.resume_at is None:
            warnings.warn(f"run: all total_epochs={config.total_epochs} epochs are trained, so there is nothing to "
                          "run: the learning-rate schedule and the plan are compiled for that many. Fix: to train "
                          "longer, build a task with a larger total_epochs and copy the weights in with "
                          "new_task.load_state_dict(task.state_dict()) (the optimizer's moments and any EMA start "
                          "over from them).", stacklevel=5)
        return end

    def autosave(self, config: TaskConfig, name: str, rec: EpochRecord) -> None:
        """save_every / save_best after an epoch, as the config says now (they can change in any phase)."""
        import os

        from ..errors import CheckpointError
        due = []
        if config.save_every and rec.epoch % config.save_every[0] == 0:
            due.append(("save_every", config.save_every[1]))
        by = config.save_best_by  # a field the records have: run() checked it before its first step
        result = self.state.result
        best = result.best_epoch if by is None else result.best_by(*by)
        if config.save_best and best == rec.epoch:
            due.append(("save_best", config.save_best))
        for setting, template in due:
            p = template.format(name=name, epoch=rec.epoch)
            folder = os.path.dirname(os.path.abspath(p))
            try:
                os.makedirs(folder, exist_ok=True)
            except OSError as exc:
                raise CheckpointError(f"{setting}: cannot make the folder {folder!r} for {p!r} ({exc.strerror}). "
                                      f"Fix: task.{setting}(...) with a path in a folder you can write to.") from None
            self.save(p)

    def plateau_step(self, config: TaskConfig, rec: EpochRecord) -> None:
        """ReduceLROnPlateau at an epoch's end: feed it the record's metric; a reduction rewrites the
        arena's table from the next step on (and the device's copy)."""
        sched, st = config.scheduler, self.state
        if not isinstance(sched, ReduceLROnPlateau) or st.plateau is None:
            return
        state = plateau_step(sched, st.plateau, float(getattr(rec, sched.monitor_)))
        if state["lr"] != st.plateau["lr"]:
            table, step = self.runner.view("lr_table"), self.runner.view("step")
            table[int(step[0]):] = np.float32(state["lr"])
            self.runner.replay.push(table)
        st.plateau = state

    def raise_halted(self) -> None:
        """A device backend stopped updating at a non-finite value (its NaN flag is 2): report it, and
        clear the flag so that the task can train again (the epoch starts over, as after a CPU halt)."""
        rx = self.runner.replay
        rx.download_all()
        flag = self.runner.view("nan.flag")
        flag[0] = 0
        rx.push(flag)
        step = int(self.runner.view("step")[0])
        raise NumericalError(f"step {step + 1}: a non-finite gradient or loss (found on the GPU, which stopped "
                             "updating there; the host checks every 16 steps, and the steps run since then replaced "
                             "that step's gradients and loss, so they are not named). The weights, moments and EMA "
                             f"weights are those before step {step + 1}; the batch-norm statistics and dropout "
                             "offsets moved on with those steps' forward passes. Fix: lower the learning rate, check "
                             "the data for extreme values, or use options(nan_policy='skip'); task.load_state(path) "
                             "of a checkpoint continues exactly.")


class _EpochLoop:
    """One run() of the epoch loop; its locals are where a failure leaves the run (step ``pos`` of
    ``epoch``, the last step boundary reached, or inside a step's kernels when ``inside``)."""

    def __init__(self, trainer: Trainer, config: TaskConfig, callbacks: Sequence[Callback], progress: str,
                 end: int) -> None:
        self.t, self.config, self.callbacks, self.end = trainer, config, callbacks, end
        self.st, self.runner, self.rx = trainer.state, trainer.runner, trainer.runner.replay
        self.sched = run_schedules(config, self.runner.replay)
        v = self.runner.view
        self.aug_offset, self.cursor, self.acc = v("aug.offset"), v("cursor"), v("metrics.sum")
        self.step_counter, self.lr_table, self.result_view = v("step"), v("lr_table"), v("result")
        self.nan_flag = v("nan.flag")  # 2: a device backend stopped updating at a non-finite value
        # what a device backend copies back every 16 steps, in one hand-over: the loss and the NaN flag, and
        # for callbacks the step counter, the loss log (the live monitor reads it) and the clip's last norm
        seen = [self.step_counter, v("loss_log")] + ([v("clip.norm")] if config.clip_grad_norm is not None else [])
        self.watched = (self.result_view, self.nan_flag) + (tuple(seen) if callbacks else ())
        first = self.sched.train(self.st.epoch)
        at = self.st.resume_at
        done = at[1] if at is not None and at[0] == self.st.epoch else 0
        self.prog = make_progress(progress, total=(end - self.st.epoch) * first.batches, desc=config.name,
                                  steps_per_epoch=first.batches, epoch=self.st.epoch + 1, step=done)
        self.stop = StopFlag()
        self.watch_sigint = threading.current_thread() is threading.main_thread()  # StopFlag's thread
        self.epoch, self.inside, self.first = self.st.epoch, False, True
        self.first_step_s = 0.0  # the run's first step (kernels compiled or loaded), told apart in its epoch
        self.pos: int | None = None  # None between epochs
        self.shown = 0

    def run(self) -> None:
        self.rx.upload_all()
        with self.stop, blas.own_cores(), self.prog.armed():  # armed: a first step that compiles says so
            try:
                while self.st.epoch < self.end:
                    if not self._epoch():
                        break
            except BaseException as exc:  # a callback, a save or a second Ctrl-C failed between two steps
                self._interrupted(exc)
                raise
        self._finish()

    def _epoch(self) -> bool:
        """One epoch; False when the run stops after (or inside) it."""
        self.epoch = epoch = self.st.epoch
        sched = self.sched.train(epoch)
        start = self._begin_epoch(epoch, sched)
        self._steps(epoch, sched, start)
        if self.st.resume_at is not None:
            self.st.result.interrupted = True
            self.prog.stopped(epoch + 1, self.pos or 0, sched.batches, self.st.result.stopped or "Ctrl-C")
            return False
        return self._end_epoch(epoch, sched)

    def _begin_epoch(self, epoch: int, sched: EpochSchedule) -> int:
        """The data order and input buffer of ``epoch``, or its state after a stop; its first step."""
        st, rx, runner = self.st, self.rx, self.runner
        st.epoch_t0 = time.perf_counter()
        start = 0
        if st.resume_at is not None and st.resume_at[0] == epoch:
            start = st.resume_at[1]
            st.epoch_t0 -= st.partial_seconds  # the epoch's time includes its steps before the stop
            rx.set_perm("train", runner.perms["train"])  # a load_state wrote the host's order only
            if runner.dp is not None:  # a checkpoint holds rank 0's prefetched batch
                runner.dp.regather(runner, sched, start, self.config.batch_size)
        else:
            runner.shuffle_into("train", epoch)
            rx.set_perm("train", runner.perms["train"])
            self.cursor[0] = 0
            self.aug_offset[0] = epoch * len(runner.perms["train"])
            rx.push(self.cursor, self.aug_offset)
            if runner.dp is not None:
                runner.dp.epoch_began()
            began = st.steps_before(epoch, int(self.step_counter[0]))
            if began != self.step_counter[0]:  # an epoch begun before (a stop or a torn step inside it, then a
                self.step_counter[0] = began    # load): the schedule, the loss log and the step counts replay
                rx.push(self.step_counter)      # its positions
            for k in sched.prologue:
                k()
        st.resume_at, st.partial_seconds = None, 0.0
        return start

    def _steps(self, epoch: int, sched: EpochSchedule, start: int) -> None:
        """The replay: every step's kernels in order; every 16 steps the device's loss and NaN flag, the
        progress and the step callbacks; a stop request ends the epoch at this step boundary. Where every
        step is one native program (kernels/program.py), the steps up to each check run in one call."""
        st, cap = self.st, sched.captured
        steps = sched.steps if cap is None else cap.steps
        whole = cap.whole if cap is not None and self.runner.dp is None else None
        self.pos = self.shown = start  # shown: the steps of this epoch the progress has counted
        i = start
        while i < sched.batches:
            if whole is not None and not self.first:
                last = self._native_steps(whole, i, sched.batches) - 1
            else:
                self._step(steps[i], i)
                last = i
            i = last + 1
            if (last & 15) == 15:
                self._check(epoch, self.pos - self.shown)
                self.shown = self.pos
            if self._stopping(last, sched.batches):
                st.resume_at = (epoch, last + 1)
                st.partial_seconds = time.perf_counter() - st.epoch_t0
                break

    def _step(self, kernels: list[Callable[[], None]], i: int) -> None:
        """One step, its kernels (or native programs) called in order; the run's first is timed."""
        self.inside = True
        t0 = time.perf_counter() if self.first else 0.0
        for k in kernels:
            k()
        self.inside, self.pos = False, i + 1
        if self.first:  # the kernels are compiled or loaded now
            self.prog.disarm()
            self.first, self.first_step_s = False, time.perf_counter() - t0

    def _native_steps(self, whole: Any, i: int, batches: int) -> int:
        """Steps i.. up to the next 16-step check or the epoch's end in one native call (fewer when a
        Ctrl-C stops them at a step boundary); the steps done. A kernel's Python path that raises leaves
        ``pos`` at the step it tore."""
        self.inside = True

        def entering(step: int) -> None:
            self.pos = step
        done = whole.run(i, min(i | 15, batches - 1) + 1, self.watch_sigint, entering)
        self.inside, self.pos = False, done
        return done

    def _stopping(self, i: int, batches: int) -> bool:
        """A stop at this boundary: on one process when asked; across ranks only at the 16-step checks
        and an epoch's last step, and then on every rank when any asked (one agreed boundary)."""
        dp = self.runner.dp
        if dp is None:
            return self.stop.requested
        if (i & 15) != 15 and i != batches - 1:
            return False
        agreed, why = dp.stop_agreed(self.stop, self.st.result.stopped)
        if agreed:  # a step callback's reason on whichever rank it stopped, told by every rank
            self.st.result.stopped = why
        return agreed

    def _check(self, epoch: int, advanced: int) -> None:
        st = self.st
        assert self.pos is not None  # a step boundary
        self.rx.pull(*self.watched)
        if self.runner.dp is not None:  # what callbacks may read (task.state_dict(), a save) is rank 0's
            self.runner.dp.share_bn_stats(self.runner)
        if self.nan_flag[0] == 2:
            self.t.raise_halted()
        loss = float(self.result_view[0])
        if self.runner.dp is not None:  # every rank checks at the same steps: the global batch's loss
            loss = self.runner.dp.mean_loss(loss)
        self.prog.update(advanced, loss)
        st.live_at = (epoch, self.pos)  # a save() from a callback records where to resume
        why = call_each(self.callbacks, "step", {"epoch": epoch + 1, "step": int(self.step_counter[0]), "loss": loss})
        if why is not None:  # a stop at this step boundary, as Ctrl-C's
            st.result.stopped, self.stop.requested = why, True
        st.live_at = None

    def _end_epoch(self, epoch: int, sched: EpochSchedule) -> bool:
        """Validation, the epoch's record, the schedule, autosave and the "epoch" callbacks."""
        st, rx, runner = self.st, self.rx, self.runner
        rx.pull(self.result_view, self.acc, self.step_counter, self.nan_flag)
        if self.nan_flag[0] == 2:
            self.t.raise_halted()
        self.prog.update(sched.batches - self.shown, float(self.result_view[0]))
        train = self.acc.copy()
        if runner.dp is not None:  # global metric sums; every rank validates rank 0's running statistics
            train = runner.dp.global_sums(runner)
            runner.dp.share_bn_stats(runner)
        try:
            val = runner.run_eval(self.sched.val) if self.sched.val else None
            emav = runner.run_eval(self.sched.ema) if self.sched.ema else None
        finally:  # the val passes share the metric sums: a resume after a failure here reads them
            self.acc[...] = train
            rx.push(self.acc)
        steps = int(self.step_counter[0])
        lr = float(self.lr_table[min(steps, len(self.lr_table)) - 1]) if steps else 0.0
        t_loss, t_top1, t_top5 = (float(v) for v in train[:3] / train[3])
        rec = EpochRecord(epoch + 1, t_loss, t_top1, t_top5, *_means(val), lr, time.perf_counter() - st.epoch_t0,
                          steps, *_means(emav), first_step_seconds=self.first_step_s,
                          tokens=bool(self.config.data and self.config.data.train.is_tokens))
        self.first_step_s = 0.0
        st.result.history.append(rec)
        st.epoch += 1
        self.pos = None
        self.t.plateau_step(self.config, rec)
        rx.download_all()
        self.t.autosave(self.config, self.config.name, rec)
        self.prog.epoch(rec)
        why = call_each(self.callbacks, "epoch", rec)
        if runner.dp is not None:  # every rank goes on, or none
            why = runner.dp.reason_agreed(why)
        if why is not None:  # after this epoch, which is whole
            st.result.stopped = why
            self.prog.note(why)
            return False
        return True

    def _interrupted(self, exc: BaseException) -> None:
        """Where a failure leaves the run: resumable at the last step boundary, or a torn step."""
        st = self.st
        st.live_at = None
        pos = self.pos
        # inside a step, or a device halt found at a check (the steps since ran without updates)
        if pos is not None and (self.inside or isinstance(exc, NumericalError)):
            st.torn_at, pos = (self.epoch, pos), None
        if pos is not None:
            try:
                self.rx.download_all()  # a device backend's state is what resumes
            except Exception:  # noqa: BLE001 - the host copy is stale: the epoch starts over
                pos = None
        if pos is not None:
            st.resume_at = (self.epoch, pos)
            st.partial_seconds = time.perf_counter() - st.epoch_t0
            st.result.interrupted = True
        self.prog.close()

    def _finish(self) -> None:
        st = self.st
        self.prog.close()
        self.rx.download_all()
        self.runner.drain_transfers()
        if self.runner.dp is not None:
            self.runner.dp.sync_log(self.runner)
            self.runner.dp.share_bn_stats(self.runner)
        st.result.step_losses = self.runner.view("loss_log")[: int(self.step_counter[0])].copy()
        why = call_each(self.callbacks, "end", {"epoch": st.epoch, "interrupted": st.result.interrupted,
                                                "stopped": st.result.stopped})
        st.result.stopped = st.result.stopped or why


def _means(sums: np.ndarray | None) -> tuple[float | None, float | None, float | None]:
    """(loss, top-1, top-5) from the metric sums (loss, top-1, top-5, count); Nones without a pass."""
    if sums is None:
        return None, None, None
    return sums[0] / sums[3], sums[1] / sums[3], sums[2] / sums[3]

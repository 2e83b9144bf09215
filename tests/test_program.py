"""The CPU step as one native program (kernels/program.py, program.c): the same bytes as the kernel-by-kernel
replay (RNB_PROGRAM=0), the host re-entered only where it must act (a guard, Ctrl-C), nothing allocated."""
from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest

from renaissance_nb import (AdamW, CosineAnnealingLR, CrossEntropyLoss, DeepLearningTask, NumericalError, SGD,
                            fc, gelu, hardswish, relu, seq, silu)
from renaissance_nb.kernels import native, program
from renaissance_nb.kernels.thunks import PREFIX, thunk_source

pytestmark = pytest.mark.skipif(native.lib() is None, reason="no C library: every kernel is a Python call")


def data(n: int = 700, d: int = 40, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x, ((x[:, :3].sum(1) > 0).astype(np.int64) + 2 * (x[:, 3] > 0))


def mlp_task(batch: int = 32, epochs: int = 2, val: bool = True, model=None) -> DeepLearningTask:  # type: ignore[no-untyped-def]
    x, y = data()
    return (DeepLearningTask("p").model(model or seq(fc(64), relu(), fc(32), relu(), fc(4)))
            .data(train=(x[:600], y[:600]), val=(x[600:], y[600:]) if val else None, batch_size=batch)
            .loss(CrossEntropyLoss().label_smoothing(0.1)).optimizer(AdamW().weight_decay(1e-4))
            .scheduler(CosineAnnealingLR().base_lr(3e-3)).total_epochs(epochs).seed(3))


def trained(monkeypatch: pytest.MonkeyPatch, flag: str, **kw) -> DeepLearningTask:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("RNB_PROGRAM", flag)
    task = mlp_task(**kw).compile()
    task.run(progress=False)
    return task


def test_thunks_cover_every_entry_and_unpack_by_type() -> None:
    text = thunk_source(native.SIGNATURES)
    for name in native.SIGNATURES:
        assert f"void {PREFIX}{name}(const rnb_arg *a, rnb_arg *r)" in text
    assert "rnb_ema(a[0].p, a[1].p, a[2].i, a[3].d)" in text  # (P, P, I64, F64)
    assert "r->d = (double)rnb_nonfinite_probe(" in text  # a float result widened into the result slot


@pytest.mark.parametrize("batch", [32, 128])
def test_weights_after_training_are_the_bytes_of_the_kernel_by_kernel_replay(monkeypatch, batch) -> None:  # type: ignore[no-untyped-def]
    on, off = trained(monkeypatch, "1", batch=batch), trained(monkeypatch, "0", batch=batch)
    sched = on.runner.executor.train_schedule(["train_base"] * 3)
    assert sched.captured is not None and sched.captured.whole is not None  # the MLP's step is C only
    assert off.runner.executor.train_schedule(["train_base"] * 3).captured is None
    a, b = on.state_dict(), off.state_dict()
    assert a.keys() == b.keys() and all(a[k].tobytes() == b[k].tobytes() for k in a)
    assert on.runner.arena.bytes.tobytes() == off.runner.arena.bytes.tobytes()  # moments, metrics, counters too
    np.testing.assert_array_equal(on.result.step_losses, off.result.step_losses)
    assert [r.val_loss for r in on.result.history] == [r.val_loss for r in off.result.history]


@pytest.mark.parametrize("clip", [0.05, 100.0])  # clipping every step, and never
def test_ema_and_clipping_run_inside_the_program_with_the_same_bytes(monkeypatch, clip) -> None:  # type: ignore[no-untyped-def]
    """ema_update and clip_grad_norm computed a value in Python between their C calls; in a program each is
    one C call (rnb_ema_warm, rnb_clip_norm) behind the NaN check's skip flag."""
    tasks = []
    for flag in ("1", "0"):
        monkeypatch.setenv("RNB_PROGRAM", flag)
        task = mlp_task().ema(0.99).clip_grad_norm(clip).options(nan_policy="skip").compile()
        task.run(progress=False)
        tasks.append(task)
    on, off = tasks
    assert any(n.startswith("CPU step captured as one native program of 14 kernels") for n in on.runner.notes)
    assert on.runner.arena.bytes.tobytes() == off.runner.arena.bytes.tobytes()
    assert [r.ema_loss for r in on.result.history] == [r.ema_loss for r in off.result.history]
    norm = on.runner.view("clip.norm")
    assert (norm[1] < 1.0) == (clip < 1.0)  # the factor applied at the last step


def test_compile_notes_say_what_is_captured(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("RNB_PROGRAM", "1")
    note = [n for n in mlp_task().compile().runner.notes if "native program" in n]
    assert len(note) == 1 and note[0].startswith("CPU step captured as one native program of 12 kernels")
    monkeypatch.setenv("RNB_PROGRAM", "0")
    assert any("not captured as a native program (RNB_PROGRAM=0)" in n for n in mlp_task().compile().runner.notes)
    monkeypatch.setenv("RNB_PROGRAM", "1")
    notes = mlp_task(model=seq(fc(64), gelu(), fc(4))).compile().runner.notes  # GELU's pass is C (gelu_native.c)
    assert any(n.startswith("CPU step captured as one native program of ") for n in notes), notes
    notes = mlp_task(model=seq(fc(64), silu(), fc(4))).compile().runner.notes  # SiLU's kernels are numba's
    assert any(n.startswith("CPU step not captured whole: ") for n in notes), notes
    notes = mlp_task(model=seq(fc(64), hardswish(), fc(4))).compile().runner.notes  # no C twin: all numba
    assert any(n.startswith("CPU step not captured as a native program (fused passes in numba: the plan's ") and
               "hardswish" in n and n.rstrip(".").endswith("every kernel is a Python call") for n in notes), notes


def test_a_python_kernel_splits_the_program_into_native_runs() -> None:
    src = np.arange(10, dtype=np.float32)
    a, b, c = np.zeros(10, np.float32), np.zeros(10, np.float32), np.zeros(10, np.float32)
    seen: list[float] = []
    kernels = [program.bind_copy(a, src), program.bind_copy(b, a), lambda: seen.append(float(b[9])),
               program.bind_copy(c, b), program.bind_zero(a)]
    packed = program.pack(kernels)
    assert [type(k).__name__ for k in packed] == ["NativeRun", "function", "NativeRun"]
    assert [k.kernels for k in packed if isinstance(k, program.NativeRun)] == [2, 2]
    for k in packed:
        k()
    assert seen == [9.0] and c.tolist() == src.tolist() and not a.any()


def test_a_guard_returns_to_the_host_and_the_program_goes_on() -> None:
    """An op whose guard trips (a non-zero status) runs its host path, then the next ops run."""
    flag, out, src = np.zeros(1, np.int64), np.zeros(4, np.float32), np.ones(4, np.float32)
    copy = program.bind_copy(out, src)
    calls: list[int] = []

    def host() -> None:
        calls.append(int(out[0]))
        flag[0] = 1  # the host asks the next op to be skipped
    loss = np.array([np.nan], np.float32)
    probe = native.bind_probe(np.zeros(8, np.float32), np.zeros(8, np.float32), 1)
    guarded = program.mark(lambda: None, program.guarded(probe, program.FINITE, loss, host))
    skipped = program.mark(lambda: None, program.skipped_if(flag, True, program.ops_of(program.bind_zero(out))))
    run = program.NativeRun([copy, guarded, skipped])
    run()
    assert calls == [1] and out.tolist() == [1.0] * 4 and flag[0] == 0  # the zeroing was skipped, the flag cleared
    loss[0] = 1.0
    run()
    assert calls == [1] and not out.any()  # no trip: the zeroing ran


def test_sigint_inside_a_native_call_stops_at_a_step_boundary() -> None:
    big = np.ones(1 << 22, np.float32)
    copies = [program.bind_copy(np.empty_like(big), big) for _ in range(4)]
    runs = [program.NativeRun(copies)] * 400  # 400 steps of 64 MiB copied each
    whole = program.NativeSteps(runs)
    got: list[int] = []
    old = signal.signal(signal.SIGINT, lambda *_: got.append(1))
    try:
        threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        done = whole.run(0, len(runs), watch=True)
    finally:
        signal.signal(signal.SIGINT, old)
    assert 0 < done < len(runs)  # stopped early, at a step boundary
    assert got == [1]  # Python's own handler ran too (chained)


def test_ctrl_c_during_native_steps_is_a_resumable_stop(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("RNB_PROGRAM", "1")
    ref = mlp_task(epochs=3, val=False)
    ref.run(progress=False)
    task = mlp_task(epochs=3, val=False).compile()

    sent: list[int] = []

    def cb(kind, info) -> None:  # type: ignore[no-untyped-def]
        if kind == "step" and info["epoch"] == 2 and not sent:  # from another thread, mid-replay
            sent.append(1)
            threading.Timer(0.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
            threading.Event().wait(0.01)
    r = task.run(progress=False, callbacks=[cb])
    assert r.interrupted and task.run_state.resume_at is not None and task.run_state.torn_at is None
    assert task.run_state.resume_at[0] == 1
    task.run(progress=False)
    a, b = task.state_dict(), ref.state_dict()
    assert all(a[k].tobytes() == b[k].tobytes() for k in a)


@pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")
def test_the_nan_check_raises_from_inside_a_native_call(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("RNB_PROGRAM", "1")
    x, y = data()
    task = (DeepLearningTask().model(seq(fc(16), relu(), fc(4))).data(train=(x * 1e3, y), batch_size=20)
            .optimizer(SGD().lr(1e8)).total_epochs(1)).compile()
    assert task.runner.executor.train_schedule(["train_base"] * 2).captured.whole is not None
    with pytest.raises(NumericalError, match="non-finite value in"):
        task.run(progress=False)
    e, i = task.run_state.torn_at
    step = int(task.executor.view("train_base", "step")[0])
    assert e == 0 and i == step  # the torn step is the one whose update the check refused
    assert all(np.isfinite(v).all() for v in task.state_dict().values())


def test_the_mlp_step_allocates_nothing(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("RNB_PROGRAM", "1")
    task = mlp_task().compile()
    got = task.memory_inspector.allocations(steps=40)
    assert got.nrt_allocs == 0 and got.python_growth == 0, got.summary()


def resnet_task(epochs: int = 2) -> DeepLearningTask:
    """A small ResNet on 3x12x12 images with crop and flip: Winograd and im2col convolutions, batch norm, the
    residual adds and the image gather, every one a C call."""
    from renaissance_nb import RESNET_3_3, RESNET_3_3_DS, block, cbr, gap
    rng = np.random.default_rng(1)
    x = rng.standard_normal((96, 3, 12, 12)).astype(np.float32)
    y = rng.integers(0, 4, 96).astype(np.int64)
    return (DeepLearningTask("r").model(seq(cbr(16, 3, 1, 1), block(16, RESNET_3_3), block(32, RESNET_3_3_DS), gap(),
                                            fc(4)))
            .data(train=(x[:64], y[:64]), val=(x[64:], y[64:]), batch_size=16).augment(crop_pad=2, flip=True)
            .optimizer(AdamW()).total_epochs(epochs).seed(4))


def test_a_resnet_step_is_one_native_program_with_the_bytes_of_the_kernel_by_kernel_replay(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Convolutions (on_own_cores carries their C call), conv backward chains, the residual adds and their
    gradient copies (rnb_add) and the image gather (a STATUS guard) all pack: one program per step."""
    tasks = []
    for flag in ("1", "0"):
        monkeypatch.setenv("RNB_PROGRAM", flag)
        task = resnet_task().compile()
        task.run(progress=False)
        tasks.append(task)
    on, off = tasks
    note = [n for n in on.runner.notes if "native program" in n]
    assert len(note) == 1 and note[0].startswith("CPU step captured as one native program of "), note
    assert on.runner.arena.bytes.tobytes() == off.runner.arena.bytes.tobytes()
    assert [r.val_loss for r in on.result.history] == [r.val_loss for r in off.result.history]


def bad_batch_raises_from_the_program(task: DeepLearningTask, start: int, match: str) -> None:
    """With the cursor at ``start`` (a batch that runs past the data), the whole-step program's gather trips its
    STATUS guard: the host runs the kernel's Python path, which raises ``match``; the cursor stays."""
    from renaissance_nb.errors import PlanError
    ex = task.runner.executor
    sched = ex.train_schedule(["train_base"] * 2)
    assert sched.captured is not None and sched.captured.whole is not None
    cursor = ex.view("train_base", "cursor")
    cursor[0] = start
    with pytest.raises(PlanError, match=match):
        sched.captured.whole.run(0, 2)
    assert cursor[0] == start


def test_a_bad_image_batch_raises_from_inside_the_program(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The image gather's status trips its guard and the fix is named (a batch of 16 from 60 of 64 samples)."""
    monkeypatch.setenv("RNB_PROGRAM", "1")
    bad_batch_raises_from_the_program(resnet_task().compile(), 60, r"transfer_image: batch \[60, 76\) runs past the "
                                      r"end of the 'train' permutation \(length 64\)")


def test_a_resnet_step_program_allocates_nothing(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The allocation audit over a conv net whose whole step is one native program: no numba record and no
    Python growth per step (convolutions, batch norm, residual adds, the image gather all C)."""
    monkeypatch.setenv("RNB_PROGRAM", "1")
    task = resnet_task().compile()
    assert any(n.startswith("CPU step captured as one native program") for n in task.runner.notes)
    got = task.memory_inspector.allocations(steps=12)
    assert got.nrt_allocs == 0 and got.python_growth == 0, got.summary()

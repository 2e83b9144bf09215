"""A GPT's CPU step as one native program (issue 39): token gather, embeddings, layer norms, causal attention
(both forms), GELU, the per-position loss and AdamW's two decay groups are all C calls, so the step packs
into one program; the weights are the bytes of the kernel-by-kernel replay and of the plan bound to numba."""
from __future__ import annotations

import numpy as np
import pytest

from gpt_helpers import token_splits
from test_program import bad_batch_raises_from_the_program
from renaissance_nb import AdamW, DeepLearningTask, gpt
from renaissance_nb.kernels import native

needs_lib = pytest.mark.skipif(native.lib() is None, reason=f"no C kernels: {native.status().why_not}")
VOCAB, T = 11, 16


def gpt_task(form: str = "materialized", approximate: str = "none", epochs: int = 2) -> DeepLearningTask:
    splits = token_splits(96, T, VOCAB, seed=2, val=32)
    return (DeepLearningTask("g").model(gpt(VOCAB, 32, 2, 2, T, dropout=0.1, attention_form=form,
                                            approximate=approximate))
            .data(splits, batch_size=16).optimizer(AdamW(lr=3e-3, weight_decay=0.1).decay("matrices"))
            .total_epochs(epochs).seed(3))


def _captured_whole(task: DeepLearningTask) -> bool:
    return any(n.startswith("CPU step captured as one native program of ") for n in task.runner.notes)


@needs_lib
@pytest.mark.parametrize("form,approximate", [("materialized", "none"), ("flash", "tanh")])
def test_a_gpt_step_is_one_native_program_with_the_bytes_of_the_replay_and_of_numba(monkeypatch, form: str,  # type: ignore[no-untyped-def]
                                                                                   approximate: str) -> None:
    runs = {}
    for name, flag in (("program", "1"), ("replay", "0"), ("numba", "1")):
        monkeypatch.setenv("RNB_PROGRAM", flag)
        if name == "numba":
            monkeypatch.setattr(native, "NUMBA_FREE_OPS", frozenset())  # the whole plan binds numba
        task = gpt_task(form, approximate).compile()
        task.run(progress=False)
        runs[name] = task
    assert _captured_whole(runs["program"]), runs["program"].runner.notes
    assert any("fused passes in numba" in n for n in runs["numba"].runner.notes)
    weights = {k: {n: w.tobytes() for n, w in t.state_dict().items()} for k, t in runs.items()}
    assert weights["program"] == weights["replay"] == weights["numba"]
    losses = {k: [(r.train_loss, r.val_loss) for r in t.result.history] for k, t in runs.items()}
    assert losses["program"] == losses["replay"] == losses["numba"]
    assert losses["program"][-1][1] < losses["program"][0][1]  # it learns


@needs_lib
def test_a_bad_token_batch_raises_from_inside_the_program(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The token gather (native.c's rnb_gather) returns batch_status's code, its guard trips: a batch of 16 from
    90 runs past the 96 windows."""
    monkeypatch.setenv("RNB_PROGRAM", "1")
    bad_batch_raises_from_the_program(gpt_task().compile(), 90, r"transfer: batch \[90, 106\) runs past the end of "
                                      r"the 'train' permutation \(length 96\)")


@needs_lib
def test_a_gpt_step_program_allocates_nothing(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("RNB_PROGRAM", "1")
    task = gpt_task("flash").compile()
    assert _captured_whole(task), task.runner.notes
    got = task.memory_inspector.allocations(steps=12)
    assert got.nrt_allocs == 0 and got.python_growth == 0, got.summary()


@needs_lib
def test_a_shorter_training_context_gathers_in_c_with_the_numba_plans_bytes(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """train_resolution(8, 16): the first epoch reads each window's first 8 tokens (rnb_gather_windows cuts
    them, fused.gather_token_windows in the numba plan), the second the whole windows."""
    runs = []
    for numba_only in (False, True):
        if numba_only:
            monkeypatch.setattr(native, "NUMBA_FREE_OPS", frozenset())
        task = gpt_task().train_resolution(8, 16, boundary_epoch=1).compile()
        task.run(progress=False)
        runs.append(task)
    assert _captured_whole(runs[0]), runs[0].runner.notes
    a, b = (t.state_dict() for t in runs)
    assert all(a[k].tobytes() == b[k].tobytes() for k in a)
    assert [r.train_loss for r in runs[0].result.history] == [r.train_loss for r in runs[1].result.history]

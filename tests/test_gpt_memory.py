"""The memory plan of a GPT: attention's scores grow as T squared in the materialised form and not in
the flash form, the inspector's by-kind and by-block reports add up, the what-ifs of a sequence model,
and fit() over the context length."""
from __future__ import annotations

import pytest

from renaissance_nb import AdamW, DeepLearningTask, gpt
from renaissance_nb.errors import ConfigError
from renaissance_nb.inspector.planview import MemoryInspector
from tests.gpt_helpers import token_splits

VOCAB, D, LAYERS, HEADS, T, BATCH = 13, 32, 2, 4, 32, 8


@pytest.fixture(scope="module")
def inspector() -> MemoryInspector:
    task = (DeepLearningTask().model(gpt(VOCAB, D, LAYERS, HEADS, T)).data(token_splits(64, T, VOCAB),
                                                                            batch_size=BATCH)
            .optimizer(AdamW(lr=1e-3)).total_epochs(1))
    task.plan()
    task.lock_memory()
    return MemoryInspector.of(task)


def _scores(m: MemoryInspector) -> int:
    return sum(t.storage_bytes for t in m.plan() if t.name.split(".")[1:2] in (["probs"], ["dprobs"]))


def test_materialised_scores_grow_as_t_squared_and_flash_has_none(inspector) -> None:  # type: ignore[no-untyped-def]
    for t in (16, 32, 64):
        m = inspector.what_if(context=t)
        # per layer: P and dP, (B, H, T, T) float32 each
        assert _scores(m) == LAYERS * 2 * BATCH * HEADS * t * t * 4
        f = inspector.what_if(context=t, attention="flash")
        assert _scores(f) == 0
        assert all(s[-1] != t or len(s) != 4 or s[-2] != t for s in (x.shape for x in f.plan()))  # no (.., T, T)
    big = (inspector.what_if(context=256), inspector.what_if(context=256, attention="flash"))
    assert big[1].arena_bytes < big[0].arena_bytes  # at T = 256 the scores dominate: flash plans less


def test_peak_by_kind_and_by_block_add_up_to_the_peak(inspector) -> None:  # type: ignore[no-untyped-def]
    peak = inspector.peak()
    kinds, blocks = inspector.peak_by_kind(), inspector.peak_by_block()
    assert sum(kinds.values()) == peak.peak_bytes == sum(blocks.values())
    assert kinds["attention scores"] > 0 and kinds["moments"] == 2 * kinds["weights"]  # Adam: M and V
    assert [b for b in blocks if b.startswith("transformer_block")] == [
        f"transformer_block({D}, {HEADS}) #{i}" for i in (1, 2)]


def test_what_if_heads_changes_only_the_scores(inspector) -> None:  # type: ignore[no-untyped-def]
    a, b = inspector, inspector.what_if(heads=8)
    assert _scores(b) == 2 * _scores(a)  # twice the heads, twice the (T, T) maps
    assert b.by_category()["weights"] == a.by_category()["weights"]  # the projections do not change


@pytest.mark.parametrize("budget_mib", [2, 4, 8])
def test_fit_over_the_context_length(inspector, budget_mib: int) -> None:  # type: ignore[no-untyped-def]
    budget = budget_mib << 20
    t = inspector.fit(budget, over="context")
    assert inspector.what_if(context=t).arena_bytes <= budget < inspector.what_if(context=t + 1).arena_bytes


def test_sequence_what_ifs_are_checked(inspector) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="context"):
        inspector.what_if(context=0)
    with pytest.raises(ConfigError, match="over"):
        inspector.fit(1 << 20, over="heads")


@pytest.mark.parametrize("form", ["materialized", "flash"])
def test_recompute_frees_the_blocks_activations_and_changes_no_byte(form: str) -> None:
    """options(recompute=True): each block's forward runs again before its backward, into twins; the plan is
    smaller, and the weights after training are the same bytes (dropout reuses its masks)."""
    from renaissance_nb import DeepLearningTask
    splits = token_splits(48, T, VOCAB)
    drop = 0.1 if form == "materialized" else 0.0

    def trained(recompute: bool):  # type: ignore[no-untyped-def]
        task = (DeepLearningTask().model(gpt(VOCAB, D, LAYERS, HEADS, T, dropout=drop, attention_form=form))
                .data(splits, batch_size=BATCH, shuffle=False).optimizer(AdamW(lr=3e-3)).total_epochs(1).seed(0)
                .options(recompute=recompute))
        task.run(progress=False)
        return task
    plain, again = trained(False), trained(True)
    assert again.arena_bytes < plain.arena_bytes
    assert again.memory_inspector.peak().peak_bytes < plain.memory_inspector.peak().peak_bytes
    a, b = plain.state_dict(), again.state_dict()
    assert all(a[k].tobytes() == b[k].tobytes() for k in a)
    twins = [t.name for t in again.memory if t.name.endswith("@recompute")]
    assert "attention1.q@recompute" in twins and "add2.out@recompute" not in twins  # a block's output is kept


def test_recompute_is_a_what_if_and_refuses_batch_norm(inspector) -> None:  # type: ignore[no-untyped-def]
    from renaissance_nb import DeepLearningTask, RESNET_3_3, block, conv, fc, gap, seq
    from tests.helpers import image_blobs
    assert inspector.what_if(recompute=True).arena_bytes < inspector.arena_bytes
    x, y = image_blobs(32)
    task = (DeepLearningTask().model(seq(conv(8, 3, p=1), block(8, RESNET_3_3), gap(), fc(4)))
            .data(train=(x, y), batch_size=8).options(recompute=True))
    with pytest.raises(ConfigError, match="batch norm"):
        task.plan()


def test_recompute_twins_the_16_bit_feature_maps_too(inspector) -> None:  # type: ignore[no-untyped-def]
    """Under bf16 the blocks' matrix products write F_FEATURE_FP16 maps: they get twins as the fp32 ones do
    (without, block 1's 16-bit maps stayed live from the first forward to its backward, at the peak too)."""
    from renaissance_nb.memory.region import Region
    plain, again = inspector.what_if(precision="bf16"), inspector.what_if(recompute=True, precision="bf16")
    names = {t.name: t for t in again.plan()}
    lowp = [n for n, t in names.items() if t.region is Region.F_FEATURE_FP16 and "@" not in n
            and n.startswith(("fc1.", "gelu1.", "fc2.", "attention1."))]
    assert "fc1.out" in lowp and all(f"{n}@recompute" in names for n in lowp)
    held = [t.name for t in again.peak().tensors if t.region == "F_FEATURE_FP16" and "@" not in t.name]
    assert not held, held  # the peak is in the last block's backward: no first forward's 16-bit map is live
    assert again.arena_bytes < plain.arena_bytes


@pytest.mark.parametrize("kw", [{"attention": "flash"}, {"attention": "flash", "recompute": True}, {"recompute": True}])
def test_attention_scratch_lives_inside_its_node(inspector, kw) -> None:  # type: ignore[no-untyped-def]
    """Flash attention's forward and backward each work in scratch of their own (the backward's ``@bwd``), and
    under recompute the forward's scratch is twinned: no block-sized scratch of layer 1 lives from its forward
    to its backward (they were one tensor, so liveness kept them across the step: a 4-layer char GPT at T = 64
    planned 30.7 MiB in the flash form, 26.2 MiB now, against 27.8 MiB materialized)."""
    m = inspector.what_if(**kw)
    peak = m.peak()
    assert peak.layer != "attention1"
    held = [t.name for t in peak.tensors if t.name.startswith("attention1.") and t.region == "T_TEMP_FP32"]
    assert not held, held


def test_context_what_ifs_scale_a_progressive_context() -> None:
    """what_if(context=...) on a task with train_resolution (progressive context) scales its begin and end with
    the windows (the unscaled begin was refused against short windows, so fit(over="context") always failed,
    and a longer context kept training on the old lengths)."""
    task = (DeepLearningTask().model(gpt(VOCAB, D, 1, HEADS, T)).data(token_splits(64, T, VOCAB), batch_size=BATCH)
            .optimizer(AdamW(lr=1e-3)).train_resolution(T // 2, T, boundary_epoch=1))
    ins = task.lock_memory().memory_inspector
    assert ins.what_if(context=2 * T).config.train_resolution == ((T, T), (2 * T, 2 * T), 1)
    assert ins.what_if(context=1).config.train_resolution is None  # one position cannot grow
    budget = 4 << 20
    t = ins.fit(budget, over="context")
    assert ins.what_if(context=t).arena_bytes <= budget < ins.what_if(context=t + 1).arena_bytes

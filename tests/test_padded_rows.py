"""Padded rows: weight matrices whose rows are a multiple of 4 KiB are stored 64 bytes per row
longer (with their gradient, moment and EMA copies), and everything that reads them still sees
the plain (out, in) matrix."""
from __future__ import annotations

import numpy as np
import pytest

from renaissance_nb import (AdamW, CheckpointError, ConfigError, DeepLearningTask, DeviceError, MemoryPlan,
                            PlanError, Region, dropout, fc, relu, seq)
from renaissance_nb.data.arrays import make_splits
from renaissance_nb.gpu.cublas import CUBLAS_OP_N, CUBLAS_OP_T, check_gemm, gemm_layout
from renaissance_nb.memory.dtensor import ROW_ALIAS_BYTES, row_pitch, span_bytes, tensor_view
from renaissance_nb.memory.region import PARAM_FAMILIES

SUFFIX = {"W": "", "E": "@ema", "G": "@grad", "M": "@m", "V": "@v"}


def _data(n: int, d: int, seed: int):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, d)).astype(np.float32), rng.integers(0, 5, n)


def wide_task(pad_rows: bool = True, epochs: int = 2, ema: bool = True) -> DeepLearningTask:
    """fc2.weight is (64, 1024) and fc1.weight (1024, 1024): rows of 4 KiB."""
    t = (DeepLearningTask().model(seq(fc(1024), relu(), fc(64), relu(), dropout(0.1), fc(5)))
         .data(train=_data(96, 1024, 0), val=_data(40, 1024, 1), batch_size=32)
         .optimizer(AdamW().weight_decay(1e-2)).total_epochs(epochs).seed(3).options(pad_rows=pad_rows))
    if ema:
        t.ema(0.9)
    return t


@pytest.fixture(scope="module")
def trained() -> tuple[DeepLearningTask, DeepLearningTask]:
    a, b = wide_task(True), wide_task(False)
    a.run(progress=False)
    b.run(progress=False)
    return a, b


def test_row_pitch_pads_only_matrices_whose_rows_are_a_multiple_of_4_kib() -> None:
    assert row_pitch((512, 1024), 4) == 1040
    assert row_pitch((3, 2048), 4) == 2064
    assert row_pitch((3, 2048), 2) == 2080  # 4096-byte rows of float16
    assert row_pitch((256, 512), 4) is None  # 2 KiB rows
    assert row_pitch((256, 784), 4) is None
    assert row_pitch((1, 1024), 4) is None  # one row: nothing to alias
    assert row_pitch((1024,), 4) is None
    assert row_pitch((2, 2, 1024), 4) is None


def test_a_plan_places_padded_rows_and_views_them_strided() -> None:
    plan = MemoryPlan("p")
    a = plan.alloc((4, 1024), "float32", Region.W_FC_WEIGHT, "a", pitch=1040)
    b = plan.alloc((3,), "float32", Region.W_FC_BIAS, "b")
    plan.finalize()
    a, b = plan["a"], plan["b"]
    assert a.slot_bytes == a.storage_bytes == 4 * 1040 * 4 and a.nbytes == 4 * 1024 * 4
    assert a.strides == (1040, 1) and "rows padded to 1040" in repr(a)
    buf = np.zeros(plan.total_bytes, np.uint8)
    v = tensor_view(buf, a)
    assert v.shape == (4, 1024) and v.strides == (1040 * 4, 4)
    v[...] = 1.0
    raw = buf[a.offset: a.offset + a.storage_bytes].view(np.float32).reshape(4, 1040)
    assert raw[:, :1024].sum() == 4096 and not raw[:, 1024:].any()
    assert tensor_view(buf, b).shape == (3,)


def test_span_bytes_covers_the_padding_between_rows_only() -> None:
    raw = np.zeros((4, 1040), np.float32)
    assert span_bytes(raw) == raw.nbytes
    assert span_bytes(raw[:, :1024]) == (3 * 1040 + 1024) * 4
    assert span_bytes(raw[:1, :1024]) == 1024 * 4
    with pytest.raises(ValueError, match="neither contiguous nor padded rows"):
        span_bytes(raw.T)


@pytest.mark.parametrize("shape,pitch", [((4, 1024), 1000), ((1024,), 1040), ((4, 1024), True),
                                         ((4, 1024), "1040")])
def test_a_bad_pitch_is_a_plan_error_naming_it(shape, pitch) -> None:  # type: ignore[no-untyped-def]
    plan = MemoryPlan("p")
    with pytest.raises(PlanError, match=r"alloc: pitch=.*Fix: pass pitch=None"):
        plan.alloc(shape, "float32", Region.W_FC_WEIGHT, "a", pitch=pitch)
    assert len(plan) == 0
    with pytest.raises(PlanError, match="slot_bytes"):
        plan.alloc((4, 1024), "float32", Region.W_FC_WEIGHT, "a", slot_bytes=4 * 1024 * 4, pitch=1040)


def test_a_variant_cannot_change_the_row_length_of_padded_rows() -> None:
    plan = MemoryPlan("p")
    plan.alloc((4, 1024), "float32", Region.W_FC_WEIGHT, "a", pitch=1040, slot_bytes=8 * 1040 * 4)
    plan.finalize()
    assert plan.with_shapes({0: (8, 1024)}, "v")["a"].storage_bytes == 8 * 1040 * 4
    with pytest.raises(PlanError, match="keep their length 1024.*Fix"):
        plan.with_shapes({0: (4, 2048)}, "v")


def test_the_compiler_pads_every_copy_of_a_parameter_alike() -> None:
    t = wide_task().compile()
    plan = t.memory
    padded = {x.name for x in plan if x.pitch is not None}
    assert padded == {f"{p}{SUFFIX[f]}" for p in ("fc1.weight", "fc2.weight") for f in PARAM_FAMILIES}
    # the flat optimizer and EMA ranges stay element-aligned: same relative offset, same slot
    bases = {f: plan.region_range(Region[f"{f}_BN_BIAS"], Region[f"{f}_DEEP_CONV"])[0] for f in PARAM_FAMILIES}
    for p in ("fc1.weight", "fc2.weight", "fc3.weight", "fc1.bias"):
        copies = [plan[f"{p}{SUFFIX[f]}"] for f in PARAM_FAMILIES]
        assert len({(c.offset - bases[c.region.family], c.slot_bytes, c.pitch) for c in copies}) == 1, p
    w = t.executor.view("train_base", "fc2.weight")
    assert w.shape == (64, 1024) and w.strides[0] == 1040 * 4 and w.strides[0] % ROW_ALIAS_BYTES
    assert any("padded rows: fc1.weight 1024 -> 1040, fc2.weight 1024 -> 1040" in n for n in t.compiled.notes)
    # activations and inputs stay contiguous: their kernels read them as one block
    assert all(x.pitch is None for x in plan if x.region.family not in PARAM_FAMILIES)
    off = wide_task(pad_rows=False).compile()
    assert all(x.pitch is None for x in off.memory) and off.memory.total_bytes < plan.total_bytes
    assert not any("padded rows" in n for n in off.compiled.notes)


def test_pad_rows_must_be_a_bool() -> None:
    t = wide_task()
    with pytest.raises(ConfigError, match="options: pad_rows='yes'.*pad_rows=True or pad_rows=False"):
        t.options(pad_rows="yes")  # type: ignore[arg-type]
    assert t.settings["options"]["pad_rows"] is True


def test_training_with_padded_rows_matches_contiguous_rows_and_the_padding_stays_zero(trained) -> None:
    a, b = trained
    ra, rb = a.result, b.result
    # the same products over other leading dimensions: a BLAS may block them otherwise, so the
    # runs agree to float32 rounding carried through two epochs, not necessarily to the byte
    np.testing.assert_allclose(ra.step_losses, rb.step_losses, rtol=1e-5)
    sa, sb = a.state_dict(), b.state_dict()
    for k in sa:
        np.testing.assert_allclose(sa[k], sb[k], rtol=1e-4, atol=1e-6, err_msg=k)
        assert sa[k].flags.c_contiguous
    for x, y in zip(ra.history, rb.history):
        assert x.val_top1 == pytest.approx(y.val_top1, abs=0.026) and x.ema_top1 == pytest.approx(y.ema_top1, abs=0.026)
    for x in a.memory:
        if x.pitch is not None:
            raw = a.arena.bytes[x.offset: x.offset + x.storage_bytes].view(np.float32).reshape(x.shape[0], x.pitch)
            assert np.abs(raw[:, : x.shape[1]]).max() > 0, x.name
            assert not raw[:, x.shape[1]:].any(), x.name


def test_state_dicts_and_checkpoints_carry_padded_weights(trained, tmp_path) -> None:  # type: ignore[no-untyped-def]
    a, b = trained
    c = wide_task(True, ema=True).compile()
    c.load_state_dict(b.state_dict())  # a contiguous task's weights into a padded one
    for k, v in b.state_dict().items():
        assert np.array_equal(c.state_dict()[k], v), k
    path = a.save(str(tmp_path / "padded.npz"))
    d = wide_task(True).compile().load_state(path)
    for k, v in a.state_dict().items():
        assert np.array_equal(d.state_dict()[k], v), k
    e = wide_task(False).compile()
    before = e.state_dict()
    with pytest.raises(CheckpointError, match=r"rows padded to 1040 in the checkpoint vs contiguous rows in this "
                                              r"task.*Fix: build the task with options\(pad_rows=True\)"):
        e.load_state(path)
    for k, v in before.items():
        assert np.array_equal(e.state_dict()[k], v), k


def test_a_byte_in_the_padding_is_named_as_such() -> None:
    t = wide_task().compile()
    w = t.memory["fc2.weight@grad"]
    first = t.memory.regions[Region.G_BN_BIAS].base
    at = w.offset - first
    assert t.arena.locate("G_BN_BIAS", at + 4 * 1041) == "fc2.weight@grad (region G_FC_WEIGHT, element [1, 1])"
    assert t.arena.locate("G_BN_BIAS", at + 4 * 1030) == ("fc2.weight@grad (region G_FC_WEIGHT, "
                                                           "the padding of row 0)")


def test_cublas_operands_may_have_padded_rows() -> None:
    raw = np.zeros((6, 1040), np.float32)
    x = raw[:, :1024]
    assert gemm_layout(x) == (CUBLAS_OP_N, 1040)
    assert gemm_layout(x.T) == (CUBLAS_OP_T, 1040)
    a = np.zeros((6, 3), np.float32)
    check_gemm(x, a, np.zeros((3, 1024), np.float32))  # a padded result is row-major
    with pytest.raises(DeviceError, match=r"into a row-major \(m, n\), its rows possibly padded. Fix:"):
        check_gemm(np.zeros((1024, 6), np.float32).T, a, np.zeros((3, 1024), np.float32))


def test_the_region_map_shows_padded_rows() -> None:
    from renaissance_nb.display import static, views
    t = wide_task().compile()
    v = views.region_view(t)
    by_name = {x["name"]: x for x in v["tensors"]}
    assert by_name["fc2.weight@m"]["pitch"] == 1040 and by_name["fc3.weight"]["pitch"] is None
    html = static.regions_html(v)
    assert "fc2.weight (#" in html and "rows padded to 1040" in html
    assert html.count("rows padded to 1040") == 2 * len(PARAM_FAMILIES)  # fc1.weight and fc2.weight, each copy


@pytest.mark.parametrize("pad_rows", [True, False])
def test_load_rebuilds_the_task_with_the_saved_row_layout(pad_rows: bool, tmp_path) -> None:  # type: ignore[no-untyped-def]
    a = wide_task(pad_rows, epochs=1, ema=False)
    a.run(progress=False)
    path = a.save(str(tmp_path / "wide.npz"))
    b = DeepLearningTask.load(path, make_splits(_data(96, 1024, 0), _data(40, 1024, 1)))
    assert b.settings["options"]["pad_rows"] is pad_rows
    assert (b.memory["fc2.weight"].pitch is not None) is pad_rows
    for k, v in a.state_dict().items():
        assert np.array_equal(b.state_dict()[k], v), k


def test_a_checkpoint_from_before_padded_rows_loads_contiguous(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from renaissance_nb import checkpoint
    a = wide_task(False, epochs=1, ema=False)
    a.run(progress=False)
    path = a.save(str(tmp_path / "old.npz"))
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    header = json.loads(arrays[checkpoint.HEADER_KEY].tobytes())
    del header["config"]["options"]["pad_rows"]  # what a checkpoint written before pad_rows existed holds
    arrays[checkpoint.HEADER_KEY] = np.frombuffer(json.dumps(header, sort_keys=True).encode(), np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    b = DeepLearningTask.load(path, make_splits(_data(96, 1024, 0), _data(40, 1024, 1)))
    assert b.memory["fc2.weight"].pitch is None
    assert np.array_equal(b.state_dict()["fc2.weight"], a.state_dict()["fc2.weight"])

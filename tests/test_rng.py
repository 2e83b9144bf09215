"""Tests of the counter-based Philox generator and its numba hot-path kernels."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from renaissance_nb.errors import ConfigError
from renaissance_nb.train.rng import (
    Philox,
    StreamId,
    dropout_mask_into,
    philox4x32_10,
    uniform_into,
)

# Random123 known-answer vectors (kat_vectors, philox4x32 10 rounds).
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("ctr,key,expected", KAT)
def test_known_answer_vectors(ctr, key, expected):
    out = philox4x32_10(np.array([ctr], dtype=np.uint32), key)
    assert out.dtype == np.uint32 and out.shape == (1, 4)
    assert tuple(int(x) for x in out[0]) == expected
    # the key may also be given as a uint32 array
    out2 = philox4x32_10(np.array([ctr], dtype=np.uint32), np.array(key, dtype=np.uint32))
    assert np.array_equal(out, out2)


def test_kat_vectorised_rows_are_independent():
    ctrs = np.array([KAT[0][0], KAT[2][0], KAT[0][0]], dtype=np.uint32)
    out = philox4x32_10(ctrs, (0, 0))
    assert tuple(int(x) for x in out[0]) == KAT[0][2]
    assert np.array_equal(out[0], out[2])


def test_counter_layout_matches_documentation():
    seed = (0x12345678 << 32) | 0x9ABCDEF0
    offset = (7 << 32) | 5
    g = Philox(seed)
    assert g.key == (0x9ABCDEF0, 0x12345678)
    bits = g.random_bits(8, StreamId.DROPOUT, offset)
    ctr = np.array([[5, 7, 3, 0], [6, 7, 3, 0]], dtype=np.uint32)
    assert np.array_equal(bits, philox4x32_10(ctr, (0x9ABCDEF0, 0x12345678)).reshape(-1))


def test_offset_carries_into_high_word():
    g = Philox(1)
    bits = g.random_bits(8, 2, 2**32 - 1)
    ctr = np.array([[0xFFFFFFFF, 0, 2, 0], [0, 1, 2, 0]], dtype=np.uint32)
    assert np.array_equal(bits, philox4x32_10(ctr, (1, 0)).reshape(-1))


def test_blocks_needed_and_consecutive_calls_tile():
    g = Philox(3)
    assert [Philox.blocks_needed(n) for n in (0, 1, 4, 5, 8)] == [0, 1, 1, 2, 2]
    assert Philox.blocks_needed(5, words_per_item=2) == 3
    whole = g.random_bits(24, 1, 10)
    a = g.random_bits(10, 1, 10)  # consumes 3 blocks (12 words), last 2 words discarded
    b = g.random_bits(12, 1, 10 + Philox.blocks_needed(10))
    assert np.array_equal(a, whole[:10])
    assert np.array_equal(b, whole[12:24])


def test_uniform_range_and_mean():
    u = Philox(0).uniform(1_000_000, StreamId.INIT, 0)
    assert u.dtype == np.float32 and u.shape == (1_000_000,)
    assert u.min() >= 0.0 and u.max() < 1.0
    assert abs(float(u.mean(dtype=np.float64)) - 0.5) < 3e-3
    # top 24 bits exactly
    bits = Philox(0).random_bits(16, StreamId.INIT, 0)
    assert np.array_equal(u[:16], (bits >> 8).astype(np.float64) * 2.0**-24)


def test_normal_moments_and_finite():
    z = Philox(42).normal(1_000_001, StreamId.INIT, 0)
    assert z.dtype == np.float32 and z.shape == (1_000_001,)
    assert np.all(np.isfinite(z))
    assert abs(float(z.mean(dtype=np.float64))) < 5e-3
    assert abs(float(z.std(dtype=np.float64)) - 1.0) < 5e-3
    # odd n is a prefix of the next even n
    assert np.array_equal(Philox(42).normal(5, 1, 0), Philox(42).normal(6, 1, 0)[:5])


def test_normal_is_box_muller_of_word_pairs():
    g = Philox(0)
    bits = g.random_bits(8, 4, 0)
    u = ((bits >> 8).astype(np.float64) + 0.5) * 2.0**-24  # open interval: never log(0)
    r = np.sqrt(-2.0 * np.log(u[0::2]))
    expected = np.stack([r * np.cos(2 * np.pi * u[1::2]), r * np.sin(2 * np.pi * u[1::2])], 1).reshape(-1)
    np.testing.assert_array_equal(g.normal(8, 4, 0), expected.astype(np.float32))
    assert np.sqrt(-2.0 * np.log(0.5 * 2.0**-24)) < 6.0  # the largest possible |z| is finite


def test_permutation():
    g = Philox(9)
    p = g.permutation(1000, StreamId.SHUFFLE, 0)
    assert p.dtype == np.int64
    assert np.array_equal(np.sort(p), np.arange(1000))
    assert not np.array_equal(p, g.permutation(1000, StreamId.SHUFFLE, 1))
    assert not np.array_equal(p, Philox(10).permutation(1000, StreamId.SHUFFLE, 0))
    assert not np.array_equal(p, g.permutation(1000, StreamId.INIT, 0))
    assert g.permutation(0, 2, 0).shape == (0,)
    # keys are word pairs: high word first
    bits = g.random_bits(2000, StreamId.SHUFFLE, 0).astype(np.uint64).reshape(1000, 2)
    keys = (bits[:, 0] << np.uint64(32)) | bits[:, 1]
    assert np.array_equal(p, np.argsort(keys, kind="stable"))
    for n, offset in [(1, 0), (2, 3), (3, 0), (777, 2**40 + 1)]:  # odd counts end on half a block
        bits = g.random_bits(2 * n, StreamId.SHUFFLE, offset).astype(np.uint64).reshape(n, 2)
        want = np.argsort((bits[:, 0] << np.uint64(32)) | bits[:, 1], kind="stable")
        assert np.array_equal(g.permutation(n, StreamId.SHUFFLE, offset), want)


def test_permutation_orders_equal_keys_as_a_stable_sort(monkeypatch) -> None:
    """Equal 64-bit keys (one pair in 2**64) keep index order, as the stable argsort did: runs of
    two and more, at the start, the middle and the end."""
    keys = np.random.default_rng(0).integers(0, 20, 500).astype(np.uint64)
    keys[-3:] = 25  # a run at the end
    assert not np.array_equal(np.argsort(keys), np.argsort(keys, kind="stable"))  # the fix-up has work to do
    monkeypatch.setattr(Philox, "_keys", lambda self, n, stream, offset: keys.copy())
    assert np.array_equal(Philox(0).permutation(len(keys), 0, 0), np.argsort(keys, kind="stable"))
    keys = np.zeros(50_000, np.uint64)  # one long run is sorted once (the fix-up used to take minutes)
    assert np.array_equal(Philox(0).permutation(len(keys), 0, 0), np.arange(50_000))


def test_same_inputs_identical_bytes():
    for method in ("random_bits", "uniform", "normal", "permutation"):
        a = getattr(Philox(123), method)(1001, StreamId.AUGMENT, 77)
        b = getattr(Philox(123), method)(1001, StreamId.AUGMENT, 77)
        assert a.tobytes() == b.tobytes()
        c = getattr(Philox(124), method)(1001, StreamId.AUGMENT, 77)
        assert a.tobytes() != c.tobytes()


def test_streams_are_separate():
    g = Philox(5)
    assert not np.array_equal(g.random_bits(64, StreamId.INIT, 0), g.random_bits(64, StreamId.DROPOUT, 0))
    assert [int(s) for s in StreamId] == [1, 2, 3, 4, 5]


def test_philox_is_immutable_and_hashable():
    g = Philox(1)
    with pytest.raises(AttributeError):
        g.seed = 2  # type: ignore[misc]
    assert Philox(1) == g and hash(Philox(1)) == hash(g)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 7, 8, 9, 1001, 100_003])
@pytest.mark.parametrize("keep", [0.9, 0.5, 0.3, 0.1, 1.0, 0.7000001])
def test_dropout_kernel_matches_reference_bit_for_bit(n, keep):
    seed, stream, offset = 2**40 + 3, StreamId.DROPOUT, 2**32 - 1
    out = np.full(n, np.nan, dtype=np.float32)
    dropout_mask_into(out, seed, stream, offset, keep)
    ref = (Philox(seed).uniform(n, stream, offset) < keep) / keep
    assert np.array_equal(out.view(np.uint32), ref.astype(np.float32).view(np.uint32))


@given(seed=st.integers(0, 2**64 - 1), stream=st.integers(0, 2**32 - 1),
       offset=st.integers(0, 2**64 - 64), n=st.integers(0, 64),
       keep=st.floats(1e-6, 1.0, allow_nan=False))
@settings(max_examples=60, deadline=None)
def test_kernels_match_reference_property(seed, stream, offset, n, keep):
    ref_u = Philox(seed).uniform(n, stream, offset)
    out = np.empty(n, dtype=np.float32)
    uniform_into(out, seed, stream, offset)
    assert np.array_equal(out.view(np.uint32), ref_u.view(np.uint32))
    dropout_mask_into(out, seed, stream, offset, keep)
    ref = ((ref_u < keep) / keep).astype(np.float32)
    assert np.array_equal(out.view(np.uint32), ref.view(np.uint32))


def test_uniform_into_matches_reference():
    out = np.empty(100_001, dtype=np.float32)
    uniform_into(out, 7, StreamId.AUGMENT, 12345)
    assert np.array_equal(out.view(np.uint32), Philox(7).uniform(100_001, StreamId.AUGMENT, 12345).view(np.uint32))


def test_dropout_mask_into_does_not_allocate():
    out = np.empty(100_000, dtype=np.float32)
    dropout_mask_into(out, 1, StreamId.DROPOUT, 0, 0.9)  # warm-up (compile / cache load)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        for i in range(100):
            dropout_mask_into(out, 1, StreamId.DROPOUT, i * 25_000, 0.9)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak - base < 10_000


def test_dropout_mask_statistics():
    out = np.empty(1_000_000, dtype=np.float32)
    dropout_mask_into(out, 11, StreamId.DROPOUT, 0, 0.8)
    assert set(np.unique(out).tolist()) == {0.0, float(np.float32(1 / 0.8))}
    assert abs(float((out > 0).mean()) - 0.8) < 3e-3
    assert abs(float(out.mean(dtype=np.float64)) - 1.0) < 5e-3


@pytest.mark.parametrize("call", [
    lambda: Philox(-1),
    lambda: Philox(2**64),
    lambda: Philox(1.5),  # type: ignore[arg-type]
    lambda: Philox(True),  # type: ignore[arg-type]
    lambda: Philox(0).uniform(-1, 1, 0),
    lambda: Philox(0).uniform(4, 2**32, 0),
    lambda: Philox(0).uniform(4, 1, -1),
    lambda: Philox(0).uniform(8, 1, 2**64 - 1),
    lambda: philox4x32_10(np.zeros((2, 3), np.uint32), (0, 0)),
    lambda: philox4x32_10(np.zeros((2, 4), np.uint32), (0, 2**32)),
    lambda: dropout_mask_into(np.empty(4, np.float32), 0, 3, 0, 0.0),
    lambda: dropout_mask_into(np.empty(4, np.float32), 0, 3, 0, 1.5),
    lambda: dropout_mask_into(np.empty(4, np.float32), 0, 3, 0, float("nan")),
    lambda: dropout_mask_into(np.empty(4, np.float64), 0, 3, 0, 0.5),
    lambda: dropout_mask_into(np.empty((2, 2), np.float32), 0, 3, 0, 0.5),
    lambda: uniform_into(np.empty(8, np.float32)[::2], 0, 3, 0),
    lambda: uniform_into(np.empty(8, np.float32), 0, 3, 2**64 - 1),
])
def test_bad_arguments_raise_config_error(call):
    with pytest.raises(ConfigError, match="Fix:"):
        call()


def test_the_numpy_fallback_gives_the_numba_bits(monkeypatch) -> None:
    """Without numba, uniform_into, dropout_mask_into and permutation take NumPy paths: the same bits."""
    import renaissance_nb.train.rng as rng_mod
    g = Philox(77)
    want = [np.empty(1001, np.float32), np.empty(1001, np.float32), g.permutation(999, StreamId.SHUFFLE, 2**33 + 1)]
    uniform_into(want[0], 77, StreamId.DROPOUT, 5)
    dropout_mask_into(want[1], 77, StreamId.DROPOUT, 5, 0.7)
    monkeypatch.setattr(rng_mod, "_HAVE_NUMBA", False)
    got = [np.empty(1001, np.float32), np.empty(1001, np.float32), g.permutation(999, StreamId.SHUFFLE, 2**33 + 1)]
    uniform_into(got[0], 77, StreamId.DROPOUT, 5)
    dropout_mask_into(got[1], 77, StreamId.DROPOUT, 5, 0.7)
    assert all(np.array_equal(a, b) for a, b in zip(want, got))

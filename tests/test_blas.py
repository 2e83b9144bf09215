"""The library's own GEMM (bands of single-threaded OpenBLAS sgemm on numba's threads) and the
threaded passes that share its pool: values against float64 references, the fallback, the bytes
of the threaded updates, and the OpenBLAS thread setting around a replay."""
from __future__ import annotations

import numba
import numpy as np
import pytest
from helpers import train_in_processes

from renaissance_nb.kernels import blas, fused

needs_own = pytest.mark.skipif(not blas.THREADED, reason=f"no OpenBLAS sgemm to call: {blas.OPENBLAS.why_not}")


def _views(rng: np.random.Generator, m: int, k: int, n: int, ta: bool, tb: bool, tc: bool, pad: int):
    """a (m, k), b (k, n), c (m, n): each row-major or a transposed view, inside a wider buffer when pad."""
    def make(r: int, c: int, trans: bool) -> np.ndarray:
        if trans:
            return make(c, r, False).T
        buf = rng.standard_normal((r, c + pad), dtype=np.float32)
        return buf[:, :c]
    c = (np.full((n, m + pad), 7.0, np.float32)[:, :m].T if tc else np.full((m, n + pad), 7.0, np.float32)[:, :n])
    return make(m, k, ta), make(k, n, tb), c


SHAPES = [(128, 784, 1024), (1024, 128, 784), (33, 70, 17), (1, 128, 512), (200, 10, 1), (5, 1, 9), (2, 3, 4)]


SGEMMS = sorted(blas.loaded_sgemms()) if blas.THREADED else []


@needs_own
@pytest.mark.parametrize("which", SGEMMS)
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_gemm_matches_a_float64_product_for_every_layout(m: int, k: int, n: int, which: str) -> None:
    """Each loadable BLAS (OpenBLAS always, oneMKL where installed) through the same bands."""
    sgemm = blas.loaded_sgemms()[which]
    rng = np.random.default_rng(m * 7 + n)
    for ta in (False, True):
        for tb in (False, True):
            for tc in (False, True):
                for pad in (0, 3):
                    a, b, c = _views(rng, m, k, n, ta, tb, tc, pad)
                    assert blas.plan_bands(a, b, c, 2) is not None, "a BLAS-addressable layout fell back"
                    blas.gemm(a, b, c, sgemm=sgemm)()
                    ref = a.astype(np.float64) @ b.astype(np.float64)
                    scale = np.sqrt(k) * np.abs(a).max() * np.abs(b).max()
                    assert np.abs(c - ref).max() <= 1e-6 * scale, (ta, tb, tc, pad)
                    if pad:
                        base = c.base if c.base is not None else c
                        assert np.count_nonzero(base == 7.0) == base.size - m * n, "wrote outside c"


@needs_own
def test_bands_cover_the_result_once_on_tile_edges() -> None:
    for size in (1, 15, 16, 17, 100, 128, 1000, 1024):
        for parts in (1, 2, 3, 4, 8):
            e = blas.band_edges(size, parts)
            assert e[0] == 0 and e[-1] == size and all(x < y for x, y in zip(e, e[1:]))
            assert len(e) - 1 <= parts and all(x % blas.BAND_ALIGN == 0 for x in e[1:-1])
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((300, 64), dtype=np.float32), rng.standard_normal((64, 50), dtype=np.float32)
    c = np.empty((300, 50), np.float32)
    bands = blas.plan_bands(a, b, c, 3)
    assert bands is not None and bands[:, 2].sum() == 300 and (bands[:, 3] == 50).all()  # row bands of m


@needs_own
def test_bound_bands_give_the_same_bytes_every_call_and_on_any_thread_count() -> None:
    """The bands are fixed at bind time: later calls, and calls with fewer numba threads, repeat the bytes."""
    import numba
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((256, 300), dtype=np.float32), rng.standard_normal((300, 512), dtype=np.float32)
    c = np.empty((256, 512), np.float32)
    run = blas.gemm(a, b, c)
    run()
    first = c.copy()
    run()
    assert np.array_equal(c, first)
    old = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        c.fill(0)
        run()
    finally:
        numba.set_num_threads(old)
    assert np.array_equal(c, first)


def test_what_blas_cannot_address_falls_back_to_matmul() -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((6, 8)).astype(np.float64)  # not float32
    b = rng.standard_normal((8, 5)).astype(np.float64)
    c = np.empty((6, 5))
    assert blas.plan_bands(a, b, c, 2) is None
    blas.gemm(a, b, c)()
    assert np.array_equal(c, a @ b)
    x = rng.standard_normal((12, 12), dtype=np.float32)
    assert blas.plan_bands(x[:, ::2], x[::2, :6], np.empty((12, 6), np.float32), 2) is None  # strided both ways
    s = np.zeros((4, 4), np.float32)
    assert blas.plan_bands(s, s, s, 2) is None  # c aliases an input
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    c32 = np.empty((6, 5), np.float32)
    blas.gemm(a32, b32, c32, threaded=False)()
    assert np.array_equal(c32, np.matmul(a32, b32))


@needs_own
def test_own_cores_sets_openblas_to_one_thread_and_restores_it() -> None:
    get = blas.OPENBLAS.get_threads
    assert get is not None
    before = get()
    with blas.own_cores():
        assert get() == 1
        with blas.own_cores():
            assert get() == 1
        assert get() == 1
    assert get() == before
    with pytest.raises(KeyboardInterrupt), blas.own_cores():  # the stop button mid-epoch
        raise KeyboardInterrupt
    assert get() == before


def test_threaded_updates_and_probe_give_the_serial_bytes() -> None:
    rng = np.random.default_rng(5)
    n = 100_003
    lr = np.full(10, 1e-3, np.float32)
    w0, g, m0, v0 = (rng.standard_normal(n, dtype=np.float32) for _ in range(4))
    v0 = np.abs(v0)
    out = []
    for f in (fused.adam_update, fused.adam_update_par):
        w, m, v, step = w0.copy(), m0.copy(), v0.copy(), np.zeros(1, np.int64)
        for _ in range(3):
            f(w, g, m, v, lr, step, 0.9, 0.999, 1e-8, 1e-2, True, False)
        out.append((w, m, v, step))
    assert all(np.array_equal(x, y) for x, y in zip(*out)) and out[0][3][0] == 3
    out = []
    for f in (fused.sgd_update, fused.sgd_update_par):
        w, m, step = w0.copy(), m0.copy(), np.zeros(1, np.int64)
        for _ in range(3):
            f(w, g, m, lr, step, 0.9, 0.1, 1e-2, True, False)
        out.append((w, m))
    assert all(np.array_equal(x, y) for x, y in zip(*out))
    parts = np.zeros(fused.PAR_CHUNKS, np.float32)
    for size in (0, 1, 7, 9, 1000):
        x = np.ones(size, np.float32)
        assert fused.nonfinite_probe_par(x, parts) == 0.0
        for pos in sorted({0, size // 2, size - 1}) if size else ():
            for bad in (np.nan, np.inf, -np.inf):
                y = x.copy()
                y[pos] = bad
                assert np.isnan(fused.nonfinite_probe_par(y, parts)), (size, pos, bad)


@needs_own
def test_a_pair_of_products_runs_side_by_side_with_each_ones_values() -> None:
    """A layer's dW and dx as one parallel call, one whole sgemm each: both match float64."""
    rng = np.random.default_rng(8)
    dy, x, w = (rng.standard_normal(s, dtype=np.float32) for s in ((64, 96), (64, 80), (96, 80)))
    dw, dx = np.empty((96, 80), np.float32), np.empty((64, 80), np.float32)
    pair = blas.gemm_pair((dy.T, x, dw), (dy, w, dx))
    pair()
    for got, a, b in ((dw, dy.T, x), (dx, dy, w)):
        ref = a.astype(np.float64) @ b.astype(np.float64)
        assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()
    fallback_dw, fallback_dx = np.empty_like(dw), np.empty_like(dx)
    blas.gemm_pair((dy.T, x, fallback_dw), (dy, w, fallback_dx), threaded=False)()
    assert np.array_equal(fallback_dw, np.matmul(dy.T, x)) and np.array_equal(fallback_dx, np.matmul(dy, w))


_TRAIN = """
import sys, numpy as np, renaissance_nb as rnb
from renaissance_nb.kernels import blas
rng = np.random.default_rng(0)
x = rng.standard_normal((600, 40), dtype=np.float32)
y = (x[:, :10].argmax(1)).astype(np.int32)
t = (rnb.DeepLearningTask("t").model(rnb.seq(rnb.fc(256), rnb.relu(), rnb.fc(128), rnb.relu(), rnb.fc(10)))
     .data(train=(x, y), batch_size=64).optimizer(rnb.AdamW().weight_decay(1e-2)).total_epochs(6).seed(1))
r = t.run(progress=False)
np.savez(sys.argv[1], threaded=np.array(blas.THREADED), losses=r.step_losses, **t.state_dict())
"""


@needs_own
def test_training_on_our_threads_matches_numpys_threaded_matmul(tmp_path) -> None:
    """The same task trained with the one-pool replay and with RNB_OWN_THREADS=0 (np.matmul on
    OpenBLAS's threads, serial passes): the same run up to float32 rounding; each path repeats its bytes."""
    runs = train_in_processes(tmp_path, _TRAIN, {"own": {}, "own2": {}, "numpy": {"RNB_OWN_THREADS": "0"}})
    assert runs["own"]["threaded"] and not runs["numpy"]["threaded"]
    assert all(np.array_equal(runs["own"][k], runs["own2"][k]) for k in runs["own"])
    np.testing.assert_allclose(runs["own"]["losses"], runs["numpy"]["losses"], rtol=1e-4)
    assert runs["own"]["losses"][-1] < 0.6 * runs["own"]["losses"][0]  # it learned
    for k, v in runs["numpy"].items():
        if k not in ("threaded", "losses"):
            np.testing.assert_allclose(runs["own"][k], v, rtol=1e-3, atol=1e-5, err_msg=k)


def test_the_sgemm_choice_follows_the_cpu_and_rnb_blas(monkeypatch) -> None:
    """auto: OpenBLAS on a non-Intel CPU, MKL on Intel only where it loads; a bad RNB_BLAS is a
    ConfigError naming the value; asking for a missing MKL warns and keeps OpenBLAS."""
    from renaissance_nb.errors import ConfigError
    monkeypatch.delenv("RNB_OWN_THREADS", raising=False)
    assert blas.choose_sgemm(blas.OPENBLAS, "auto", "AuthenticAMD").name == "openblas"
    assert blas.choose_sgemm(blas.OPENBLAS, " OpenBLAS ", "GenuineIntel").name == "openblas"
    with pytest.raises(ConfigError, match="RNB_BLAS='cublas'.*'auto', 'openblas' or 'mkl'"):
        blas.choose_sgemm(blas.OPENBLAS, "cublas", "GenuineIntel")
    monkeypatch.setattr(blas, "_mkl_paths", lambda: [])
    assert blas.choose_sgemm(blas.OPENBLAS, "auto", "GenuineIntel").name == "openblas"
    with pytest.warns(UserWarning, match="RNB_BLAS=mkl: oneMKL is not installed"):
        assert blas.choose_sgemm(blas.OPENBLAS, "mkl", "GenuineIntel").name == "openblas"
    monkeypatch.setattr(blas, "_mkl_paths", lambda: ["/nonexistent/libmkl_rt.so.3"])
    with pytest.warns(UserWarning, match="cannot load /nonexistent/libmkl_rt.so.3"):
        assert blas.choose_sgemm(blas.OPENBLAS, "mkl", "GenuineIntel").name == "openblas"
    monkeypatch.setenv("MKL_BLAS_COMPUTE_MODE", "FLOAT_TO_BF16")  # MKL would round to bfloat16
    with pytest.warns(UserWarning, match="MKL_BLAS_COMPUTE_MODE=FLOAT_TO_BF16"):
        assert blas.choose_sgemm(blas.OPENBLAS, "mkl", "GenuineIntel").name == "openblas"
    monkeypatch.setenv("RNB_OWN_THREADS", "0")
    assert blas.choose_sgemm(blas.OPENBLAS, "mkl", "GenuineIntel").name == "openblas"


@pytest.mark.skipif("mkl" not in SGEMMS, reason="oneMKL is not installed (the [mkl] extra)")
def test_training_with_mkl_repeats_its_bytes_and_matches_openblas(tmp_path) -> None:
    """RNB_BLAS=mkl against RNB_BLAS=openblas, each twice in fresh processes: each repeats its
    bytes (the arena gives MKL the same alignment every run); they agree up to float32 rounding."""
    script = _TRAIN.replace("threaded=np.array(blas.THREADED)", "threaded=np.array(blas.SGEMM.name)")
    runs = train_in_processes(tmp_path, script, {"mkl": {"RNB_BLAS": "mkl"}, "mkl2": {"RNB_BLAS": "mkl"},
                                                 "openblas": {"RNB_BLAS": "openblas"}})
    assert str(runs["mkl"]["threaded"]) == "mkl" and str(runs["openblas"]["threaded"]) == "openblas"
    assert all(np.array_equal(runs["mkl"][k], runs["mkl2"][k]) for k in runs["mkl"])
    np.testing.assert_allclose(runs["mkl"]["losses"], runs["openblas"]["losses"], rtol=1e-4)
    for k, v in runs["openblas"].items():
        if k not in ("threaded", "losses"):
            np.testing.assert_allclose(runs["mkl"][k], v, rtol=1e-3, atol=1e-5, err_msg=k)


def test_compile_notes_say_what_the_products_run_on() -> None:
    import renaissance_nb as rnb
    x = np.random.default_rng(0).standard_normal((64, 8), dtype=np.float32)
    t = (rnb.DeepLearningTask("t").model(rnb.seq(rnb.fc(4))).data(train=(x, np.arange(64, dtype=np.int32) % 4), batch_size=16)
         .total_epochs(1).compile())
    notes = [n for n in t.runner.notes if n.startswith("device: CPU")]
    from renaissance_nb.kernels import native
    assert notes == [f"device: CPU, {blas.describe()}; {native.plan_note(t.runner.executor.ops)}."]
    if blas.THREADED:
        expected = {"mkl": "oneMKL's", "openblas": "NumPy's OpenBLAS"}[blas.SGEMM.name]
        assert f"bands of {expected} sgemm on {numba.get_num_threads()} " in notes[0]
    else:
        assert "np.matmul" in notes[0]


def test_threaded_batch_gather_gives_the_serial_bytes() -> None:
    rng = np.random.default_rng(2)
    xs, ys = rng.standard_normal((500, 37), dtype=np.float32), rng.integers(0, 10, 500).astype(np.int32)
    perm = rng.permutation(500).astype(np.int64)
    for b in (1, 7, 128):
        outs = []
        for f in (fused.gather_batch, fused.gather_batch_par):
            cursor = np.array([13], np.int64)
            x, y = np.full((b, 37), 9.0, np.float32), np.full(b, -1, np.int32)
            f(xs, ys, perm, cursor, x, y)
            outs.append((x, y, cursor[0]))
        assert np.array_equal(outs[0][0], outs[1][0]) and np.array_equal(outs[0][1], outs[1][1])
        assert outs[0][2] == outs[1][2] == 13 + b
        assert np.array_equal(outs[0][0], xs[perm[13:13 + b]])


def test_a_batch_gather_past_the_data_order_is_an_error_not_a_stray_read() -> None:
    """A cursor past the end of the data order, or an order naming a row the source lacks, gives a
    status (nothing copied, the cursor left) and, through the bound transfer kernel, a PlanError
    saying what to fix; numba does not check indices, so these once read outside the source."""
    from renaissance_nb.errors import PlanError
    from renaissance_nb.kernels.cpu import KERNELS, BindEnv
    rng = np.random.default_rng(3)
    xs, ys = rng.standard_normal((50, 6), dtype=np.float32), rng.integers(0, 4, 50).astype(np.int32)
    perm = rng.permutation(50).astype(np.int64)
    for f in (fused.gather_batch, fused.gather_batch_par):
        x, y = np.full((8, 6), 9.0, np.float32), np.full(8, -1, np.int32)
        for start, order, code in ((45, perm, 1), (-1, perm, 1), (0, np.where(perm == 3, 50, perm), 2)):
            cursor = np.array([start], np.int64)
            assert f(xs, ys, order, cursor, x, y) == code
            assert cursor[0] == start and (x == 9.0).all() and (y == -1).all()
        cursor = np.array([42], np.int64)
        assert f(xs, ys, perm, cursor, x, y) == 0 and cursor[0] == 50 and np.array_equal(x, xs[perm[42:]])
    cursor = np.array([48], np.int64)
    env = BindEnv(sources={"train": (xs, ys)}, perms={"train": perm})
    transfer = KERNELS["transfer"]([x, y], [cursor], {"source": "train"}, env)
    with pytest.raises(PlanError, match=r"batch \[48, 56\) runs past the end of the 'train' permutation \(length 50\)"
                                        r"\. Fix: reset the cursor"):
        transfer()
    assert cursor[0] == 48


def test_a_bad_rnb_blas_warns_at_import_instead_of_breaking_it() -> None:
    """Raised at import, the ConfigError made ``import renaissance_nb`` and the CLI's --help fail."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, RNB_BLAS="bogus")
    run = subprocess.run([sys.executable, "-c", "from renaissance_nb.kernels import blas; print(blas.SGEMM.name)"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() in ("openblas", "mkl")
    assert "RNB_BLAS='bogus': expected 'auto', 'openblas' or 'mkl'" in run.stderr
    assert "using the automatic choice" in run.stderr and "Traceback" not in run.stderr

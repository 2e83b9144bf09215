"""The C kernels (kernels/native.c) give their numba twins' bytes, on every thread count.

Each test runs the numba kernel and the C one on copies of the same data (random values with
zeros, negative zeros, subnormals, NaN and large values mixed in; row counts that do not divide
into the eight blocks; strided rows) and compares the outputs byte for byte.
"""
from __future__ import annotations

import numpy as np
import pytest
from helpers import forked_child_exits_0

from renaissance_nb.kernels import blas, fused, native, native_build, philox
from renaissance_nb.kernels.operands import PAR_CHUNKS

needs_lib = pytest.mark.skipif(native.lib() is None, reason=f"no C kernels: {native.status().why_not}")
THREADS = (1, 2, 3)


def awkward(rng: np.random.Generator, shape: tuple[int, ...], nan: bool = False) -> np.ndarray:
    """float32 values of all magnitudes, with the special values a step can meet."""
    x = (rng.standard_normal(shape) * np.exp(rng.uniform(-6, 3, shape))).astype(np.float32)
    flat = x.reshape(-1)
    k = flat.size
    specials = [0.0, -0.0, 1e-40, -1e-39, 3e38]
    if nan:
        specials += [np.nan, np.inf]
    for s in specials[:k]:
        flat[rng.integers(0, k)] = s
    return x


def same(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes(), f"{np.count_nonzero(a.view(np.uint8) != b.view(np.uint8))} bytes differ"


@needs_lib
@pytest.mark.parametrize("rows,cols", [(128, 1024), (13, 7), (3, 5), (64, 10)])
@pytest.mark.parametrize("act", range(5))
def test_bias_act(rows: int, cols: int, act: int) -> None:
    rng = np.random.default_rng(act * 100 + rows)
    y0 = awkward(rng, (rows, cols), nan=True)
    b = awkward(rng, (cols,))
    for threads in THREADS:
        for bias in (b, np.zeros(0, np.float32)):
            ref, got = y0.copy(), y0.copy()
            fused.bias_act_(ref, bias, act, 0.01)
            native.bind_bias_act(got, bias, act, 0.01, threads)()
            same(ref, got)


@needs_lib
def test_bias_act_strided_rows() -> None:
    rng = np.random.default_rng(5)
    big = awkward(rng, (40, 48))
    ref, got = big.copy(), big.copy()
    b = awkward(rng, (33,))
    fused.bias_act_(ref[:, 5:38], b, 3, 0.0)
    native.bind_bias_act(got[:, 5:38], b, 3, 0.0, 2)()
    same(ref, got)


@needs_lib
@pytest.mark.parametrize("rows,cols", [(128, 1024), (128, 10), (13, 7), (5, 3), (71, 33)])
@pytest.mark.parametrize("act", range(5))
def test_act_grad_colsum(rows: int, cols: int, act: int) -> None:
    rng = np.random.default_rng(act * 7 + rows)
    d0 = awkward(rng, (rows, cols))
    y = awkward(rng, (rows, cols))
    if act == 1:
        y = np.maximum(y, 0)
    for threads in THREADS:
        for with_bias in (True, False):
            n = cols if with_bias else 0
            ref, got = d0.copy(), d0.copy()
            out_r, out_g = np.full(n, 7, np.float32), np.full(n, 9, np.float32)
            parts_r, parts_g = np.zeros((PAR_CHUNKS, n)), np.ones((PAR_CHUNKS, n))
            fused.act_grad_colsum_(ref, y, act, 0.02, parts_r, out_r)
            native.bind_act_grad_colsum(got, y, act, 0.02, parts_g, out_g, threads)()
            same(ref, got)
            same(out_r, out_g)


OPTIMIZERS = [
    dict(beta1=0.9, beta2=0.999, eps=1e-8, wd=0.0, decoupled=False, maximize=False),
    dict(beta1=0.9, beta2=0.999, eps=1e-8, wd=0.01, decoupled=True, maximize=False),
    dict(beta1=0.3, beta2=0.99, eps=1e-6, wd=0.1, decoupled=False, maximize=True),
    dict(beta1=0.0, beta2=0.5, eps=1e-12, wd=0.0, decoupled=True, maximize=False),
]


@needs_lib
@pytest.mark.parametrize("cfg", OPTIMIZERS)
@pytest.mark.parametrize("n", [1, 9, 1000, 70001])
def test_adam_steps(cfg: dict, n: int) -> None:
    rng = np.random.default_rng(n)
    lr = np.array([1e-3, 3e-3, 2e-3, 5e-4], np.float32)
    state = [awkward(rng, (n,)) for _ in range(2)] + [np.abs(awkward(rng, (n,)))]  # w, m, v
    a = [s.copy() for s in state] + [np.zeros(1, np.int64)]
    b = [s.copy() for s in state] + [np.zeros(1, np.int64)]
    for t in range(6):
        g = awkward(rng, (n,))
        w, m, v, step = a
        fused.adam_update(w, g.copy(), m, v, lr, step, cfg["beta1"], cfg["beta2"], cfg["eps"], cfg["wd"],
                          cfg["decoupled"], cfg["maximize"])
        w2, m2, v2, step2 = b
        native.bind_adam(w2, g.copy(), m2, v2, lr, step2, cfg["beta1"], cfg["beta2"], cfg["eps"], cfg["wd"],
                         cfg["decoupled"], cfg["maximize"], THREADS[t % 3])()
        for x, y in zip(a, b):
            same(x, y)


@pytest.mark.parametrize("momentum,dampening,wd,nesterov,maximize", [
    (0.0, 0.0, 0.0, False, False), (0.9, 0.0, 1e-4, True, False), (0.9, 0.1, 0.0, False, True)])
@needs_lib
def test_sgd_steps(momentum: float, dampening: float, wd: float, nesterov: bool, maximize: bool) -> None:
    rng = np.random.default_rng(3)
    n = 5003
    lr = np.array([0.1, 0.05], np.float32)
    w0 = awkward(rng, (n,))
    mlen = n if momentum else 0
    a = [w0.copy(), np.zeros(mlen, np.float32), np.zeros(1, np.int64)]
    b = [w0.copy(), np.zeros(mlen, np.float32), np.zeros(1, np.int64)]
    for t in range(4):
        g = awkward(rng, (n,))
        fused.sgd_update(a[0], g.copy(), a[1], lr, a[2], momentum, dampening, wd, nesterov, maximize)
        native.bind_sgd(b[0], g.copy(), b[1], lr, b[2], momentum, dampening, wd, nesterov, maximize, THREADS[t % 3])()
        for x, y in zip(a, b):
            same(x, y)


@needs_lib
def test_ema() -> None:
    rng = np.random.default_rng(4)
    e0, w = awkward(rng, (1001,)), awkward(rng, (1001,))
    ref, got = e0.copy(), e0.copy()
    fused.ema_(ref, w, 0.9)
    native.bind_ema(got, w)(0.9)
    same(ref, got)


@needs_lib
@pytest.mark.parametrize("n", [0, 3, 4097, 100000])
def test_probe_and_clip(n: int) -> None:
    rng = np.random.default_rng(n)
    x = awkward(rng, (n,))
    parts = np.zeros(PAR_CHUNKS, np.float32)
    for threads in THREADS:
        assert native.bind_probe(x, parts, threads)() == 0.0
        total, scale = native.bind_clip(x, threads)
        assert total() == fused.sq_sum_chunked(x) == fused.sq_sum_par(x)  # the same float64, bit for bit
        ref, got = x.copy(), x.copy()
        fused.scale_(ref, np.float32(0.37))
        native.bind_clip(got, threads)[1](np.float32(0.37))
        same(ref, got)
    if n:
        for bad in (np.nan, np.inf, -np.inf):
            y = x.copy()
            y[n // 2] = bad
            assert np.isnan(native.bind_probe(y, parts, 2)())


@needs_lib
@pytest.mark.parametrize("dtype", [np.float32, np.uint8])
def test_gather(dtype: type) -> None:
    rng = np.random.default_rng(8)
    xs = (rng.random((300, 17)) * 200).astype(dtype)
    ys = rng.integers(0, 10, 300).astype(np.int64)
    perm = rng.permutation(300).astype(np.int64)
    for threads in THREADS:
        c1, c2 = np.array([13], np.int64), np.array([13], np.int64)
        x1, x2 = np.zeros((37, 17), dtype), np.zeros((37, 17), dtype)
        y1, y2 = np.zeros(37, np.int64), np.zeros(37, np.int64)
        k = native.bind_gather(xs, ys, perm, c2, x2, y2, threads)
        assert fused.gather_batch(xs, ys, perm, c1, x1, y1) == k() == 0
        same(x1, x2)
        same(y1, y2)
        same(c1, c2)
        c2[0] = 290  # runs past the order: nothing copied, the status says why
        assert k() == 1 and c2[0] == 290
        bad = perm.copy()
        bad[20] = 300
        c3 = np.array([13], np.int64)
        assert native.bind_gather(xs, ys, bad, c3, x2, y2, threads)() == 2 and c3[0] == 13


@needs_lib
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("weighted", [False, True])
def test_softmax_xent(smoothing: float, weighted: bool) -> None:
    rng = np.random.default_rng(9)
    logits = (rng.standard_normal((50, 10)) * 4).astype(np.float32)
    logits[3, 2] = np.nan
    logits[4, :] = 1.0  # ties
    labels64 = rng.integers(0, 10, 50).astype(np.int64)
    weight = rng.random(10).astype(np.float32) if weighted else np.zeros(0, np.float32)
    for grad, labels in ((True, labels64), (False, labels64), (False, labels64.astype(np.int32))):
        r1, r2 = np.zeros(3, np.float32), np.zeros(3, np.float32)
        d1, d2 = np.zeros_like(logits), np.zeros_like(logits)
        fused.softmax_xent(logits, labels, smoothing, weight, r1, d1, grad)
        native.bind_softmax_xent(logits, labels, smoothing, weight, r2, d2, grad)()
        same(r1, r2)
        same(d1, d2)


@needs_lib
def test_accumulate_metrics() -> None:
    result = np.array([0.731, 17, 40], np.float32)
    a1, a2 = np.zeros(4), np.zeros(4)
    l1, l2 = np.zeros(5, np.float32), np.zeros(5, np.float32)
    step = np.array([3], np.int64)
    for _ in range(3):
        fused.accumulate_metrics(result, a1, 48.0, l1, step)
        native.bind_accumulate_metrics(result, a2, 48.0, l2, step)()
    same(a1, a2)
    same(l1, l2)


@needs_lib
@pytest.mark.skipif(not blas.THREADED, reason="no sgemm address to call")
@pytest.mark.parametrize("shape", [(128, 784, 1024), (3, 5, 7), (1024, 128, 512)])
def test_gemm_bands(shape: tuple[int, int, int]) -> None:
    m, k, n = shape
    rng = np.random.default_rng(m)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    for parts in (1, 2, 3):
        c1, c2 = np.zeros((m, n), np.float32), np.zeros((m, n), np.float32)
        bands1, bands2 = blas.plan_bands(a, b, c1, parts), blas.plan_bands(a, b, c2, parts)
        sg = blas.SGEMM
        with blas.own_cores():
            (blas._bands64 if sg.int_bits == 64 else blas._bands32)(sg.address, bands1)
            native.bind_gemm_bands(sg.address, sg.int_bits == 64, bands2, 2)()
        same(c1, c2)
        np.testing.assert_allclose(c2, a @ b, rtol=1e-4, atol=1e-3)


@needs_lib
@pytest.mark.parametrize("n", [1, 2, 7, 1000])
def test_philox_keys(n: int) -> None:
    ref, got = np.zeros(n, np.uint64), np.zeros(n, np.uint64)
    args = (0x12345678, 0x9ABCDEF0, 5, 0xFFFFFFFF, 3)
    philox.keys_kernel(ref, *args)
    assert native.philox_keys(got, *args)
    same(ref, got)


def test_build_reports_and_disables(monkeypatch: pytest.MonkeyPatch) -> None:
    built = native.status()
    assert ("fused passes in C" in built.describe()) if built.lib is not None else ("numba" in built.describe())
    monkeypatch.setenv("RNB_NATIVE", "0")
    assert native.build().lib is None and "RNB_NATIVE=0" in native.build().describe()
    monkeypatch.setenv("RNB_NATIVE", "1")
    monkeypatch.setattr(native_build, "compiler", lambda: None)
    assert "no C compiler" in native.build().why_not


def test_broken_compiler_falls_back(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A compiler that fails leaves no library behind and says why; nothing raises."""
    fake = tmp_path / "cc"
    fake.write_text("#!/bin/sh\necho 'cc: fatal error: no input' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    monkeypatch.setenv("RNB_NATIVE", "1")
    monkeypatch.setenv("RNB_CACHE_DIR", str(tmp_path / "cache"))
    b = native.build()
    assert b.lib is None and "could not be built" in b.why_not and "fatal error" in b.why_not
    assert not list((tmp_path / "cache").glob("*.so"))
    assert not list((tmp_path / "cache").glob(native.TEMP_PREFIX + "*"))  # its objects and folder are gone too


_MLP_RUN = """
import gc, hashlib, json
import numpy as np
from numba.core.dispatcher import Dispatcher
from renaissance_nb import DeepLearningTask, AdamW, fc, relu, seq
from renaissance_nb.kernels import native
rng = np.random.default_rng(0)
x, y = rng.standard_normal((300, 20)).astype(np.float32), rng.integers(0, 5, 300).astype(np.int32)
task = (DeepLearningTask('m').model(seq(fc(64), relu(), fc(32), relu(), fc(5)))
        .data(train=(x[:200], y[:200]), val=(x[200:], y[200:]), batch_size=32)
        .optimizer(AdamW().lr(1e-3)).total_epochs(2).seed(3).compile())
task.run(progress=False)
compiled = sorted(o.py_func.__name__ for o in gc.get_objects() if isinstance(o, Dispatcher)
                  and o.py_func.__module__.startswith('renaissance_nb') and sum(o.stats.cache_misses.values()))
print(json.dumps({"compiled": compiled, "helper": task.runner.warmup is not None, "native": native.lib() is not None,
                  "w": hashlib.sha256(b"".join(task.read(f"fc{i}.{k}").tobytes() for i in (1, 2, 3)
                                               for k in ("weight", "bias"))).hexdigest()}))
"""


@needs_lib
def test_an_mlp_from_an_empty_numba_cache_compiles_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The MLP's whole run (training, validation, metrics, the optimizer) binds C kernels only: from an
    empty numba cache nothing is compiled and no warm-up helper starts. The same run with RNB_NATIVE=0
    compiles the numba kernels (the count is real) and ends with the same weights."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    def run(cache: str, **env: str) -> dict:
        out = subprocess.run([sys.executable, "-c", _MLP_RUN], capture_output=True, text=True, timeout=900,
                             cwd=Path(__file__).resolve().parents[1],
                             env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / cache), "RNB_WARMUP": "1", **env})
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    c = run("a")
    assert c["native"] and c["compiled"] == [] and not c["helper"], c
    n = run("b", RNB_NATIVE="0", RNB_WARMUP="0")
    assert not n["native"] and ({"adam_update_par", "adam_update"} & set(n["compiled"])), n
    assert n["w"] == c["w"]


_GPT_RUN = """
import gc, json
from numba.core.dispatcher import Dispatcher
from renaissance_nb import AdamW, DeepLearningTask, datasets, gpt
from renaissance_nb.data.arrays import DataSplits, Dataset
data = datasets.default_text(context=16)
tr = data.train
splits = DataSplits(Dataset(tr.x[:128], tr.y[:128], tr.num_classes, tr.name, tokenizer=data.tokenizer), None, 'text')
task = (DeepLearningTask('g').model(gpt(tr.num_classes, 32, 2, 2, 16, dropout=0.1)).data(splits, batch_size=16)
        .optimizer(AdamW(lr=3e-3, weight_decay=0.1).decay('matrices')).total_epochs(1).seed(0).compile())
task.run(progress=False)
text = task.generate('ROMEO:', 8, temperature=0.8, seed=0)
compiled = sorted(o.py_func.__name__ for o in gc.get_objects() if isinstance(o, Dispatcher)
                  and o.py_func.__module__.startswith('renaissance_nb') and sum(o.stats.cache_misses.values()))
print(json.dumps({"compiled": compiled, "helper": task.runner.warmup is not None, "text": text}))
"""


@needs_lib
def test_a_gpt_trains_and_generates_from_an_empty_numba_cache_compiling_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Every kernel of a GPT's training step and of generate()'s one-token step binds C: from an empty numba
    cache nothing is compiled and no warm-up helper starts (tests/test_gpt_program.py compares the bytes)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path
    out = subprocess.run([sys.executable, "-c", _GPT_RUN], capture_output=True, text=True, timeout=900,
                         cwd=Path(__file__).resolve().parents[1],
                         env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "RNB_WARMUP": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["compiled"] == [] and not got["helper"] and got["text"].startswith("ROMEO:"), got


@needs_lib
def test_a_plan_runs_on_one_thread_pool() -> None:
    """An MLP and a conv net (conv, batch norm, pooling: kernels/conv_native.py) bind their passes to C; a
    net with a layer whose kernels are numba's only (hardswish) keeps every pass on numba (one pool per
    plan), and the compile notes say which and why."""
    from renaissance_nb import AdamW, DeepLearningTask, fc, hardswish, relu, seq
    from renaissance_nb.blueprint import cbr, gap, maxpool

    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((40, 3, 8, 8)).astype(np.float32), rng.integers(0, 4, 40).astype(np.int32)

    def task(*layers) -> DeepLearningTask:  # type: ignore[no-untyped-def]
        return (DeepLearningTask("c").model(seq(*layers)).data(train=(x, y), batch_size=8).optimizer(AdamW())
                .total_epochs(1).compile())
    conv = task(cbr(4, 3, 1, 1), maxpool(2), gap(), fc(4))
    mixed = task(cbr(4, 3, 1, 1), hardswish(), gap(), fc(4))
    xf = x.reshape(40, -1)
    mlp = (DeepLearningTask("m").model(seq(fc(16), relu(), fc(4))).data(train=(xf, y), batch_size=8)
           .optimizer(AdamW()).total_epochs(1).compile())

    def note(t: DeepLearningTask) -> str:
        return next(n for n in t.runner.notes if n.startswith("device: CPU"))
    assert "fused passes in C" in note(mlp) and "fused passes in C" in note(conv)
    assert "fused passes in numba: the plan's" in note(mixed) and "hardswish" in note(mixed)
    with native.chosen_for(mixed.runner.executor.ops) as use_c:
        assert not use_c and native.active() is None
        assert native.bind_bias_act(np.zeros((2, 2), np.float32), np.zeros(2, np.float32), 1, 0.0, 1) is None
    for t in (mlp, conv):
        with native.chosen_for(t.runner.executor.ops) as use_c:
            assert use_c and native.active() is not None


@needs_lib
def test_a_forked_child_runs_the_threaded_kernels_on_its_own_thread() -> None:
    """OpenMP's pool does not survive fork(): after one threaded call in the parent, a forked child's
    threaded call must still return (on one thread, the same value) instead of hanging."""
    x = np.arange(1, 300_001, dtype=np.float32)
    total, _ = native.bind_clip(x, 2)
    want = total()
    forked_child_exits_0(lambda: total() == want, "the forked child hung in a threaded C kernel")


def test_numba_threaded_adds_only_in_plans_on_numbas_threads() -> None:
    """A residual add in a plan bound to C stays NumPy's (no numba pool beside OpenMP's); in a plan with
    numba kernels (hardswish) it runs on numba's threads."""
    from renaissance_nb.kernels import cpu
    a = np.ones(1 << 18, np.float32)
    with native.chosen_for({"add", "fc_fwd"}) as use_c:
        assert not cpu._threaded_elementwise(a, a, a) if use_c else True
    with native.chosen_for({"add", "hardswish_fwd"}):
        assert cpu._threaded_elementwise(a, a, a) == blas.THREADED


def test_the_library_builds_wherever_a_compiler_is_found() -> None:
    """A source that stops compiling must fail the suite: the C tests skip where native.lib() is None (no
    compiler), so a broken build would otherwise turn every one of them into a skip and run numba instead."""
    import os
    if os.environ.get("RNB_NATIVE") == "0" or native.compiler() is None:
        pytest.skip("no C compiler here (or RNB_NATIVE=0): numba's kernels run")
    assert native.lib() is not None, native.status().why_not

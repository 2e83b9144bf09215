"""The conv nets' C kernels (kernels/conv_native.c, winograd_native.c) give their numba twins' bytes.

Each test binds the same kernel-table entry twice on copies of the same data: once in a plan bound to
C (``native.chosen_for`` with the op, which kernels/native.py's NUMBA_FREE_OPS lists) and once in a plan
on numba's threads, runs both (twice, so state carried between steps counts) and compares every array,
outputs and inputs (some kernels write their inputs), byte for byte. The values mix in what a step can
meet (zeros, -0.0, subnormals, NaN, ties). Then whole conv nets: the same weights after training with
``RNB_NATIVE=0`` and with C, and no numba kernel compiled from an empty cache.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

from renaissance_nb.kernels import blas, conv_loops, conv_native, conv_tiled, native, winograd
from renaissance_nb.kernels.cpu import KERNELS, BindEnv
from test_native import awkward, same

needs_lib = pytest.mark.skipif(native.lib() is None, reason=f"no C kernels: {native.status().why_not}")
needs_threads = pytest.mark.skipif(not blas.THREADED, reason=f"no sgemm address: {blas.describe()}")
NUMBA = {"an op only numba has"}
"""A plan with this op binds numba's kernels (chosen_for: it is not in NUMBA_FREE_OPS)."""


def twice(op: str, make: Callable[[], tuple[list, list]], runs: int = 2, **params) -> None:  # type: ignore[no-untyped-def]
    """Bind KERNELS[op] on make()'s (outs, ins) in a numba plan and in a C plan, run each ``runs`` times,
    compare every array; the C binding must decline nothing."""
    got = []
    for ops in (NUMBA, {op}):
        outs, ins = make()
        with native.chosen_for(ops) as use_c:
            declined = len(native.DECLINED)
            kernel = KERNELS[op](outs, ins, dict(params), BindEnv())
            assert use_c == (ops != NUMBA)
            assert len(native.DECLINED) == declined, native.DECLINED[declined:]
        for _ in range(runs):
            kernel()
        got.append(outs + ins)
    for a, b in zip(*got):
        same(a, b)


def seeded(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


@needs_lib
@pytest.mark.parametrize("shape", [(4, 5, 3, 16), (3, 7, 5, 33), (2, 1, 1, 8), (20, 3)])
@pytest.mark.parametrize("act", ["none", "relu"])
def test_batch_norm(shape: tuple[int, ...], act: str) -> None:
    c = shape[-1]

    def fwd_arrays() -> tuple[list, list]:
        rng = seeded(len(shape) * 10 + c)
        x = awkward(rng, shape) + np.float32(3.0)
        gamma, beta = rng.uniform(0.5, 1.5, c).astype(np.float32), awkward(rng, (c,))
        stats = [np.zeros(c, np.float32), np.zeros(c, np.float32), np.zeros(c, np.float32), np.ones(c, np.float32)]
        return [np.zeros_like(x), *stats], [x, gamma, beta]
    twice("bn_fwd", fwd_arrays, momentum=0.1, eps=1e-5, act=act)

    def bwd_arrays() -> tuple[list, list]:
        outs, ins = fwd_arrays()
        KERNELS["bn_fwd"](outs, ins, dict(momentum=0.1, eps=1e-5, act=act), BindEnv())()  # numba's statistics
        rng = seeded(c)
        y, mean, invstd = outs[:3]
        dy = awkward(rng, shape)
        grads = [np.zeros(shape, np.float32), np.zeros(c, np.float32), np.zeros(c, np.float32)]
        return grads, [dy, ins[0], y, ins[1], mean, invstd]
    twice("bn_bwd", bwd_arrays, runs=1, act=act)


@needs_lib
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("chunks", [1, 8])
def test_batch_norm_on_every_thread_count(threads: int, chunks: int) -> None:
    """The C passes against the serial (one block of sums) and the threaded (eight) numba kernels."""
    from renaissance_nb.kernels import conv_par
    rng = seeded(threads)
    m, c = 203, 24
    x, gamma, beta, dy0 = awkward(rng, (m, c)), awkward(rng, (c,)), awkward(rng, (c,)), awkward(rng, (m, c))
    results = []
    for use_c in (False, True):
        y, stats = np.zeros_like(x), [np.zeros(c, np.float32) for _ in range(4)]
        dx, dg, db, dy = np.zeros_like(x), np.zeros(c, np.float32), np.zeros(c, np.float32), dy0.copy()
        acc, parts, aff = np.zeros((2, c)), np.zeros((chunks, 2, c)), np.zeros((2, c), np.float32)
        gacc, gparts, gaff = np.zeros((2, c)), np.zeros((chunks, 2, c)), np.zeros((3, c))
        fargs = (x, gamma, beta, y, *stats, 0.1, 1e-5, 1, acc, aff)
        bargs = (dy, x, y, gamma, stats[0], stats[1], dx, dg, db, 1, gacc, gaff)
        if use_c:
            with native.chosen_for({"bn_fwd"}):
                conv_native.bind_bn_fwd(*fargs, parts, threads)()
                conv_native.bind_bn_bwd(*bargs, gparts, threads)()
        elif chunks == 1:
            conv_loops.bn_train_fwd_(*fargs)
            conv_loops.bn_train_bwd_(*bargs)
        else:
            conv_par.bn_train_fwd_par_(*fargs, parts)
            conv_par.bn_train_bwd_par_(*bargs, gparts)
        results.append([y, *stats, dx, dg, db, dy, acc, gacc, aff, gaff])
    for a, b in zip(*results):
        same(a, b)


def _pool_arrays(kind: str, shape: tuple[int, ...], k: int, s: int, p: int, seed: int) -> Callable[[], tuple]:
    def make() -> tuple[list, list]:
        rng = seeded(seed)
        x = rng.integers(-3, 3, shape).astype(np.float32)  # ties: the first max must win
        x.reshape(-1)[rng.integers(0, x.size, 4)] = [np.nan, -np.inf, -0.0, 1e-40]
        n, h, w, c = shape
        ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
        y = np.full((n, ho, wo, c), 9.0, np.float32)
        return ([y, np.zeros(y.shape, np.int32)] if kind == "max" else [y]), [x]
    return make


@needs_lib
@pytest.mark.parametrize("kind,k,s,p", [("max", 2, 2, 0), ("max", 3, 2, 1), ("avg", 2, 2, 0), ("avg", 3, 1, 1)])
@pytest.mark.parametrize("shape", [(11, 7, 6, 19), (2, 4, 4, 3)])
def test_pooling(kind: str, k: int, s: int, p: int, shape: tuple[int, ...]) -> None:
    make = _pool_arrays(kind, shape, k, s, p, shape[0])
    twice(f"{kind}pool_fwd", make, k=k, s=s, p=p)

    def grads() -> tuple[list, list]:
        outs, ins = make()
        KERNELS[f"{kind}pool_fwd"](outs, ins, dict(k=k, s=s, p=p), BindEnv())()
        dy = awkward(seeded(3), outs[0].shape)
        dx = np.full(shape, 5.0, np.float32)
        return [dx], [dy] + outs[1:]
    twice(f"{kind}pool_bwd", grads, k=k, s=s, p=p)


@needs_lib
@pytest.mark.parametrize("shape", [(9, 7, 7, 128), (2, 1, 1, 3)])
def test_global_average_pooling(shape: tuple[int, ...]) -> None:
    n, c = shape[0], shape[-1]
    twice("gap_fwd", lambda: ([np.full((n, c), 4.0, np.float32)], [awkward(seeded(1), shape)]))
    twice("gap_bwd", lambda: ([np.full(shape, 4.0, np.float32)], [awkward(seeded(2), (n, c))]))


@needs_lib
def test_batch_norm_at_inference() -> None:
    rng = seeded(4)
    c = 13

    def fold() -> tuple[list, list]:
        r = seeded(5)
        return [np.zeros(c, np.float32), np.zeros(c, np.float32)], [awkward(r, (c,)) for _ in range(3)] + [
            r.uniform(0, 2, c).astype(np.float32)]
    twice("bn_fold", fold, eps=1e-5)
    x = awkward(rng, (5, 3, 3, c), nan=True)
    for act in ("none", "relu"):
        twice("bn_inf", lambda: ([np.zeros_like(x)], [x.copy(), awkward(seeded(1), (c,)), awkward(seeded(2), (c,))]),
              act=act)


@needs_lib
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_im2col_and_col2im(threads: int) -> None:
    """conv_par.patches_par_ (im2col, col2im) and im2col_taps_par_ (one channel, tap-major)."""
    from renaissance_nb.kernels import conv, conv_par
    rng = seeded(threads)
    for (n, h, w, c, k, s, p) in [(5, 7, 6, 3, 3, 1, 1), (3, 9, 9, 4, 3, 2, 1), (2, 5, 4, 2, 5, 1, 2)]:
        ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
        x3 = awkward(rng, (n, h, w * c))
        shape = (n * ho * wo, k * k * c)
        ref, got = np.full(shape, 7.0, np.float32), np.full(shape, 3.0, np.float32)
        conv_par.patches_par_(x3, ref, c, k, s, p, ho, wo, True)
        with native.chosen_for({"conv_fwd"}):
            conv_native.bind_patches(x3, got, c, k, s, p, ho, wo, True, threads)()
        same(ref, got)
        dref, dgot = np.full(x3.shape, 1.0, np.float32), np.full(x3.shape, 2.0, np.float32)
        conv_par.patches_par_(dref, ref, c, k, s, p, ho, wo, False)
        with native.chosen_for({"conv_bwd"}):
            conv_native.bind_patches(dgot, got, c, k, s, p, ho, wo, False, threads)()
        same(dref, dgot)
        x1 = awkward(rng, (n, h, w, 1))
        spans = np.array([conv._tap_span(i, h, ho, s, p) + conv._tap_span(j, w, wo, s, p) for i in range(k)
                          for j in range(k)], np.int64)
        tref, tgot = np.full((k * k, n * ho * wo), 7.0, np.float32), np.full((k * k, n * ho * wo), 3.0, np.float32)
        conv_par.im2col_taps_par_(x1.reshape(n, h, w), tref, spans, k, s, p, ho, wo)
        with native.chosen_for({"conv_fwd"}):
            conv_native.bind_im2col_taps(x1.reshape(n, h, w), tgot, spans, k, s, p, ho, wo, threads)()
        same(tref, tgot)


def _conv_arrays(n: int, h: int, cin: int, cout: int, k: int, s: int, p: int, bias: bool, need_dx: bool,
                 seed: int) -> Callable[[], tuple]:
    """(make_fwd, make_bwd) of a conv layer: fresh arrays with the same values each call."""
    ho = (h + 2 * p - k) // s + 1

    def make(backward: bool) -> tuple[list, list]:
        rng = seeded(seed)
        x = awkward(rng, (n, h, h, cin))
        w = (awkward(rng, (cout, k, k, cin)) / np.float32(np.sqrt(k * k * cin))).astype(np.float32)
        b = awkward(rng, (cout,))
        cols = np.full((n * ho * ho, k * k * cin), 3.0, np.float32)
        y = np.zeros((n, ho, ho, cout), np.float32)
        if not backward:
            return [y, cols], [x, w] + ([b] if bias else [])
        dy = awkward(rng, y.shape)
        grads = [np.zeros_like(w)] + ([np.zeros(cout, np.float32)] if bias else [])
        grads += [np.zeros_like(x), np.full_like(cols, 2.0)] if need_dx else []
        return grads, [dy, x, w, cols, y]
    return make


@needs_lib
@needs_threads
@pytest.mark.parametrize("n,h,cin,cout,k,s,p", [
    (6, 12, 16, 32, 3, 1, 1),   # Winograd, every pass
    (3, 7, 64, 64, 3, 1, 1),    # Winograd at an odd size (border tiles clipped)
    (5, 9, 16, 24, 3, 2, 1),    # stride 2: im2col tiles
    (4, 8, 8, 16, 1, 2, 0),     # a 1x1 stride-2 shortcut: im2col tiles
    (7, 10, 1, 8, 3, 1, 1),     # one input channel: tap-major columns and products
    (3, 6, 4, 8, 1, 1, 0),      # a plain product
])
@pytest.mark.parametrize("need_dx", [True, False])
def test_convolutions(n: int, h: int, cin: int, cout: int, k: int, s: int, p: int, need_dx: bool) -> None:
    """Forward and backward by Winograd, by im2col tiles, tap-major or as one product: the same bytes
    as numba's (the same sgemm calls, the same transforms)."""
    for bias, act in ((False, "none"), (True, "relu")):
        make = _conv_arrays(n, h, cin, cout, k, s, p, bias, need_dx, seed=n * h + cin)
        params = dict(k=k, s=s, p=p, bias=bias, act=act, need_dx=need_dx)
        twice("conv_fwd", lambda: make(False), **params)
        twice("conv_bwd", lambda: make(True), runs=1, **params)


@needs_lib
@needs_threads
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("m", [2, 4])
def test_winograd_and_tiles_on_every_thread_count(threads: int, m: int) -> None:
    """The Winograd passes, F(2x2, 3x3) and F(4x4, 3x3) (m), forward, input and weight gradients with 1
    to 3 buffers (threads of the numba kernel, iterations of the OpenMP loop): each buffer's share is
    the same work, whichever thread runs it. 9x11 maps: both tile sizes clip at the bottom and right."""
    _winograd_twins(threads, m, 5, 9, 11, 16, 32)


@needs_lib
@needs_threads
@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("c, co", [(70, 67), (131, 9), (5, 129)])
def test_winograd_filter_transforms_past_one_block_of_lanes(m: int, c: int, co: int) -> None:
    """The C filter transforms and weight-gradient end run 64 filters side by side and cut the channels
    into blocks for the threads (winograd43_native.c): channel counts past one block, and not a multiple
    of it, give numba's bytes too."""
    _winograd_twins(2, m, 2, 7, 7, c, co)


def _winograd_twins(threads: int, m: int, n: int, h: int, wd: int, c: int, co: int) -> None:
    """Winograd's forward, input and weight gradients by C and by numba, on the same buffers: the same bytes."""
    rng = seeded(threads + c)
    p = (m + 2) ** 2
    x, w, dy = awkward(rng, (n, h, wd, c)), awkward(rng, (co, 3, 3, c)) / np.float32(12), awkward(rng, (n, h, wd, co))
    ch = winograd.plan(n, h, wd, c, co, 1 << 22, weight_grad=True, m=m)
    per = ch.per_thread
    sg = blas.SGEMM
    out = []
    for use_c in (False, True):
        y, dw, dx = np.zeros_like(dy), np.zeros_like(w), np.zeros_like(x)
        u, uf, bufs = np.zeros((p, c, co), np.float32), np.zeros((p, co, c), np.float32), np.full((threads, per), 5.0, np.float32)
        at = winograd.part_at(ch.rows * ((wd + m - 1) // m), c, co, m)
        none = np.zeros(0, np.float32)
        with blas.own_cores():
            if use_c:
                with native.chosen_for({"conv_fwd"}):
                    conv_native.bind_winograd_fwd(sg.address, sg.int_bits == 64, w, False, u, x, y, none, 0, bufs, ch.rows, m)()
                    conv_native.bind_winograd_fwd(sg.address, sg.int_bits == 64, w, True, uf, dy, dx, none, 0, bufs, ch.rows, m)()
                    conv_native.bind_winograd_dw(sg.address, sg.int_bits == 64, x, dy, dw, bufs, ch.rows, m)()
            else:
                transform = winograd.weights_ if m == 2 else winograd.weights43_
                transform(w, u, False)
                transform(w, uf, True)
                winograd.fwd_(sg.address, sg.int_bits == 64, x.reshape(n, h, wd * c), u, y.reshape(n, h, wd * co),
                              y.reshape(-1, co), none, 0, bufs, c, co, ch.rows, m)
                winograd.fwd_(sg.address, sg.int_bits == 64, dy.reshape(n, h, wd * co), uf, dx.reshape(n, h, wd * c),
                              dx.reshape(-1, c), none, 0, bufs, co, c, ch.rows, m)
                winograd.dw_(sg.address, sg.int_bits == 64, x.reshape(n, h, wd * c), dy.reshape(n, h, wd * co), dw, bufs,
                             bufs[:1, at:at + p * c * co], bufs[1:, None, at:at + p * c * co], c, co, ch.rows, m)
        out.append((y, dx, dw, u, uf))
    for a, b in zip(*out):
        same(a, b)
    assert conv_tiled.max_threads(n) >= 1


@needs_lib
@pytest.mark.parametrize("size", [1000, 1 << 18])
@pytest.mark.filterwarnings("ignore:overflow encountered in add:RuntimeWarning")  # NumPy's twin, on awkward values
def test_relu_mul_add_copy_and_dropout(size: int) -> None:
    rng = seeded(size % 97)
    x = awkward(rng, (size,), nan=True)
    twice("act_fwd", lambda: ([np.zeros_like(x)], [x.copy()]), act="relu")
    twice("act_bwd", lambda: ([np.zeros_like(x)], [awkward(seeded(1), (size,)), x.copy()]), act="relu")
    twice("mul", lambda: ([np.zeros_like(x)], [x.copy(), awkward(seeded(2), (size,))]))
    twice("add", lambda: ([np.zeros_like(x)], [x.copy(), awkward(seeded(2), (size,))]))  # a residual sum
    twice("copy", lambda: ([np.zeros_like(x)], [x.copy()]))  # the gradient add hands each branch

    def accumulate() -> tuple[list, list]:  # a gradient summed in place: out is the first input
        g = x.copy()
        return [g], [g, awkward(seeded(3), (size,))]
    twice("add", accumulate, runs=3)
    twice("dropout_fwd", lambda: ([np.zeros_like(x), np.zeros_like(x)], [x.copy(), np.array([2 ** 32 - 3], np.int64)]),
          runs=3, p=0.3)


@needs_lib
@pytest.mark.parametrize("crop_pad,flip,resize,cn", [(0, False, False, 3), (2, True, False, 3), (3, True, True, 3),
                                                      (2, False, False, 1), (0, False, False, 1), (2, True, False, 1)])
def test_image_gather(crop_pad: int, flip: bool, resize: bool, cn: int) -> None:
    """transfer_image: gather, resize, crop and flip into NHWC, the cursor advanced, statuses as numba's; one
    channel without a flip has a row-copy path of its own."""
    rng = seeded(crop_pad)
    xs, ys = awkward(rng, (30, cn, 8, 8)), rng.integers(0, 10, 30).astype(np.int64)
    perm = rng.permutation(30).astype(np.int64)
    hw = (11, 11) if resize else (8, 8)
    env = BindEnv(7, {"train": (xs, ys)}, {"train": perm})
    got = []
    for ops in (NUMBA, {"transfer_image"}):
        x_out, y_out = np.zeros((7, *hw, cn), np.float32), np.zeros(7, np.int32)
        cursor, aug = np.array([3], np.int64), np.array([11], np.int64)
        with native.chosen_for(ops):
            k = KERNELS["transfer_image"]([x_out, y_out], [cursor, aug], dict(source="train", crop_pad=crop_pad,
                                                                               flip=flip, out_hw=hw), env)
        for _ in range(3):
            k()
        with pytest.raises(Exception, match="transfer"):  # past the end: the status becomes an error
            for _ in range(5):
                k()
        got.append((x_out, y_out, cursor))
    for a, b in zip(*got):
        same(a, b)


_NETS_RUN = """
import gc, hashlib, json, sys
import numpy as np
from numba.core.registry import CPUDispatcher
import renaissance_nb as rnb
from renaissance_nb.blueprint import RESNET_3_3, RESNET_3_3_DS, block, cbr, gap, maxpool
from renaissance_nb.kernels import native
rng = np.random.default_rng(0)
x, y = rng.standard_normal((96, 1, 16, 16), dtype=np.float32), rng.integers(0, 10, 96).astype(np.int32)
nets = {"conv": rnb.seq(cbr(16, 3, 1, 1), maxpool(2), cbr(32, 3, 1, 1), gap(), rnb.fc(10)),
        "resnet": rnb.seq(cbr(16, 3, 1, 1), block(16, RESNET_3_3), block(32, RESNET_3_3_DS), gap(), rnb.fc(10))}
out = {}
for name, net in nets.items():
    t = (rnb.DeepLearningTask(name).model(net).data(train=(x[:64], y[:64]), val=(x[64:], y[64:]), batch_size=16)
         .loss(rnb.CrossEntropyLoss().label_smoothing(0.1)).optimizer(rnb.AdamW()).total_epochs(2).ema(0.99).seed(1))
    t.compile()
    t.run(progress=False)
    out[name] = hashlib.sha256(t.arena.bytes.tobytes()).hexdigest()
compiled = sorted(o.py_func.__name__ for o in gc.get_objects() if isinstance(o, CPUDispatcher)
                  and o.py_func.__module__.startswith("renaissance_nb") and sum(o.stats.cache_misses.values()))
print(json.dumps({"arena": out, "compiled": compiled, "native": native.lib() is not None,
                  "declined": native.DECLINED}))
"""


@needs_lib
@needs_threads
def test_conv_nets_from_an_empty_numba_cache_compile_nothing_and_train_as_numba_does(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A conv net (cbr, max pooling, Winograd's convs, gap) and a ResNet block net (stride-2 tiles, a 1x1
    shortcut, residual adds and ReLUs) train two epochs with validation and an EMA: with C, from an empty
    numba cache, nothing is compiled and no binder declines; with RNB_NATIVE=0 (every kernel numba's)
    the whole arena ends byte for byte the same."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    def run(**env: str) -> dict:
        out = subprocess.run([sys.executable, "-c", _NETS_RUN], capture_output=True, text=True, timeout=900,
                             cwd=Path(__file__).resolve().parents[1], env={**os.environ, **env})
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    c = run(NUMBA_CACHE_DIR=str(tmp_path / "empty"), RNB_WARMUP="0")
    assert c["native"] and c["compiled"] == [] and c["declined"] == [], c
    n = run(RNB_NATIVE="0", RNB_WARMUP="0")
    assert not n["native"] and n["arena"] == c["arena"], (n, c)


@needs_lib
@pytest.mark.parametrize("crop_pad,flip", [(0, False), (2, True)])
def test_prefetched_image_gather(crop_pad: int, flip: bool) -> None:
    """transfer_image_async's claim and background gather (then transfer_wait): numba's bytes, claim included."""
    rng = seeded(crop_pad + 7)
    xs, ys = awkward(rng, (40, 1, 9, 9)), rng.integers(0, 10, 40).astype(np.int32)
    env = BindEnv(3, {"train": (xs, ys)}, {"train": rng.permutation(40).astype(np.int64)})
    got = []
    for ops in (NUMBA, {"transfer_image_async", "transfer_wait"}):
        x_out, y_out, claim = np.zeros((6, 9, 9, 1), np.float32), np.zeros(6, np.int32), np.zeros(2, np.int64)
        cursor, aug = np.array([1], np.int64), np.array([5], np.int64)
        with native.chosen_for(ops):
            declined = len(native.DECLINED)
            start = KERNELS["transfer_image_async"]([x_out, y_out, claim], [cursor, aug], dict(
                source="train", crop_pad=crop_pad, flip=flip, scratch=("claim",)), env)
            wait = KERNELS["transfer_wait"]([], [x_out], {}, env)
            assert len(native.DECLINED) == declined
        for _ in range(4):
            start()
            wait()
        got.append((x_out, y_out, cursor, claim))
    for a, b in zip(*got):
        same(a, b)


@needs_lib
def test_other_activations_decline_so_the_plan_is_not_called_numba_free() -> None:
    """act_fwd binds C for ReLU only: tanh in a C plan binds numba's loop and records a decline
    (native.covers is then False); outside a plan nothing is recorded."""
    x, y = awkward(seeded(0), (64,)), np.zeros(64, np.float32)
    before = len(native.DECLINED)
    KERNELS["act_fwd"]([y], [x], {"act": "tanh"}, BindEnv())()
    assert len(native.DECLINED) == before
    with native.chosen_for({"act_fwd"}) as use_c:
        KERNELS["act_fwd"]([y], [x], {"act": "relu"}, BindEnv())
        assert use_c and len(native.DECLINED) == before
        KERNELS["act_fwd"]([y], [x], {"act": "tanh"}, BindEnv())()
    assert native.DECLINED[before:] == ["bind_activation"]
    assert not native.covers({"act_fwd"}, before)
    np.testing.assert_allclose(y, np.tanh(x.astype(np.float64)), rtol=1e-6, atol=1e-30)

"""The image transfer kernels: gather + resize + crop + flip + NCHW->NHWC, sync and in the background."""
from __future__ import annotations

import gc
import threading
import tracemalloc
import weakref

import numpy as np
import pytest

import renaissance_nb.kernels.transfer as transfer  # registers the kernels
from renaissance_nb.data.augment import augment_draws, bilinear_weights, resize_bilinear
from renaissance_nb.errors import DataError, PlanError
from renaissance_nb.kernels.cpu import KERNELS, BindEnv
from renaissance_nb.train.rng import Philox, StreamId

SEED = 1234


# ---------------------------------------------------------------- helpers and the NumPy reference


def make_env(n: int = 64, c: int = 3, hw: tuple[int, int] = (32, 32), seed: int = SEED, data_seed: int = 0,
             perm_len: int | None = None) -> BindEnv:
    rng = np.random.default_rng(data_seed)
    x = rng.standard_normal((n, c, *hw)).astype(np.float32)
    y = rng.integers(0, 10, n).astype(np.int32)
    perm = rng.permutation(n).astype(np.int64)
    if perm_len is not None:
        perm = rng.integers(0, n, perm_len).astype(np.int64)
    xv = rng.standard_normal((n // 2, c, *hw)).astype(np.float32)
    yv = rng.integers(0, 10, n // 2).astype(np.int32)
    return BindEnv(seed=seed, sources={"train": (x, y), "val": (xv, yv)},
                   perms={"train": perm, "val": np.arange(n // 2, dtype=np.int64)})


class Node:
    """The tensors of one transfer node and its bound kernel."""

    def __init__(self, env: BindEnv, b: int, out_hw: tuple[int, int] | None = None, *, kind: str = "transfer_image",
                 source: str = "train", crop_pad: int = 0, flip: bool = False, aug_base: int = 0, **extra) -> None:
        xs = env.sources[source][0]
        h, w = out_hw or xs.shape[2:]
        self.x = np.full((b, h, w, xs.shape[1]), np.nan, np.float32)
        self.y = np.full(b, -1, np.int32)
        self.cursor = np.zeros(1, np.int64)
        self.aug = np.array([aug_base], np.int64)
        params = dict(source=source, crop_pad=crop_pad, flip=flip, out_hw=out_hw, **extra)
        self.run = KERNELS[kind]([self.x, self.y], [self.cursor, self.aug], params, env)
        self.params = params


def ref_bilinear(src: np.ndarray, out_hw: tuple[int, int]) -> np.ndarray:
    """Bilinear resize, align_corners=False, written independently of the library (float64 coordinates)."""
    n, c, hs, ws = src.shape
    h, w = out_hw

    def axis(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        s = np.maximum((np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5, 0.0)
        i0 = np.minimum(np.floor(s).astype(int), n_in - 1)
        i1 = np.minimum(i0 + 1, n_in - 1)
        return i0, i1, s - i0

    y0, y1, ly = axis(hs, h)
    x0, x1, lx = axis(ws, w)
    s = src.astype(np.float64)
    ly, lx = ly[:, None], lx[None, :]
    out = ((1 - ly) * ((1 - lx) * s[:, :, y0][:, :, :, x0] + lx * s[:, :, y0][:, :, :, x1])
           + ly * ((1 - lx) * s[:, :, y1][:, :, :, x0] + lx * s[:, :, y1][:, :, :, x1]))
    return out


def reference_batch(env: BindEnv, source: str, start: int, b: int, out_hw: tuple[int, int] | None, crop_pad: int,
                    flip: bool, aug_base: int, fill: float = 0.0, resize=ref_bilinear) -> tuple[np.ndarray, np.ndarray]:
    """gather -> resize -> pad + crop -> flip -> NHWC, with the draws taken straight from Philox.

    ``resize`` is the test's own float64 bilinear by default, or the library's float32
    ``resize_bilinear`` to check that the kernel composes the same arithmetic bit for bit.
    """
    xs, ys = env.sources[source]
    rows = env.perms[source][start:start + b]
    img = xs[rows]
    h, w = out_hw or xs.shape[2:]
    if (h, w) != xs.shape[2:]:
        img = resize(img, (h, w))
    words = Philox(env.seed).random_bits(4 * b, StreamId.AUGMENT, aug_base + start).reshape(b, 4).astype(np.uint64)
    m = 2 * crop_pad + 1
    out = np.empty((b, img.shape[1], h, w), img.dtype)
    for i in range(b):
        dy = int((int(words[i, 0]) * m) >> 32)
        dx = int((int(words[i, 1]) * m) >> 32)
        p = crop_pad
        padded = np.pad(img[i], ((0, 0), (p, p), (p, p)), constant_values=fill)
        crop = padded[:, dy:dy + h, dx:dx + w]
        if flip and int(words[i, 2]) >= 2**31:
            crop = crop[:, :, ::-1]
        out[i] = crop
    return out.transpose(0, 2, 3, 1), ys[rows]


# ---------------------------------------------------------------- correctness


CASES = [
    # out_hw, crop_pad, flip
    (None, 0, False),
    (None, 4, False),
    (None, 0, True),
    (None, 4, True),
    ((40, 40), 4, True),   # upscale
    ((20, 24), 2, True),   # downscale, non-square
    ((64, 48), 0, False),  # resize only
]


@pytest.mark.parametrize("out_hw,crop_pad,flip", CASES)
def test_matches_numpy_reference(out_hw, crop_pad, flip) -> None:  # type: ignore[no-untyped-def]
    env = make_env(n=48)
    b, aug_base = 16, 3 << 32
    node = Node(env, b, out_hw, crop_pad=crop_pad, flip=flip, aug_base=aug_base)
    for k in range(3):  # three batches: the cursor advances, draws follow the position in the epoch
        node.run()
        assert node.cursor[0] == (k + 1) * b
        ref_x, ref_y = reference_batch(env, "train", k * b, b, out_hw, crop_pad, flip, aug_base)
        np.testing.assert_array_equal(node.y, ref_y)
        assert node.x.dtype == np.float32 and node.x.shape == ref_x.shape
        if out_hw is None:
            np.testing.assert_array_equal(node.x, ref_x)  # a pure copy: exact
        else:  # float32 weights vs the float64 reference: a few ulps of the pixel values
            np.testing.assert_allclose(node.x, ref_x, rtol=0, atol=2e-5)
            same_math, _ = reference_batch(env, "train", k * b, b, out_hw, crop_pad, flip, aug_base,
                                           resize=resize_bilinear)
            np.testing.assert_array_equal(node.x, same_math)


@pytest.mark.parametrize("out_hw", [(40, 40), (20, 24), (64, 48), (17, 33)])
def test_resize_matches_torch(out_hw) -> None:  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    env = make_env(n=8)
    node = Node(env, 8, out_hw)
    node.run()
    xs = env.sources["train"][0][env.perms["train"][:8]]
    t = torch.nn.functional.interpolate(torch.from_numpy(xs), size=out_hw, mode="bilinear", align_corners=False,
                                        antialias=False).numpy()
    np.testing.assert_allclose(node.x, t.transpose(0, 2, 3, 1), rtol=0, atol=1e-5)
    np.testing.assert_allclose(resize_bilinear(xs, out_hw), t, rtol=0, atol=1e-5)


def test_bilinear_weights_identity_and_edges() -> None:
    i0, i1, w0, w1 = bilinear_weights(32, 32)
    np.testing.assert_array_equal(i0, np.arange(32))
    assert not w1.any() and (w0 == 1).all()
    i0, i1, w0, w1 = bilinear_weights(4, 8)  # upscale: the borders clamp to the edge pixels
    assert i0[0] == 0 and w1[0] == 0 and i0[-1] == 3 and i1[-1] == 3
    np.testing.assert_allclose(w0 + w1, 1.0)
    with pytest.raises(DataError):
        bilinear_weights(0, 4)
    with pytest.raises(DataError, match="out_hw"):
        resize_bilinear(np.zeros((1, 1, 4, 4), np.float32), (4,))


def test_two_runs_are_byte_identical_and_offset_matters() -> None:
    outs = []
    for aug_base in (0, 0, 1 << 32):
        env = make_env(n=40)
        node = Node(env, 20, (36, 36), crop_pad=4, flip=True, aug_base=aug_base)
        node.run()
        node.run()
        outs.append(node.x.tobytes())
    assert outs[0] == outs[1]
    assert outs[0] != outs[2]  # another epoch offset: other crops and flips


def test_draws_follow_the_sample_position_not_the_batching() -> None:
    env = make_env(n=32)
    small = Node(env, 8, crop_pad=3, flip=True, aug_base=77)
    big = Node(env, 16, crop_pad=3, flip=True, aug_base=77)
    small.run()
    first = small.x.copy()
    small.run()
    big.run()
    np.testing.assert_array_equal(np.concatenate([first, small.x]), big.x)


def test_augment_draws_reference_matches_philox() -> None:
    dy, dx, flip = augment_draws(SEED, 5, 10, 6, crop_pad=4)
    words = Philox(SEED).random_bits(24, StreamId.AUGMENT, 15).reshape(6, 4)
    for i in range(6):
        assert dy[i] == (int(words[i, 0]) * 9) >> 32 and dx[i] == (int(words[i, 1]) * 9) >> 32
        assert flip[i] == int(words[i, 2]) >> 31


def test_flip_rate_and_crop_offsets_are_uniform() -> None:
    """Recover each sample's crop offsets and flip from a coordinate-coded image."""
    pad, n, hw = 4, 8192, 32
    code = (1000 + 100 * np.arange(hw)[:, None] + np.arange(hw)[None, :]).astype(np.float32)
    xs = code.reshape(1, 1, hw, hw)
    env = BindEnv(seed=99, sources={"train": (xs, np.zeros(1, np.int32))}, perms={"train": np.zeros(n, np.int64)})
    node = Node(env, n, crop_pad=pad, flip=True, aug_base=12345)
    node.run()
    v15, v16 = node.x[:, 16, 15, 0].astype(np.int64), node.x[:, 16, 16, 0].astype(np.int64)
    flipped = v16 < v15
    sy, sx = (v16 - 1000) // 100, (v16 - 1000) % 100
    dy = sy - 16 + pad
    dx = np.where(flipped, sx - (hw - 1 - 16), sx - 16) + pad
    assert abs(flipped.mean() - 0.5) < 0.03
    for d in (dy, dx):
        assert d.min() == 0 and d.max() == 2 * pad
        counts = np.bincount(d, minlength=2 * pad + 1)
        expected = n / (2 * pad + 1)
        chi2 = float(((counts - expected) ** 2 / expected).sum())
        assert chi2 < 35.0, counts  # df = 8: P(chi2 > 35) ~ 3e-5
    exp_dy, exp_dx, exp_flip = augment_draws(99, 12345, 0, n, pad)
    np.testing.assert_array_equal(dy, exp_dy)
    np.testing.assert_array_equal(dx, exp_dx)
    np.testing.assert_array_equal(flipped, exp_flip == 1)
    # padding shows up as fill (0.0) exactly where the window leaves the image
    top_pad_rows = pad - dy  # rows of fill at the top when dy < pad
    i = int(np.argmax(top_pad_rows > 0))
    assert (node.x[i, : top_pad_rows[i]] == 0.0).all() and (node.x[i, top_pad_rows[i]:, 16] >= 1000).all()


def test_fill_value_and_val_source_without_aug_offset() -> None:
    env = make_env(n=16)
    node = Node(env, 8, crop_pad=8, aug_base=0, fill=-7.5)
    node.run()
    ref_x, _ = reference_batch(env, "train", 0, 8, None, 8, False, 0, fill=-7.5)
    np.testing.assert_array_equal(node.x, ref_x.astype(np.float32))
    assert (node.x == -7.5).any()
    # a val node that draws nothing may leave out aug_offset
    xv, yv = env.sources["val"]
    x_out, y_out, cursor = np.zeros((8, 32, 32, 3), np.float32), np.zeros(8, np.int32), np.zeros(1, np.int64)
    KERNELS["transfer_image"]([x_out, y_out], [cursor], dict(source="val"), env)()
    np.testing.assert_array_equal(x_out, xv[:8].transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(y_out, yv[:8])


# ---------------------------------------------------------------- errors


def test_bind_and_run_errors() -> None:
    env = make_env(n=16)
    ok = dict(source="train", crop_pad=2, flip=True)
    x_out, y_out = np.zeros((4, 32, 32, 3), np.float32), np.zeros(4, np.int32)
    cur, aug = np.zeros(1, np.int64), np.zeros(1, np.int64)
    f = KERNELS["transfer_image"]
    with pytest.raises(PlanError, match="aug_offset"):
        f([x_out, y_out], [cur], ok, env)  # draws need the offset tensor
    with pytest.raises(PlanError, match="x_out"):
        f([np.zeros((4, 32, 32, 1), np.float32), y_out], [cur, aug], ok, env)
    with pytest.raises(PlanError, match="crop_pad"):
        f([x_out, y_out], [cur, aug], dict(ok, crop_pad=-1), env)
    with pytest.raises(PlanError, match="flip"):
        f([x_out, y_out], [cur, aug], dict(ok, flip="yes"), env)
    flat_env = BindEnv(sources={"train": (np.zeros((4, 3072), np.float32), np.zeros(4, np.int32))},
                       perms={"train": np.arange(4, dtype=np.int64)})
    with pytest.raises(PlanError, match="NCHW"):
        f([x_out, y_out], [cur, aug], ok, flat_env)
    missing = f([x_out, y_out], [cur, aug], dict(ok, source="test"), env)  # bound fine, fails when run
    with pytest.raises(PlanError, match="'test'"):
        missing()
    run = f([x_out, y_out], [cur, aug], ok, env)
    cur[0] = 14  # 14 + 4 > 16
    with pytest.raises(PlanError, match="past the end"):
        run()
    assert cur[0] == 14


def test_worker_exception_surfaces_at_wait() -> None:
    env = make_env(n=16)
    node = Node(env, 8, kind="transfer_image_async", crop_pad=2, flip=True)
    wait = KERNELS["transfer_wait"]([], [node.x], {}, env)
    node.cursor[0] = 12  # the job will run past the end of the permutation
    node.run()  # returns at once: the error is the worker's
    with pytest.raises(PlanError, match="past the end") as info:
        wait()
    assert any("background" in n for n in getattr(info.value, "__notes__", ["background"]))
    wait()  # reported once; nothing pending now
    node.cursor[0] = 0
    node.run()
    wait()
    ref_x, _ = reference_batch(env, "train", 0, 8, None, 2, True, 0)
    np.testing.assert_array_equal(node.x, ref_x.astype(np.float32))


# ---------------------------------------------------------------- background prefetch


@pytest.mark.parametrize("out_hw", [None, (40, 40)])
def test_async_matches_sync_while_main_thread_computes(out_hw) -> None:  # type: ignore[no-untyped-def]
    env_sync, env_async = make_env(n=256), make_env(n=256)
    b, steps = 32, 6
    sync = Node(env_sync, b, out_hw, crop_pad=4, flip=True, aug_base=2 << 32)
    # two alternating buffers, as the engine's A/B input buffers
    bufs = [Node(env_async, b, out_hw, kind="transfer_image_async", crop_pad=4, flip=True, aug_base=2 << 32)
            for _ in range(2)]
    shared_cursor = bufs[0].cursor
    for nd in bufs[1:]:
        nd.run = KERNELS["transfer_image_async"]([nd.x, nd.y], [shared_cursor, nd.aug], nd.params, env_async)
    waits = [KERNELS["transfer_wait"]([], [nd.x], {}, env_async) for nd in bufs]
    a = np.random.default_rng(0).standard_normal((384, 384)).astype(np.float32)
    c = np.empty_like(a)
    bufs[0].run()  # prologue: batch 0
    for k in range(steps):
        cur, nxt = bufs[k % 2], bufs[(k + 1) % 2]
        waits[k % 2]()
        if k + 1 < steps:
            nxt.run()  # batch k+1 in the background ...
        for _ in range(3):
            np.matmul(a, a, out=c)  # ... while the main thread does BLAS work
        sync.run()
        assert cur.x.tobytes() == sync.x.tobytes() and cur.y.tobytes() == sync.y.tobytes()
    assert shared_cursor[0] == steps * b == sync.cursor[0]
    pf = transfer.prefetcher_for(env_async)
    assert pf is transfer.prefetcher_for(env_async) and pf.thread.is_alive() and pf.thread.daemon


def test_wait_finds_the_job_across_bind_envs_and_without_job() -> None:
    env = make_env(n=32)
    node = Node(env, 8, kind="transfer_image_async")
    other_env = BindEnv(seed=env.seed, sources=env.sources, perms=env.perms)  # e.g. another capture's env
    wait = KERNELS["transfer_wait"]([], [node.x.reshape(8, -1)], {}, other_env)
    wait()  # nothing pending yet: returns at once
    node.run()
    wait()
    np.testing.assert_array_equal(node.x, env.sources["train"][0][env.perms["train"][:8]].transpose(0, 2, 3, 1))


def test_one_prefetcher_per_executor_envs() -> None:
    env = make_env(n=16)
    capture_env = BindEnv(env.seed, env.sources, env.perms)  # the executor's per-capture envs share sources
    pf = transfer.prefetcher_for(env)
    assert transfer.prefetcher_for(capture_env) is pf and transfer.prefetcher_for(env) is pf
    assert transfer.prefetcher_for(make_env(n=16)) is not pf  # another task: its own worker
    own = transfer.Prefetcher()
    capture_env.prefetcher = own  # type: ignore[attr-defined] - an engine-provided one wins
    assert transfer.prefetcher_for(capture_env) is own
    own.close()


def test_prefetcher_lifecycle() -> None:
    pf = transfer.Prefetcher(name="test-prefetch")
    slot = transfer.TransferSlot(0)
    seen: list[str] = []
    pf.submit(slot, lambda: seen.append(threading.current_thread().name))
    slot.wait()
    assert seen == ["test-prefetch"]
    thread = pf.thread
    ref = weakref.ref(pf)
    del pf
    gc.collect()
    assert ref() is None
    thread.join(5)
    assert not thread.is_alive()  # the finalizer stopped the worker
    pf2 = transfer.Prefetcher()
    pf2.close()
    pf2.close()  # idempotent
    pf2.thread.join(5)
    assert pf2.closed and not pf2.thread.is_alive()
    pf2.submit(slot, lambda: seen.append("inline"))  # after close: runs on the caller
    slot.wait()
    assert seen[-1] == "inline"

    def boom() -> None:
        raise RuntimeError("boom")

    pf2.submit(slot, boom)
    with pytest.raises(RuntimeError, match="boom"):
        slot.wait()


# ---------------------------------------------------------------- allocation-free replay


@pytest.mark.parametrize("out_hw", [None, (40, 40)])
def test_sync_kernel_does_not_allocate(out_hw) -> None:  # type: ignore[no-untyped-def]
    b, calls = 128, 20
    env = make_env(n=256, perm_len=b * (calls + 1))
    node = Node(env, b, out_hw, crop_pad=4, flip=True, aug_base=1 << 32)
    node.run()  # warm-up: compile
    node.cursor[0] = 0
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        for _ in range(calls):
            node.run()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert node.cursor[0] == calls * b
    assert peak - base < 32 * 1024, f"{peak - base} bytes allocated in {calls} calls"

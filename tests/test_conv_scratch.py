"""The im2col scratch a plan gives a convolution: the tiles' columns, not the whole matrix.

kernels/operands.conv_scratch_shape sizes ``cols`` and ``dcols`` as (tiles, rows of a tile, k*k*Cin);
every backend walks the batch through them: the CPU's threads by tiles (conv_tiled.py), the CPU
without its own threads or in float64 a scratch-full of images at a time (conv.py), and the GPU
likewise (gpu/image_kernels.py, run here on the CUDA stand-in).
"""
from __future__ import annotations

import numpy as np
import pytest
from conv_cases import close, reference
from test_gpu_backend import assert_same_run, conv_task, emulated, module  # noqa: F401 - the fixture

from renaissance_nb import DeepLearningTask, fc, seq
from renaissance_nb.blueprint import RESNET_3_3, RESNET_3_3_DS, block, cbr, conv, gap
from renaissance_nb.errors import PlanError
from renaissance_nb.kernels import operands
from renaissance_nb.kernels.cpu import KERNELS, BindEnv
from renaissance_nb.memory.region import Region


def readme_resnet(n: int = 256) -> DeepLearningTask:
    """The guide's ResNet example (docs/guide.md, image models) on random 3x32x32 images (its plan depends only on the shapes)."""
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((n, 3, 32, 32), dtype=np.float32), rng.integers(0, 10, n).astype(np.int32)
    net = seq(cbr(32, 3, 1, 1), block(32, RESNET_3_3), block(64, RESNET_3_3_DS), gap(), fc(10))
    return (DeepLearningTask().model(net).data(train=(x, y), val=(x[:64], y[:64]), batch_size=128)
            .augment(crop_pad=4, flip=True).train_resolution(24, 32, boundary_epoch=10).ema(0.999).total_epochs(30))


def test_the_readme_resnet_plans_tiles_not_whole_im2col_matrices() -> None:
    t = readme_resnet()
    t.lock_memory()
    m, table = t.locked.memory, t.planned.shapes.tables["train_lowres"]  # 32x32: the largest variant
    shapes = {name: (x, y) for name, x, y in table.layer_shapes}
    whole = 0
    for layer in t.planned.arch.layers:
        if layer.kind != "conv":
            continue
        (_, _, cin), (ho, wo, _) = shapes[layer.name]
        kk, per = layer.p["k"] ** 2 * cin, ho * wo
        whole += 128 * per * kk * 4
        tiles, rows, width = table.specs[table.ids[f"{layer.name}.cols"]].shape
        assert width == kk and rows % per == 0 and tiles <= operands.CONV_THREADS, layer.name
        assert rows * kk * 4 <= max(operands.CONV_TILE_BYTES, per * kk * 4), layer.name  # one tile: 512 KiB or one image
        if f"{layer.name}.dcols" in table.ids:
            assert table.specs[table.ids[f"{layer.name}.dcols"]].shape == (tiles, rows, width)
    t_bytes = m.regions[Region.T_TEMP_FP32].size
    largest = max(t.slot_bytes for t in m.tensors_in(Region.T_TEMP_FP32))
    assert whole > 250 << 20  # the six whole matrices at 32x32, batch 128 (cols alone)
    assert largest == 8 * 1024 * 288 * 4  # conv2's tiles at 32x32: 8 of one image each
    # one convolution's tiles at a time (forward and backward scratch share bytes), and the small sums
    assert t_bytes <= largest + (1 << 20), t_bytes  # was 486.5 MiB with whole matrices for cols and dcols
    assert m.total_bytes < 260 << 20, m.total_bytes  # was 731 MiB
    shown = {tn.name: tn.shape for tn in m.tensors_in(Region.T_TEMP_FP32)}
    assert shown["conv2.cols"] == (8, 576, 288)  # train_base at 24x24: 8 tiles of one image's 576 rows


def test_the_region_map_shows_the_tiles() -> None:
    """The region map's data (display/views.py, what the widget and its static copy draw): region T
    lists each convolution's tiles by name and shape, per variant, and its row is one tile set long."""
    from renaissance_nb.display import views
    v = views.region_view(readme_resnet().lock_memory())
    t_row = next(r for r in v["regions"] if r["region"] == "T_TEMP_FP32")
    t_tensors = {t["name"]: t for t in v["tensors"] if t["region"] == "T_TEMP_FP32"}
    assert t_tensors["conv2.cols"]["shapes"]["train_lowres"] == [8, 1024, 288]  # 32x32: one image a tile
    assert t_tensors["conv2.bwd_cols"]["shapes"]["train_base"] == [8, 576, 288]
    assert t_row["size"] < 10 << 20 < t_row["size_without_reuse"]


def test_a_one_by_one_stride_one_conv_plans_no_columns_and_one_channel_keeps_its_matrix() -> None:
    assert operands.conv_scratch_shape(128, 8, 8, 1, 1, 0, 64) == (1, 64)  # x is the column matrix
    assert operands.conv_scratch_shape(128, 28, 28, 3, 1, 1, 1) == (128 * 784, 9)  # tap-major, whole
    assert operands.conv_scratch_shape(5, 7, 7, 3, 1, 1, 3) == (1, 5 * 49, 27)  # the batch fits one tile
    assert operands.conv_scratch_shape(48, 16, 16, 3, 1, 1, 3) == (3, 16 * 256, 27)  # three even tiles
    assert operands.conv_scratch_shape(128, 32, 32, 3, 1, 1, 32) == (8, 1024, 288)  # one image a tile


def _bound(x, w, cols, dcols, k, s, p, act, need_dx=True):
    """conv_fwd and conv_bwd of x by w over the given scratch; returns (fwd, bwd, y, dy, dw, dx)."""
    n, h, _, cin = x.shape
    cout = w.shape[0]
    ho = (h + 2 * p - k) // s + 1
    y = np.zeros((n, ho, ho, cout), x.dtype)
    dy = np.random.default_rng(3).standard_normal(y.shape).astype(x.dtype)
    dw, dx = np.zeros_like(w), np.zeros_like(x)
    prm = dict(k=k, s=s, p=p, bias=False, act=act, need_dx=need_dx)
    fwd = KERNELS["conv_fwd"]([y, cols], [x, w], prm, BindEnv())
    bwd = KERNELS["conv_bwd"]([dw] + ([dx, dcols] if need_dx else []), [dy, x, w, cols, y], prm, BindEnv())
    return fwd, bwd, y, dy, dw, dx


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cin,k,s,p,images", [(3, 3, 1, 1, 2), (4, 3, 2, 1, 3), (1, 3, 1, 1, 2), (5, 1, 2, 0, 4)])
def test_a_scratch_of_a_few_images_gives_the_whole_matrix_results(dtype, cin, k, s, p, images) -> None:
    """Fewer images' columns than the batch (float64 and one channel take the scratch-full-at-a-time
    path, float32 with Cin > 1 the threads' tiles): the float64 reference's values, and cols holds
    no promise after the forward (the backward makes its columns again)."""
    rng = np.random.default_rng(cin + k)
    n, h, cout = 7, 9, 6
    x = rng.standard_normal((n, h, h, cin)).astype(dtype)
    w = (rng.standard_normal((cout, k, k, cin)) / np.sqrt(k * k * cin)).astype(dtype)
    ho = (h + 2 * p - k) // s + 1
    scratch = np.zeros((images, ho * ho, k * k * cin), dtype)  # as the plan shapes it: (tiles, rows, width)
    fwd, bwd, y, dy, dw, dx = _bound(x, w, scratch, np.zeros_like(scratch), k, s, p, "relu")
    y_ref, dw_ref, dx_ref = reference(x, w, None, "relu", dy, k, s, p)
    fwd()
    tol = 1e-12 if dtype == np.float64 else 2e-5
    assert np.abs(y - y_ref).max() <= tol * max(1.0, np.abs(y_ref).max())
    scratch[...] = np.nan  # what the forward left there: nothing may read it
    bwd()
    for got, want in ((dw, dw_ref), (dx, dx_ref)):
        assert np.abs(got - want).max() <= tol * max(1.0, np.abs(want).max())


def test_the_scratch_full_path_repeats_its_bytes_and_needs_whole_images() -> None:
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((6, 8, 8, 3)), rng.standard_normal((4, 3, 3, 3))
    scratch = np.zeros((2 * 64, 27))
    fwd, bwd, y, dy, dw, dx = _bound(x, w, scratch, np.zeros_like(scratch), 3, 1, 1, "none")
    fwd(), bwd()
    first = (y.copy(), dw.copy(), dx.copy())
    fwd(), bwd()
    assert all(np.array_equal(a, b) for a, b in zip(first, (y, dw, dx)))
    with pytest.raises(PlanError, match="whole number of images"):
        _bound(x, w, np.zeros((100, 27)), np.zeros((100, 27)), 3, 1, 1, "none")


def test_conv_bwd_without_dx_over_a_small_scratch() -> None:
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((5, 6, 6, 2)), rng.standard_normal((3, 3, 3, 2))
    fwd, bwd, y, dy, dw, dx = _bound(x, w, np.zeros((36, 18)), None, 3, 1, 1, "none", need_dx=False)
    fwd(), bwd()
    close(dw, reference(x, w, None, "none", dy, 3, 1, 1)[1])
    assert not dx.any()


def test_emulated_gpu_walks_the_tiles_like_the_cpu(module, monkeypatch) -> None:  # noqa: F811
    """One image per tile (8 tiles for a batch of 32): the GPU makes each tile's columns, in the forward
    and again in the backward, and adds each tile's dW product; the run follows the CPU's."""
    monkeypatch.setattr(operands, "CONV_TILE_BYTES", 1)
    net = seq(cbr(6, 3, 1, 1), block(6, RESNET_3_3), block(8, RESNET_3_3_DS),
              conv(8, 1, 1, 0, bias=False), gap(), fc(4, bias=True))
    cpu = conv_task(net, epochs=1)
    cpu.lock_memory()
    shapes = {t.name: t.shape for t in cpu.locked.memory.tensors_in(Region.T_TEMP_FP32)}
    assert shapes["conv1.cols"] == (8, 64, 18) and shapes["conv7.cols"] == (1, 8)  # 8x8x2 images; the 1x1 conv
    rc = cpu.run(progress=False)
    before = module.launches.get("rnb_im2col", 0)
    gpu = emulated(conv_task(net, epochs=1), module)
    rg = gpu.run(progress=False)
    assert_same_run(cpu, rc, gpu, rg, rtol_loss=1e-5, rtol_w=1e-4, atol_w=1e-4)
    # 4 steps of 32, 32, 32 and 24 images, 8 images a scratch-full: 3 or 4 im2col launches per conv in the
    # forward and as many in the backward, for the 6 convolutions with columns (one launch each, whole)
    assert module.launches.get("rnb_im2col", 0) - before >= 4 * 6 * 2 * 3

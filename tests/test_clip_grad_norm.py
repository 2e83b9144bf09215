"""clip_grad_norm: torch.nn.utils.clip_grad_norm_ compiled into the step (the torch comparison of a
whole training run is in test_torch_parity.py; the CUDA kernels' in test_gpu_backend.py)."""
from __future__ import annotations

import numpy as np
import pytest

from renaissance_nb import (SGD, CheckpointError, ConfigError, DeepLearningTask, GraphId, PhaseError, PlanError, fc,
                            relu, seq)
from renaissance_nb.kernels import fused
from renaissance_nb.kernels.cpu import KERNELS, BindEnv

RNG = np.random.default_rng(7)
X = RNG.standard_normal((300, 12)).astype(np.float32)
Y = RNG.integers(0, 3, 300)


def task(clip: float | None, lr: float = 0.5, epochs: int = 2) -> DeepLearningTask:
    return (DeepLearningTask("clip").model(seq(fc(16), relu(), fc(3))).data(train=(X, Y), batch_size=64)
            .optimizer(SGD().lr(lr)).total_epochs(epochs).seed(5).clip_grad_norm(clip))


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 1001, 4096 + 3])
def test_the_squared_sums_are_the_float64_sum_in_every_chunking(n: int) -> None:
    x = (RNG.standard_normal(n) * 10.0 ** RNG.uniform(-8, 3, n)).astype(np.float32)
    want = float(np.sum(x.astype(np.float64) ** 2))
    for f in (fused.sq_sum, fused.sq_sum_chunked, fused.sq_sum_par):
        assert f(x) == pytest.approx(want, rel=1e-14, abs=0.0)
    assert fused.sq_sum_chunked(x) == fused.sq_sum_par(x)  # the same order: the same float64


@pytest.mark.parametrize("max_norm", [1e-3, 2.0, 1e9])
def test_the_kernel_scales_every_gradient_as_torch_does(max_norm: float) -> None:
    g = (RNG.standard_normal(5000) * 0.01).astype(np.float32)
    work, clip, flag = g.copy(), np.zeros(2, np.float32), np.zeros(1, np.int64)
    env = BindEnv(range_view=lambda first, last, dtype: work)
    run = KERNELS["clip_grad_norm"]([clip, np.zeros(4)], [flag], {"max_norm": max_norm, "first": "G", "last": "G"}, env)
    run()
    norm = np.float32(np.sqrt(np.sum(g.astype(np.float64) ** 2)))
    factor = np.float32(max_norm) / (norm + np.float32(1e-6))  # torch: max_norm / (total_norm + 1e-6), in float32
    assert clip[0] == norm and clip[1] == min(factor, np.float32(1.0))
    assert np.array_equal(work, g * factor if factor < 1 else g)  # the same float32 products, or untouched
    if factor < 1:
        assert np.linalg.norm(work.astype(np.float64)) == pytest.approx(max_norm, rel=1e-5)
    before = work.copy()
    flag[0] = 1  # the NaN check skipped this step: nothing to clip
    run()
    assert np.array_equal(work, before)


def test_a_non_finite_norm_makes_every_gradient_nan_as_torch_does() -> None:
    """With nan_check off nothing stops a NaN gradient before the clip: torch's factor is then NaN
    and so is every gradient after it."""
    g = np.array([3.0, 4.0, np.nan, 1.0], np.float32)
    clip, flag = np.zeros(2, np.float32), np.zeros(1, np.int64)
    env = BindEnv(range_view=lambda first, last, dtype: g)
    KERNELS["clip_grad_norm"]([clip, np.zeros(4)], [flag], {"max_norm": 1.0, "first": "G", "last": "G"}, env)()
    assert np.isnan(g).all() and np.isnan(clip).all()


def test_clipping_bounds_every_update_and_changes_training() -> None:
    plain, clipped = task(None), task(0.01)
    plain.compile()
    clipped.compile()
    w0 = clipped.state_dict()
    clipped.run(epochs=1, progress=False)
    # plain SGD moves each weight by lr * g; with the total norm clipped to 0.01 no step moves the
    # weights by more than lr * 0.01 in 2-norm, so 5 steps by at most 5 * 0.5 * 0.01
    moved = np.sqrt(sum(np.sum((clipped.state_dict()[k].astype(np.float64) - w0[k]) ** 2) for k in w0))
    assert 0 < moved <= 5 * 0.5 * 0.01 * (1 + 1e-5)
    norm, factor = clipped.executor.view("train_base", "clip.norm")  # the last step's
    assert norm > 0.01 and factor == pytest.approx(0.01 / norm, rel=1e-5)
    plain.run(epochs=1, progress=False)
    assert not np.array_equal(plain.state_dict()["fc1.weight"], clipped.state_dict()["fc1.weight"])


def test_the_step_graph_shows_the_clip_and_its_tensor() -> None:
    t = task(1.0)
    t.lock_memory()
    nodes = t.graphs.train.nodes(GraphId.CAST_AND_CHECK)
    assert [n.op for n in nodes] == ["nan_check", "clip_grad_norm"]
    assert nodes[1].p["max_norm"] == 1.0
    assert t.memory["clip.norm"].shape == (2,)
    assert t.settings["clip_grad_norm"] == 1.0
    off = task(None)
    off.lock_memory()
    assert [n.op for n in off.graphs.train.nodes(GraphId.CAST_AND_CHECK)] == ["nan_check"]
    with pytest.raises(PlanError, match="clip.norm"):
        off.memory["clip.norm"]  # no clip, no tensor


def test_the_blueprint_view_lists_the_clip() -> None:
    from renaissance_nb.display.views import blueprint_view
    assert ("gradient clipping", "total 2-norm at most 0.25") in blueprint_view(task(0.25))["settings"]
    assert not any(k == "gradient clipping" for k, _ in blueprint_view(task(None))["settings"])


def test_same_seed_same_bytes() -> None:
    a, b = task(0.05), task(0.05)
    for t in (a, b):
        t.run(progress=False)
    sa, sb = a.state_dict(), b.state_dict()
    assert all(sa[k].tobytes() == sb[k].tobytes() for k in sa)


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), "1.0", True])
def test_bad_max_norm_is_a_config_error_that_keeps_the_setting(bad) -> None:  # type: ignore[no-untyped-def]
    t = task(2.0)
    with pytest.raises(ConfigError, match=r"clip_grad_norm: max_norm=.*finite number > 0.*Fix: use e\.g\."):
        t.clip_grad_norm(bad)
    assert t.settings["clip_grad_norm"] == 2.0


def test_the_setting_is_fixed_once_planned() -> None:
    t = task(2.0)
    t.plan()
    with pytest.raises(PhaseError):
        t.clip_grad_norm(1.0)
    t.reset()
    assert t.settings["clip_grad_norm"] == 2.0  # reset keeps settings
    t.clip_grad_norm(None).compile()
    assert [n.op for n in t.graphs.train.nodes(GraphId.CAST_AND_CHECK)] == ["nan_check"]


def test_maximize_shows_only_when_set_so_older_checkpoints_compare_equal(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # a checkpoint compares the optimizer's text; those saved before maximize existed say nothing of it
    assert repr(SGD().lr(0.5)) == "SGD(lr=0.5, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False)"
    assert repr(SGD().maximize()).endswith("nesterov=False, maximize=True)")
    t = task(None, epochs=1)
    t.compile()
    path = t.save(str(tmp_path / "m.npz"))
    other = (DeepLearningTask("clip").model(seq(fc(16), relu(), fc(3))).data(train=(X, Y), batch_size=64)
             .optimizer(SGD().lr(0.5).maximize()).total_epochs(1).seed(5).compile())
    with pytest.raises(CheckpointError, match="maximize=True"):
        other.load_state(path)


def test_checkpoints_keep_the_clip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    t = task(0.05, epochs=3)
    t.run(epochs=1, progress=False)
    path = t.save(str(tmp_path / "c.npz"))
    back = DeepLearningTask.load(path, t.splits)
    assert back.settings["clip_grad_norm"] == 0.05
    t.run(epochs=2, progress=False)
    back.run(epochs=2, progress=False)
    assert all(t.state_dict()[k].tobytes() == back.state_dict()[k].tobytes() for k in t.state_dict())
    other = task(0.5, epochs=3).compile()
    with pytest.raises(CheckpointError, match="clip_grad_norm"):
        other.load_state(path)

"""LARS against a NumPy float64 reference of its formula (optim/lars.py), the kernels alone and in training:
per-tensor trust ratios, biases and batch norm excluded, the N tensors holding the norms, the numba and C
twins giving the same bytes, checkpoint resumes byte-identical, and clear errors for bad settings."""
from __future__ import annotations

import numpy as np
import pytest

from renaissance_nb import (LARS, ConfigError, CosineAnnealingLR, DeepLearningTask, GraphId, Region, bn, checkpoint,
                            conv, fc, gap, relu, seq)
from renaissance_nb.kernels import fused, native
from renaissance_nb.kernels.cpu import KERNELS, BindEnv
from renaissance_nb.inspector.tensorstats import tensor_stats
from renaissance_nb.optim import definition
from renaissance_nb.optim.lars import pieces, segments

torch = pytest.importorskip("torch")

STEPS, BATCH = 30, 16


def reference_step(w: dict, g: dict, m: dict, lr: float, opt: LARS, adapted: set[str]) -> None:
    """One LARS step in float64, in place: the formula of train/optimizers.py LARS."""
    mom, wd, eta, eps = opt.momentum_, opt.weight_decay_, opt.trust_coefficient_, opt.eps_
    for k in w:
        if k in adapted:
            wn, gn = float(np.linalg.norm(w[k])), float(np.linalg.norm(g[k]))
            trust = eta * wn / (gn + wd * wn + eps) if wn > 0 and gn > 0 else 1.0
            d = trust * (g[k] + wd * w[k])
        else:
            d = g[k]
        m[k] = mom * m[k] + d
        w[k] = w[k] - lr * m[k]


# ---- the kernels alone --------------------------------------------------------------------------------------
LAYOUT = (("bias", 5, False), ("w1", 30, True), ("pad", 3, False), ("w2", 17, True), ("zero", 8, True),
          ("bias2", 4, False))
"""A W range: excluded values, two adapted weights with padding between, an all-zero weight (trust 1)."""


def _ranges(rng: np.random.Generator):
    n = sum(size for _, size, _ in LAYOUT)
    ranges = {"W": np.zeros(n, np.float32), "G": np.zeros(n, np.float32), "M": np.zeros(n, np.float32),
              "V": np.zeros(0, np.float32), "N": np.full(2 * 4, -1.0, np.float32)}
    views, at = {}, 0
    for name, size, _ in LAYOUT:
        views[name] = slice(at, at + size)
        if name not in ("pad", "zero"):
            ranges["W"][at:at + size] = rng.standard_normal(size)
        at += size
    return ranges, views


def test_the_kernels_follow_the_float64_formula_for_30_steps() -> None:
    rng = np.random.default_rng(0)
    opt = LARS(lr=0.5, momentum=0.9, weight_decay=1e-2, trust_coefficient=0.02)
    ranges, views = _ranges(rng)
    adapted = [k for k, _, a in LAYOUT if a]
    norms = {k: ranges["N"][2 * i + 2:2 * i + 4] for i, k in enumerate(adapted)}  # pairs after a gap of 2
    env = BindEnv(range_view=lambda first, last, dtype: ranges[first[0]])
    lr_table = np.linspace(0.5, 0.1, STEPS).astype(np.float32)
    step, flag = np.zeros(1, np.int64), np.zeros(1, np.int64)
    w_views = [ranges["W"][views[k]] for k in adapted]
    g_views = [ranges["G"][views[k]] for k in adapted]
    norm_k = KERNELS["optimizer_norms"](list(norms.values()), [flag, *(x for pair in zip(w_views, g_views) for x in pair)],
                                        {"kind": "lars"}, env)
    update = KERNELS["optimizer"]([step], [lr_table, flag, *(x for k, wv in zip(adapted, w_views)
                                                              for x in (wv, norms[k]))], opt.graph_params(), env)
    ref_w = {k: ranges["W"][s].astype(np.float64) for k, s in views.items()}
    ref_m = {k: np.zeros_like(v) for k, v in ref_w.items()}
    for i in range(STEPS):
        g = (rng.standard_normal(ranges["G"].size) * 10.0 ** rng.uniform(-3, 0)).astype(np.float32)
        g[views["pad"]] = 0.0
        ranges["G"][...] = g
        norm_k()
        for k in adapted:  # the norms of this step's weights and gradients, rounded to float32
            np.testing.assert_allclose(norms[k], [np.linalg.norm(ranges["W"][views[k]].astype(np.float64)),
                                                  np.linalg.norm(g[views[k]].astype(np.float64))], rtol=1e-7)
        update()
        reference_step(ref_w, {k: g[s].astype(np.float64) for k, s in views.items()}, ref_m, float(lr_table[i]), opt,
                       set(adapted))
        assert step[0] == i + 1
    w = ranges["W"]
    scale = max(float(np.abs(v).max()) for v in ref_w.values())
    err = max(float(np.abs(w[views[k]] - ref_w[k]).max()) for k in views)
    assert err <= 1e-6 * scale, err
    assert not w[views["pad"]].any() and ranges["N"][:2].tolist() == [-1.0, -1.0]  # padding stays 0, N's gap untouched
    assert w[views["zero"]].any()  # a zero weight moves by the plain step (trust 1: its norm is 0)
    # a flagged step: neither the norms nor the update run, and the flag is cleared
    before, n_before = w.copy(), ranges["N"].copy()
    flag[0] = 1
    norm_k()
    update()
    assert flag[0] == 0 and step[0] == STEPS and np.array_equal(w, before) and np.array_equal(ranges["N"], n_before)


@pytest.mark.skipif(native.lib() is None, reason="no C compiler: the numba kernels serve alone")
@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_the_c_kernels_give_the_numba_bytes(n_threads: int) -> None:
    rng = np.random.default_rng(n_threads)
    sizes = [700, 9, 70001, 1]
    total = sum(sizes) + 40
    w0 = rng.standard_normal(total).astype(np.float32)
    seg = np.array([(at, size, 2 * i) for i, (at, size) in enumerate(zip(np.cumsum([3] + sizes[:-1]) + 10 * np.arange(4),
                                                                         sizes))], np.int64)
    cut = pieces(seg, total)
    lr = np.array([0.3, 0.2, 0.1], np.float32)
    a = [w0.copy(), np.zeros(total, np.float32), np.zeros(8, np.float32), np.zeros(1, np.int64)]
    b = [w0.copy(), np.zeros(total, np.float32), np.zeros(8, np.float32), np.zeros(1, np.int64)]
    for _ in range(4):
        g = (rng.standard_normal(total) * 1e-2).astype(np.float32)
        fused.lars_norms(a[0], g, a[2], seg)
        native.bind_lars_norms(b[0], g, b[2], seg, n_threads)()
        fused.lars_update(a[0], g, a[1], a[2], cut, lr, a[3], 0.9, 1e-3, 1e-3, 1e-8)
        native.bind_lars(b[0], g, b[1], b[2], cut, lr, b[3], 0.9, 1e-3, 1e-3, 1e-8, n_threads)()
        for x, y in zip(a, b):
            assert x.tobytes() == y.tobytes()
    threaded = [w0.copy(), np.zeros(total, np.float32), np.zeros(8, np.float32), np.zeros(1, np.int64)]
    fused.lars_norms_par(threaded[0], g, threaded[2], seg)  # the threaded numba twin: the same norms too
    fused.lars_norms(w0, g, b[2], seg)
    assert threaded[2].tobytes() == b[2].tobytes()


# ---- training: an MLP and a conv net against the float64 reference ------------------------------------------
def _torch_mlp():
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).double()


class _ConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = torch.nn.Conv2d(3, 6, 3, 1, 1), torch.nn.BatchNorm2d(6)
        self.conv2, self.bn2 = torch.nn.Conv2d(6, 8, 3, 1, 1), torch.nn.BatchNorm2d(8)
        self.fc1 = torch.nn.Linear(8, 4)

    def forward(self, t):  # type: ignore[no-untyped-def]
        t = torch.relu(self.bn1(self.conv1(t)))
        return self.fc1(torch.relu(self.bn2(self.conv2(t))).mean(dim=(2, 3)))


MLP_NAMES = {"0.weight": "fc1.weight", "0.bias": "fc1.bias", "2.weight": "fc2.weight", "2.bias": "fc2.bias"}


def _data(image: bool):
    rng = np.random.default_rng(1)
    n = STEPS * BATCH
    if image:
        y = rng.integers(0, 4, n)  # class c < 3 brightens channel c, class 3 darkens all three
        x = rng.standard_normal((n, 3, 6, 6)).astype(np.float32)
        x += np.where(y[:, None] == np.arange(3), 1.0, np.where(y[:, None] == 3, -0.5, 0.0))[:, :, None, None]
    else:
        x = rng.standard_normal((n, 12)).astype(np.float32)
        y = x[:, :4].argmax(axis=1)
    return x, y.astype(np.int64)


def _task(image: bool, opt: LARS, epochs: int = 1) -> DeepLearningTask:
    x, y = _data(image)
    model = (seq(conv(6, 3, 1, 1), bn(), relu(), conv(8, 3, 1, 1), bn(), relu(), gap(), fc(4)) if image
             else seq(fc(16), relu(), fc(4)))
    return (DeepLearningTask("lars").model(model).data(train=(x, y), batch_size=BATCH, shuffle=False)
            .optimizer(opt).scheduler(CosineAnnealingLR().base_lr(opt.lr_)).total_epochs(epochs).seed(2)
            .options(prefetch=False))


def _reference_run(image: bool, init: dict, opt: LARS, lrs: np.ndarray):
    """Losses per step and final weights of the float64 reference: torch autograd for the gradients, the
    LARS step in NumPy (reference_step)."""
    net = _ConvNet().double() if image else _torch_mlp()
    names = {k: k for k in net.state_dict()} if image else MLP_NAMES
    with torch.no_grad():
        for k, t in net.state_dict().items():
            if names[k] in init:
                t.copy_(torch.from_numpy(init[names[k]].astype(np.float64)))
    params = dict(net.named_parameters())
    w = {k: p.detach().numpy().copy() for k, p in params.items()}
    m = {k: np.zeros_like(v) for k, v in w.items()}
    adapted = {k for k in w if k.endswith("weight") and w[k].ndim > 1}  # fc and conv weights, not BN's
    x, y = _data(image)
    losses = []
    for i in range(STEPS):
        with torch.no_grad():
            for k, p in params.items():
                p.copy_(torch.from_numpy(w[k]))
        net.zero_grad()
        xb = torch.from_numpy(x[i * BATCH:(i + 1) * BATCH].astype(np.float64))
        loss = torch.nn.functional.cross_entropy(net(xb), torch.from_numpy(y[i * BATCH:(i + 1) * BATCH]))
        loss.backward()
        losses.append(loss.item())
        reference_step(w, {k: p.grad.numpy() for k, p in params.items()}, m, float(lrs[i]), opt, adapted)
    return np.array(losses), {names[k]: v for k, v in w.items()}


@pytest.mark.parametrize("image", [False, True], ids=["mlp", "convnet"])
def test_30_training_steps_match_the_float64_reference(image: bool) -> None:
    torch.set_num_threads(2)
    opt = LARS(lr=0.5, momentum=0.9, weight_decay=5e-3, trust_coefficient=0.05)
    task = _task(image, opt).compile()
    assert task.steps_per_epoch == STEPS
    init = task.state_dict()
    res = task.run(progress=False)
    lrs = task.lr_table()
    ref_losses, ref_w = _reference_run(image, init, opt, lrs)
    rel = np.abs(res.step_losses.astype(np.float64) - ref_losses) / np.abs(ref_losses)
    final = task.state_dict()
    w_err = max(float(np.linalg.norm(final[k] - v) / np.linalg.norm(v)) for k, v in ref_w.items())
    print(f"\nLARS {'convnet' if image else 'mlp'}: max rel loss diff {rel.max():.1e}, final weights {w_err:.1e}")
    assert rel.max() < 1e-4 and w_err < 1e-3, (rel.max(), w_err)
    assert ref_losses[-1] < 0.9 * ref_losses[0]  # it trained
    moved = {k: float(np.linalg.norm(final[k] - init[k])) for k in ref_w if k.endswith("weight")}  # BN's too
    assert min(moved.values()) > 1e-3, moved  # (a conv bias before batch norm has gradient 0 and stays)
    # the N tensors hold [||w||, ||g||] of the last step's weights before its update (W + lr * M) and its gradient
    for k in (k for k in ref_w if k.endswith("weight") and ref_w[k].ndim > 1):
        wn, gn = task.read(f"{k}@n")
        before = task.read(k).astype(np.float64) + lrs[-1] * task.read(f"{k}@m").astype(np.float64)
        assert wn == pytest.approx(float(np.linalg.norm(before)), rel=1e-5)
        assert gn == pytest.approx(float(np.linalg.norm(task.read(f"{k}@grad").astype(np.float64))), rel=1e-6)


def test_norms_live_in_the_n_regions_for_weights_only_and_fill_lars_norms() -> None:
    task = _task(True, LARS()).lock_memory()
    norms = [t for t in task.memory if t.region.family == "N"]
    assert sorted(t.name for t in norms) == ["conv1.weight@n", "conv2.weight@n", "fc1.weight@n"]
    assert {t.region for t in norms} == {Region.N_FIRST_CONV, Region.N_DEEP_CONV, Region.N_FC_WEIGHT}
    assert all(t.shape == (2,) and t.dtype == "float32" for t in norms)
    (n,) = task.graphs.train.nodes(GraphId.LARS_NORMS)
    assert n.op == "optimizer_norms" and len(n.outputs) == 3
    assert Region.N_FC_WEIGHT.reserved_for is None and GraphId.LARS_NORMS.reserved_for is None
    assert [t.name for t in task.memory if t.name.endswith("@m")]  # momentum for every parameter, biases included
    assert "bn1.weight@n" not in {t.name for t in task.memory}


def test_a_resumed_run_is_byte_identical(tmp_path) -> None:
    opt = LARS(lr=1.0, weight_decay=1e-3, trust_coefficient=0.01)
    whole = _task(False, opt, epochs=2)
    whole.run(progress=False)
    first = _task(False, opt, epochs=2)
    first.run(epochs=1, progress=False)
    path = checkpoint.save(first, tmp_path / "lars.npz")
    resumed = _task(False, opt, epochs=2).compile()
    checkpoint.load_state(resumed, path)
    resumed.run(progress=False)
    assert {k: v.tobytes() for k, v in resumed.state_dict().items()} == {k: v.tobytes() for k, v in
                                                                         whole.state_dict().items()}
    np.testing.assert_array_equal(resumed.result.step_losses, whole.result.step_losses)
    assert resumed.config.optimizer == opt  # rebuilt from the checkpoint's settings
    assert np.array_equal(resumed.read("fc1.weight@n"), whole.read("fc1.weight@n"))


def test_the_inspector_reconstructs_the_change_one_real_step_made() -> None:
    """One batch per epoch: run(2) then run(1) is exactly one more step; W is read before and after it."""
    x, y = _data(False)
    task = (DeepLearningTask("one").model(seq(fc(16), relu(), fc(4))).data(train=(x[:32], y[:32]), batch_size=32)
            .optimizer(LARS(lr=1.0, weight_decay=1e-2, trust_coefficient=0.05)).total_epochs(4).seed(1)).compile()
    task.run(2, progress=False)
    before = {k: task.read(k).astype(np.float64) for k in ("fc1.weight", "fc1.bias")}
    task.run(1, progress=False)
    for k, what in (("fc1.weight", "trust = 0.05 * ||W||"), ("fc1.bias", "excluded from the trust ratio")):
        after = task.read(k).astype(np.float64)
        u = tensor_stats(task, k).update
        assert u.step == 3 and what in u.how and u.changed == int((after != before[k]).sum()) > 0
        assert u.update_norm == pytest.approx(np.linalg.norm(after - before[k]), rel=1e-6)
    wn, gn = task.read("fc1.weight@n")
    trust = 0.05 * wn / (gn + 1e-2 * wn + 1e-8)
    assert f"= {trust:.4g} (||W|| = {wn:.4g}" in tensor_stats(task, "fc1.weight").update.how


@pytest.mark.parametrize("kwargs,said", [
    ({"momentum": 1.0}, "momentum=1.0"), ({"momentum": -0.1}, "momentum=-0.1"),
    ({"trust_coefficient": 0.0}, "trust_coefficient=0.0"), ({"eps": -1e-9}, "eps=-1e-09"),
    ({"lr": float("nan")}, "lr=nan"), ({"weight_decay": "0.1"}, "weight_decay='0.1'"), ({"beta": 0.9}, "beta")])
def test_bad_settings_are_config_errors_naming_them(kwargs: dict, said: str) -> None:
    with pytest.raises(ConfigError, match="LARS") as exc:
        LARS(**kwargs)
    assert said in str(exc.value) and "Fix:" in str(exc.value)


def test_the_definition_is_found_by_kind_and_an_unknown_kind_is_named() -> None:
    from renaissance_nb.errors import PlanError
    assert definition("lars").label == "LARS"
    with pytest.raises(PlanError, match="'lion'.*sgd, adam, adamw, lars"):
        definition("lion")
    w = np.zeros(10, np.float32)
    with pytest.raises(PlanError, match="does not lie inside"):
        segments(w, np.zeros(2, np.float32), [np.zeros(3, np.float32)], [np.zeros(2, np.float32)])


# ---- the GPU kernels on the CUDA stand-in (tests/cuda_emulator.py) ------------------------------------------
@pytest.fixture(scope="module")
def module(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    import shutil
    if shutil.which("g++") is None:
        pytest.skip("g++ is needed to build the CPU harness")
    import cuda_emulator
    return cuda_emulator.EmulatedModule(tmp_path_factory.mktemp("emu"))


@pytest.mark.parametrize("image,capture", [(False, "entry"), (False, "step"), (True, "entry")])
def test_the_emulated_gpu_trains_like_the_cpu(module, image: bool, capture: str) -> None:  # type: ignore[no-untyped-def]
    """The GpuExecutor with the CPU stand-in for CuPy: the race detector checks each entry's accesses against
    what it declared. The GPU sums each norm in another fixed order (block partials), float64 rounding apart."""
    import cuda_emulator
    from renaissance_nb.gpu.executor import GpuExecutor
    opt = LARS(lr=0.5, momentum=0.9, weight_decay=5e-3, trust_coefficient=0.05)
    cpu = _task(image, opt)
    rc = cpu.run(progress=False)
    gpu = _task(image, opt).compile()
    gpu.runner.replay = GpuExecutor(gpu.compiled, gpu.executor, gpu.runner.env, gpu.config.nan_policy, "device",
                                    runtime=cuda_emulator.emulated_runtime(module), capture=capture)
    before = dict(module.launches)
    rg = gpu.run(progress=False)
    np.testing.assert_allclose(rg.step_losses, rc.step_losses, rtol=1e-5 if image else 1e-6)
    for k, v in cpu.state_dict().items():
        np.testing.assert_allclose(gpu.state_dict()[k], v, rtol=1e-4, atol=1e-5, err_msg=k)
    for k in ("fc1.weight@n", "conv1.weight@n") if image else ("fc1.weight@n", "fc2.weight@n"):
        np.testing.assert_allclose(gpu.read(k), cpu.read(k), rtol=1e-5)
    runs = {k: module.launches.get(k, 0) - before.get(k, 0) for k in ("rnb_lars", "rnb_lars_norms")}
    assert runs["rnb_lars_norms"] >= STEPS * (3 if image else 2) and runs["rnb_lars"] >= STEPS * 2, runs


def test_what_if_names_the_fix_for_an_optimizer_class() -> None:
    """what_if(optimizer=LARS), the class: a ConfigError saying to pass an object (it was a raw TypeError)."""
    from renaissance_nb import LARS, ConfigError, DeepLearningTask, fc, seq
    t = DeepLearningTask().model(seq(fc(4))).data(train=(np.zeros((8, 3), np.float32), np.arange(8) % 4), batch_size=4)
    t.lock_memory()
    with pytest.raises(ConfigError, match=r"an object: SGD\(\), not SGD"):
        t.memory_inspector.what_if(optimizer=LARS)
    assert t.memory_inspector.what_if(optimizer=LARS()).plan().total_bytes > 0

"""se(): squeeze-and-excitation as one op (renaissance_nb/ops/se.py), checked against PyTorch: the
kernels' values and gradients against float64 autograd, 30 SGD steps of a conv net with three se layers
(one of them the first layer), ONNX in onnxruntime, from_torch and torchvision's state-dict names and
shapes, the CUDA kernels on the CPU stand-in (and a whole emulated GPU run), byte-identical reruns,
argument errors, and the memory plan holding the saved activations from the forward to the backward."""
from __future__ import annotations

import importlib
import shutil

import numpy as np
import pytest

from renaissance_nb import (BluePrint, BluePrintError, DeepLearningTask, ShapeError, conv, fc, flatten, gap,
                            maxpool, relu, se, seq)
from renaissance_nb.memory.region import Region
from helpers import image_blobs, train_from_torch

se_module = importlib.import_module("renaissance_nb.ops.se")  # the module (renaissance_nb.ops.se is the builder)

torch = pytest.importorskip("torch")
nn = torch.nn

try:  # torchvision's own module where installed; else the same module, attribute for attribute
    from torchvision.ops import SqueezeExcitation
except ImportError:
    class SqueezeExcitation(nn.Module):  # type: ignore[no-redef]
        """torchvision.ops.SqueezeExcitation (torchvision/ops/misc.py), its attributes and forward."""

        def __init__(self, input_channels: int, squeeze_channels: int, activation=nn.ReLU,  # type: ignore[no-untyped-def]
                     scale_activation=nn.Sigmoid) -> None:
            super().__init__()
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc1 = nn.Conv2d(input_channels, squeeze_channels, 1)
            self.fc2 = nn.Conv2d(squeeze_channels, input_channels, 1)
            self.activation = activation()
            self.scale_activation = scale_activation()

        def forward(self, x):  # type: ignore[no-untyped-def]
            s = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
            return s * x

SHAPES = [(5, 3, 4, 8, 4), (3, 7, 5, 6, 1), (9, 2, 2, 3, 7), (2, 1, 1, 5, 2)]
"""(N, H, W, C, C_sq): odd sizes, one squeeze channel, more squeeze channels than C, a 1x1 map, a
batch above the 8 chunks of the threaded passes."""


def _case(n: int, h: int, w: int, c: int, cs: int, seed: int = 4):  # type: ignore[no-untyped-def]
    r = np.random.default_rng(seed)
    x = (r.normal(size=(n, h, w, c)) * 2).astype(np.float32)
    params = [(r.normal(size=s) * 0.7).astype(np.float32) for s in ((cs, 1, 1, c), (cs,), (c, 1, 1, cs), (c,))]
    dy = r.normal(size=x.shape).astype(np.float32)
    return x, params, dy


def _ours(x, params, dy, need_dx: bool = True):  # type: ignore[no-untyped-def]
    """The CPU kernels as the runtime binds them: (y, dx, dw1, db1, dw2, db2) and the saved tensors."""
    n, c, cs = x.shape[0], x.shape[-1], params[1].size
    y, dx = np.full_like(x, np.nan), np.full_like(x, np.nan)
    saved = [np.full((n, k), np.nan, np.float32) for k in (c, cs, c)]
    sums, dz, dh = np.zeros((n, c)), np.zeros((n, c)), np.zeros((n, cs))
    grads = [np.full_like(p, np.nan) for p in params]
    se_module.bind_fwd([y, *saved, sums], [x, *params], {}, None)()
    se_module.bind_bwd(grads + ([dx] if need_dx else []) + [dz, dh], [dy, x, params[0], params[2], *saved],
                       {"need_dx": need_dx, "scratch": ("dz", "dh")}, None)()
    return y, dx, grads, saved


def _torch_se(x, params, dy, dtype):  # type: ignore[no-untyped-def]
    """torch autograd of the same layer (NCHW), in ``dtype``: y, dx and the parameters' gradients as ours."""
    n, h, w, c = x.shape
    cs = params[1].size
    m = SqueezeExcitation(c, cs).to(dtype)
    with torch.no_grad():
        for p, v in zip((m.fc1.weight, m.fc1.bias, m.fc2.weight, m.fc2.bias), params):
            p.copy_(torch.from_numpy(v.transpose(0, 3, 1, 2).copy() if v.ndim == 4 else v))
    tx = torch.from_numpy(x.transpose(0, 3, 1, 2).copy()).to(dtype).requires_grad_(True)
    ty = m(tx)
    ty.backward(torch.from_numpy(dy.transpose(0, 3, 1, 2).copy()).to(dtype))
    back = (lambda a: a.detach().numpy().transpose(0, 2, 3, 1))
    grads = [g.grad.detach().numpy() for g in (m.fc1.weight, m.fc1.bias, m.fc2.weight, m.fc2.bias)]
    return back(ty), back(tx.grad), [g.transpose(0, 2, 3, 1) if g.ndim == 4 else g for g in grads]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_values_and_gradients_match_torch_autograd_in_float64(shape) -> None:  # type: ignore[no-untyped-def]
    x, params, dy = _case(*shape)
    y, dx, grads, saved = _ours(x, params, dy)
    assert 0 < (saved[1] > 0).mean() < 1  # some hidden units pass the ReLU, some do not
    ty, tdx, tgrads = _torch_se(x, params, dy, torch.float64)
    # float64 sums rounded once to float32, at a few points (means, hidden units, gates, outputs): a few
    # float32 ulps of each tensor's scale from float64 torch (measured: 1e-7 to 2e-7 of it)
    pairs = [("y", y, ty), ("dx", dx, tdx)] + [(f"grad{i}", g, t) for i, (g, t) in enumerate(zip(grads, tgrads))]
    for name, a, b in pairs:
        np.testing.assert_allclose(a, b, rtol=0, atol=5e-7 * np.abs(b).max(), err_msg=name)
    # and as close to float64 as torch's own float32 autograd is, or closer
    fy, fdx, fgrads = _torch_se(x, params, dy, torch.float32)
    for a, f, b in [(y, fy, ty), (dx, fdx, tdx)] + list(zip(grads, fgrads, tgrads)):
        assert np.abs(a - b).max() <= max(2 * np.abs(f - b).max(), 2e-7 * np.abs(b).max())


def test_without_dx_the_weight_gradients_are_the_same_bytes() -> None:
    x, params, dy = _case(*SHAPES[0])
    _, dx, grads, _ = _ours(x, params, dy, need_dx=False)
    _, _, with_dx, _ = _ours(x, params, dy)
    assert np.isnan(dx).all() and all(np.array_equal(a, b) for a, b in zip(grads, with_dx))


def test_the_threaded_passes_give_the_serial_bytes() -> None:
    x, params, dy = _case(11, 4, 3, 6, 3, seed=3)
    n, c, cs = 11, 6, 3
    w1, b1, w2, b2 = params
    w1m, w2m = w1.reshape(cs, c), w2.reshape(c, cs)
    x3, dy3 = x.reshape(n, -1, c), dy.reshape(n, -1, c)
    out = {}
    for mode in ("serial", "par"):
        y, pooled, hidden, scale = np.zeros_like(x3), np.zeros((n, c), np.float32), np.zeros((n, cs), np.float32), \
            np.zeros((n, c), np.float32)
        sums, dz, dh, dx = np.zeros((n, c)), np.zeros((n, c)), np.zeros((n, cs)), np.zeros_like(x3)
        g = [np.zeros((cs, c), np.float32), np.zeros(cs, np.float32), np.zeros((c, cs), np.float32),
             np.zeros(c, np.float32)]
        if mode == "serial":
            se_module.se_fwd_rows_(x3, w1m, b1, w2m, b2, y, pooled, hidden, scale, sums, 0, n)
            se_module.se_gate_grads_rows_(dy3, x3, w2m, hidden, scale, dz, dh, 0, n)
            se_module.se_weight_grads_rows_(dz, hidden, g[2], g[3], 0, c)
            se_module.se_weight_grads_rows_(dh, pooled, g[0], g[1], 0, cs)
            se_module.se_dx_rows_(dy3, w1m, scale, dh, dz, dx, 0, n)
        else:
            se_module.se_fwd_par_(x3, w1m, b1, w2m, b2, y, pooled, hidden, scale, sums)
            se_module.se_gate_grads_par_(dy3, x3, w2m, hidden, scale, dz, dh)
            se_module.se_weight_grads_par_(dz, hidden, g[2], g[3])
            se_module.se_weight_grads_par_(dh, pooled, g[0], g[1])
            se_module.se_dx_par_(dy3, w1m, scale, dh, dz, dx)
        out[mode] = [y, pooled, hidden, scale, dx, *g]
    assert all(np.array_equal(a, b) for a, b in zip(out["serial"], out["par"]))


# ---- training against torch ----------------------------------------------------------------------
def _torch_net() -> nn.Sequential:
    """se as the first layer (no dx), after a conv (dx into it), and with more squeeze channels than C."""
    torch.manual_seed(0)
    return nn.Sequential(SqueezeExcitation(3, 2), nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), SqueezeExcitation(8, 2),
                         nn.MaxPool2d(2), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), SqueezeExcitation(8, 12),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))


def _data(n: int):  # type: ignore[no-untyped-def]
    return image_blobs(n, seed=2, scale=1.5, shift=1.5)


def test_thirty_sgd_steps_match_torch() -> None:
    torch.set_num_threads(2)
    steps, lr = 30, 0.05
    model = _torch_net()
    x, y = _data(steps * 16)
    blueprint = BluePrint.from_torch(model)
    assert [layer.p for layer in blueprint.leaves() if layer.kind == "se"] == [{"squeeze": 2}, {"squeeze": 2},
                                                                                  {"squeeze": 12}]
    task, state = train_from_torch(model, x, y, lr=lr)
    ours = task.state_dict()
    theirs = dict(zip(state, (p.detach().numpy() for p in model.parameters())))  # both in the Sequential's order
    assert len(theirs) == len(state) == 18 and "se3.fc2.weight" in theirs
    for name, b in theirs.items():
        a = ours[name]
        assert a.shape == b.shape == state[name].shape, name
        rel = np.linalg.norm(a - b) / np.linalg.norm(b)
        assert rel < 1e-4, (name, rel)  # measured: under 2e-7
        assert np.linalg.norm(b - state[name]) > 5e-4 * np.linalg.norm(b), name  # it trained (se's least: 1e-3)


def _task(net=None, seed: int = 1, n: int = 64) -> DeepLearningTask:  # type: ignore[no-untyped-def]
    x, y = _data(n)
    net = net or seq(conv(8, 3, p=1), relu(), se(), maxpool(2), conv(6, 3, p=1), se(squeeze=3), gap(), fc(4))
    return DeepLearningTask().model(net).data(train=(x, y), batch_size=16).total_epochs(1).seed(seed)


def test_reruns_are_byte_identical() -> None:
    a, b = _task(), _task()
    a.run(progress=False)
    b.run(progress=False)
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb) and all(sa[k].tobytes() == sb[k].tobytes() for k in sa)
    assert not np.array_equal(sa["se1.fc1.weight"], _task().compile().state_dict()["se1.fc1.weight"])  # trained


def test_a_step_allocates_nothing_but_numbas_argument_records() -> None:
    task = _task(seq(se(squeeze=2), conv(8, 3, p=1), relu(), se(), maxpool(2), gap(), fc(4)))
    task.compile()
    a = task.memory_inspector.allocations(steps=6)
    assert a.nrt_net == 0 and a.python_growth == 0 and a.only_argument_records and a.nrt_allocs == a.array_arguments > 0


@pytest.mark.parametrize("scheme", ["kaiming_uniform", "xavier_uniform"])
def test_initialised_as_torchvisions_1x1_convolutions(scheme: str) -> None:
    """Weights by the scheme with a 1x1 conv's fans (fan_in C, C_sq); biases as nn.Conv2d's (zero but
    under kaiming_uniform)."""
    task = _task(seq(conv(16, 3, p=1), se(squeeze=6), gap(), fc(4))).init(scheme)
    task.compile()
    s = task.state_dict()
    w1, b1, w2 = s["se1.fc1.weight"], s["se1.fc1.bias"], s["se1.fc2.weight"]
    bound1 = 1 / np.sqrt(16) if scheme == "kaiming_uniform" else np.sqrt(6 / (16 + 6))
    assert w1.shape == (6, 16, 1, 1) and 0.8 * bound1 < np.abs(w1).max() <= bound1
    assert 0 < np.abs(w2).max() <= (1 / np.sqrt(6) if scheme == "kaiming_uniform" else np.sqrt(6 / 22))
    assert (np.abs(b1).max() > 0) == (scheme == "kaiming_uniform")


# ---- the memory plan ---------------------------------------------------------------------------------
def test_the_memory_plan_keeps_the_saved_activations_from_forward_to_backward() -> None:
    task = _task()
    task.compile()
    compiled = task.compiled
    plan, ids = compiled.plan, compiled.ids
    regions = {t.name: t.region for t in plan}
    for name, region in [("se1.pooled", Region.F_FEATURE_FP32), ("se1.hidden", Region.F_FEATURE_FP32),
                         ("se1.scale", Region.F_FEATURE_FP32), ("se1.sums", Region.T_TEMP_FP32),
                         ("se1.dz", Region.T_TEMP_FP32), ("se1.dh", Region.T_TEMP_FP32),
                         ("se1.fc1.weight", Region.W_FC_WEIGHT), ("se1.fc2.bias", Region.W_FC_BIAS),
                         ("se1.fc1.weight@grad", Region.G_FC_WEIGHT)]:
        assert regions[name] == region, name
    assert plan["se2.hidden"].shape == (16, 3) and plan["se1.hidden"].shape == (16, 2)
    assert plan["se1.fc1.weight"].shape == (2, 1, 1, 8)  # a 1x1 conv's arena layout; torch's (2, 8, 1, 1) outside
    # the training program: each saved tensor lives from se_fwd through se_bwd, and shares no bytes meanwhile
    from renaissance_nb.compiler.stages import labelled_programs
    _, program = labelled_programs(compiled.graphs)[0]
    at = {(n.op, n.layer): i for i, (_, n) in enumerate(program)}
    fwd, bwd = at[("se_fwd", "se1")], at[("se_bwd", "se1")]
    assert fwd < bwd
    for role in ("pooled", "hidden", "scale"):
        start, end = compiled.lifetimes[ids[f"se1.{role}"]][0]
        assert start <= fwd and end >= bwd, role
    assert plan.live_overlaps() == []


# ---- export and import -------------------------------------------------------------------------------
def test_onnx_export_runs_in_onnxruntime_with_the_tasks_logits(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    task = _task(seq(se(squeeze=2), conv(8, 3, p=1), relu(), se(), maxpool(2), flatten(), fc(4)))
    task.run(progress=False)
    x, _ = _data(16)
    path = task.export_onnx(tmp_path / "se.onnx")
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    np.testing.assert_allclose(got, task.predict_logits(x), rtol=1e-4, atol=1e-5)


def test_from_torch_reads_squeeze_excitation_with_torchvisions_names_and_shapes() -> None:
    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), SqueezeExcitation(8, 3), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(8, 4)).eval()
    bp, state = BluePrint.from_torch(model, weights=True)
    assert bp.leaves()[1] == se(squeeze=3)
    assert {k: v.shape for k, v in state.items() if k.startswith("se1.")} == {
        "se1.fc1.weight": (3, 8, 1, 1), "se1.fc1.bias": (3,), "se1.fc2.weight": (8, 3, 1, 1), "se1.fc2.bias": (8,)}
    assert {f"se1.{k}" for k in model[1].state_dict()} == {k for k in state if k.startswith("se1.")}
    x, y = _data(32)
    task = DeepLearningTask().model(bp).data(train=(x, y), batch_size=16)
    task.compile()
    task.load_state_dict(state)
    assert all(np.array_equal(task.state_dict()[k], v) for k, v in state.items())
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(task.predict_logits(x), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kw", [{"activation": nn.SiLU}, {"scale_activation": nn.Hardsigmoid}],
                         ids=["efficientnet", "mobilenetv3"])
def test_from_torch_refuses_other_activations(kw) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(BluePrintError, match="SqueezeExcitation.*(SiLU|Hardsigmoid)"):
        BluePrint.from_torch(nn.Sequential(nn.Conv2d(3, 8, 3), SqueezeExcitation(8, 2, **kw)))


# ---- argument errors ---------------------------------------------------------------------------------
@pytest.mark.parametrize("call,match", [
    (lambda: se(0), "reduction=0 is invalid; expected a positive int"),
    (lambda: se(-2), "reduction=-2"),
    (lambda: se("4"), "reduction='4'"),
    (lambda: se(2.5), "reduction=2.5"),
    (lambda: se(squeeze=0), "squeeze=0 is invalid"),
    (lambda: se(reduction=2, squeeze=8), "reduction=2 is invalid; expected reduction= or squeeze=, not both"),
    (lambda: se(squeeze_channels=8), "write squeeze= "),
    (lambda: se(input_channels=8), "channels are read from the input"),
])
def test_builder_errors_name_the_argument_value_and_fix(call, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(BluePrintError, match=match) as info:
        call()
    assert "Fix:" in str(info.value)


def test_builder_forms_and_round_trip() -> None:
    assert se() == se(4) == se(reduction=4) and se() != se(squeeze=4)
    assert se(squeeze=8).signature() == "se(squeeze=8)" and se(2).signature() == "se(reduction=2)"
    for layer in (se(), se(3), se(squeeze=5)):
        assert BluePrint.from_dict(layer.to_dict()) == layer
    assert se_module.squeeze_channels(se(8).p, 4) == 1 and se_module.squeeze_channels(se(squeeze=9).p, 4) == 9


def test_flat_features_are_a_shape_error() -> None:
    x, y = np.random.default_rng(0).normal(size=(32, 6)).astype(np.float32), np.arange(32) % 4
    task = DeepLearningTask().model(seq(fc(8), se(), fc(4))).data(train=(x, y), batch_size=16)
    with pytest.raises(ShapeError, match=r"se1 \(se\) needs image features, got shape \(8,\)"):
        task.compile()


# ---- the CUDA kernels on the CPU stand-in --------------------------------------------------------------
@pytest.fixture(scope="module")
def module(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """The package's CUDA source (se's kernels included) built for the CPU once (tests/cuda_emulator.py)."""
    if shutil.which("g++") is None:
        pytest.skip("g++ builds the CUDA stand-in")
    import cuda_emulator
    return cuda_emulator.EmulatedModule(tmp_path_factory.mktemp("emu"))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_cuda_kernels_give_the_cpus_bytes_on_the_stand_in(shape, module) -> None:  # type: ignore[no-untyped-def]
    import cuda_emulator
    from renaissance_nb.gpu.base import GpuBindEnv
    env = GpuBindEnv(module=module, gemm=None, ops=None)  # type: ignore[arg-type]
    x, params, dy = _case(*shape, seed=5)
    before = module.launches.get("rnb_se_weight_grad", 0)
    for need_dx in (True, False):
        y, dx, grads, saved = _ours(x, params, dy, need_dx)
        n, c, cs = x.shape[0], x.shape[-1], params[1].size
        gy, gdx = np.full_like(x, np.nan), np.full_like(x, np.nan)
        gsaved = [np.full((n, k), np.nan, np.float32) for k in (c, cs, c)]
        ggrads = [np.full_like(p, np.nan) for p in params]
        sums, dz, dh = np.zeros((n, c)), np.zeros((n, c)), np.zeros((n, cs))
        se_module.launch_fwd([gy, *gsaved, sums], [x, *params], {}, env)(cuda_emulator.NULL_STREAM)
        se_module.launch_bwd(ggrads + ([gdx] if need_dx else []) + [dz, dh], [dy, x, params[0], params[2], *gsaved],
                             {"need_dx": need_dx}, env)(cuda_emulator.NULL_STREAM)
        for a, b in zip([y, dx, *grads, *saved], [gy, gdx, *ggrads, *gsaved]):
            assert a.tobytes() == b.tobytes()
    assert module.launches["rnb_se_weight_grad"] == before + 4  # two per backward, with and without dx


def test_emulated_gpu_training_matches_the_cpu_backend(module) -> None:  # type: ignore[no-untyped-def]
    """The real GpuExecutor over the stand-in: its dependency analysis must cover what the se kernels
    touch (the race detector checks), and the run follows the CPU's (the conv's products are summed
    in another order there, so the weights agree to rounding, not to the byte)."""
    import cuda_emulator
    from renaissance_nb.gpu.executor import GpuExecutor
    net = seq(se(squeeze=2), conv(8, 3, p=1), relu(), se(), maxpool(2), conv(6, 3, p=1), se(squeeze=3), gap(), fc(4))
    cpu, gpu = _task(net), _task(net)
    rc = cpu.run(progress=False)
    gpu.compile()
    gpu.runner.replay = GpuExecutor(gpu.compiled, gpu.executor, gpu.runner.env, gpu.config.nan_policy, "device",
                                    runtime=cuda_emulator.emulated_runtime(module), capture="entry")
    rg = gpu.run(progress=False)
    np.testing.assert_allclose(rc.step_losses, rg.step_losses, rtol=1e-5)
    sc, sg = cpu.state_dict(), gpu.state_dict()
    for k in sc:
        np.testing.assert_allclose(sc[k], sg[k], rtol=1e-4, atol=1e-5, err_msg=k)
    assert module.launches.get("rnb_se_dx", 0) > 0 and module.launches.get("rnb_se_pool", 0) > 0


def test_a_sequentials_safetensors_file_with_se_loads_by_position(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """torch names an se's tensors by position and part (``3.fc1.weight``): load_weights pairs them with
    se1.fc1... in order, as it pairs the numbered ones."""
    st_torch = pytest.importorskip("safetensors.torch")
    model = _torch_net().eval()
    path = str(tmp_path / "seq.safetensors")
    st_torch.save_file(model.state_dict(), path)
    x, y = _data(32)
    task = DeepLearningTask().model(BluePrint.from_torch(model)).data(train=(x, y), batch_size=16).compile()
    task.load_weights(path)
    with torch.no_grad():
        theirs = model(torch.from_numpy(x)).numpy()
    assert np.abs(task.predict_logits(x) - theirs).max() <= 1e-5 * np.abs(theirs).max()

"""Grouped and depthwise convolution: conv(out, k, s, p, groups=g), its own op (ops/grouped_conv.py) with
numba loops and CUDA kernels. Checked against PyTorch: the kernels against conv2d and autograd in float64,
30 SGD steps of nets with depthwise and grouped convs, ONNX in onnxruntime, from_torch with weights; the
BluePrint round trip (an ungrouped conv unchanged), the plan-time ShapeError, the CUDA kernels on the CPU
stand-in against the CPU's bytes, and byte-identical runs."""
from __future__ import annotations

import json
import shutil
import types

import numba
import numpy as np
import pytest

from renaissance_nb import (SGD, BluePrint, BluePrintError, DeepLearningTask, ShapeError, conv, fc, flatten, gap,
                            maxpool, relu, relu6, seq)
from renaissance_nb.blueprint_nodes import Layer
from renaissance_nb.memory.region import Region
from renaissance_nb.ops import grouped_conv
from renaissance_nb.ops.registry import OPS
from helpers import image_blobs, train_from_torch

torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional

# name: (n, in, out, groups, k, s, p, h, w, bias, act)
CASES = {
    "depthwise": (3, 8, 8, 8, 3, 1, 1, 7, 6, True, "relu"),
    "depthwise_x2": (2, 4, 8, 4, 3, 2, 1, 9, 7, True, "none"),  # a channel multiplier of 2
    "grouped_s2": (2, 6, 9, 3, 3, 2, 0, 8, 11, False, "relu"),
    "grouped_1x1": (2, 8, 4, 2, 1, 1, 0, 5, 5, True, "none"),
    "k5_s3_p2": (1, 6, 6, 2, 5, 3, 2, 13, 10, True, "relu"),
    "k2_s2_p1": (2, 4, 6, 2, 2, 2, 1, 5, 6, False, "none"),
    "wide_padding": (1, 3, 3, 3, 3, 1, 2, 4, 3, True, "none"),
}


def _operands(case: str, seed: int = 0):  # type: ignore[no-untyped-def]
    """Channels-last float32 x, w (out, k, k, in/groups), b, dy and the node parameters of a case."""
    n, c, o, g, k, s, p, h, w, bias, act = CASES[case]
    r = np.random.default_rng(seed)
    ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    x = r.normal(size=(n, h, w, c)).astype(np.float32)
    wt = r.normal(size=(o, k, k, c // g)).astype(np.float32)
    b = r.normal(size=o).astype(np.float32)
    dy = r.normal(size=(n, ho, wo, o)).astype(np.float32)
    params = dict(k=k, s=s, p=p, groups=g, bias=bias, act=act, need_dx=True)
    return x, wt, b, dy, params


def _cpu(x, wt, b, dy, params):  # type: ignore[no-untyped-def]
    """(y, dw, db, dx) of the CPU kernels; outputs start as NaN so a value never written shows."""
    n, h, w, c = x.shape
    o, k = wt.shape[0], wt.shape[1]
    ho, wo = dy.shape[1], dy.shape[2]
    y, dw, db, dx = (np.full(shape, np.nan, np.float32) for shape in ((n, ho, wo, o), wt.shape, (o,), x.shape))
    bias, relu_ = params["bias"], params["act"] == "relu"
    grouped_conv.cpu_fwd([y], [x, wt] + ([b] if bias else []), params, None)()
    outs = [dw] + ([db] if bias else []) + [dx]
    grouped_conv.cpu_bwd(outs, [dy, x, wt] + ([y] if relu_ else []), params, None)()
    return y, dw, db if bias else None, dx


def _torch64(x, wt, b, dy, params):  # type: ignore[no-untyped-def]
    """The same in float64 through torch.nn.functional.conv2d and autograd, channels-last like ours."""
    tx = torch.from_numpy(x.transpose(0, 3, 1, 2).astype(np.float64)).requires_grad_(True)
    tw = torch.from_numpy(wt.transpose(0, 3, 1, 2).astype(np.float64)).requires_grad_(True)
    tb = torch.from_numpy(b.astype(np.float64)).requires_grad_(True) if params["bias"] else None
    ty = F.conv2d(tx, tw, tb, params["s"], params["p"], 1, params["groups"])
    if params["act"] == "relu":
        ty = torch.relu(ty)
    ty.backward(torch.from_numpy(dy.transpose(0, 3, 1, 2).astype(np.float64)))
    nhwc = lambda t: t.detach().numpy().transpose(0, 2, 3, 1)  # noqa: E731
    return nhwc(ty), nhwc(tw.grad), tb.grad.numpy() if tb is not None else None, nhwc(tx.grad)


def _assert_float32_rounding(name: str, ours: np.ndarray, ref: np.ndarray) -> None:
    """ours is ref rounded once to float32: within half a float32 ulp of ref (plus float64 sum noise)."""
    assert ours.dtype == np.float32 and np.isfinite(ours).all(), name
    tol = 0.5 * np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64) + 1e-12 * np.abs(ref).max()
    err = np.abs(ours.astype(np.float64) - ref)
    assert (err <= tol).all(), (name, float((err / np.maximum(tol, 1e-300)).max()))


@pytest.mark.parametrize("case", sorted(CASES))
def test_kernels_match_torch_conv2d_and_autograd_in_float64(case: str) -> None:
    ops = _operands(case)
    for name, a, b in zip(("y", "dw", "db", "dx"), _cpu(*ops), _torch64(*ops)):
        if b is not None:
            _assert_float32_rounding(name, a, b)


def test_kernels_give_the_same_bytes_on_one_thread_and_on_all() -> None:
    ops = _operands("depthwise", seed=3)
    many = _cpu(*ops)
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        one = _cpu(*ops)
    finally:
        numba.set_num_threads(before)
    assert all(np.array_equal(a, b) for a, b in zip(many, one))


def _data(n: int):  # type: ignore[no-untyped-def]
    return image_blobs(n, seed=2, scale=1.5, shift=1.5)


def _depthwise_net() -> nn.Sequential:
    """MobileNet's pattern: a conv, a depthwise conv with ReLU6 (not fused), then a grouped conv at stride 2."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.ReLU6(),
                         nn.Conv2d(8, 12, 3, stride=2, padding=1, groups=4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(12 * 4 * 4, 4))


def _grouped_first_net() -> nn.Sequential:
    """A grouped conv reading the input (its own weight family), without bias, then a grouped 1x1 conv."""
    torch.manual_seed(1)
    return nn.Sequential(nn.Conv2d(3, 6, 3, padding=1, groups=3, bias=False), nn.ReLU(), nn.Conv2d(6, 6, 1, groups=2),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(6 * 4 * 4, 4))


NETS = {"depthwise": _depthwise_net, "grouped_first": _grouped_first_net}


def _task(blueprint, x, y, seed: int = 0) -> DeepLearningTask:  # type: ignore[no-untyped-def]
    return (DeepLearningTask().model(blueprint).data(train=(x, y), batch_size=16, shuffle=False)
            .optimizer(SGD().lr(0.05).momentum(0.9)).total_epochs(1).seed(seed))


@pytest.mark.parametrize("net", sorted(NETS))
def test_thirty_training_steps_match_torch(net: str) -> None:
    torch.set_num_threads(2)
    steps, model = 30, NETS[net]()
    x, y = _data(steps * 16)
    task, state = train_from_torch(model, x, y, lr=0.05)
    ours, theirs = task.state_dict(), dict(zip(state, (p.detach().numpy() for p in model.state_dict().values())))
    assert ours.keys() == theirs.keys()
    for name, b in theirs.items():
        assert ours[name].shape == b.shape, name  # grouped weights leave as torch's (out, in/groups, k, k)
        rel = np.linalg.norm(ours[name] - b) / np.linalg.norm(b)
        assert rel < 1e-4, (name, rel)


def test_from_torch_with_weights_gives_torchs_logits() -> None:
    model = _depthwise_net().eval()
    x, y = _data(32)
    blueprint, state = BluePrint.from_torch(model, weights=True)
    assert [leaf.p.get("groups", 1) for leaf in blueprint.leaves() if leaf.kind == "conv"] == [1, 8, 4]
    assert state["conv2.weight"].shape == (8, 1, 3, 3) and state["conv3.weight"].shape == (12, 2, 3, 3)
    task = _task(blueprint, x, y)
    task.compile()
    task.load_state_dict(state)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(task.predict_logits(x), want, rtol=1e-5, atol=1e-5)


def test_from_torch_still_refuses_dilation() -> None:
    with pytest.raises(BluePrintError, match=r"#0 is Conv2d: dilation=\(2, 2\)"):
        BluePrint.from_torch(nn.Sequential(nn.Conv2d(4, 4, 3, dilation=2, groups=2)))


def test_onnx_export_runs_in_onnxruntime_with_the_tasks_logits(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    x, y = _data(64)
    bp = seq(conv(8, 3, p=1), relu(), conv(8, 3, p=1, groups=8), relu6(), conv(12, 3, s=2, p=1, groups=4, bias=False),
             relu(), maxpool(2), flatten(), fc(4))
    task = _task(bp, x, y, seed=1)
    task.run(progress=False)
    path = task.export_onnx(tmp_path / "m.onnx")
    convs = [n for n in onnx.load(str(path)).graph.node if n.op_type == "Conv"]
    assert [next((a.i for a in n.attribute if a.name == "group"), 1) for n in convs] == [1, 8, 4]
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"input": x[:16]})[0]
    np.testing.assert_allclose(got, task.predict_logits(x[:16]), rtol=1e-4, atol=1e-5)


def test_the_blueprint_round_trips_and_an_ungrouped_conv_is_unchanged() -> None:
    grouped = conv(32, 3, p=1, groups=32)
    assert grouped.p["groups"] == 32 and grouped.kind == "conv"
    again = BluePrint.from_dict(json.loads(json.dumps(seq(grouped, conv(12, 3, groups=4, bias=False)).to_dict())))
    assert again == seq(grouped, conv(12, 3, groups=4, bias=False))
    assert again.tree().splitlines()[1:] == ["├─ conv(32, k=3, s=1, p=1, groups=32)",
                                             "└─ conv(12, k=3, s=1, p=0, groups=4, bias=False)"]
    # groups=1 is today's conv exactly: no groups parameter, the same description
    old = Layer("conv", (("bias", True), ("k", 3), ("out", 8), ("p", 1), ("s", 1)))
    assert conv(8, 3, p=1, groups=1) == conv(8, 3, p=1) == old
    assert conv(8, 3, p=1).to_dict() == {"layer": "conv", "params": {"bias": True, "k": 3, "out": 8, "p": 1, "s": 1}}


def test_the_plan_describes_grouped_layers_and_their_weights() -> None:
    x, y = _data(32)
    task = _task(seq(conv(6, 3, p=1, groups=3), relu(), conv(6, 3, p=1, groups=6), gap(), fc(4)), x, y)
    text = repr(task.plan())
    assert "conv1: conv(6, k=3, s=1, p=1, groups=3) + relu (fused)  <- input" in text
    assert "conv2: conv(6, k=3, s=1, p=1, groups=6)  <- conv1.out" in text
    table = task.planned.shapes.tables["train_base"]
    regions = {s.name: (s.shape, s.region) for s in table.specs}
    assert regions["conv1.weight"] == ((6, 3, 3, 1), Region.W_FIRST_CONV)
    assert regions["conv2.weight"] == ((6, 3, 3, 1), Region.W_DEEP_CONV)
    assert regions["conv2.bias"] == ((6,), Region.W_FC_BIAS)
    assert not [s for s in table.specs if s.name.startswith("conv2.") and s.region.name.startswith("T_")]


@pytest.mark.parametrize("groups", [0, -2, 2.5, True, "2", 3])
def test_the_builder_checks_groups(groups) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(BluePrintError, match=r"conv: groups=.* is invalid; expected .*Fix: "):
        conv(8, 3, groups=groups)


def test_channels_groups_do_not_divide_are_a_shape_error_naming_the_layer() -> None:
    x, y = _data(32)
    with pytest.raises(ShapeError, match=r"conv1 \(conv\(8, k=3, s=1, p=0, groups=2\)\) gets 3 input channels, which "
                                         r"groups=2 .*Fix: .*one of 1\)"):
        _task(seq(conv(8, 3, groups=2), gap(), fc(4)), x, y).plan()
    with pytest.raises(ShapeError, match=r"conv2 .* gets 6 input channels, which groups=4 .*one of 1, 2\)"):
        _task(seq(conv(6, 3), conv(8, 3, groups=4), gap(), fc(4)), x, y).plan()


def test_same_seed_gives_byte_identical_weights() -> None:
    x, y = _data(96)
    bp = seq(conv(8, 3, p=1, groups=1), relu(), conv(8, 3, p=1, groups=8), relu(), conv(8, 1, groups=2), gap(), fc(4))
    a, b = (_task(bp, x, y, seed=5).total_epochs(2) for _ in range(2))
    a.run(progress=False)
    b.run(progress=False)
    sa, sb = a.state_dict(), b.state_dict()
    assert all(sa[k].tobytes() == sb[k].tobytes() for k in sa)


# ---- the CUDA kernels on the CPU stand-in -------------------------------------------------------------
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ builds the CUDA stand-in")


@pytest.fixture(scope="module")
def module(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    import cuda_emulator
    return cuda_emulator.EmulatedModule(tmp_path_factory.mktemp("emu"))


@needs_gxx
@pytest.mark.parametrize("case", sorted(CASES))
def test_cuda_kernels_give_the_cpus_bytes_on_the_stand_in(case: str, module) -> None:  # type: ignore[no-untyped-def]
    import cuda_emulator
    x, wt, b, dy, params = ops = _operands(case, seed=7)
    want = _cpu(*ops)
    env = types.SimpleNamespace(module=module)  # launch_grid reads the module only
    y, dw, db, dx = (np.full_like(a, np.nan) if a is not None else None for a in want)
    bias, relu_ = params["bias"], params["act"] == "relu"
    fwd = grouped_conv.gpu_fwd([y], [x, wt] + ([b] if bias else []), params, env)
    bwd = grouped_conv.gpu_bwd([dw] + ([db] if bias else []) + [dx], [dy, x, wt] + ([want[0]] if relu_ else []),
                               params, env)
    stream = cuda_emulator.current_stream()  # one stream for every case: its work is ordered
    fwd(stream)
    bwd(stream)
    for a, g in zip(want, (y, dw, db, dx)):
        assert a is None or np.array_equal(a, g)
    assert {"rnb_grouped_conv_fwd", "rnb_grouped_conv_dw", "rnb_grouped_conv_dx"} <= set(module.launches)


@needs_gxx
def test_emulated_gpu_training_follows_the_cpu(module) -> None:  # type: ignore[no-untyped-def]
    import cuda_emulator
    from renaissance_nb.gpu.executor import GpuExecutor
    x, y = _data(64)
    bp = seq(conv(8, 3, p=1), relu(), conv(8, 3, p=1, groups=8), relu6(), conv(8, 3, s=2, p=1, groups=2), relu(),
             flatten(), fc(4))
    cpu, gpu = _task(bp, x, y, seed=3), _task(bp, x, y, seed=3)
    gpu.compile()
    gpu.runner.replay = GpuExecutor(gpu.compiled, gpu.executor, gpu.runner.env, gpu.config.nan_policy, "device",
                                    runtime=cuda_emulator.emulated_runtime(module), capture="entry")
    rc, rg = cpu.run(progress=False), gpu.run(progress=False)
    np.testing.assert_allclose(rc.step_losses, rg.step_losses, rtol=1e-6)
    sc, sg = cpu.state_dict(), gpu.state_dict()
    for k in sc:  # the grouped convs give the same bytes; conv and fc run through cuBLAS's stand-in
        np.testing.assert_allclose(sc[k], sg[k], rtol=1e-5, atol=1e-6, err_msg=k)
    assert module.launches.get("rnb_grouped_conv_dx", 0) >= 4


def test_the_grouped_op_is_registered_with_its_kernels() -> None:
    op = OPS[grouped_conv.GROUPED_CONV]
    assert set(op.cpu_kernels) == set(op.gpu_kernels) == {"grouped_conv_fwd", "grouped_conv_bwd"}
    assert "rnb_grouped_conv_dx" in op.cuda_source and op.fuses == ("relu",)

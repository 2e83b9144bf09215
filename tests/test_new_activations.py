"""relu6, hardswish and elu: ops of their own modules (renaissance_nb/ops/), each with its numba
loops and CUDA kernels. Checked against PyTorch: the kernels value by value (boundaries included),
30 training steps of an MLP and of a conv net, ONNX in onnxruntime, and from_torch; the CUDA
kernels on the CPU stand-in against the CPU's bytes."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from renaissance_nb import (BluePrint, BluePrintError, DeepLearningTask, conv, elu, fc, flatten, hardswish,
                            maxpool, relu6, seq)
from renaissance_nb.ops import registry
from helpers import train_from_torch

torch = pytest.importorskip("torch")
nn = torch.nn

GRID = np.concatenate([np.array([-7, -6, -3.0001, -3, -2.9999, -1, -1e-7, 0, 1e-7, 1, 2.9999, 3, 3.0001, 5.9999, 6,
                                 6.0001, 9, np.nan, np.inf, -np.inf], np.float32),
                       np.random.default_rng(0).normal(scale=4, size=997).astype(np.float32)])
CASES = {"relu6": (relu6(), nn.ReLU6()), "hardswish": (hardswish(), nn.Hardswish()),
         "elu": (elu(), nn.ELU()), "elu_0.3": (elu(0.3), nn.ELU(0.3))}


def _on_the_grid(layer):  # type: ignore[no-untyped-def]
    """(op, x, dy, y, dx): the layer's own CPU kernels, forward and backward, over GRID."""
    op = registry.op_for_layer(layer.kind)
    x = GRID.copy()
    dy = np.random.default_rng(1).normal(size=x.size).astype(np.float32)
    y, dx = np.empty_like(x), np.empty_like(x)
    op.cpu_kernels[f"{op.kind}_fwd"]([y], [x], layer.p, None)()
    op.cpu_kernels[f"{op.kind}_bwd"]([dx], [dy, x], layer.p, None)()
    return op, x, dy, y, dx


@pytest.mark.parametrize("case", sorted(CASES))
def test_kernels_match_torch_value_by_value(case: str) -> None:
    layer, module = CASES[case]
    op, x, dy, y, dx = _on_the_grid(layer)
    tx = torch.from_numpy(x.copy()).requires_grad_(True)
    ty = module(tx)
    ty.backward(torch.from_numpy(dy))
    if op.kind == "elu":  # exp rounded once from float64 here; torch's float32 expm1: an ulp apart at most
        np.testing.assert_allclose(y, ty.detach().numpy(), rtol=2e-7, atol=0)  # NaN where torch has NaN
        np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=3e-7, atol=1e-30)
    else:  # float32 arithmetic in torch's order: the same bytes, boundaries included
        assert np.array_equal(y, ty.detach().numpy(), equal_nan=True)
        assert np.array_equal(dx, tx.grad.numpy(), equal_nan=True)


def _torch_mlp(act: nn.Module) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 32), act, nn.Linear(32, 16), act, nn.Linear(16, 4))


def _torch_convnet(act: nn.Module) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), act, nn.MaxPool2d(2), nn.Conv2d(8, 8, 3, padding=1), act,
                         nn.Flatten(), nn.Linear(8 * 4 * 4, 4))


def _data(image: bool, n: int = 480):  # type: ignore[no-untyped-def]
    r = np.random.default_rng(2)
    y = r.integers(0, 4, n)
    shape = (n, 3, 8, 8) if image else (n, 20)
    x = (r.normal(size=shape) * 2.5).astype(np.float32)  # wide enough to reach every piece of each activation
    x[:, 0] += (y * 1.5).reshape((n,) + (1,) * (x.ndim - 2)).astype(np.float32)
    return x, y


def _train_both(model: nn.Sequential, image: bool, steps: int = 30, lr: float = 0.05):  # type: ignore[no-untyped-def]
    """30 steps of SGD with momentum, the same weights and batches on both sides: (ours, torch's) state dicts."""
    x, y = _data(image, steps * 16)
    task, state = train_from_torch(model, x, y, lr=lr)
    ours = task.state_dict()
    names = [n for n in state if n.endswith((".weight", ".bias"))]
    theirs = [p.detach().numpy() for p in model.parameters()]
    return [ours[n] for n in names], theirs, names


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("image", [False, True], ids=["mlp", "convnet"])
def test_thirty_training_steps_match_torch(case: str, image: bool) -> None:
    torch.set_num_threads(2)
    act = CASES[case][1]
    model = _torch_convnet(act) if image else _torch_mlp(act)
    ours, theirs, names = _train_both(model, image)
    for name, a, b in zip(names, ours, theirs):
        b = b.transpose(0, 2, 3, 1) if (a.ndim == 4 and a.shape != b.shape) else b
        rel = np.linalg.norm(a - b.reshape(a.shape)) / np.linalg.norm(b)
        assert rel < 1e-4, (name, rel)  # test_torch_parity's bound on final weights is 1e-3 (measured here: up to 2e-5)


@pytest.mark.parametrize("case", sorted(CASES))
def test_from_torch_reads_the_module(case: str) -> None:
    layer, module = CASES[case]
    bp = BluePrint.from_torch(nn.Sequential(nn.Linear(4, 4), module, nn.Linear(4, 2)))
    assert bp.leaves()[1] == layer


def test_builders_check_their_arguments() -> None:
    with pytest.raises(BluePrintError, match="alpha"):
        elu(-1)
    with pytest.raises(BluePrintError, match="alpha"):
        elu("big")
    with pytest.raises(BluePrintError):
        relu6(6)  # type: ignore[call-arg]
    assert seq(fc(4), relu6(), fc(2)).tree().splitlines()[2].endswith("relu6()")


def test_layers_are_named_with_a_separator_after_a_digit() -> None:
    x, y = _data(False, 64)
    task = DeepLearningTask().model(seq(fc(8), relu6(), fc(8), relu6(), fc(4))).data(train=(x, y), batch_size=16)
    arch = task.plan()
    assert [layer.name for layer in arch.layers] == ["fc1", "relu6_1", "fc2", "relu6_2", "fc3"]
    assert "relu6_1: relu6  <- fc1.out" in repr(arch)


@pytest.mark.parametrize("case", sorted(CASES))
def test_onnx_export_runs_in_onnxruntime_with_the_tasks_logits(case: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    x, y = _data(True, 64)
    layer = CASES[case][0]
    task = (DeepLearningTask().model(seq(conv(4, 3, p=1), layer, maxpool(2), flatten(), fc(8), layer, fc(4)))
            .data(train=(x, y), batch_size=16).total_epochs(1).seed(1))
    task.run(progress=False)
    path = task.export_onnx(tmp_path / "m.onnx")
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"input": x[:16]})[0]
    np.testing.assert_allclose(got, task.predict_logits(x[:16]), rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ builds the CUDA stand-in")
@pytest.mark.parametrize("case", sorted(CASES))
def test_cuda_kernels_give_the_cpus_bytes_on_the_stand_in(case: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import cuda_emulator
    module = cuda_emulator.EmulatedModule(tmp_path)
    layer = CASES[case][0]
    op, x, dy, y, dx = _on_the_grid(layer)
    gy, gdx, n, alpha = np.full_like(x, np.nan), np.full_like(x, np.nan), np.int64(x.size), np.float32(op.alpha(layer.p))
    grid = (max(1, -(-x.size // 7)),), (7,)
    module.get_function(f"rnb_{op.kind}_fwd")(*grid, (x, gy, n, alpha))
    module.get_function(f"rnb_{op.kind}_bwd")(*grid, (dy, x, gdx, n, alpha))
    assert np.array_equal(y, gy, equal_nan=True) and np.array_equal(dx, gdx, equal_nan=True)

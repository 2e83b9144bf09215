"""Models to and from other frameworks (issue 27): safetensors weights read by PyTorch, the inference
graph as ONNX run by onnxruntime, BluePrints from PyTorch modules, each against the task's own logits
on 1,000 real MNIST digits (the embedded set's validation split); and the errors of each."""
from __future__ import annotations

import os
from collections import OrderedDict

import numpy as np
import pytest

from renaissance_nb import (RESNET_3_3, RESNET_3_3_DS, AdamW, BluePrint, BluePrintError, CheckpointError,
                            DeepLearningTask, ExportError, PhaseError, avgpool, block, bn, cbr, conv, datasets,
                            dropout, fc, flatten, gap, gelu, maxpool, relu, seq, silu)
from renaissance_nb.__main__ import main

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
st_torch = pytest.importorskip("safetensors.torch")
nn = torch.nn
torch.set_num_threads(2)

FLAT, IMAGES = datasets.default_mnist(), datasets.default_mnist(layout="image")
VAL_FLAT, VAL_IMAGES = FLAT.val.x[:1000], IMAGES.val.x[:1000]  # 1,000 real digits, never trained on


def mlp_blueprint() -> BluePrint:
    return seq(fc(1024), relu(), fc(512), relu(), fc(256), relu(), fc(10))  # the original's MNIST MLP


def convnet_blueprint() -> BluePrint:
    return seq(conv(8, 3, p=1), bn(), relu(), maxpool(2), conv(16, 3, p=1), gelu(), avgpool(3, s=2, p=1), flatten(),
               dropout(0.2), fc(32), silu(), fc(10))


def resnet_blueprint() -> BluePrint:
    return seq(cbr(8, 3, 1, 1), block(8, RESNET_3_3), block(16, RESNET_3_3_DS), gap(), fc(10))


def mlp_torch() -> nn.Module:
    return nn.Sequential(OrderedDict(fc1=nn.Linear(784, 1024), r1=nn.ReLU(), fc2=nn.Linear(1024, 512), r2=nn.ReLU(),
                                     fc3=nn.Linear(512, 256), r3=nn.ReLU(), fc4=nn.Linear(256, 10)))


def convnet_torch() -> nn.Module:
    return nn.Sequential(OrderedDict(
        conv1=nn.Conv2d(1, 8, 3, 1, 1), bn1=nn.BatchNorm2d(8), r=nn.ReLU(), mp=nn.MaxPool2d(2),
        conv2=nn.Conv2d(8, 16, 3, 1, 1), g=nn.GELU(), ap=nn.AvgPool2d(3, 2, 1), f=nn.Flatten(), d=nn.Dropout(0.2),
        fc1=nn.Linear(16 * 7 * 7, 32), s=nn.SiLU(), fc2=nn.Linear(32, 10)))


class ResNetTorch(nn.Module):
    """resnet_blueprint() written in PyTorch, its modules named as the compiler names the layers."""

    def __init__(self) -> None:
        super().__init__()
        convs = {1: (1, 8, 3, 1), 2: (8, 8, 3, 1), 3: (8, 8, 3, 1), 4: (8, 16, 1, 2), 5: (8, 16, 3, 2), 6: (16, 16, 3, 1)}
        for i, (cin, cout, k, s) in convs.items():
            setattr(self, f"conv{i}", nn.Conv2d(cin, cout, k, s, k // 2, bias=False))
            setattr(self, f"bn{i}", nn.BatchNorm2d(cout))
        self.fc1 = nn.Linear(16, 10)

    def cb(self, i: int, t):  # type: ignore[no-untyped-def]
        return getattr(self, f"bn{i}")(getattr(self, f"conv{i}")(t))

    def forward(self, t):  # type: ignore[no-untyped-def]
        t = torch.relu(self.cb(1, t))
        t = torch.relu(t + self.cb(3, torch.relu(self.cb(2, t))))
        t = torch.relu(self.cb(4, t) + self.cb(6, torch.relu(self.cb(5, t))))
        return self.fc1(t.mean(dim=(2, 3)))


MODELS = {"mlp": (mlp_blueprint, mlp_torch, FLAT, VAL_FLAT), "convnet": (convnet_blueprint, convnet_torch, IMAGES, VAL_IMAGES),
          "resnet": (resnet_blueprint, ResNetTorch, IMAGES, VAL_IMAGES)}


@pytest.fixture(scope="module")
def trained() -> dict[str, DeepLearningTask]:
    """Each model trained briefly (the MLP one epoch on 4,000 digits, the conv nets two on 1,024), so that
    the weights and batch-norm statistics are a trained model's, not the initial ones."""
    out = {}
    for name, (blueprint, _, data, _) in MODELS.items():
        task = DeepLearningTask(name).model(blueprint()).seed(1).optimizer(AdamW().lr(3e-3))
        if name == "mlp":
            task.data(data, batch_size=128).total_epochs(1)
        else:
            task.data(train=(data.train.x[:1024], data.train.y[:1024]), batch_size=64).total_epochs(2)
        task.run(progress=False)
        out[name] = task
    return out


@pytest.mark.parametrize("name", list(MODELS))
def test_onnx_runs_in_onnxruntime_with_the_tasks_logits(trained, tmp_path, name: str) -> None:  # type: ignore[no-untyped-def]
    task, x = trained[name], MODELS[name][3]
    path = task.export_onnx(str(tmp_path / f"{name}.onnx"))
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].version == 17
    assert [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == ["N", *x.shape[1:]]
    assert {n.op_type for n in model.graph.node}.isdisjoint({"Dropout"})
    relus = sum(l.fused_act == "relu" or (l.kind == "act" and l.p["act"] == "relu") for l in task.arch.layers)
    assert [n.op_type for n in model.graph.node].count("Relu") == relus  # once each, fused or not (not visible in values)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    ours = task.predict_logits(x)
    theirs = session.run(["logits"], {"input": x})[0]
    assert np.abs(ours).max() > 1.0  # trained logits, not near-zero ones that would match anything
    assert np.abs(theirs - ours).max() <= 1e-5
    for rows in (1, 7):  # the batch dimension is dynamic
        np.testing.assert_allclose(session.run(None, {"input": x[:rows]})[0], ours[:rows], rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", list(MODELS))
def test_safetensors_weights_load_into_the_same_torch_module(trained, tmp_path, name: str) -> None:  # type: ignore[no-untyped-def]
    task, (_, torch_model, _, x) = trained[name], MODELS[name]
    path = task.save_weights(str(tmp_path / "w.safetensors"))
    weights = st_torch.load_file(path)
    assert all(np.array_equal(weights[k].numpy(), v) for k, v in task.state_dict().items())  # bit for bit
    net = torch_model().eval()
    missing, unexpected = net.load_state_dict(weights, strict=False)
    assert unexpected == [] and all(k.endswith("num_batches_tracked") for k in missing)
    with torch.no_grad():
        theirs = net(torch.from_numpy(x)).numpy()
    ours = task.predict_logits(x)
    assert np.abs(theirs - ours).max() <= 1e-6 * np.abs(ours).max()  # float32 sums in another order
    again = DeepLearningTask().model(MODELS[name][0]()).data(train=(x[:64], MODELS[name][2].val.y[:64]), batch_size=32,
                                                            num_classes=10).compile()
    assert np.array_equal(again.load_weights(path).predict_logits(x), ours)  # and back into a task


FROM_TORCH = {
    "mlp": lambda: nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, 256),
                                 nn.ReLU(), nn.Linear(256, 10)),
    "convnet": lambda: nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                                     nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.GELU()), nn.AvgPool2d(3, 2, 1),
                                     nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(16, 10)),
    "activations": lambda: nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.BatchNorm1d(64), nn.Tanh(),
                                         nn.Linear(64, 32), nn.LeakyReLU(0.2), nn.Linear(32, 32), nn.Sigmoid(),
                                         nn.Identity(), nn.Linear(32, 16), nn.SiLU(), nn.Linear(16, 10)),
}


def torch_with_statistics(make) -> nn.Module:  # type: ignore[no-untyped-def]
    """A module with random weights and batch-norm statistics that are not the initial ones."""
    torch.manual_seed(0)
    net = make()
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                m.running_mean.uniform_(-0.5, 0.5), m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5), m.bias.uniform_(-0.2, 0.2)
    return net.eval()


@pytest.mark.parametrize("name", list(FROM_TORCH))
def test_from_torch_gives_a_task_with_the_modules_logits(tmp_path, name: str) -> None:  # type: ignore[no-untyped-def]
    net = torch_with_statistics(FROM_TORCH[name])
    data = FLAT if name == "mlp" else IMAGES
    x = data.val.x[:1000]
    with torch.no_grad():
        theirs = net(torch.from_numpy(x)).numpy()
    blueprint, state = BluePrint.from_torch(net, weights=True)
    assert BluePrint.from_torch(net) == blueprint
    task = (DeepLearningTask().model(blueprint).data(train=(data.train.x[:64], data.train.y[:64]), batch_size=32)
            .compile())
    task.load_state_dict(state)
    ours = task.predict_logits(x)
    # 1e-5, not 1e-6: torch's own CPU logits of the "activations" net differ between processes (two sets of
    # bytes in four runs, 3.7e-6 of the largest logit apart), while ours are the same bytes every run
    assert np.abs(ours - theirs).max() <= 1e-5 * np.abs(theirs).max()
    # the module's own safetensors file (tensors named by position: '0.weight', '1.running_var'...) loads too
    st_torch.save_file(net.state_dict(), str(tmp_path / "torch.safetensors"))
    fresh = DeepLearningTask().model(blueprint).data(train=(data.train.x[:64], data.train.y[:64]), batch_size=32)
    assert np.array_equal(fresh.compile().load_weights(str(tmp_path / "torch.safetensors")).predict_logits(x), ours)
    path = task.export_onnx(str(tmp_path / "m.onnx"))  # and every activation has its ONNX form
    got = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    assert np.abs(got - ours).max() <= 1e-5


def test_a_torch_resnet_saved_as_safetensors_loads_into_the_blueprint(tmp_path) -> None:  # type: ignore[no-untyped-def]
    net = torch_with_statistics(ResNetTorch)
    x = VAL_IMAGES
    st_torch.save_file(net.state_dict(), str(tmp_path / "r.safetensors"))
    task = (DeepLearningTask().model(resnet_blueprint()).data(train=(IMAGES.train.x[:64], IMAGES.train.y[:64]),
                                                              batch_size=32).compile())
    ours = task.load_weights(str(tmp_path / "r.safetensors")).predict_logits(x)
    with torch.no_grad():
        theirs = net(torch.from_numpy(x)).numpy()
    assert np.abs(ours - theirs).max() <= 1e-6 * np.abs(theirs).max()


@pytest.mark.parametrize("layer, says", [
    (nn.LSTM(4, 4), r"layer #1 is LSTM: it has no counterpart here"),
    (nn.Conv2d(1, 4, (3, 5)), r"layer #1 is Conv2d: kernel_size=\(3, 5\) is not square"),
    (nn.LayerNorm(4, elementwise_affine=False), r"layer #1 is LayerNorm: .*elementwise_affine=False"),
    (nn.AdaptiveAvgPool2d(2), r"layer #1 is AdaptiveAvgPool2d: output_size=2"),
    (nn.BatchNorm2d(4, momentum=None), r"layer #1 is BatchNorm2d: .*momentum=None"),
])
def test_unsupported_layers_are_named_with_their_position(layer, says: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(BluePrintError, match=f"from_torch: {says}.*Fix:"):
        BluePrint.from_torch(nn.Sequential(nn.Conv2d(1, 4, 3), layer))
    with pytest.raises(BluePrintError, match=r"layer #0 of the nn.Sequential at '1' \('1.0'\) is LSTM"):
        BluePrint.from_torch(nn.Sequential(nn.Linear(3, 4), nn.Sequential(nn.LSTM(4, 4))))
    with pytest.raises(BluePrintError, match=r"module=ResNetTorch is invalid; expected a torch.nn.Sequential"):
        BluePrint.from_torch(ResNetTorch())


def small_task() -> DeepLearningTask:
    x, y = FLAT.train.x[:64], FLAT.train.y[:64]
    return DeepLearningTask().model(seq(fc(16), relu(), fc(10))).data(train=(x, y), batch_size=32).compile()


def test_safetensors_files_that_do_not_fit_are_refused_naming_the_tensors(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from safetensors.numpy import save_file
    task = small_task()
    before = task.state_dict()
    good = {k: v.copy() for k, v in before.items()}
    cases = {
        "missing": ({k: v for k, v in good.items() if k != "fc2.bias"}, r"missing \['fc2.bias'\], unexpected \[\]"),
        "extra": ({**good, "fc3.weight": np.zeros((2, 2), np.float32)}, r"missing \[\], unexpected \['fc3.weight'\]"),
        "shape": ({**good, "fc1.weight": np.zeros((16, 783), np.float32)},
                  r"fc1.weight is \(16, 783\), the model needs \(16, 784\)"),
        "positions": ({"0.weight": good["fc1.weight"], "0.bias": good["fc1.bias"]}, r"names its tensors by position"),
    }
    for case, (tensors, says) in cases.items():
        path = str(tmp_path / f"{case}.safetensors")
        save_file(tensors, path)
        with pytest.raises(CheckpointError, match=f"load_weights: .*{case}.safetensors.*{says}"):
            task.load_weights(path)
    (tmp_path / "junk.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(CheckpointError, match="is not a readable safetensors file"):
        task.load_weights(str(tmp_path / "junk.safetensors"))
    with pytest.raises(CheckpointError, match="holds one set of weights; ema=True"):
        task.load_weights(task.save_weights(str(tmp_path / "ok.safetensors")), ema=True)
    assert all(np.array_equal(v, before[k]) for k, v in task.state_dict().items())  # nothing was loaded


def test_paths_that_cannot_be_written_are_errors_and_nothing_is_half_written(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    task = small_task()
    for write, name in ((task.save_weights, "w.safetensors"), (task.export_onnx, "m.onnx")):
        with pytest.raises(ExportError, match=r"the folder .*none.* does not exist"):
            write(str(tmp_path / "none" / name))
        with pytest.raises(ExportError, match=r"path=.* expected a file name \(not a folder\)"):
            write(str(tmp_path))
        if os.geteuid() != 0:  # root writes anywhere
            locked = tmp_path / "locked"
            locked.mkdir(exist_ok=True)
            locked.chmod(0o500)
            with pytest.raises(ExportError, match="cannot write in the folder"):
                write(str(locked / name))
            locked.chmod(0o700)
    (tmp_path / "out").mkdir()
    target = tmp_path / "out" / "kept.onnx"
    target.write_bytes(b"the previous file")

    def fail(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "fsync", fail)  # the disk fills up after part of the file was written
    with pytest.raises(OSError, match="No space left"):
        task.export_onnx(str(target))
    assert target.read_bytes() == b"the previous file" and os.listdir(tmp_path / "out") == ["kept.onnx"]


def test_exports_need_a_compiled_task() -> None:
    task = DeepLearningTask().model(seq(fc(10))).data(FLAT)
    for call in (task.save_weights, task.export_onnx):
        with pytest.raises(PhaseError, match="state_dict"):
            call("x.onnx")


def test_cli_exports_a_checkpoint_without_its_data(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    task = small_task()
    ckpt = task.save(str(tmp_path / "run.npz"))
    onnx_path, st_path = str(tmp_path / "m.onnx"), str(tmp_path / "w.safetensors")
    assert main(["export", ckpt, "--onnx", onnx_path, "--safetensors", st_path]) == 0
    out = capsys.readouterr().out
    assert f"wrote {onnx_path} (onnx" in out and f"wrote {st_path} (safetensors" in out
    x = VAL_FLAT
    got = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    assert np.abs(got - task.predict_logits(x)).max() <= 1e-5
    assert all(np.array_equal(st_torch.load_file(st_path)[k].numpy(), v) for k, v in task.state_dict().items())
    assert main(["export", str(tmp_path / "none.npz"), "--onnx", onnx_path]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "no checkpoint file" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as info:
        main(["export", ckpt])
    assert info.value.code == 2 and "--onnx PATH and/or --safetensors PATH" in capsys.readouterr().err

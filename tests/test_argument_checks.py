"""Argument checks of the builders, settings and data loaders.

Each bad value must raise the library's own error (not OverflowError or pathlib's
TypeError) naming the argument and the value; NumPy scalars count as the Python
numbers they hold and are stored as Python ints and floats.
"""
from __future__ import annotations

import dataclasses
import re
import importlib
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from renaissance_nb import (SGD, Adam, AdamW, BluePrintError, ConfigError, ConstantLR, CosineAnnealingLR,
                            CrossEntropyLoss, DataError, DeepLearningTask, ExponentialLR, MultiStepLR, PolynomialLR,
                            StepLR, avgpool, block, bn, conv, datasets, dropout, fc, leaky_relu, maxpool, relu, repeat,
                            seq)

HUGE = 10**400  # a valid Python int that no float can hold


def raises(exc: type[Exception], call: Callable[[], Any], *words: str) -> str:
    """Run ``call``, expect ``exc`` with every word and a fix in its message; return the message."""
    with pytest.raises(exc) as info:
        call()
    msg = str(info.value)
    for w in words:
        assert w in msg, (w, msg)
    assert "Fix:" in msg, msg
    return msg


# ---- 1. pooling padding -------------------------------------------------------------------------------
@pytest.mark.parametrize("make,kind,p,k", [
    (lambda: maxpool(2, p=2), "maxpool", 2, 2),
    (lambda: avgpool(3, p=2), "avgpool", 2, 3),
    (lambda: maxpool(3, s=1, p=5), "maxpool", 5, 3),
])
def test_pool_padding_over_half_the_kernel_is_refused(make, kind, p, k) -> None:  # type: ignore[no-untyped-def]
    msg = raises(BluePrintError, make, f"{kind}: p={p}", "at most half the kernel size k (as in PyTorch)",
                 f"k={k}")
    assert f"p={k // 2}" in msg.split("Fix:")[1]


def test_pool_padding_up_to_half_the_kernel_is_accepted() -> None:
    assert maxpool(2, p=1).p == {"k": 2, "p": 1, "s": 2}
    assert avgpool(3, s=1, p=1).p == {"k": 3, "p": 1, "s": 1}


# ---- 2. ints too large for a float ---------------------------------------------------------------------
@pytest.mark.parametrize("exc,make,name", [
    (ConfigError, lambda: AdamW().lr(HUGE), "lr"),
    (ConfigError, lambda: AdamW(weight_decay=HUGE), "weight_decay"),
    (ConfigError, lambda: SGD().momentum(HUGE), "momentum"),
    (ConfigError, lambda: CrossEntropyLoss().label_smoothing(HUGE), "label_smoothing"),
    (BluePrintError, lambda: dropout(HUGE), "p"),
    (BluePrintError, lambda: leaky_relu(HUGE), "negative_slope"),
    (BluePrintError, lambda: bn(eps=HUGE), "eps"),
    (BluePrintError, lambda: bn(momentum=HUGE), "momentum"),
    (ConfigError, lambda: CosineAnnealingLR().base_lr(HUGE), "base_lr"),
    (ConfigError, lambda: StepLR().gamma(HUGE), "gamma"),
    (BluePrintError, lambda: fc(HUGE), "out"),
    (BluePrintError, lambda: conv(8, 3, p=HUGE), "p"),
])
def test_huge_ints_are_out_of_range_not_overflow(exc, make, name) -> None:  # type: ignore[no-untyped-def]
    raises(exc, make, f"{name}={str(HUGE)[:20]}", "expected")


def test_layer_sizes_stop_at_the_largest_32_bit_int() -> None:
    assert fc(2**31 - 1).p["out"] == 2**31 - 1
    raises(BluePrintError, lambda: fc(2**31), "fc: out=2147483648", "a positive int up to 2147483647")
    raises(BluePrintError, lambda: maxpool(2**31), "maxpool: k=2147483648", "up to 2147483647")


# ---- 3. NumPy scalars ------------------------------------------------------------------------------------
def test_numpy_scalars_are_accepted_and_stored_as_python_numbers() -> None:
    layer = fc(np.int64(10))
    assert layer == fc(10) and type(layer.p["out"]) is int
    assert conv(np.int32(4), np.int64(3), s=np.uint8(1), p=np.int16(1)) == conv(4, 3, s=1, p=1)
    assert maxpool(np.int64(2)) == maxpool(2) and avgpool(np.int64(3), p=np.int64(1)) == avgpool(3, p=1)
    assert dropout(np.float32(0.25)) == dropout(0.25) and type(dropout(np.float32(0.25)).p["p"]) is float
    assert leaky_relu(np.float64(0.125)) == leaky_relu(0.125)
    assert bn(momentum=np.float32(0.5), eps=np.float64(1e-5)) == bn(momentum=0.5, eps=1e-5)
    assert repeat(fc(3), np.int64(2)) == repeat(fc(3), 2)

    opt = AdamW().lr(np.float32(1e-3))
    assert type(opt.lr_) is float and opt.lr_ == float(np.float32(1e-3))
    adam = Adam(lr=np.float64(0.01), betas=(np.float32(0.5), np.float64(0.99)), eps=np.float64(1e-8))
    assert adam == Adam(lr=0.01, betas=(0.5, 0.99), eps=1e-8)
    assert all(type(v) is float for v in (adam.lr_, *adam.betas_, adam.eps_, adam.weight_decay_))
    sgd = SGD().lr(np.int64(1)).momentum(np.float32(0.5)).weight_decay(np.float16(0.25))
    assert sgd == SGD(lr=1.0, momentum=0.5, weight_decay=0.25)
    assert all(type(v) is float for v in (sgd.lr_, sgd.momentum_, sgd.weight_decay_))
    loss = CrossEntropyLoss().label_smoothing(np.float32(0.125))
    assert loss == CrossEntropyLoss(label_smoothing=0.125) and type(loss.label_smoothing_) is float
    sched = CosineAnnealingLR(base_lr=np.float32(0.5), warmup=np.int64(1))
    assert sched == CosineAnnealingLR(base_lr=0.5, warmup=1) and type(sched.base_lr_) is float


@pytest.mark.parametrize("exc,make,name", [
    (BluePrintError, lambda: fc(np.bool_(True)), "out"),
    (BluePrintError, lambda: fc(True), "out"),
    (BluePrintError, lambda: dropout(np.bool_(False)), "p"),
    (ConfigError, lambda: AdamW().lr(np.bool_(True)), "lr"),
    (ConfigError, lambda: AdamW().lr(True), "lr"),
    (ConfigError, lambda: CrossEntropyLoss().label_smoothing(np.bool_(False)), "label_smoothing"),
    (ConfigError, lambda: AdamW().lr(np.float32("nan")), "lr"),
])
def test_bools_and_nan_scalars_are_still_refused(exc, make, name) -> None:  # type: ignore[no-untyped-def]
    raises(exc, make, f"{name}=", "expected")


def _tiny_task(n: Callable[[Any], Any], f: Callable[[Any], Any]) -> DeepLearningTask:
    """A small MLP whose every number passes through ``n`` (ints) or ``f`` (floats)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((32, 6)).astype(np.float32)
    y = np.arange(32) % 3
    model = seq(fc(n(8)), leaky_relu(f(0.125)), dropout(f(0.25)), fc(n(3)))
    return (DeepLearningTask("numpy-args").model(model).data(train=(x, y), batch_size=8)
            .loss(CrossEntropyLoss().label_smoothing(f(0.125)))
            .optimizer(AdamW().lr(f(0.0625)).betas(f(0.5), f(0.75)).weight_decay(f(0.03125)))
            .scheduler(CosineAnnealingLR(base_lr=f(0.0625), warmup=n(1)))
            .total_epochs(2))


def test_task_built_from_numpy_scalars_trains_like_python_numbers() -> None:
    a = _tiny_task(int, float)
    b = _tiny_task(np.int64, np.float32)
    a.run(progress=False)
    b.run(progress=False)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    assert {k: v.tobytes() for k, v in sa.items()} == {k: v.tobytes() for k, v in sb.items()}


# ---- 4. unknown keywords of optimizers and losses -------------------------------------------------------
@pytest.mark.parametrize("cls,bad,names", [
    (Adam, "learning_rate", "lr, betas, eps, weight_decay, maximize"),
    (AdamW, "momentum", "lr, betas, eps, weight_decay, maximize"),
    (SGD, "mom", "lr, momentum, dampening, weight_decay, nesterov, maximize"),
    (CrossEntropyLoss, "smoothing", "label_smoothing"),
    (CosineAnnealingLR, "foo", "base_lr, eta_min, warmup, warmup_start_factor"),
])
def test_unknown_keyword_lists_the_valid_settings(cls, bad, names) -> None:  # type: ignore[no-untyped-def]
    raises(ConfigError, lambda: cls(**{bad: 1}), f"{cls.__name__}(): {bad}=1", f"one of the settings {names}")


def test_every_setting_class_uses_the_checked_constructor() -> None:
    """A subclass declared without init=False would get the dataclass's __init__ and its bare TypeError."""
    from renaissance_nb.train.settings import Settings

    def subclasses(c: type) -> list[type]:
        return [c] + [d for s in c.__subclasses__() for d in subclasses(s)]
    classes = [c for c in subclasses(Settings) if dataclasses.is_dataclass(c) and dataclasses.fields(c)]
    assert {Adam, AdamW, SGD, CrossEntropyLoss, CosineAnnealingLR, StepLR} <= set(classes)
    assert [c for c in classes if c.__init__ is not Settings.__init__] == []


@pytest.mark.parametrize("cls", [Adam, AdamW, SGD, CrossEntropyLoss, CosineAnnealingLR])
def test_positional_setting_is_a_config_error(cls) -> None:  # type: ignore[no-untyped-def]
    raises(ConfigError, lambda: cls(0.1), "positional argument=0.1", "by name")


def test_optimizers_and_losses_take_their_setting_names_like_schedulers() -> None:
    assert Adam(lr=1e-2) == Adam().lr(1e-2)
    assert AdamW(lr=0.1, betas=[0.8, 0.9], weight_decay=0.0) == AdamW().lr(0.1).betas(0.8, 0.9).weight_decay(0)
    assert SGD(lr=0.1, momentum=0.9, nesterov=True) == SGD().lr(0.1).momentum(0.9).nesterov()
    assert CrossEntropyLoss(label_smoothing=0.1) == CrossEntropyLoss().label_smoothing(0.1)
    assert type(AdamW(lr=0.1)) is AdamW and AdamW().weight_decay_ == 1e-2
    # every setting is checked the same way whichever path sets it
    raises(ConfigError, lambda: Adam(lr=-1), "Adam: lr=-1")
    raises(ConfigError, lambda: SGD(nesterov=True), "nesterov=True", "momentum")
    assert AdamW(maximize=True) == AdamW().maximize() and SGD(maximize=np.True_).maximize_ is True
    raises(ConfigError, lambda: Adam().maximize(1), "Adam: maximize=1", "True or False")
    raises(ConfigError, lambda: SGD(nesterov="yes"), "SGD: nesterov='yes'", "True or False")
    # dataclasses.replace (the field names) still works, with the same checks
    assert dataclasses.replace(AdamW(), lr_=0.5) == AdamW(lr=0.5)
    raises(ConfigError, lambda: dataclasses.replace(AdamW(), lr_=-0.5), "lr=-0.5")
    for s in (Adam(), AdamW(), SGD(), CrossEntropyLoss(), MultiStepLR(milestones=[1]), ExponentialLR(),
              ConstantLR(), PolynomialLR(), StepLR()):
        assert type(s)(**s.settings()) == s


# ---- 5. data set paths and flags ---------------------------------------------------------------------
@pytest.mark.parametrize("call,where,name,value", [
    (lambda: datasets.mnist(None), "mnist", "root", "None"),
    (lambda: datasets.mnist(5), "mnist", "root", "5"),
    (lambda: datasets.cifar10(5), "cifar10", "root", "5"),
    (lambda: datasets.cifar10(None), "cifar10", "root", "None"),
    (lambda: datasets.read_idx(None), "read_idx", "path", "None"),
    (lambda: datasets.read_idx(b"train-images"), "read_idx", "path", "b'train-images'"),
    (lambda: datasets.download_mnist(3.5), "download_mnist", "root", "3.5"),
    (lambda: datasets.download_cifar10([]), "download_cifar10", "root", "[]"),
])
def test_dataset_paths_must_be_str_or_pathlike(call, where, name, value) -> None:  # type: ignore[no-untyped-def]
    raises(DataError, call, f"{where}: {name}={value}", "a str or os.PathLike path")


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any download attempt fails the test."""
    def fail(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a download was attempted")
    for module in ("renaissance_nb.data.mnist", "renaissance_nb.data.cifar"):  # the package's names are functions
        monkeypatch.setattr(importlib.import_module(module), "_fetch", fail)


@pytest.mark.parametrize("call,where,name", [
    (lambda root: datasets.mnist(root, download="no"), "mnist", "download"),
    (lambda root: datasets.mnist(root, download=1), "mnist", "download"),
    (lambda root: datasets.mnist(root, normalize="no"), "mnist", "normalize"),
    (lambda root: datasets.mnist(root, verify="yes"), "mnist", "verify"),
    (lambda root: datasets.cifar10(root, download="no"), "cifar10", "download"),
])
def test_dataset_flags_must_be_bools(no_network, tmp_path: Path, call, where, name) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path / "missing"
    raises(DataError, lambda: call(root), f"{where}: {name}=", "True or False")
    assert not root.exists()


def test_numpy_bool_download_flag_is_a_bool(no_network, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    raises(DataError, lambda: datasets.mnist(tmp_path, download=np.bool_(False)), "mnist: root=", "missing")


def test_task_settings_take_numpy_scalars_too() -> None:
    """ema, train_resolution, total_epochs and default_mnist read numbers like the builders do."""
    from renaissance_nb import DeepLearningTask, datasets

    t = (DeepLearningTask().ema(np.float64(0.9)).total_epochs(np.int64(3))
         .train_resolution(np.int64(6), (np.int32(6), 8), boundary_epoch=np.int64(1)))
    assert t.settings["ema"] == 0.9 and type(t.settings["ema"]) is float
    assert t.settings["train_resolution"] == ((6, 6), (6, 8), 1) and t.settings["total_epochs"] == 3
    assert len(datasets.default_mnist(val_fraction=np.float64(0.1)).val) == 500
    with pytest.raises(ConfigError, match=r"begin=\(6, True\)"):
        DeepLearningTask().train_resolution((6, True), 8, 1)
    with pytest.raises(DataError, match="normalize='no'"):
        datasets.default_mnist(normalize="no")


def test_from_dict_rebuilds_through_the_builders() -> None:
    """A model description read from a file (a checkpoint's spec) gets the builders' checks."""
    from renaissance_nb import BluePrint, add2, gap, identity, relu

    model = seq(conv(8, 3, 1, 1), bn(), relu(), maxpool(2), repeat(seq(fc(4), relu()), 2), add2(identity(), relu()),
                gap(), fc(3))
    assert BluePrint.from_dict(model.to_dict()) == model
    for bad, said in [({"layer": "fc", "params": {"out": 0}}, "fc: out=0"),
                      ({"layer": "maxpool", "params": {"k": 2, "p": 2, "s": 2}}, "maxpool: p=2"),
                      ({"layer": "evil", "params": {}}, "layer 'evil'"),
                      ({"layer": "fc", "params": {"outt": 3}}, "fc: outt=3 is invalid; expected one of the names: out, bias"),
                      ({"repeat": {"layer": "relu", "params": {}}, "n": 0}, "n=0"),
                      (5, "5 is not a BluePrint description")]:
        with pytest.raises(BluePrintError, match=re.escape(said)):
            BluePrint.from_dict(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("call, said", [
    (lambda: conv(8, 3, padding=1), "conv: padding=1 is invalid; expected one of the names: out, k, s, p, bias, "
                                    "groups. Fix: write p= (PyTorch's padding=)"),
    (lambda: conv(8, kernel_size=3), "conv: kernel_size=3 is invalid; expected one of the names: out, k, s, p, bias, "
                                     "groups. Fix: write k= (PyTorch's kernel_size=)"),
    (lambda: fc(out_features=10), "Fix: write out= (PyTorch's out_features=)"),
    (lambda: relu(inplace=True), "relu: inplace=True is invalid; expected no arguments (relu() takes no keywords). "
                                 "Fix: drop inplace=: every layer writes its own region of the arena"),
    (lambda: relu(5), "relu: too many positional arguments (it takes no arguments). Fix: call relu() with no arguments"),
    (lambda: seq(layers=[relu()]), "seq: layers=[relu()] is invalid; expected only layers, by position (seq() takes "
                                   "no keywords). Fix: remove layers= and pass layers by position"),
    (lambda: bn(num_features=16), "Fix: drop num_features=: channels are read from the input"),
    (lambda: maxpool(2, stride=2), "Fix: write s= (PyTorch's stride=)"),
    (lambda: fc(10, True, 3), "fc: too many positional arguments (it takes out, bias)"),
    (lambda: dropout(q=0.1), "dropout: q=0.1 is invalid; expected one of the names: p. Fix: remove q="),
    # a PyTorch name is translated only where this builder takes it with the same meaning
    (lambda: dropout(padding=1), "dropout: padding=1 is invalid; expected one of the names: p. Fix: remove padding="),
    (lambda: block(8, stride=2), "block: stride=2 is invalid; expected one of the names: out, kind. Fix: remove"),
    (lambda: bn(out_channels=8), "bn: out_channels=8 is invalid; expected one of the names: momentum, eps. Fix: remove"),
    (lambda: seq(relu(), name="x"), "seq: name='x' is invalid"),
])
def test_layer_builders_name_their_arguments_and_pytorch_spellings(call, said) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(BluePrintError, match=re.escape(said)):
        call()


def test_checked_layer_builders_keep_their_signatures() -> None:
    import inspect

    assert list(inspect.signature(conv).parameters) == ["out", "k", "s", "p", "bias", "groups"]
    assert conv(8, 3, p=1) == conv(out=8, k=3, s=1, p=1, bias=True)


def test_pytorch_habits_get_errors_that_say_what_to_write() -> None:
    from renaissance_nb import DeepLearningTask, conv, fc, maxpool
    raises(BluePrintError, lambda: fc(784, 10), "bias=10", "write fc(10) for PyTorch's nn.Linear(784, 10)")
    raises(BluePrintError, lambda: conv(16, 0), "k=0", "e.g. conv(64, 3)")  # a hint that itself works
    raises(BluePrintError, lambda: conv(16, 3, -1), "s=-1", "e.g. conv(64, 3, s=2)")
    raises(BluePrintError, lambda: maxpool(0), "k=0", "e.g. maxpool(2)")
    conv(64, 3), conv(64, 3, s=2), maxpool(2), fc(10)  # noqa: B018 - the hints are valid calls

    class CrossEntropyLoss:  # what torch.nn.CrossEntropyLoss() looks like to the task: same name, other module
        __module__ = "torch.nn.modules.loss"
    raises(ConfigError, lambda: DeepLearningTask().loss(CrossEntropyLoss()), "renaissance_nb's CrossEntropyLoss()",
           "this is torch.nn.modules.loss.CrossEntropyLoss")
    t = DeepLearningTask().scheduler(CosineAnnealingLR()).scheduler(None)  # None: a constant lr, as by default
    assert t.settings["scheduler"] is None

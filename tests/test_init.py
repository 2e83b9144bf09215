"""Weight initialisation, task.init(): torch.nn.init's schemes with every random number from Philox's INIT stream.

Each scheme's weights are torch.nn.init's own function run on Philox's numbers (its std, bound and QR read
by standing in for Tensor.uniform_/normal_), follow their distribution (moments within what the sample
size allows), repeat byte for byte per seed, also under another CPU's code paths, and the default is the
init the runner always had."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import train_in_processes
from renaissance_nb import (ConfigError, DeepLearningTask, PhaseError, TaskConfig, bn, conv, datasets, fc, flatten,
                            relu, seq)
from renaissance_nb.config_checks import NONLINEARITIES
from renaissance_nb.runtime.init import calculate_gain
from renaissance_nb.train.rng import Philox, StreamId
from test_checkpoint import _edited, _v1_data

RNG = np.random.default_rng(0)
X = RNG.standard_normal((64, 512)).astype(np.float32)
Y = RNG.integers(0, 5, 64)
IMG = RNG.standard_normal((8, 32, 5, 5)).astype(np.float32)
IMG_Y = RNG.integers(0, 4, 8)
INIT = int(StreamId.INIT)

CASES = [  # (scheme, keywords, torch's std from (fan_in, fan_out), distribution)
    ("kaiming_uniform", {}, lambda fi, fo: 1 / math.sqrt(3 * fi), "uniform"),
    ("kaiming_uniform", {"a": 0}, lambda fi, fo: math.sqrt(2 / fi), "uniform"),
    ("kaiming_uniform", {"mode": "fan_out", "nonlinearity": "relu"}, lambda fi, fo: math.sqrt(2 / fo), "uniform"),
    ("kaiming_normal", {}, lambda fi, fo: math.sqrt(2 / fi), "normal"),
    ("kaiming_normal", {"mode": "fan_out", "nonlinearity": "relu"}, lambda fi, fo: math.sqrt(2 / fo), "normal"),
    ("kaiming_normal", {"a": 0.2}, lambda fi, fo: torch.nn.init.calculate_gain("leaky_relu", 0.2) / math.sqrt(fi),
     "normal"),
    ("kaiming_normal", {"nonlinearity": "tanh"}, lambda fi, fo: 5 / 3 / math.sqrt(fi), "normal"),
    ("xavier_uniform", {}, lambda fi, fo: math.sqrt(2 / (fi + fo)), "uniform"),
    ("xavier_normal", {"gain": 2.0}, lambda fi, fo: 2 * math.sqrt(2 / (fi + fo)), "normal"),
    ("orthogonal", {}, None, "orthogonal"),
    ("orthogonal", {"gain": 1.5}, None, "orthogonal"),
    ("zeros", {}, None, "zeros"),
]
IDS = [s + "".join(f"-{k}={v}" for k, v in kw.items()) for s, kw, _, _ in CASES]


def mlp(scheme: str | None = None, seed: int = 0, **kw) -> DeepLearningTask:  # type: ignore[no-untyped-def]
    t = DeepLearningTask("init").model(seq(fc(256), relu(), fc(5))).data(train=(X, Y), batch_size=16).seed(seed)
    return t if scheme is None else t.init(scheme, **kw)


def cnn(scheme: str | None = None, seed: int = 0, **kw) -> DeepLearningTask:  # type: ignore[no-untyped-def]
    t = (DeepLearningTask("init-cnn").model(seq(conv(128, 3), relu(), flatten(), fc(4)))
         .data(train=(IMG, IMG_Y), batch_size=4).seed(seed))
    return t if scheme is None else t.init(scheme, **kw)


def torch_fans(shape: tuple[int, ...]) -> tuple[int, int]:
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def to_torch_layout(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Numbers drawn in the arena's order, (out, kh, kw, in) for a conv weight, as torch's (out, in, kh, kw)."""
    if len(shape) == 4:
        return a.reshape(shape[0], shape[2], shape[3], shape[1]).transpose(0, 3, 1, 2)
    return a.reshape(shape)


def torch_reference(monkeypatch, scheme: str, kw: dict, shape: tuple[int, ...], seed: int, offset: int) -> np.ndarray:
    """torch.nn.init.<scheme>_ on a float64 tensor of torch's shape, its random numbers Philox's INIT stream
    from ``offset`` (uniform_(lo, hi) takes (2u - 1) * hi, normal_ mean + std * z), cast to float32."""
    def uniform_(self, lo, hi, generator=None):  # type: ignore[no-untyped-def]
        assert lo == -hi
        u = Philox(seed).uniform(self.numel(), INIT, offset).astype(np.float64)
        self.copy_(torch.from_numpy(np.ascontiguousarray(to_torch_layout((2 * u - 1) * hi, tuple(self.shape)))))
        return self

    def normal_(self, mean=0.0, std=1.0, generator=None):  # type: ignore[no-untyped-def]
        z = Philox(seed).normal(self.numel(), INIT, offset).astype(np.float64) * std + mean
        self.copy_(torch.from_numpy(np.ascontiguousarray(to_torch_layout(z, tuple(self.shape)))))
        return self

    monkeypatch.setattr(torch.Tensor, "uniform_", uniform_)
    monkeypatch.setattr(torch.Tensor, "normal_", normal_)
    w = torch.empty(shape, dtype=torch.float64)
    if scheme == "kaiming_uniform":
        kw = {"a": math.sqrt(5), **kw}  # nn.Linear's and nn.Conv2d's reset_parameters
    getattr(torch.nn.init, scheme + "_")(w, **kw)
    monkeypatch.undo()
    return w.numpy().astype(np.float32)


@pytest.mark.parametrize("scheme, kw, std, dist", CASES, ids=IDS)
@pytest.mark.parametrize("layer", ["fc1", "conv1"])
def test_each_scheme_is_torchs_function_on_philox_numbers(monkeypatch, scheme, kw, std, dist, layer) -> None:  # type: ignore[no-untyped-def]
    """The first layer's weight against torch.nn.init's function given the same random numbers: bytes equal
    (the same std or bound, in torch's order of operations), orthogonal's QR (torch's LAPACK, ours NumPy's)
    to float32 rounding. kaiming_uniform's bias draws first; the other schemes' biases draw nothing."""
    task = (mlp if layer == "fc1" else cnn)(scheme, seed=5, **kw).compile()
    got = task.state_dict()[f"{layer}.weight"]
    offset = Philox.blocks_needed(got.shape[0]) if scheme == "kaiming_uniform" else 0
    want = torch_reference(monkeypatch, scheme, kw, got.shape, 5, offset)
    if dist == "orthogonal" or (scheme == "kaiming_uniform" and not kw):  # torch's a=sqrt(5) bound: 1/sqrt(fan_in)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-7)               # to the last float64 bit
    else:
        assert got.tobytes() == want.tobytes()


def _moments(w: np.ndarray, std: float, dist: str) -> None:
    """Mean, std and the share within one std against the distribution, each to six standard errors
    of its estimate from n samples (uniform: var(s) = 0.2 std^2 / n; normal: 0.5 std^2 / n)."""
    n = w.size
    x = w.astype(np.float64).ravel()
    assert abs(x.mean()) < 6 * std / math.sqrt(n)
    rel = 0.2 if dist == "uniform" else 0.5
    assert abs(x.std() / std - 1) < 6 * math.sqrt(rel / n)
    p = 1 / math.sqrt(3) if dist == "uniform" else math.erf(1 / math.sqrt(2))
    assert abs(np.mean(np.abs(x) < std) - p) < 6 * math.sqrt(p * (1 - p) / n)
    if dist == "uniform":
        bound = math.sqrt(3) * std
        assert np.abs(x).max() <= bound * (1 + 1e-7) and np.abs(x).max() > bound * (1 - 40 / n)


@pytest.mark.parametrize("scheme, kw, std, dist", CASES, ids=IDS)
def test_weights_follow_the_distribution_and_biases_the_rule(scheme, kw, std, dist) -> None:  # type: ignore[no-untyped-def]
    """An fc weight of 131,072 numbers and a conv weight of 36,864 (fans counted on torch's (out, in, kh, kw))."""
    for task, layer in ((mlp(scheme, **kw), "fc1"), (cnn(scheme, **kw), "conv1")):
        sd = task.compile().state_dict()
        w, b = sd[f"{layer}.weight"], sd[f"{layer}.bias"]
        fan_in, fan_out = torch_fans(w.shape)
        if dist in ("uniform", "normal"):
            _moments(w, std(fan_in, fan_out), dist)
        elif dist == "orthogonal":  # (semi-)orthogonal rows or columns of the (out, in * kh * kw) matrix
            m = w.reshape(w.shape[0], -1).astype(np.float64) / kw.get("gain", 1.0)
            gram = m @ m.T if m.shape[0] <= m.shape[1] else m.T @ m
            assert np.abs(gram - np.eye(gram.shape[0])).max() < 1e-5
        else:
            assert not w.any()
        if scheme == "kaiming_uniform":  # reset_parameters' bias, whatever a= and nonlinearity= say
            assert np.abs(b).max() <= 1 / math.sqrt(fan_in) and np.abs(b).max() > 0.9 / math.sqrt(fan_in)
        else:
            assert not b.any()


def test_the_default_is_the_runners_init_as_it_always_was() -> None:
    """No init() call, init() and init('kaiming_uniform') give the same arena; each fc and conv tensor, bias
    then weight in plan order, is U(-1/sqrt(fan_in), 1/sqrt(fan_in)) from one running INIT offset: the
    NumPy reference of the runner's init before init() existed."""
    for make in (mlp, cnn):
        plain = make().compile()
        for same in (make("kaiming_uniform").compile(), make().init().compile()):
            assert same.arena.bytes.tobytes() == plain.arena.bytes.tobytes()
        sd, offset = plain.state_dict(), 0
        for p in plain.compiled.params:
            shape = sd[p.name].shape
            n = math.prod(shape)
            u = Philox(0).uniform(n, INIT, offset)
            want = ((2.0 * u.astype(np.float64) - 1.0) / math.sqrt(p.fan_in)).astype(np.float32)
            assert sd[p.name].tobytes() == np.ascontiguousarray(to_torch_layout(want, shape)).tobytes(), p.name
            offset += Philox.blocks_needed(n)


@pytest.mark.parametrize("scheme, kw", [(s, kw) for s, kw, _, _ in CASES], ids=IDS)
def test_a_seed_gives_the_same_bytes_and_another_seed_others(scheme, kw) -> None:  # type: ignore[no-untyped-def]
    a, b = (cnn(scheme, seed=11, **kw).compile().state_dict() for _ in range(2))
    assert all(a[k].tobytes() == b[k].tobytes() for k in a)
    if scheme != "zeros":
        c = cnn(scheme, seed=12, **kw).compile().state_dict()
        assert all(not np.array_equal(a[k], c[k]) for k in ("conv1.weight", "fc1.weight"))


_WEIGHTS = """
import sys, numpy as np, renaissance_nb as rnb
rng = np.random.default_rng(0)
x, y = rng.standard_normal((32, 300)).astype(np.float32), rng.integers(0, 3, 32)
out = {}
for scheme in ("kaiming_normal", "xavier_uniform", "orthogonal"):
    t = (rnb.DeepLearningTask().model(rnb.seq(rnb.fc(400), rnb.relu(), rnb.fc(3))).data(train=(x, y), batch_size=8)
         .seed(3).init(scheme).compile())
    out.update({f"{scheme}__{k}": v for k, v in t.state_dict().items()})
np.savez(sys.argv[1], **out)
"""


def _other_cpu() -> dict[str, str]:
    """Another CPU's code paths on this one: OpenBLAS's kernels for an older core on one thread (its QR's
    float64 bits differ), and NumPy's float64 log without AVX-512 where this CPU has it (np.log's bits differ)."""
    env = {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_NUM_THREADS": "1"}
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    except ImportError:
        return env
    off = [f for f in __cpu_dispatch__ if f.startswith(("X86_V4", "AVX512")) and __cpu_features__.get(f)]
    return {**env, "NPY_DISABLE_CPU_FEATURES": " ".join(off)} if off else env


def test_the_same_bytes_under_another_cpus_blas_and_simd_paths(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The Philox numbers are exact integer arithmetic; Box-Muller's log and the QR are float64, rounded once
    to float32, so their last-bit differences between CPUs do not reach the weights of these layers."""
    root = str(Path(__file__).resolve().parent.parent)
    path = {"PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    runs = train_in_processes(tmp_path, _WEIGHTS, {"here": path, "other": {**path, **_other_cpu()}})
    assert sorted(runs["here"]) == sorted(runs["other"]) and len(runs["here"]) == 12
    for k, v in runs["here"].items():
        assert v.tobytes() == runs["other"][k].tobytes(), k


def test_batch_norm_and_ema_start_as_torchs_whatever_the_scheme() -> None:
    t = (DeepLearningTask().model(seq(conv(8, 3), bn(), relu(), flatten(), fc(4)))
         .data(train=(IMG, IMG_Y), batch_size=4).ema(0.9).init("orthogonal").compile())
    sd, ema = t.state_dict(), t.state_dict(ema=True)
    assert (sd["bn1.weight"] == 1).all() and not sd["bn1.bias"].any()
    assert not sd["bn1.running_mean"].any() and (sd["bn1.running_var"] == 1).all()
    assert all(sd[k].tobytes() == ema[k].tobytes() for k in sd)


def test_calculate_gain_is_torchs() -> None:
    for name in NONLINEARITIES:
        for a in (0.0, 0.01, 0.2, math.sqrt(5)):
            assert calculate_gain(name, a) == torch.nn.init.calculate_gain(name, a if name == "leaky_relu" else None)


def test_xavier_uniform_trains_an_mlp_and_zeros_never_break_symmetry() -> None:
    """One epoch of MNIST-5k; zeros (torch.nn.init.zeros_) leaves every hidden unit the same: with both
    layers zero no weight gets a gradient, only the output bias learns the class frequencies."""
    data = datasets.default_mnist()
    xavier = DeepLearningTask().model(seq(fc(128), relu(), fc(10))).data(data, batch_size=64).init("xavier_uniform")
    assert xavier.run(progress=False).history[-1].val_top1 > 0.85
    zeros = DeepLearningTask().model(seq(fc(128), relu(), fc(10))).data(data, batch_size=64).init("zeros")
    assert zeros.run(progress=False).history[-1].val_top1 < 0.2
    sd = zeros.state_dict()
    assert not sd["fc1.weight"].any() and not sd["fc2.weight"].any() and sd["fc2.bias"].any()


@pytest.mark.parametrize("args, kw, match", [
    (("xavier",), {}, r"init: scheme='xavier' is invalid; expected one of 'kaiming_uniform', .*'zeros'\. Fix:"),
    (("xavier_uniform_",), {}, r"scheme='xavier_uniform_'.*Fix: pass the name, init\('xavier_uniform'\)"),
    ((torch.nn.init.orthogonal_,), {}, r"scheme=.*Fix: pass the name, init\('orthogonal'\)"),
    (("xavier_uniform",), {"a": 1}, r"init: a=1 is invalid; expected no a= with 'xavier_uniform' \(it takes gain=\)"),
    (("kaiming_normal",), {"gain": 2}, r"gain=2 is invalid; expected no gain= with 'kaiming_normal'.*Fix: remove "),
    (("zeros",), {"gain": 2}, r"expected no gain= with 'zeros' \(it takes no keywords\)"),
    (("kaiming_normal",), {"a": -1}, r"a=-1 is invalid; expected a number in \[0, 1e6\]"),
    (("kaiming_uniform",), {"a": 1e200}, r"a=1e\+200 is invalid; expected a number in \[0, 1e6\]"),  # gain overflowed
    (("kaiming_normal",), {"a": True}, r"a=True is invalid"),
    (("orthogonal",), {"gain": float("nan")}, r"gain=nan is invalid; expected a number in \(0, 1e6\]"),
    (("orthogonal",), {"gain": 0}, r"gain=0 is invalid"),
    (("kaiming_normal",), {"mode": "in"}, r"mode='in' is invalid; expected one of 'fan_in', 'fan_out'"),
    (("kaiming_normal",), {"nonlinearity": "gelu"}, r"nonlinearity='gelu' is invalid.*Fix: .*'relu' is the usual"),
    (("kaiming_uniform",), {"a": 0.1, "nonlinearity": "relu"}, r"a=0.1 is invalid; expected no a= with "
                                                               r"nonlinearity='relu'"),
    (("orthogonal", 2.0), {}, r"init: too many positional arguments"),
    (("orthogonal",), {"gian": 2.0}, r"init: gian=2.0 is invalid; expected one of the names: scheme, gain"),
])
def test_bad_arguments_are_config_errors_that_change_nothing(args, kw, match) -> None:  # type: ignore[no-untyped-def]
    task = mlp("xavier_normal", gain=3.0)
    before = task.config
    with pytest.raises(ConfigError, match=match) as info:
        task.init(*args, **kw)
    assert "Fix:" in str(info.value) and task.config is before


def test_init_is_a_planning_setting() -> None:
    task = mlp()
    task.plan()
    with pytest.raises(PhaseError, match=r"init.*PLANNING \(before plan\(\)\).*task.reset\(\)"):
        task.init("orthogonal")
    assert task.config.init == "kaiming_uniform"
    assert task.reset().init("orthogonal").config.init == "orthogonal"


def test_settings_show_it_and_to_dict_round_trips() -> None:
    t = mlp("kaiming_normal", mode="fan_out", nonlinearity="relu")
    assert t.settings["init"] == "kaiming_normal(mode='fan_out', nonlinearity='relu')"
    assert mlp().settings["init"] == "kaiming_uniform"
    for given, same in ((mlp("orthogonal", gain=1), mlp("orthogonal")),  # a default given is left out
                        (mlp("kaiming_normal", a=0), mlp("kaiming_normal")),
                        (mlp("kaiming_uniform", a=math.sqrt(5), mode="fan_in"), mlp())):
        assert (given.config.init, given.config.init_args) == (same.config.init, same.config.init_args)
    d = json.loads(json.dumps(t.config.to_dict()))
    assert d["init"] == {"scheme": "kaiming_normal", "mode": "fan_out", "nonlinearity": "relu"}
    back = TaskConfig.from_dict(d)
    assert (back.init, back.init_args) == (t.config.init, t.config.init_args)
    del d["init"]  # a record written before init() existed
    assert (TaskConfig.from_dict(d).init, TaskConfig.from_dict(d).init_args) == ("kaiming_uniform", ())
    with pytest.raises(ConfigError, match=r"init: gain=-1"):
        TaskConfig.from_dict({**d, "init": {"scheme": "orthogonal", "gain": -1}})


def test_a_checkpoint_records_it_and_resumes_exactly(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Resumed from epoch 1 of 2, an orthogonal run ends on the uninterrupted run's bytes; init is not a
    strict setting (a resume overwrites the initial weights), and a checkpoint without it loads as the default."""
    def make() -> DeepLearningTask:
        return mlp("orthogonal", gain=0.5, seed=4).total_epochs(2)
    whole = make()
    whole.run(progress=False)
    half = make()
    half.run(1, progress=False)
    path = half.save(str(tmp_path / "o.npz"))
    back = DeepLearningTask.load(path, half.splits)
    assert (back.config.init, back.config.init_args) == ("orthogonal", (("gain", 0.5),))
    back.run(progress=False)
    assert all(v.tobytes() == whole.state_dict()[k].tobytes() for k, v in back.state_dict().items())
    other = mlp("zeros", seed=4).total_epochs(2).compile().load_state(path)  # strict, another init
    assert all(v.tobytes() == half.state_dict()[k].tobytes() for k, v in other.state_dict().items())
    old = _edited(path, str(tmp_path / "old.npz"), lambda h: h["config"].pop("init"))
    assert DeepLearningTask.load(old, half.splits).config.init_text == "kaiming_uniform"
    v1 = DeepLearningTask.load(os.path.join(os.path.dirname(__file__), "fixtures", "v1_epoch1.npz"),
                               _v1_data())
    assert (v1.config.init, v1.config.init_args) == ("kaiming_uniform", ())

"""WarmupStableDecayLR: its table against a float64 reference written here (and, for the linear and
cosine shapes, torch's SequentialLR of three phases), a 30-step training run against torch fed the same
rates, argument errors, and its round trip through to_dict/from_dict and a checkpoint."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import renaissance_nb as rnb
from renaissance_nb import ConfigError, TaskConfig, WarmupStableDecayLR

# --------------------------------------------------------------------------- the float64 reference


def reference(base: float, warmup: float, start_factor: float, fraction: float, shape: str, eta_min: float,
              spe: int, epochs: int) -> np.ndarray:
    """Step by step in Python floats: warmup (round(warmup * spe) steps, linear from start_factor),
    base held, then the last round(fraction * all steps) steps decay from base towards eta_min."""
    total = spe * epochs
    w, d = round(warmup * spe), round(fraction * total)
    shapes = {"linear": lambda p: 1.0 - p, "cosine": lambda p: 0.5 * (1.0 + math.cos(math.pi * p)),
              "sqrt": lambda p: 1.0 - math.sqrt(p)}
    out = []
    for t in range(total):
        if t < w:
            out.append(base * (start_factor + (1.0 - start_factor) * t / w))
        elif t < total - d:
            out.append(base)
        else:
            out.append(eta_min + (base - eta_min) * shapes[shape]((t - (total - d)) / d))
    return np.array(out, dtype=np.float64)


# (warmup epochs, decay fraction, shape, steps per epoch, epochs); 7 steps per epoch is 100 samples in
# batches of 16 (a partial last batch of 4); 0.5, 1.5, 0.25 and 2.5 epochs of warmup are fractional.
CASES = [
    (0.0, 0.2, "sqrt", 10, 3),
    (1.0, 0.1, "linear", 7, 4),
    (0.5, 0.25, "cosine", 7, 3),
    (1.5, 0.3, "sqrt", 7, 5),
    (0.25, 0.5, "linear", 4, 2),
    (2.5, 0.4, "cosine", 3, 5),
    (0.0, 1.0, "linear", 5, 2),  # no stable phase: decay from the first step
    (1.0, 0.8, "sqrt", 2, 5),  # the decay takes every step after warmup
    (0.5, 0.15, "cosine", 13, 1),  # one epoch
]


@pytest.mark.parametrize("warmup,fraction,shape,spe,epochs", CASES)
@pytest.mark.parametrize("eta_min", [0.0, 1e-3])
def test_table_matches_the_float64_reference(warmup, fraction, shape, spe, epochs, eta_min) -> None:
    s = WarmupStableDecayLR(base_lr=0.1, warmup=warmup, warmup_start_factor=0.2, decay_fraction=fraction,
                            decay_shape=shape, eta_min=eta_min)
    table = s.table(spe, epochs)
    ref = reference(0.1, warmup, 0.2, fraction, shape, eta_min, spe, epochs)
    assert table.dtype == np.float32 and table.shape == (spe * epochs,)
    np.testing.assert_allclose(table, ref, rtol=1e-7, atol=0)  # float32's rounding of the float64 value
    d = s.decay_steps(spe, epochs)
    assert d == round(fraction * spe * epochs) and table[-d] == np.float32(0.1) and table[-1] < table[-d]
    assert np.all(np.diff(table[-d:]) < 0) and table[-1] > eta_min  # decays, one step short of eta_min


def test_small_tables_by_hand() -> None:
    """4 steps, the last half decaying: 1, 1, then f(0) = 1 and f(1/2)."""
    make = WarmupStableDecayLR(base_lr=1.0, decay_fraction=0.5).decay_shape
    np.testing.assert_array_equal(make("linear").table(4, 1), np.float32([1, 1, 1, 0.5]))
    np.testing.assert_array_equal(make("cosine").table(4, 1), np.float32([1, 1, 1, 0.5]))
    np.testing.assert_array_equal(make("sqrt").table(4, 1), np.float32([1, 1, 1, 1 - math.sqrt(0.5)]))
    np.testing.assert_array_equal(make("linear").table(10, 1)[5:], np.float32([1, 0.8, 0.6, 0.4, 0.2]))


def test_defaults_and_the_optimizers_lr() -> None:
    s = WarmupStableDecayLR()
    assert (s.decay_fraction_, s.decay_shape_, s.eta_min_, s.base_lr_, s.warmup_) == (0.2, "sqrt", 0.0, None, 0.0)
    np.testing.assert_allclose(s.table(10, 5, lr=0.05), reference(0.05, 0, 0.1, 0.2, "sqrt", 0.0, 10, 5), rtol=1e-7)
    assert repr(s.warmup(1)) == "WarmupStableDecayLR(decay_fraction=0.2, decay_shape='sqrt', eta_min=0.0, warmup=1 epoch)"
    b = s.decay_fraction(0.1).decay_shape("cosine").eta_min(1e-4).base_lr(0.01)
    assert s == WarmupStableDecayLR() and b == WarmupStableDecayLR(base_lr=0.01, decay_fraction=0.1,
                                                                   decay_shape="cosine", eta_min=1e-4)


@pytest.mark.parametrize("warmup,fraction,shape,spe,epochs", [c for c in CASES if c[2] != "sqrt"])
def test_linear_and_cosine_equal_torchs_three_phase_sequence(warmup, fraction, shape, spe, epochs) -> None:
    """torch: SequentialLR([LinearLR warmup, ConstantLR(factor=1), LinearLR(1 -> 0) or CosineAnnealingLR])."""
    torch = pytest.importorskip("torch")
    from torch.optim import lr_scheduler as L

    total = spe * epochs
    w, d = round(warmup * spe), round(fraction * total)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    decay = L.LinearLR(opt, 1.0, 0.0, total_iters=d) if shape == "linear" else L.CosineAnnealingLR(opt, d, 1e-3)
    parts = [(L.LinearLR(opt, 0.2, 1.0, total_iters=w) if w else None, w),
             (L.ConstantLR(opt, factor=1.0, total_iters=1), total - w - d), (decay, d)]
    phases, lengths = zip(*[(p, n) for p, n in parts if n])  # an empty phase is left out
    marks = list(np.cumsum(lengths[:-1]))
    sched = L.SequentialLR(opt, list(phases), milestones=marks) if marks else phases[0]
    ref = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(total):
            ref.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
    ours = WarmupStableDecayLR(base_lr=0.1, warmup=warmup, warmup_start_factor=0.2, decay_fraction=fraction,
                               decay_shape=shape, eta_min=0.0 if shape == "linear" else 1e-3)
    np.testing.assert_allclose(ours.table(spe, epochs), ref, rtol=1e-6, atol=1e-9)


# --------------------------------------------------------------------------- argument errors


@pytest.mark.parametrize("make,match", [
    (lambda: WarmupStableDecayLR(decay_fraction=0), r"WarmupStableDecayLR.decay_fraction: decay_fraction=0 is "
                                                    r"invalid; expected a number in \(0, 1\]\. Fix: pass the share"),
    (lambda: WarmupStableDecayLR().decay_fraction(1.5), r"decay_fraction=1.5 is invalid; expected a number in \(0, 1\]"),
    (lambda: WarmupStableDecayLR().decay_fraction(float("nan")), r"decay_fraction=nan is invalid"),
    (lambda: WarmupStableDecayLR().decay_fraction("0.2"), r"decay_fraction='0.2' is invalid"),
    (lambda: WarmupStableDecayLR().decay_fraction(True), r"decay_fraction=True is invalid"),
    (lambda: WarmupStableDecayLR().decay_shape("exp"), r"decay_shape='exp' is invalid; expected 'linear', 'cosine' "
                                                       r"or 'sqrt'\. Fix: pass decay_shape='sqrt'"),
    (lambda: WarmupStableDecayLR().decay_shape("1-sqrt"), r"expected 'linear', 'cosine' or 'sqrt' \('sqrt' is the "
                                                          r"1-sqrt shape\)"),
    (lambda: WarmupStableDecayLR().decay_shape(np.array(["sqrt"])), r"decay_shape=.* is invalid"),
    (lambda: WarmupStableDecayLR().eta_min(-1e-3), r"eta_min=-0.001 is invalid; expected a finite number >= 0"),
    (lambda: WarmupStableDecayLR(base_lr=1e-3, eta_min=1e-2), r"eta_min=0.01 is invalid; expected at most base_lr "
                                                              r"\(0.001\).*Fix: lower eta_min"),
    (lambda: WarmupStableDecayLR(eta_min=1e-2).table(4, 2, lr=1e-3), r"eta_min=0.01 is invalid"),
    (lambda: WarmupStableDecayLR().warmup(-1), r"warmup=-1 is invalid"),
    (lambda: WarmupStableDecayLR(decay_frac=0.2), r"decay_frac=0.2 is invalid; expected one of the settings"),
    (lambda: WarmupStableDecayLR(decay_fraction=0.01).table(4, 2), r"decay_fraction=0.01 is invalid; expected a "
                                                                   r"share that is at least one of the 8 training steps"),
    (lambda: WarmupStableDecayLR(warmup=1, decay_fraction=0.8).table(4, 2),
     r"decay_fraction=0.8 is invalid; expected at most the 4 steps left after the warmup's 4 of 8; it is 6 steps: the decay "
     r"would overlap the warmup\. Fix: lower decay_fraction or shorten the warmup"),
    (lambda: WarmupStableDecayLR(warmup=2).table(4, 2), r"it is 8 steps: warmup as long as training"),
    (lambda: WarmupStableDecayLR(warmup=3).table(4, 2), r"it is 12 steps: warmup longer than training"),
])
def test_bad_arguments_are_config_errors_naming_value_and_fix(make, match) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        make()
    assert "Fix:" in str(info.value)


# --------------------------------------------------------------------------- training, config, checkpoint

RNG = np.random.default_rng(7)
X = RNG.standard_normal((90, 6)).astype(np.float32)  # 90 / 16: 6 steps per epoch, the last of 10 samples
Y = (X[:, 0] + X[:, 1] > 0).astype(np.int64)
SCHED = WarmupStableDecayLR(warmup=0.5, decay_fraction=0.3, decay_shape="sqrt", eta_min=1e-3)


def make_task(sched=SCHED, epochs: int = 5, shuffle: bool = False) -> rnb.DeepLearningTask:
    return (rnb.DeepLearningTask("wsd").model(rnb.seq(rnb.fc(8), rnb.relu(), rnb.fc(2)))
            .data(train=(X, Y), batch_size=16, shuffle=shuffle)
            .optimizer(rnb.SGD().lr(0.2)).scheduler(sched).total_epochs(epochs).seed(5))


def torch_sgd(init: dict[str, np.ndarray], lrs: np.ndarray, epochs: int) -> dict[str, np.ndarray]:
    """The same MLP in torch, plain SGD, batches in order, each step at the given rate."""
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    fc1, fc2 = torch.nn.Linear(6, 8), torch.nn.Linear(8, 2)
    with torch.no_grad():
        for name, lin in (("fc1", fc1), ("fc2", fc2)):
            lin.weight.copy_(torch.from_numpy(init[f"{name}.weight"]))
            lin.bias.copy_(torch.from_numpy(init[f"{name}.bias"]))
    model = torch.nn.Sequential(fc1, torch.nn.ReLU(), fc2)
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    xt, yt = torch.from_numpy(X), torch.from_numpy(Y)
    step = 0
    for _ in range(epochs):
        for i in range(0, len(X), 16):
            opt.param_groups[0]["lr"] = float(lrs[step])
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xt[i:i + 16]), yt[i:i + 16]).backward()
            opt.step()
            step += 1
    return {f"{n}.{p}": getattr(lin, p).detach().numpy().copy() for n, lin in (("fc1", fc1), ("fc2", fc2))
            for p in ("weight", "bias")}


def _rel(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    return max(float(np.linalg.norm(a[k] - b[k]) / np.linalg.norm(b[k])) for k in b)


def test_thirty_training_steps_use_the_reference_rates_and_match_torch() -> None:
    task = make_task().compile()
    assert task.steps_per_epoch == 6 and task.config.total_steps == 30
    ref = reference(0.2, 0.5, 0.1, 0.3, "sqrt", 1e-3, 6, 5)  # 3 warmup steps, 18 stable, 9 decaying
    np.testing.assert_allclose(task.lr_table(), ref, rtol=1e-7, atol=0)
    init = task.state_dict()
    res = task.run(progress=False)
    np.testing.assert_array_equal(task.read("lr_table"), task.lr_table())  # the table the steps read
    assert int(task.read("step")[0]) == 30
    np.testing.assert_allclose([r.lr for r in res.history], ref[5::6], rtol=1e-7)  # each epoch's last step
    ours = task.state_dict()
    err = _rel(ours, torch_sgd(init, task.lr_table(), 5))
    assert err < 1e-5, err
    # the rates mattered: torch at the stable rate throughout ends elsewhere by far more
    assert _rel(ours, torch_sgd(init, np.full(30, 0.2), 5)) > 100 * max(err, 1e-7)


def test_config_to_dict_from_dict_round_trip() -> None:
    cfg = make_task().config
    d = cfg.to_dict()
    assert d["scheduler"] == {"class": "WarmupStableDecayLR", "settings": {
        "base_lr": None, "decay_fraction": 0.3, "decay_shape": "sqrt", "eta_min": 1e-3, "warmup": 0.5,
        "warmup_start_factor": 0.1}}
    back = TaskConfig.from_dict(d)
    assert back.scheduler == SCHED and type(back.scheduler) is WarmupStableDecayLR
    bad = {**d, "scheduler": {**d["scheduler"], "settings": {**d["scheduler"]["settings"], "decay_shape": "exp"}}}
    with pytest.raises(ConfigError, match="decay_shape='exp' is invalid"):
        TaskConfig.from_dict(bad)


def test_checkpoint_resume_gives_byte_identical_weights(tmp_path) -> None:
    """Stopped mid-stable phase (epoch 2 of 5) and in the decay (epoch 4), saved, loaded, run on: the
    same bytes as the run never stopped, with shuffled batches."""
    whole = make_task(shuffle=True)
    whole.run(progress=False)
    want = {k: v.tobytes() for k, v in whole.state_dict().items()}
    for stop in (2, 4):
        part = make_task(shuffle=True)
        part.run(stop, progress=False)
        path = part.save(str(tmp_path / f"wsd{stop}.npz"))
        back = rnb.DeepLearningTask.load(path, (X, Y))
        assert back.config.scheduler == SCHED and repr(back.config.scheduler) == repr(SCHED)
        back.run(progress=False)
        assert {k: v.tobytes() for k, v in back.state_dict().items()} == want
        assert [r.lr for r in back.result.history] == [r.lr for r in whole.result.history]

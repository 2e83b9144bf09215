"""Tests of the precomputed learning-rate tables against PyTorch, plus validation and immutability."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from renaissance_nb.errors import ConfigError
from renaissance_nb.train.schedulers import (
    ConstantLR,
    DEFAULT_LR,
    CosineAnnealingLR,
    CosineAnnealingWarmRestarts,
    LinearLR,
    OneCycleLR,
    ExponentialLR,
    MultiStepLR,
    PolynomialLR,
    Scheduler,
    StepLR,
)

BASE = 0.1


def _torch_table(make_main, base_lr: float, warmup_steps: int, start_factor: float, total: int) -> np.ndarray:
    """Record ``opt.param_groups[0]['lr']`` before each of ``total`` steps, stepping per batch.

    Uses torch's public chainable ``scheduler.step()`` path; the closed form is only
    used by SequentialLR itself at the milestone (``_update_lr(0)``), as in real training.
    """
    torch = pytest.importorskip("torch")
    from torch.optim import lr_scheduler as L

    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=base_lr)
    if warmup_steps:
        warm = L.LinearLR(opt, start_factor=start_factor, end_factor=1.0, total_iters=warmup_steps)
        sched = L.SequentialLR(opt, [warm, make_main(opt)], milestones=[warmup_steps])
    else:
        sched = make_main(opt)
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(total):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
    return np.array(out, dtype=np.float64)


def _compare(ours: Scheduler, make_main, spe: int, epochs: int) -> None:
    table = ours.table(spe, epochs)
    assert table.dtype == np.float32 and table.shape == (spe * epochs,)
    w = ours.warmup_steps(spe)
    base = DEFAULT_LR if ours.base_lr_ is None else ours.base_lr_
    ref = _torch_table(make_main, base, w, ours.warmup_start_factor_, spe * epochs)
    np.testing.assert_allclose(table, ref, rtol=1e-6, atol=0)


WARMUPS = [0.0, 1.0, 0.5]  # epochs
SHAPES = [(7, 6), (10, 3)]  # (steps_per_epoch, epochs)


@pytest.mark.parametrize("warmup", WARMUPS)
@pytest.mark.parametrize("spe,epochs", SHAPES)
@pytest.mark.parametrize("eta_min", [0.0, 1e-3])
def test_cosine_matches_torch(warmup, spe, epochs, eta_min):
    from torch.optim import lr_scheduler as L  # noqa: F401 (importorskip done in helper)

    ours = CosineAnnealingLR(base_lr=BASE, eta_min=eta_min, warmup=warmup, warmup_start_factor=0.25)
    horizon = spe * epochs - ours.warmup_steps(spe)
    _compare(ours, lambda o: L.CosineAnnealingLR(o, T_max=horizon, eta_min=eta_min), spe, epochs)


@pytest.fixture(autouse=True)
def _torch():
    pytest.importorskip("torch")


@pytest.mark.parametrize("warmup", WARMUPS)
@pytest.mark.parametrize("spe,epochs", SHAPES)
@pytest.mark.parametrize("step_size,gamma", [(1, 0.5), (2, 0.1), (1.5, 0.9)])
def test_step_matches_torch(warmup, spe, epochs, step_size, gamma):
    from torch.optim import lr_scheduler as L

    ours = StepLR(base_lr=BASE).step_size(step_size).gamma(gamma).warmup(warmup)
    size = round(step_size * spe)
    _compare(ours, lambda o: L.StepLR(o, step_size=size, gamma=gamma), spe, epochs)


@pytest.mark.parametrize("warmup", WARMUPS)
@pytest.mark.parametrize("spe,epochs", SHAPES)
@pytest.mark.parametrize("milestones,gamma", [((1, 2), 0.1), ((0.5, 1.5, 2.5), 0.5), ((3,), 0.3)])
def test_multistep_matches_torch(warmup, spe, epochs, milestones, gamma):
    from torch.optim import lr_scheduler as L

    ours = MultiStepLR(base_lr=BASE, milestones=milestones, gamma=gamma, warmup=warmup)
    steps = [round(m * spe) for m in milestones]
    _compare(ours, lambda o: L.MultiStepLR(o, milestones=steps, gamma=gamma), spe, epochs)


@pytest.mark.parametrize("warmup", WARMUPS)
@pytest.mark.parametrize("spe,epochs", SHAPES)
@pytest.mark.parametrize("gamma", [0.5, 0.95, 1.2])
def test_exponential_matches_torch(warmup, spe, epochs, gamma):
    from torch.optim import lr_scheduler as L

    ours = ExponentialLR(base_lr=BASE, gamma=gamma, warmup=warmup)
    # Reference: torch ExponentialLR with the per-step gamma gamma**(1/steps_per_epoch).
    _compare(ours, lambda o: L.ExponentialLR(o, gamma=gamma ** (1.0 / spe)), spe, epochs)


@pytest.mark.parametrize("warmup", WARMUPS)
@pytest.mark.parametrize("spe,epochs", SHAPES)
@pytest.mark.parametrize("factor,total_iters", [(1 / 3, 1), (0.5, 2.5), (0.1, 0.1)])
def test_constant_matches_torch(warmup, spe, epochs, factor, total_iters):
    from torch.optim import lr_scheduler as L

    ours = ConstantLR(base_lr=BASE, factor=factor, total_iters=total_iters, warmup=warmup)
    n = round(total_iters * spe)
    _compare(ours, lambda o: L.ConstantLR(o, factor=factor, total_iters=n), spe, epochs)


@pytest.mark.parametrize("warmup", WARMUPS)
@pytest.mark.parametrize("spe,epochs", SHAPES)
@pytest.mark.parametrize("total_iters,power", [(None, 1.0), (None, 2.0), (1.5, 0.5), (2, 1.0)])
def test_polynomial_matches_torch(warmup, spe, epochs, total_iters, power):
    from torch.optim import lr_scheduler as L

    ours = PolynomialLR(base_lr=BASE, total_iters=total_iters, power=power, warmup=warmup)
    horizon = spe * epochs - ours.warmup_steps(spe)
    n = horizon if total_iters is None else round(total_iters * spe)
    _compare(ours, lambda o: L.PolynomialLR(o, total_iters=n, power=power), spe, epochs)


@pytest.mark.parametrize("warmup", WARMUPS)
@pytest.mark.parametrize("spe,epochs", SHAPES)
@pytest.mark.parametrize("start,end,total_iters", [(1 / 3, 1.0, 1), (1.0, 0.0, 2.5), (0.5, 0.1, 9)])
def test_linear_matches_torch(warmup, spe, epochs, start, end, total_iters):
    from torch.optim import lr_scheduler as L

    ours = LinearLR(base_lr=BASE, start_factor=start, end_factor=end, total_iters=total_iters, warmup=warmup)
    n = round(total_iters * spe)
    _compare(ours, lambda o: L.LinearLR(o, start_factor=start, end_factor=end, total_iters=n), spe, epochs)


@pytest.mark.parametrize("warmup", WARMUPS)
@pytest.mark.parametrize("spe,epochs", SHAPES)
@pytest.mark.parametrize("t0,t_mult", [(1, 1), (0.5, 2), (1.5, 3), (20, 2)])
def test_warm_restarts_match_torch(warmup, spe, epochs, t0, t_mult):
    from torch.optim import lr_scheduler as L

    ours = CosineAnnealingWarmRestarts(base_lr=BASE, T_0=t0, T_mult=t_mult, eta_min=1e-3, warmup=warmup)
    n = round(t0 * spe)
    _compare(ours, lambda o: L.CosineAnnealingWarmRestarts(o, T_0=n, T_mult=t_mult, eta_min=1e-3), spe, epochs)


@pytest.mark.parametrize("spe,epochs", SHAPES + [(3, 1), (1, 2)])
@pytest.mark.parametrize("pct,anneal,three", [(0.3, "cos", False), (0.25, "linear", False), (0.3, "cos", True),
                                              (0.45, "linear", True), (0.9, "cos", False)])
def test_one_cycle_matches_torch_without_momentum_cycling(spe, epochs, pct, anneal, three):
    from torch.optim import lr_scheduler as L

    ours = OneCycleLR(base_lr=BASE, pct_start=pct, anneal_strategy=anneal, three_phase=three, div_factor=10,
                      final_div_factor=100)
    _compare(ours, lambda o: L.OneCycleLR(o, max_lr=BASE, total_steps=spe * epochs, pct_start=pct, anneal_strategy=anneal,
                                          three_phase=three, div_factor=10, final_div_factor=100,
                                          cycle_momentum=False), spe, epochs)


def test_one_cycle_defaults_and_shape():
    t = OneCycleLR().table(100, 10, lr=0.01).astype(np.float64)  # max_lr is the optimizer's lr
    assert t[0] == pytest.approx(0.01 / 25) and t.max() == pytest.approx(0.01, rel=1e-6)
    assert int(np.argmax(t)) == 299 and t[-1] == pytest.approx(0.01 / 25 / 1e4, rel=1e-5)
    assert repr(OneCycleLR()) == ("OneCycleLR(pct_start=0.3, anneal_strategy='cos', div_factor=25.0, "
                                  "final_div_factor=10000.0, three_phase=False)")
    assert OneCycleLR(cycle_momentum=False) == OneCycleLR()


def test_one_cycle_refuses_momentum_cycling_and_degenerate_phases():
    with pytest.raises(ConfigError, match=r"cycle_momentum=True is invalid; expected False: the optimizer's "
                                          r"betas/momentum are constants of the compiled step\. Fix: drop"):
        OneCycleLR(cycle_momentum=True)
    with pytest.raises(ConfigError, match=r"anneal_strategy='cosine' is invalid; expected 'cos' or 'linear'"):
        OneCycleLR().anneal_strategy("cosine")
    for bad in (0, 1, 1.5, float("nan")):
        with pytest.raises(ConfigError, match="pct_start"):
            OneCycleLR(pct_start=bad)
    with pytest.raises(ConfigError, match=r"no phase of zero length over the 10 steps after warmup\. Fix:"):
        OneCycleLR(pct_start=0.1).table(5, 2)  # torch: ZeroDivisionError
    with pytest.raises(ConfigError, match=r"OneCycleLR.warmup: warmup=1 is invalid; expected 0: OneCycleLR rises "
                                          r"from max_lr / div_factor itself\. Fix: drop warmup and set pct_start"):
        OneCycleLR().warmup(1)


def test_new_schedules_validate_and_show_epochs():
    assert repr(CosineAnnealingWarmRestarts(T_0=10, T_mult=2)) == \
        "CosineAnnealingWarmRestarts(T_0=10 epochs, T_mult=2, eta_min=0.0, warmup=0 epochs)"
    assert repr(LinearLR(start_factor=0.5, total_iters=1)) == \
        "LinearLR(start_factor=0.5, end_factor=1.0, total_iters=1 epoch, warmup=0 epochs)"
    for make in (lambda: CosineAnnealingWarmRestarts(T_mult=0), lambda: CosineAnnealingWarmRestarts(T_mult=1.5),
                 lambda: CosineAnnealingWarmRestarts(T_0=0), lambda: LinearLR(start_factor=0),
                 lambda: LinearLR(end_factor=1.5), lambda: LinearLR(total_iters=-1)):
        with pytest.raises(ConfigError, match="Fix:"):
            make()
    with pytest.raises(ConfigError, match=r"T_0=0.1 is invalid; expected at least one step \(2 steps per epoch\)"):
        CosineAnnealingWarmRestarts(T_0=0.1).table(2, 3)


def test_constant_factor_zero_freezes_then_restores():
    # torch's chainable ConstantLR divides by factor (ZeroDivisionError for 0); ours follows
    # torch's closed form: base_lr * (factor + (k >= total_iters) * (1 - factor)).
    t = ConstantLR(base_lr=0.5, factor=0.0, total_iters=1, warmup=1).table(2, 4)
    np.testing.assert_allclose(t, [0.05, 0.275, 0, 0, 0.5, 0.5, 0.5, 0.5], rtol=1e-6)


def test_default_settings_match_torch_defaults():
    from torch.optim import lr_scheduler as L

    _compare(ConstantLR(base_lr=0.01), lambda o: L.ConstantLR(o), 1, 8)  # factor 1/3, 5 iters
    _compare(CosineAnnealingLR().warmup(1), lambda o: L.CosineAnnealingLR(o, T_max=12), 4, 4)


def test_warmup_is_linear_from_start_factor():
    t = CosineAnnealingLR(base_lr=1.0, warmup=1).table(4, 3).astype(np.float64)
    np.testing.assert_allclose(t[:4], [0.1, 0.325, 0.55, 0.775], rtol=1e-6)
    assert t[4] == 1.0  # the main schedule starts at step 0 after warmup


def test_table_is_float32_and_deterministic():
    s = MultiStepLR(milestones=[1, 2])
    assert s.table(5, 3).tobytes() == s.table(5, 3).tobytes()


# --------------------------------------------------------------------------- immutability, repr


def test_setters_return_new_objects():
    a = CosineAnnealingLR()
    b = a.base_lr(0.5).eta_min(0.01).warmup(2).warmup_start_factor(0.5)
    assert a == CosineAnnealingLR() and a.base_lr_ is None and a.warmup_ == 0.0
    assert (b.base_lr_, b.eta_min_, b.warmup_, b.warmup_start_factor_) == (0.5, 0.01, 2.0, 0.5)
    assert b == CosineAnnealingLR(base_lr=0.5, eta_min=0.01, warmup=2, warmup_start_factor=0.5)
    assert type(b) is CosineAnnealingLR
    with pytest.raises(AttributeError):
        a.base_lr_ = 2.0  # type: ignore[misc]
    assert hash(a) == hash(CosineAnnealingLR())


def test_repr_reads_well():
    assert repr(CosineAnnealingLR(base_lr=0.001, warmup=1)) == (
        "CosineAnnealingLR(base_lr=0.001, eta_min=0.0, warmup=1 epoch)")
    assert repr(MultiStepLR(milestones=[30, 60.5]).warmup(2).warmup_start_factor(0.5)) == (
        "MultiStepLR(milestones=[30, 60.5] epochs, gamma=0.1, warmup=2 epochs, "
        "warmup_start_factor=0.5)")
    assert repr(PolynomialLR()) == "PolynomialLR(total_iters=whole training, power=1.0, warmup=0 epochs)"
    assert repr(StepLR(step_size=1.5)).startswith("StepLR(step_size=1.5 epochs, gamma=0.1")


def test_settings_dict():
    assert StepLR(gamma=0.5).settings() == {
        "base_lr": None, "step_size": 30.0, "gamma": 0.5, "warmup": 0.0, "warmup_start_factor": 0.1}


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("make", [
    lambda: CosineAnnealingLR().base_lr(-1e-3),
    lambda: CosineAnnealingLR().base_lr(float("nan")),
    lambda: CosineAnnealingLR().base_lr(math.inf),
    lambda: CosineAnnealingLR().base_lr("0.1"),
    lambda: CosineAnnealingLR().base_lr(True),
    lambda: CosineAnnealingLR(base_lr=-1.0),
    lambda: CosineAnnealingLR().eta_min(-0.1),
    lambda: CosineAnnealingLR().warmup(-1),
    lambda: CosineAnnealingLR().warmup(float("nan")),
    lambda: CosineAnnealingLR().warmup_start_factor(0.0),
    lambda: CosineAnnealingLR().warmup_start_factor(1.5),
    lambda: CosineAnnealingLR(lr=0.1),
    lambda: StepLR().gamma(0),
    lambda: StepLR().gamma(-0.5),
    lambda: StepLR().step_size(0),
    lambda: MultiStepLR().gamma(0.0),
    lambda: MultiStepLR().milestones([2, 1]),
    lambda: MultiStepLR().milestones([1, 1]),
    lambda: MultiStepLR().milestones([]),
    lambda: MultiStepLR().milestones([0, 1]),
    lambda: MultiStepLR().milestones(3),
    lambda: ExponentialLR().gamma(0),
    lambda: ConstantLR().factor(1.5),
    lambda: ConstantLR().factor(-0.1),
    lambda: ConstantLR().total_iters(-1),
    lambda: ConstantLR().total_iters(0),
    lambda: PolynomialLR().power(-1.0),
    lambda: PolynomialLR().total_iters(0),
])
def test_invalid_settings_raise_config_error(make):
    with pytest.raises(ConfigError, match="Fix:"):
        make()


def test_error_message_names_argument_value_and_fix():
    with pytest.raises(ConfigError) as info:
        StepLR().gamma(-0.5)
    msg = str(info.value)
    assert "gamma=-0.5" in msg and "expected" in msg and "Fix:" in msg
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("make,args", [
    (lambda: CosineAnnealingLR(warmup=3), (4, 3)),  # warmup == training
    (lambda: CosineAnnealingLR(warmup=5), (4, 3)),  # warmup longer than training
    (lambda: CosineAnnealingLR(), (0, 3)),
    (lambda: CosineAnnealingLR(), (4, 0)),
    (lambda: CosineAnnealingLR(), (4.0, 3)),
    (lambda: MultiStepLR(), (4, 3)),  # no milestones
    (lambda: StepLR(step_size=0.1), (2, 3)),  # rounds to 0 steps
    (lambda: PolynomialLR(total_iters=0.1), (2, 3)),
    (lambda: ConstantLR(total_iters=0.1), (2, 3)),
])
def test_table_errors(make, args):
    with pytest.raises(ConfigError, match="Fix:"):
        make().table(*args)


def test_warmup_longer_than_training_message():
    with pytest.raises(ConfigError, match="warmup longer than training"):
        CosineAnnealingLR(warmup=5).table(4, 3)


@pytest.mark.parametrize("make,main", [
    (lambda: CosineAnnealingLR(base_lr=0.1, warmup=2),
     lambda o: __import__("torch").optim.lr_scheduler.CosineAnnealingLR(o, T_max=2800)),
    (lambda: ExponentialLR(base_lr=0.1, gamma=0.9, warmup=2),
     lambda o: __import__("torch").optim.lr_scheduler.ExponentialLR(o, gamma=0.9 ** (1 / 100))),
    (lambda: PolynomialLR(base_lr=0.1, power=2.0, warmup=2),
     lambda o: __import__("torch").optim.lr_scheduler.PolynomialLR(o, total_iters=2800, power=2.0)),
])
def test_long_runs_match_torch_chainable_form(make, main):
    # 3000 steps: torch's chainable (ratio) form accumulates rounding; still within rel 1e-6.
    _compare(make(), main, 100, 30)


# --------------------------------------------------------------------------- the optimizer's lr


def test_the_schedule_scales_the_optimizers_lr_unless_base_lr_is_set():
    """As in PyTorch, where a scheduler scales the lr the optimizer was built with."""
    import renaissance_nb as rnb

    x = np.random.default_rng(0).standard_normal((64, 5)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)

    def task(opt, sched):  # type: ignore[no-untyped-def]
        return (rnb.DeepLearningTask().model(rnb.seq(rnb.fc(2))).data(train=(x, y), batch_size=16)
                .optimizer(opt).scheduler(sched).total_epochs(2))

    cos = CosineAnnealingLR()
    assert task(rnb.AdamW().lr(5e-3), cos).lr_table()[0] == np.float32(5e-3)
    np.testing.assert_array_equal(task(rnb.SGD().lr(0.1), cos).lr_table(), cos.table(4, 2, lr=0.1))
    assert task(rnb.AdamW(), cos.base_lr(2e-3)).lr_table()[0] == np.float32(2e-3)  # default lr: base_lr wins
    assert task(rnb.AdamW().lr(2e-3), cos.base_lr(2e-3)).lr_table()[0] == np.float32(2e-3)
    with pytest.raises(ConfigError, match=r"two learning rates: AdamW\(lr=0.005\) and CosineAnnealingLR\(base_lr=0.002\)"):
        task(rnb.AdamW().lr(5e-3), cos.base_lr(2e-3)).plan()
    assert repr(cos) == "CosineAnnealingLR(eta_min=0.0, warmup=0 epochs)"  # no base_lr: the optimizer's


def test_a_schedule_past_float32_is_refused_with_where() -> None:
    with pytest.raises(ConfigError, match=r"ExponentialLR: the schedule reaches lr=.* at step 129 of 200, past "
                                          r"float32.*Fix: a smaller base_lr or gamma"):
        ExponentialLR(gamma=2.0).table(1, 200, lr=1.0)  # 2**128 > float32's largest
    assert np.isfinite(ExponentialLR(gamma=2.0).table(1, 120, lr=1.0)).all()
    with pytest.raises(ConfigError, match=r"base_lr=1e\+39 is invalid; expected a finite number in \[0, 3\.4"):
        CosineAnnealingLR(base_lr=1e39)


@pytest.mark.parametrize("sched", [OneCycleLR(pct_start=0.25, anneal_strategy="linear", three_phase=True),
                                   CosineAnnealingWarmRestarts(T_0=0.5, T_mult=2, eta_min=1e-5),
                                   LinearLR(start_factor=1.0, end_factor=0.0, total_iters=3)])
def test_new_schedules_train_save_and_load_with_their_settings(tmp_path, sched):  # type: ignore[no-untyped-def]
    """A checkpoint rebuilds the schedule by name and settings, and the resumed run is byte-identical."""
    import renaissance_nb as rnb

    x = np.random.default_rng(1).standard_normal((48, 5)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)

    def task():  # type: ignore[no-untyped-def]
        return (rnb.DeepLearningTask("s").model(rnb.seq(rnb.fc(3), rnb.relu(), rnb.fc(2))).data(train=(x, y), batch_size=16)
                .optimizer(rnb.SGD().lr(0.05)).scheduler(sched).total_epochs(3).seed(4))

    whole, part = task(), task()
    np.testing.assert_array_equal(whole.lr_table(), sched.table(3, 3, lr=0.05))
    whole.run(progress=False)
    part.run(1, progress=False)
    path = part.save(str(tmp_path / "s.npz"))
    back = rnb.DeepLearningTask.load(path, (x, y))
    assert repr(back.config.scheduler) == repr(sched)
    back.run(progress=False)
    assert all(back.state_dict()[k].tobytes() == v.tobytes() for k, v in whole.state_dict().items())
    lrs = [r.lr for r in whole.result.history]
    assert [r.lr for r in back.result.history] == lrs and len(set(lrs)) == 3


# --------------------------------------------------------------------------- ReduceLROnPlateau
@pytest.mark.parametrize("mode,threshold_mode,patience,cooldown,min_lr,eps",
                         [("min", "rel", 2, 0, 0.0, 1e-8), ("min", "abs", 0, 1, 1e-3, 1e-8),
                          ("max", "rel", 1, 2, 0.0, 1e-8), ("max", "abs", 3, 0, 0.0, 0.01)])
def test_plateau_steps_as_torch(mode, threshold_mode, patience, cooldown, min_lr, eps):
    """plateau_step against torch's ReduceLROnPlateau fed the same metrics (ties, NaN, long plateaus)."""
    torch = pytest.importorskip("torch")
    from renaissance_nb.train.plateau import ReduceLROnPlateau, plateau_step
    rng = np.random.default_rng(3)
    metrics = np.round(rng.standard_normal(80).cumsum() * 0.1, 2)  # rounded: ties happen
    metrics[[10, 11, 40]] = np.nan
    ours = ReduceLROnPlateau(mode=mode, threshold_mode=threshold_mode, patience=patience, cooldown=cooldown,
                             min_lr=min_lr, eps=eps, factor=0.5, threshold=0.01)
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1)
    ref = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode=mode, threshold_mode=threshold_mode, patience=patience,
                                                     cooldown=cooldown, min_lr=min_lr, eps=eps, factor=0.5,
                                                     threshold=0.01)
    state = ours.initial_state(0.1)
    lrs = []
    for m in metrics:
        ref.step(float(m))
        state = plateau_step(ours, state, float(m))
        lrs.append(state["lr"])
        assert state["lr"] == opt.param_groups[0]["lr"]  # float64, bit for bit
        assert (state["bad"], state["cooldown"]) == (ref.num_bad_epochs, ref.cooldown_counter)
    assert len(set(lrs)) > 2  # it did reduce, more than once


def test_plateau_lowers_the_arena_table_and_resumes_exactly(tmp_path):
    """The task feeds each epoch's record to the schedule; a reduction rewrites the table the step reads
    from the next step on; a checkpoint keeps the schedule's state, and a resumed run is byte-identical."""
    import renaissance_nb as rnb
    from renaissance_nb.train.plateau import ReduceLROnPlateau

    torch = pytest.importorskip("torch")
    x = np.random.default_rng(1).standard_normal((60, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    plateau = ReduceLROnPlateau(monitor="train_loss", mode="max", patience=1, factor=0.5)  # a falling loss never improves

    def task():  # type: ignore[no-untyped-def]
        return (rnb.DeepLearningTask("p").model(rnb.seq(rnb.fc(8), rnb.relu(), rnb.fc(2))).data(train=(x, y), batch_size=16)
                .optimizer(rnb.SGD().lr(0.1)).scheduler(plateau).total_epochs(6).seed(2))

    whole = task()
    hist = whole.run(progress=False).history
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1)
    ref = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", patience=1, factor=0.5)
    expected = []
    for r in hist:  # an epoch's record shows the rate its last step used: the one before that epoch's step()
        expected.append(np.float32(opt.param_groups[0]["lr"]))
        ref.step(r.train_loss)
    assert [np.float32(r.lr) for r in hist] == expected and len(set(expected)) >= 3
    table, spe = whole.read("lr_table"), whole.steps_per_epoch
    assert table[-1] == np.float32(opt.param_groups[0]["lr"]) and np.all(np.diff(table) <= 0)
    assert np.array_equal(whole.lr_table(), np.full(6 * spe, np.float32(0.1)))  # the plan is unchanged
    part = task().save_every(1, str(tmp_path / "p{epoch}.npz"))
    part.run(3, progress=False)
    back = rnb.DeepLearningTask.load(str(tmp_path / "p3.npz"), (x, y))
    assert back.run_state.plateau == part.run_state.plateau
    back.run(progress=False)
    assert all(back.state_dict()[k].tobytes() == v.tobytes() for k, v in whole.state_dict().items())
    assert [r.lr for r in back.result.history] == [r.lr for r in hist]


def test_plateau_settings_are_checked():
    from renaissance_nb.train.plateau import ReduceLROnPlateau
    assert repr(ReduceLROnPlateau(patience=2)) == (
        "ReduceLROnPlateau(monitor='val_loss', mode=None, factor=0.1, patience=2, threshold=0.0001, "
        "threshold_mode='rel', cooldown=0, min_lr=0.0, eps=1e-08)")
    assert ReduceLROnPlateau(monitor="val_top1").direction == "max" and ReduceLROnPlateau().direction == "min"
    for bad, match in ((dict(factor=1.0), r"factor=1.0 is invalid; expected a number in \(0, 1\)"),
                       (dict(monitor="val_acc"), r"monitor='val_acc' is invalid; expected one of 'val_loss'"),
                       (dict(mode="maximum"), "mode='maximum' is invalid"),
                       (dict(patience=-1), "patience=-1 is invalid"),
                       (dict(warmup=1), r"warmup=1 is invalid; expected 0: ReduceLROnPlateau starts at base_lr")):
        with pytest.raises(ConfigError, match=match):
            ReduceLROnPlateau(**bad)


def test_plateau_after_a_strict_false_load_starts_from_the_rate_in_force(tmp_path):
    """A checkpoint of another schedule (or another monitor) loaded with strict=False: the schedule's state
    starts afresh, and the restored table's rate at the next step holds until the first reduction (a
    reduction used to raise the rate above the restored cosine's)."""
    import renaissance_nb as rnb
    from renaissance_nb.train.plateau import ReduceLROnPlateau
    x = np.random.default_rng(1).standard_normal((60, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)

    def task(sched):  # type: ignore[no-untyped-def]
        return (rnb.DeepLearningTask("p").model(rnb.seq(rnb.fc(8), rnb.relu(), rnb.fc(2))).data(train=(x, y), batch_size=16)
                .optimizer(rnb.SGD().lr(0.1)).scheduler(sched).total_epochs(6).seed(2))
    cos = task(CosineAnnealingLR())
    cos.run(3, progress=False)
    path = cos.save(str(tmp_path / "cos.npz"))
    plateau = task(ReduceLROnPlateau(monitor="train_loss", patience=0, factor=0.5)).compile()
    plateau.load_state(path, strict=False)
    table, step = plateau.read("lr_table"), 3 * plateau.steps_per_epoch
    assert (table[step:] == cos.read("lr_table")[step]).all() and plateau.run_state.plateau["lr"] == float(table[step])
    assert plateau.run_state.plateau["best"] == np.inf and plateau.run_state.plateau["bad"] == 0
    plateau.run(progress=False)
    assert np.all(np.diff(plateau.read("lr_table")[step:]) <= 0)  # reductions only lower it

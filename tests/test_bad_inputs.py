"""A catalogue of malformed inputs through the public API.

Each entry builds a task in some phase, makes one bad call, and checks that
(1) a RenaissanceError subclass of the expected type is raised, (2) its message
names the argument or operation and says how to fix it, and (3) the task is
exactly as it was before the call (phase, settings, plan, arena bytes).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

from renaissance_nb import (SGD, Adam, AdamW, BluePrintError, CheckpointError, ConfigError, CosineAnnealingLR,
                           CrossEntropyLoss, DataError, DeepLearningTask, PhaseError, PlanError, Region,
                           RenaissanceError, ShapeError, StepLR, TaskBase, dropout, fc, leaky_relu, node, relu, repeat, seq)
from renaissance_nb import checkpoint
from renaissance_nb.datasets import DataSplits, Dataset

RNG = np.random.default_rng(1)
X = RNG.standard_normal((24, 6)).astype(np.float32)
Y = np.arange(24) % 3
XV = RNG.standard_normal((8, 6)).astype(np.float32)
YV = np.arange(8) % 3
MODEL = seq(fc(8), relu(), fc(3))


# ---- task builders -------------------------------------------------------------------------------------
def blank() -> DeepLearningTask:
    return DeepLearningTask("bad")


def fresh() -> DeepLearningTask:
    return DeepLearningTask("bad").model(MODEL).data(train=(X, Y), val=(XV, YV), batch_size=8).total_epochs(2)


def planned() -> DeepLearningTask:
    t = fresh()
    t.plan()
    return t


def compiled() -> DeepLearningTask:
    return fresh().compile()


def with_model(m) -> Callable[[], DeepLearningTask]:  # type: ignore[no-untyped-def]
    return lambda: DeepLearningTask("bad").model(m).data(train=(X, Y), batch_size=8).total_epochs(2)


def tb_planning() -> TaskBase:
    t = TaskBase("tb")
    t.alloc((4, 3), "float32", Region.I_A_DATA, "X")
    t.alloc((5, 3), "float32", Region.W_FC_WEIGHT, "W")
    t.alloc((5,), "float32", Region.W_FC_BIAS, "b")
    t.alloc((4, 5), "float32", Region.F_FEATURE_FP32, "Y")
    return t


def tb_locked() -> TaskBase:
    t = tb_planning()
    t.finalize_memory()
    return t


def tb_compiled() -> TaskBase:
    t = tb_locked()
    t.add_graph("fwd", [node("fc_fwd", [0, 1, 2], [3], act="relu", slope=0.0)])
    t.compile()
    return t


# ---- snapshot: everything a failed call must leave alone ------------------------------------------------
def snapshot(t: Any) -> tuple:
    if t is None:
        return ()
    arena = None if t.arena is None else t.arena.bytes.tobytes()
    base = (t.phase, len(t.memory), t.memory.finalized, tuple(t.registered_graphs), arena, len(t.transitions))
    if isinstance(t, DeepLearningTask):
        base += (t.config,)  # every setting, as one frozen value
    else:
        base += (tuple(t.bound_graphs),)
    if isinstance(t, DeepLearningTask):
        base += (t.arch is None, t.run_state.epoch, t.run_state.resume_at, len(t.result.history))
        if t.arena is not None:
            base += (t.runner.env.perms["train"].tobytes(),)
    return base


def _nan_x() -> np.ndarray:
    x = X.copy()
    x[3, 2] = np.nan
    return x


def _inf_x() -> np.ndarray:
    x = X.copy()
    x[5, 0] = np.inf
    return x


P = pytest.param
CASES = [
    # ---- BluePrint builders (evaluated inside task.model(...), so the task is checked too) --------------
    P(fresh, lambda t: t.model(seq(fc(0))), BluePrintError, ["fc", "out=0"], id="fc(0)"),
    P(fresh, lambda t: t.model(seq(fc(-3))), BluePrintError, ["fc", "out=-3"], id="fc(-3)"),
    P(fresh, lambda t: t.model(seq(fc(2.5))), BluePrintError, ["fc", "out=2.5"], id="fc(2.5)"),
    P(fresh, lambda t: t.model(seq(fc(True))), BluePrintError, ["fc", "out=True"], id="fc(True)"),
    P(fresh, lambda t: t.model(seq(fc(10, bias="yes"))), BluePrintError, ["bias"], id="fc-bias-str"),
    P(fresh, lambda t: t.model(seq(dropout(1.5))), BluePrintError, ["dropout", "p=1.5"], id="dropout(1.5)"),
    P(fresh, lambda t: t.model(seq(dropout(-0.1))), BluePrintError, ["dropout", "p=-0.1"], id="dropout(-0.1)"),
    P(fresh, lambda t: t.model(seq(dropout(1.0))), BluePrintError, ["dropout", "p=1.0"], id="dropout(1.0)"),
    P(fresh, lambda t: t.model(seq(leaky_relu(-1))), BluePrintError, ["negative_slope"], id="leaky_relu(-1)"),
    P(fresh, lambda t: t.model(seq()), BluePrintError, ["seq", "no layers"], id="seq()"),
    P(fresh, lambda t: t.model(seq(relu)), BluePrintError, ["seq", "layer #0", "relu()"], id="seq(relu-fn)"),
    P(fresh, lambda t: t.model(seq(3)), BluePrintError, ["seq", "layer #0"], id="seq(3)"),
    P(fresh, lambda t: t.model(repeat(fc(3), 0)), BluePrintError, ["repeat", "n=0"], id="repeat-n0"),
    P(fresh, lambda t: t.model(repeat("fc", 2)), BluePrintError, ["repeat", "body"], id="repeat-body-str"),
    P(fresh, lambda t: t.model("seq(fc(10))"), ConfigError, ["model", "blueprint"], id="model-not-blueprint"),
    # ---- loss / optimizer / scheduler ------------------------------------------------------------------
    P(fresh, lambda t: t.loss(AdamW()), ConfigError, ["loss", "CrossEntropyLoss"], id="loss-wrong-kind"),
    P(fresh, lambda t: t.optimizer(CrossEntropyLoss()), ConfigError, ["optimizer"], id="optimizer-wrong-kind"),
    P(fresh, lambda t: t.scheduler(AdamW()), ConfigError, ["scheduler"], id="scheduler-wrong-kind"),
    P(fresh, lambda t: t.optimizer(AdamW().lr(-1)), ConfigError, ["lr=-1"], id="lr-negative"),
    P(fresh, lambda t: t.optimizer(AdamW().lr(float("nan"))), ConfigError, ["lr=nan"], id="lr-nan"),
    P(fresh, lambda t: t.optimizer(SGD().lr(float("inf"))), ConfigError, ["lr=inf"], id="lr-inf"),
    P(fresh, lambda t: t.optimizer(AdamW().weight_decay(-0.1)), ConfigError, ["weight_decay"], id="wd-negative"),
    P(fresh, lambda t: t.optimizer(Adam().betas(1.0, 0.999)), ConfigError, ["beta1"], id="beta1-one"),
    P(fresh, lambda t: t.optimizer(AdamW().betas(0.9, -0.1)), ConfigError, ["beta2"], id="beta2-negative"),
    P(fresh, lambda t: t.optimizer(Adam().betas((0.9,))), ConfigError, ["betas"], id="betas-not-pair"),
    P(fresh, lambda t: t.optimizer(Adam().eps(-1.0)), ConfigError, ["eps"], id="adam-eps-negative"),
    P(fresh, lambda t: t.optimizer(SGD().nesterov(True)), ConfigError, ["nesterov", "momentum"],
      id="sgd-nesterov-no-momentum"),
    P(fresh, lambda t: t.optimizer(SGD().momentum(-0.5)), ConfigError, ["momentum"], id="sgd-momentum-negative"),
    P(fresh, lambda t: t.loss(CrossEntropyLoss().label_smoothing(1.5)), ConfigError, ["label_smoothing"],
      id="label-smoothing-1.5"),
    P(fresh, lambda t: t.scheduler(CosineAnnealingLR().base_lr(-1.0)), ConfigError, ["base_lr"],
      id="sched-base-lr-negative"),
    P(fresh, lambda t: t.scheduler(StepLR().step_size(0)), ConfigError, ["step_size"], id="steplr-step-size-0"),
    P(lambda: fresh().scheduler(CosineAnnealingLR().warmup(5)), lambda t: t.plan(), ConfigError,
      ["warmup", "longer than training"], id="warmup-longer-than-training"),
    # ---- task settings -----------------------------------------------------------------------------------
    P(fresh, lambda t: t.total_epochs(0), ConfigError, ["total_epochs", "epochs=0"], id="total_epochs(0)"),
    P(fresh, lambda t: t.total_epochs(1.5), ConfigError, ["total_epochs", "epochs=1.5"], id="total_epochs(1.5)"),
    P(fresh, lambda t: t.seed(-1), ConfigError, ["seed", "seed=-1"], id="seed(-1)"),
    P(fresh, lambda t: t.options(fuse="yes"), ConfigError, ["options", "fuse"], id="options-fuse-str"),
    # ---- data --------------------------------------------------------------------------------------------
    P(fresh, lambda t: t.data(train=(X, Y), batch_size=0), ConfigError, ["batch_size=0"], id="batch-0"),
    P(fresh, lambda t: t.data(train=(X, Y), batch_size=25), DataError, ["batch_size=25", "24"],
      id="batch-larger-than-data"),
    P(fresh, lambda t: t.data(train=(X, Y), batch_size=8, val_batch_size=-2), ConfigError, ["val_batch_size"],
      id="val-batch-negative"),
    P(fresh, lambda t: t.data(train=(X, Y), batch_size=8, shuffle="yes"), ConfigError, ["shuffle"], id="shuffle-str"),
    P(fresh, lambda t: t.data(train=(X[:, 0], Y)), DataError, ["train X"], id="X-1d"),
    P(fresh, lambda t: t.data(train=(np.array([["a", "b"]] * 24), Y)), DataError, ["train X"], id="X-strings"),
    P(fresh, lambda t: t.data(train=(X.astype(object), Y)), DataError, ["train X"], id="X-object"),
    P(fresh, lambda t: t.data(train=(X, Y - 1)), DataError, ["train y", "-1"], id="y-negative"),
    P(fresh, lambda t: t.data(train=(X, Y), val=(XV, YV + 5)), DataError, ["val y", "num_classes"],
      id="val-y-out-of-range"),
    P(fresh, lambda t: t.data(train=(X, np.full(24, 1.5))), DataError, ["train y", "1.5"], id="y-float-1.5"),
    P(fresh, lambda t: t.data(train=(X, np.eye(3)[Y])), DataError, ["train y", "argmax"], id="y-one-hot"),
    P(fresh, lambda t: t.data(train=(_nan_x(), Y)), DataError, ["train X", "NaN"], id="X-nan"),
    P(fresh, lambda t: t.data(train=(_inf_x(), Y)), DataError, ["train X", "Inf"], id="X-inf"),
    P(fresh, lambda t: t.data(train=(X, Y[:20])), DataError, ["train y", "length"], id="X-y-length-mismatch"),
    P(fresh, lambda t: t.data(train=(X[:0], Y[:0])), DataError, ["train"], id="empty-dataset"),
    P(fresh, lambda t: t.data(train=(X, Y), val=(XV[:, :4], YV)), DataError, ["val X", "shape"],
      id="val-sample-shape"),
    P(fresh, lambda t: t.data(train=X), DataError, ["train"], id="train-not-a-pair"),
    P(fresh, lambda t: t.data("mnist"), DataError, ["data"], id="data-str"),
    P(blank, lambda t: t.data((X, Y), train=(X, Y)), ConfigError, ["data", "train="], id="data-twice"),
    # ---- plan-time mismatches ------------------------------------------------------------------------------
    P(with_model(seq(fc(8), relu(), fc(5))), lambda t: t.plan(), ShapeError, ["plan", "3"],
      id="output-width-ne-classes"),
    P(lambda: DeepLearningTask("bad").model(seq(fc(8), relu(), fc(3)))
      .data(train=(X.reshape(24, 2, 3), Y), batch_size=8), lambda t: t.plan(), ShapeError, ["fc", "flatten()"],
      id="fc-on-unflattened-images"),
    P(lambda: DeepLearningTask("bad").data(train=(X, Y), batch_size=8), lambda t: t.plan(), ConfigError, ["plan", "model"],
      id="plan-without-model"),
    P(lambda: DeepLearningTask("bad").model(MODEL), lambda t: t.plan(), ConfigError, ["plan", "data"],
      id="plan-without-data"),
    # ---- phase guards ----------------------------------------------------------------------------------------
    P(tb_locked, lambda t: t.alloc((2,), "float32", Region.T_TEMP_FP32), PhaseError, ["alloc()", "PLANNING"],
      id="tb-alloc-after-finalize"),
    P(tb_planning, lambda t: t.add_graph("g", [node("fc_fwd", [0, 1, 2], [3])]), PhaseError,
      ["add_graph()", "MEMORY_LOCKED"], id="tb-add_graph-before-finalize"),
    P(tb_planning, lambda t: t.run("fwd"), PhaseError, ["run()", "COMPILED"], id="tb-run-before-compile"),
    P(tb_locked, lambda t: t.read(0), PhaseError, ["read()", "COMPILED"], id="tb-read-before-compile"),
    P(tb_locked, lambda t: t.write(0, 1.0), PhaseError, ["write()", "COMPILED"], id="tb-write-before-compile"),
    P(tb_planning, lambda t: t.compile(), PhaseError, ["compile()", "MEMORY_LOCKED"], id="tb-compile-in-planning"),
    P(tb_compiled, lambda t: t.finalize_memory(), PhaseError, ["finalize_memory()"], id="tb-finalize-twice"),
    P(planned, lambda t: t.total_epochs(3), PhaseError, ["total_epochs()", "reset()"], id="dlt-setter-after-plan"),
    P(compiled, lambda t: t.model(MODEL), PhaseError, ["model()", "COMPILED"], id="dlt-setter-after-compile"),
    P(fresh, lambda t: t.evaluate(XV, YV), PhaseError, ["evaluate()", "compile()"], id="dlt-evaluate-before-compile"),
    P(fresh, lambda t: t.predict(XV), PhaseError, ["predict()", "compile()"], id="dlt-predict-before-compile"),
    P(fresh, lambda t: t.state_dict(), PhaseError, ["state_dict()"], id="dlt-state_dict-before-compile"),
    P(compiled, lambda t: t.lock_memory(), PhaseError, ["lock_memory()"], id="dlt-lock-after-compile"),
    P(fresh, lambda t: t.alloc((2,), "float32", Region.T_TEMP_FP32), PlanError, ["alloc", "TaskBase"],
      id="dlt-alloc-by-hand"),
    # ---- TaskBase planning and graphs ------------------------------------------------------------------------
    P(tb_planning, lambda t: t.alloc((2, 2)), PlanError, ["alloc", "region"], id="alloc-no-region"),
    P(tb_planning, lambda t: t.alloc((2, 2), "complex128", Region.T_TEMP_FP32), PlanError, ["alloc", "dtype"],
      id="alloc-complex128"),
    P(tb_planning, lambda t: t.alloc((0, 3), "float32", Region.T_TEMP_FP32), PlanError, ["alloc", "shape"],
      id="alloc-shape-0"),
    P(tb_planning, lambda t: t.alloc((2.5, 3), "float32", Region.T_TEMP_FP32), PlanError, ["alloc", "shape"],
      id="alloc-shape-float"),
    P(tb_planning, lambda t: t.alloc((2,), "float32", Region.END), PlanError, ["alloc", "region"],
      id="alloc-region-END"),
    P(tb_planning, lambda t: t.alloc((2,), "float32", Region.T_TEMP_FP32, "X"), PlanError, ["alloc", "name"],
      id="alloc-duplicate-name"),
    P(lambda: TaskBase("tb"), lambda t: t.finalize_memory(), PlanError, ["finalize_memory", "alloc()"],
      id="finalize-empty"),
    P(tb_locked, lambda t: t.add_graph("g", [node("fc_fwd", [0, 1, 99], [3])]), PlanError, ["add_graph", "99"],
      id="node-unknown-tensor-id"),
    P(tb_locked, lambda t: t.add_graph("g", [node("conv9d", [0], [3])]), PlanError, ["add_graph", "conv9d"],
      id="node-unknown-op"),
    P(tb_locked, lambda t: t.add_graph("", [node("fc_fwd", [0, 1, 2], [3])]), PlanError, ["add_graph", "name"],
      id="graph-empty-name"),
    P(tb_locked, lambda t: t.add_graph("g", []), PlanError, ["add_graph", "graph"], id="graph-no-nodes"),
    P(tb_locked, lambda t: t.add_graph("g", [node("fc_fwd", [0, 1, 2], [3])], stream="comp"), PlanError,
      ["add_graph", "stream"], id="graph-bad-stream"),
    P(tb_compiled, lambda t: t.run("nope"), PlanError, ["run", "nope"], id="run-unknown-graph"),
    P(tb_compiled, lambda t: t.write(1, np.zeros((3, 5))), PlanError, ["write", "value"], id="write-wrong-shape"),
    P(tb_compiled, lambda t: t.read("nope"), PlanError, ["nope"], id="read-unknown-name"),
    P(tb_compiled, lambda t: t.read(17), PlanError, ["17"], id="read-unknown-id"),
    # ---- compiled DeepLearningTask ---------------------------------------------------------------------------
    P(compiled, lambda t: t.evaluate(XV[:, :4], YV), DataError, ["evaluate: x=array"], id="evaluate-sample-shape"),
    P(compiled, lambda t: t.evaluate(XV, YV + 3), DataError, ["y"], id="evaluate-labels-out-of-range"),
    P(compiled, lambda t: t.predict(XV[:, :5]), DataError, ["predict: x=array"], id="predict-sample-shape"),
    P(compiled, lambda t: t.load_state_dict({"fc1.weight": np.zeros((8, 6))}), CheckpointError,
      ["load_state_dict", "missing"], id="load_state_dict-missing-key"),
    P(compiled, lambda t: t.load_state_dict({**t.state_dict(), "fc1.weight": np.zeros((6, 8))}), CheckpointError,
      ["load_state_dict", "fc1.weight"], id="load_state_dict-wrong-shape"),
    P(compiled, lambda t: t.load_state_dict({**t.state_dict(), "fc2.bias": np.full(3, np.nan)}), CheckpointError,
      ["load_state_dict", "non-finite"], id="load_state_dict-nan"),
    P(compiled, lambda t: t.load_state_dict([1, 2]), CheckpointError, ["load_state_dict", "state"],
      id="load_state_dict-not-dict"),
    P(compiled, lambda t: checkpoint.load_state(t, "/nonexistent/dir/ck.npz"), CheckpointError,
      ["load_state", "/nonexistent/dir/ck.npz"], id="load_state-missing-file"),
    P(fresh, lambda t: checkpoint.save(t, "/tmp/x.npz"), PhaseError, ["save()"], id="save-before-compile"),
    P(compiled, lambda t: t.run(epochs=0, progress=False), ConfigError, ["run", "epochs=0"], id="run-epochs-0"),
    P(compiled, lambda t: t.write("fc1.weight", 1e300), PlanError, ["write", "value=1e+300", "finite values within"],
      id="write-past-float32"),
    P(with_model(seq(fc(2 ** 30), relu(), fc(2 ** 31 - 1), relu(), fc(3))), lambda t: t.compile(), PlanError,
      ["arena", "32.0 EiB", "cannot allocate"], id="compile-arena-past-numpy"),  # was NumPy's ValueError
    P(compiled, lambda t: t.generate([1], 2), ConfigError, ["generate", "token windows"], id="generate-not-a-language-model"),
    P(blank, lambda t: t.data(DataSplits(None, None, "s")), DataError, ["data: train=None", "Dataset("],
      id="data-splits-without-train"),
    P(blank, lambda t: t.data(DataSplits(Dataset(X, Y, 3, "d"), (XV, YV), "s")), DataError, ["data: val=", "or None"],
      id="data-splits-val-a-tuple"),
    P(blank, lambda t: t.data(Dataset([[1.0, 2.0], [3.0]], [0, 1], 3, "d")), DataError, ["train.x=", "equal-shaped"],
      id="data-dataset-ragged"),
    P(compiled, lambda t: setattr(t, "name", None), ConfigError, ["name=None", "non-empty str"], id="name-none"),
    P(compiled, lambda t: setattr(t, "name", ""), ConfigError, ["name=''", "non-empty str"], id="name-empty"),
    P(tb_locked, lambda t: t.add_graph("g", [node("act_fwd", [3], [3], act="bogus")]), PlanError,
      ["act='bogus'", "Fix: set the parameter"], id="add_graph-unknown-activation"),
    # ---- the memory inspector --------------------------------------------------------------------------------
    P(fresh, lambda t: t.memory_inspector.fit(float("nan")), ConfigError, ["memory.fit", "budget_bytes=nan"],
      id="fit-nan"),
    P(fresh, lambda t: t.memory_inspector.fit(float("inf")), ConfigError, ["memory.fit", "budget_bytes=inf"],
      id="fit-inf"),
    P(fresh, lambda t: t.memory_inspector.live_at("3"), ConfigError, ["memory.live_at", "time='3'", "a tick in [0, "],
      id="live_at-str"),
    P(fresh, lambda t: t.memory_inspector.live_at(10 ** 9), ConfigError, ["memory.live_at", "time=1000000000"],
      id="live_at-past-the-step"),
    P(fresh, lambda t: t.memory_inspector.plan([]), PlanError, ["memory.plan", "variant=[]"], id="plan-variant-list"),
    P(fresh, lambda t: t.memory_inspector.diff(None), ConfigError, ["memory.diff", "other=None"], id="diff-none"),
    P(fresh, lambda t: t.memory_inspector.what_if(heads=2), ConfigError, ["heads=2", "attention layers"],
      id="what_if-heads-without-attention"),
]

# ---- engine gaps: the call is refused and the task is unchanged, but the message gives no fix ----------------
@pytest.mark.parametrize("setup, call, exc, words", CASES)
def test_bad_input(setup, call, exc, words) -> None:
    t = setup()
    before = snapshot(t)
    with pytest.raises(RenaissanceError) as info:
        call(t)
    err = info.value
    msg = str(err)
    assert isinstance(err, exc), f"{type(err).__name__}: {msg}"
    for w in words:
        assert w in msg, f"{w!r} not in: {msg}"
    assert snapshot(t) == before, "the failed call changed the task"
    assert "Fix" in msg, msg


def test_catalogue_size() -> None:
    assert len(CASES) >= 40
    assert len({c.id for c in CASES}) == len(CASES)


def test_compiled_task_still_trains_after_bad_calls() -> None:
    """After a series of refused calls a compiled task still trains to the same numbers."""
    a, b = compiled(), compiled()
    for call in (lambda: b.evaluate(XV[:, :4], YV), lambda: b.load_state_dict({}), lambda: b.total_epochs(5),
                 lambda: b.run(epochs=0), lambda: checkpoint.load_state(b, "/nonexistent.npz")):
        with pytest.raises(RenaissanceError):
            call()
    a.run(progress=False)
    b.run(progress=False)
    assert {k: v.tobytes() for k, v in a.state_dict().items()} == {k: v.tobytes() for k, v in b.state_dict().items()}


def test_a_dataset_of_lists_trains_as_arrays_do() -> None:
    """A Dataset built by hand from Python lists is taken as train=(x, y) takes them (it raised AttributeError)."""
    a = DeepLearningTask("l").model(MODEL).data(Dataset(X.tolist(), Y.tolist(), 3, "d"), batch_size=8).total_epochs(1)
    b = DeepLearningTask("l").model(MODEL).data(Dataset(X, Y, 3, "d"), batch_size=8).total_epochs(1)
    a.run(progress=False)
    b.run(progress=False)
    assert {k: v.tobytes() for k, v in a.state_dict().items()} == {k: v.tobytes() for k, v in b.state_dict().items()}


def test_load_state_names_a_setting_that_sizes_the_plan(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A checkpoint of another total_epochs or batch size: the setting is named (the loss log's or the batch
    buffer's shape was), strict or not, and the task is left as it was; another val_batch_size loads with
    strict=False, as it did."""
    saved = compiled()
    saved.save(str(tmp_path / "a.npz"))
    for other, words in ((fresh().total_epochs(3), "setting total_epochs differs: 2 in"),
                         (DeepLearningTask("bad").model(MODEL).data(train=(X, Y), val=(XV, YV), batch_size=4)
                          .total_epochs(2), "setting batch_size differs: 8 in")):
        other.compile()
        before = snapshot(other)
        for strict in (True, False):
            with pytest.raises(CheckpointError, match=words + r".*even with strict=False"):
                other.load_state(str(tmp_path / "a.npz"), strict=strict)
        assert snapshot(other) == before
    val = DeepLearningTask("bad").model(MODEL).data(train=(X, Y), val=(XV, YV), batch_size=8, val_batch_size=4)
    val.total_epochs(2).compile()
    with pytest.raises(CheckpointError, match="setting val_batch_size differs"):
        val.load_state(str(tmp_path / "a.npz"))
    val.load_state(str(tmp_path / "a.npz"), strict=False)

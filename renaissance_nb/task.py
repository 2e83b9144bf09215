"""DeepLearningTask: the fluent builder and the phase facade over the engine's objects.

    task.plan()          PLANNING       task.planned:  ArchPlan + the tensors of all six variants
    task.lock_memory()   MEMORY_LOCKED  task.locked:   zero-shape graphs, six MemoryPlans
    task.compile()       COMPILED       task.compiled: the atlas; task.runner: arena bound, weights set
    task.run()                          task.trainer replays the compiled step, epoch by epoch

The task holds one frozen TaskConfig (builder calls replace it), the stage values (compiler/
pipeline.py), the Runner and the Trainer with its RunState; each of those owns its own state.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from . import config_checks as check
from .blueprint import BluePrint
from .checks import SuggestsNames, arguments_checked, as_flag
from .compiler.pipeline import (Locked, Planned, compile_stage, describe_task, learning_rates,
                                learning_rates_key, lock_stage, plan_stage)
from .compiler.stages import CompiledPlan
from .compiler.layers import ArchPlan
from .config import TaskConfig
from .data.arrays import DataSplits, Dataset
from .errors import CheckpointError, ConfigError, PhaseError, PlanError
from .export import export_onnx, save_safetensors
from .inspector import MemoryInspector
from .inspector.lr_range import LRRangeTest, check_lr_find, lr_range_test
from .memory.dtensor import DTensor
from .memory.plan import MemoryPlan
from .phases import Phase, Phased, PhaseMachine
from .progress import progress_kind
from .result import TrainingResult
from .runtime.inference import Inference
from .runtime.runner import Runner
from .runtime.tensors import TensorIO
from .runtime.trainer import RunState, Trainer, plateau_start
from .task_settings import NumericSettings
from .text import human_bytes, plural
from .train.callbacks import check_watchers, checked_callbacks
from .train.losses import CrossEntropyLoss
from .train.optimizers import Optimizer
from .train.plateau import ReduceLROnPlateau
from .train.schedulers import Scheduler

_arguments_checked = arguments_checked(ConfigError, call="task.")
"""Task builders: a misspelt keyword or a setting passed by position is a ConfigError."""


_ELSEWHERE = {"lr": "the learning rate is the optimizer's: task.optimizer(AdamW().lr(1e-3)).",
              "batch_size": "the batch size comes with the data: task.data(splits, batch_size=128).",
              "fit": "task.run() trains (it compiles first when needed).",
              "train": "task.run() trains (it compiles first when needed)."}
"""Names users bring from other libraries for what lives elsewhere here, with where it lives."""


class DeepLearningTask(NumericSettings, Phased, SuggestsNames):
    """Model, data, loss, optimizer and schedule, compiled into one replayable step."""
    _elsewhere = _ELSEWHERE  # task.epochs(3): did you mean total_epochs; task.lr: the optimizer's

    def __init__(self, name: str = "task", *, config: TaskConfig | None = None) -> None:
        self._config = config if config is not None else TaskConfig(name=check.task_name(name))
        self.phases = PhaseMachine()
        self.planned: Planned | None = None
        self.locked: Locked | None = None
        self.compiled: CompiledPlan | None = None
        self.runner: Runner | None = None
        self.trainer: Trainer | None = None
        self.run_state = RunState()
        self._lr_cache: tuple[Any, np.ndarray] | None = None

    # ---- settings (PLANNING, before plan()) ---------------------------------------------------------
    def _settable(self, name: str) -> None:
        if self.phase is not Phase.PLANNING or self.planned is not None:
            state = f"{self.phase} (planned)" if self.phase is Phase.PLANNING else str(self.phase)
            keep = (" and the trained weights (keep them: sd = task.state_dict(), then task.load_state_dict(sd) "
                    "after compile(); the optimizer's moments start over)"
                    if self.result.history and name != "model" else "")
            raise PhaseError(name, state, "PLANNING (before plan())",
                             f"The setting {name} can no longer change: the task's plan is made from it. "
                             f"Fix: create a new DeepLearningTask, or call task.reset() to discard the plan{keep}.")

    def _set(self, name: str | None, fields: Callable[[], dict[str, Any]]) -> "DeepLearningTask":
        """A new config with the ``fields()`` config_checks returns; ``name``: the plan setting it changes,
        checked first (a setting that can no longer change is refused before its arguments are read)."""
        if name is not None:
            self._settable(name)
        self._config = self._config.with_(**fields())
        return self

    @_arguments_checked
    def model(self, blueprint: BluePrint) -> "DeepLearningTask":
        return self._set("model", lambda: check.model(blueprint))

    @_arguments_checked
    def data(self, splits: DataSplits | Dataset | tuple | None = None, *, train: tuple | None = None,
             val: tuple | None = None, batch_size: int = 128, val_batch_size: int | None = None,
             shuffle: bool = True, num_classes: int | None = None,
             channels_last: bool | None = None, val_fraction: float | None = None) -> "DeepLearningTask":
        """Data as DataSplits (datasets.mnist(...)) or arrays: train=(X, y), val=(Xv, yv);
        ``val_fraction`` holds out that share of each class of the training arrays as the validation
        set instead (the same split every time);
        ``num_classes`` for arrays whose highest class is missing from train. Images are read as
        (N, C, H, W), as in PyTorch: ``channels_last=True`` converts (N, H, W, C) images (and the
        arrays later given to evaluate/predict); ``False`` says (N, C, H, W) data that plan() would
        otherwise take for channels-last is not."""
        return self._set("data", lambda: check.data(splits, train=train, val=val, batch_size=batch_size,
                                          val_batch_size=val_batch_size, shuffle=shuffle, num_classes=num_classes,
                                          channels_last=channels_last, val_fraction=val_fraction))

    @_arguments_checked
    def loss(self, loss: CrossEntropyLoss) -> "DeepLearningTask":
        return self._set("loss", lambda: check.loss(loss))

    @_arguments_checked
    def optimizer(self, optimizer: Optimizer) -> "DeepLearningTask":
        return self._set("optimizer", lambda: check.optimizer(optimizer))

    @_arguments_checked
    def scheduler(self, scheduler: Scheduler | None) -> "DeepLearningTask":
        """The learning-rate schedule over the optimizer's lr; None for a constant lr (the default)."""
        return self._set("scheduler", lambda: check.scheduler(scheduler))

    @_arguments_checked
    def total_epochs(self, epochs: int) -> "DeepLearningTask":
        return self._set("total_epochs", lambda: check.total_epochs(epochs))

    @_arguments_checked
    def seed(self, seed: int) -> "DeepLearningTask":
        return self._set("seed", lambda: check.seed(seed))

    @_arguments_checked
    def init(self, scheme: str = "kaiming_uniform", *, gain: float | None = None, a: float | None = None,
             mode: str | None = None, nonlinearity: str | None = None) -> "DeepLearningTask":
        """Weight initialisation, torch.nn.init's ``<scheme>_`` with its keywords (docs/guide.md):
        "kaiming_uniform" (nn.Linear's and nn.Conv2d's own, a=sqrt(5): the default), "kaiming_normal",
        "xavier_uniform", "xavier_normal", "orthogonal" or "zeros"; all but the first zero the biases."""
        return self._set("init", lambda: check.init(scheme, gain=gain, a=a, mode=mode, nonlinearity=nonlinearity))

    @_arguments_checked
    def train_resolution(self, begin: int | tuple[int, int], end: int | tuple[int, int],
                         boundary_epoch: int) -> "DeepLearningTask":
        """Progressive resizing: train at ``begin`` (H, W) before ``boundary_epoch``, at ``end`` after (for a language
        model: context lengths). Both use the same graph; the atlas binds one copy per distinct ShapeId."""
        return self._set("train_resolution", lambda: check.train_resolution(begin, end, boundary_epoch))

    @_arguments_checked
    def augment(self, crop_pad: int = 0, flip: bool = False) -> "DeepLearningTask":
        """On-the-fly augmentation of image data, drawn from Philox's AUGMENT stream (deterministic)."""
        return self._set("augment", lambda: check.augment(crop_pad, flip))

    @_arguments_checked
    def options(self, *, fuse: bool | None = None, liveness: bool | None = None, nan_check: bool | None = None,
                zero_grad: bool | None = None, nan_policy: str | None = None, prefetch: bool | None = None,
                pad_rows: bool | None = None, fold_bn: bool | None = None,
                recompute: bool | None = None) -> "DeepLearningTask":
        """Compiler switches, each testable against the plain path (like tinygrad's flags).

        pad_rows (default True): weight matrices with rows a multiple of 4 KiB get 64 more bytes per row (so do
        their gradients, moments, EMA copies): such strides alias in the cache and slow the products (oneMKL's guide).
        fold_bn (default False): at inference a conv + bn runs as one conv (ops/conv_bn.py); recompute
        (default False): each block's activations are recomputed before its backward (compiler/recompute.py).
        nan_policy: "raise" (default) stops at a non-finite gradient or loss, naming it;
        "skip" skips that update and counts it (task.skipped_updates). A skipped update is not a
        step: Adam's step count (as torch's, whose GradScaler skips ``optimizer.step()``) and the
        schedule both index finished updates, so the lr table is not advanced by a skipped batch (as
        DeepSpeed skips its scheduler on overflow; a torch AMP loop that calls ``scheduler.step()``
        every batch would advance it), and a run with skips ends before the table's last entries."""
        return self._set("options", lambda: check.options(fuse=fuse, liveness=liveness, nan_check=nan_check,
                                                          zero_grad=zero_grad, nan_policy=nan_policy,
                                                          prefetch=prefetch, pad_rows=pad_rows, fold_bn=fold_bn,
                                                          recompute=recompute))

    @_arguments_checked
    def device(self, device: str = "auto", *, data: str = "auto", capture: str = "entry") -> "DeepLearningTask":
        """Where the step replays: "cpu" (a task's default until device() is called), "cuda" (CUDA graphs
        through CuPy; an error if there is no GPU) or "auto" (this method's default: the GPU when CuPy
        finds one and the model's ops all have GPU kernels, else the CPU). The plan, offsets and atlas are
        the same on both.

        data (GPU only): "device" copies the data sets to GPU memory once and gathers each batch there;
        "pinned" keeps them on the host and streams each batch through page-locked staging, the copy
        overlapping the step before; "auto" picks "device" when the data take under a quarter of the
        free GPU memory. capture (GPU only): "entry" replays one CUDA graph per atlas entry, a handful
        per step; "step" also captures each distinct step program as one graph, so a step is one launch.
        """
        return self._set("device", lambda: check.device(device, data=data, capture=capture))

    @_arguments_checked
    def distributed(self, backend: str | None = "mpi", ranks: int | None = None, allreduce: str = "buckets") -> "DeepLearningTask":
        """Data-parallel over mpiexec's ranks (``ranks``: plan for N without MPI), batch_size the global batch (docs/scaling.md)."""
        return self._set("distributed", lambda: check.distributed(backend, ranks, allreduce))

    @_arguments_checked
    def save_every(self, epochs: int | None, path: str = "checkpoints/{name}-epoch{epoch}.npz") -> "DeepLearningTask":
        """Checkpoint every ``epochs`` epochs (None: stop); ``path`` may use {name} and {epoch}. Not part of
        the plan, so it can change in any phase; checkpoints record it, and ``load()`` keeps saving."""
        return self._set(None, lambda: check.save_every(epochs, path))

    @_arguments_checked
    def save_best(self, path: str | None = "checkpoints/{name}-best.npz", *, monitor: str | None = None,
                  mode: str | None = None) -> "DeepLearningTask":
        """Checkpoint whenever an epoch is the best so far (None: stop): by validation top-1 (train top-1
        without val data), or by ``monitor``, an EpochRecord field such as 'val_loss' (Lightning's
        ModelCheckpoint(monitor=...)), lowest best for a loss and highest for a top-k unless ``mode``
        says 'min' or 'max'. Like save_every, it can change in any phase."""
        return self._set(None, lambda: check.save_best(path, monitor=monitor, mode=mode))

    def reset(self) -> "DeepLearningTask":
        """Discard the plan, arena and history; settings stay. Back to PLANNING."""
        self.run_state.check_not_running("reset", self.phase)
        self.__init__(config=self._config)  # type: ignore[misc]
        return self

    @contextmanager
    def _unchanged_on_error(self) -> Iterator[None]:
        """A stage that fails (a bad setting found late, no GPU, no memory, Ctrl-C) leaves the task as it was:
        the stages assign new objects, so a shallow copy of the attributes and the phases is the whole state."""
        saved, phases = dict(self.__dict__), self.phases.snapshot()
        try:
            yield
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(saved)
            self.phases.restore(phases)
            raise

    def alloc(self, *args: Any, **kwargs: Any) -> None:
        raise _by_hand("alloc", "plans its memory", "allocate tensors")

    def add_graph(self, *args: Any, **kwargs: Any) -> None:
        raise _by_hand("add_graph", "builds its graphs", "register hand-built graphs")

    # ---- the stages ------------------------------------------------------------------------------------
    def plan(self) -> ArchPlan:
        """Stages 1-2: ArchPlan and the tensors of all six variants (inspect task.planned)."""
        self._require("plan", Phase.PLANNING)
        if self.planned is None:
            started = time.time()
            self.planned = plan_stage(self._config)  # nothing to undo: it assigns once, at the end
            self.phases.note("plan", started)
        return self.planned.arch

    def lock_memory(self) -> "DeepLearningTask":
        """Stages 3 and 4: build the zero-shape graphs, then finalize the six MemoryPlans."""
        self._require("lock_memory", Phase.PLANNING)
        with self._unchanged_on_error():
            self.plan()
            started = time.time()
            assert self.planned is not None
            self.locked = lock_stage(self._config, self.planned)
            self.phases.advance(Phase.MEMORY_LOCKED, "lock_memory", started)
        return self

    def compile(self) -> "DeepLearningTask":
        """Stage 5 and binding: fill the atlas, create the arena, bind, initialise weights."""
        if self.phase is Phase.COMPILED:
            return self
        with self._unchanged_on_error():  # from PLANNING too: a missing GPU or memory undoes lock_memory()
            if self.phase is Phase.PLANNING:
                self.lock_memory()
            started = time.time()
            assert self.planned is not None and self.locked is not None
            compiled = compile_stage(self._config, self.planned, self.locked)
            runner = Runner(self._config, compiled, self.planned.lr_table)
            self.compiled, self.runner = compiled, runner
            self.trainer = Trainer(runner, self.run_state, self.save)
            if isinstance(self._config.scheduler, ReduceLROnPlateau):
                self.run_state.plateau = plateau_start(self._config)
            self.phases.advance(Phase.COMPILED, "compile", started)
        return self

    # ---- training ----------------------------------------------------------------------------------
    @_arguments_checked
    def run(self, epochs: int | None = None, *, progress: str | bool = "auto", resume: bool = True,
            callbacks: Sequence[Callable[[str, Any], None]] = ()) -> TrainingResult:
        """Train to total_epochs (or ``epochs`` more), compiling first if needed. Ctrl-C (the notebook's
        stop button) ends the run at a step boundary, history complete to that step; ``run()`` continues
        from the next step to the same weights as an uninterrupted run; ``resume=False`` starts the epoch
        over on the weights as they are (step count, schedule and loss log back at its start). A callback's
        exception stops the same way (and is raised), StopTraining cleanly (``result.stopped``; see
        EarlyStopping). ``callbacks``: ``cb(kind, info)`` with kind "start", "step" (at steps 16, 32, ...
        of each epoch), "epoch" and "end". ``progress``: "auto"/True (a tqdm bar in a notebook, lines in a
        terminal: one per epoch, and one every 20 s inside a long epoch), "bar", "lines", False/None/0."""
        kind = progress_kind(progress)
        resume = check.flag("run", "resume", resume)
        cbs = checked_callbacks(callbacks)
        self.run_state.check_not_running("run", self.phase)
        more = None if epochs is None else check.int_setting("run", "epochs", epochs)  # before anything changes
        check_watchers(self._config.record_fields(), self._config.save_best_field, cbs)  # before compile()
        self.run_state.running = True
        try:
            if self.phase is not Phase.COMPILED:
                self._require("run", Phase.PLANNING, Phase.MEMORY_LOCKED, Phase.COMPILED)
                self.compile()
            assert self.trainer is not None
            return self.trainer.run(self._config, more, kind, resume, cbs, self)
        finally:
            self.run_state.running = False

    def lr_find(self, start_lr: float = 1e-7, end_lr: float = 10.0, steps: int = 100, *,
                progress: str | bool = "auto") -> "LRRangeTest":
        """The learning-rate range test (fastai's lr_find): the CPU step replayed with the lr rising exponentially
        (a fresh optimizer, the current weights, the full resolution), stopping when the loss diverges; the task is
        restored byte for byte, compiled first if needed. ``.suggestion``, ``.plot()`` (inspector/lr_range.py)."""
        self.run_state.check_not_running("lr_find", self.phase)
        check_lr_find(self._config, start_lr, end_lr, steps, progress)  # before anything compiles
        if self.phase is not Phase.COMPILED:
            self._require("lr_find", Phase.PLANNING, Phase.MEMORY_LOCKED, Phase.COMPILED)
            self.compile()
        return lr_range_test(self.runner, start_lr, end_lr, steps, progress)

    # ---- inference and parameters --------------------------------------------------------------------
    def _inference(self, op: str, hint: str = "Call task.compile() first.") -> Inference:
        self._require(op, Phase.COMPILED, hint=hint)
        assert self.runner is not None  # compile() made it
        return Inference(self._config, self.runner, self.run_state)

    def evaluate(self, x: Any, y: Any, *, ema: bool = False) -> dict[str, float]:
        """Loss (the task's, label smoothing and class weights included; averaged over batches of the
        validation batch size by their sizes, as the epochs' val loss), top-1 and top-5 on any labelled
        data; ``ema=True`` evaluates the EMA weights (``ema()`` on), as the epochs' ema columns do."""
        return self._inference("evaluate").evaluate(x, y, ema)

    def predict(self, x: Any, *, ema: bool = False) -> np.ndarray:
        """Predicted class of each row of x (int64, shape (N,)); ``ema=True``: by the EMA weights."""
        return self._inference("predict").predict(x, ema)

    def predict_logits(self, x: Any, *, ema: bool = False) -> np.ndarray:
        """The model's outputs for each row of x before softmax (float32, (N, classes)): torch's ``model(x)``
        in eval mode (dropout off, batch norm's running statistics); ``ema=True``: the EMA model's."""
        return self._inference("predict_logits").gathered("predict_logits", x, lambda logits: logits, ema)

    def predict_proba(self, x: Any, *, ema: bool = False) -> np.ndarray:
        """Class probabilities for each row of x (float32, shape (N, classes), rows summing to 1):
        ``softmax(predict_logits(x, ema=ema))``, computed in float64."""
        return self._inference("predict_proba").gathered("predict_proba", x, _softmax, ema)

    def generate(self, prompt: str | Any, tokens: int = 200, *, temperature: float = 1.0, top_k: int | None = None,
                 seed: int = 0) -> str | np.ndarray:
        """``prompt`` (text or token ids) and ``tokens`` sampled tokens from the decode step (runtime/generate.py)."""
        from .runtime.generate import generate
        self._require("generate", Phase.COMPILED, hint="Call task.compile() first (or train it with task.run()).")
        return generate(lambda: self.decoder, self._config.data, prompt, tokens, temperature, top_k, seed)

    decoder = property(lambda self: self._inference("generate").runner.decoder, doc="The one-token decode step.")

    def state_dict(self, *, ema: bool = False) -> dict[str, np.ndarray]:
        """Parameters and BN buffers by layer name, in PyTorch's layouts: 'fc1.weight' is
        (out, in), 'conv1.weight' is (out, in, k, k), 'bn1.running_mean' ... ``ema=True``: the EMA
        model's (``ema()`` on), under the same names, ready for ``load_state_dict`` of a task or a
        torch module."""
        return self._inference("state_dict", "Parameters exist once the task is compiled.").state_dict(ema)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Set parameters; every key and shape is checked before anything is written. With ema() on,
        the EMA copies start from them too, as they start from the initial weights."""
        self._inference("load_state_dict").load_state_dict(state)

    def load_weights(self, path: str, *, ema: bool = False) -> "DeepLearningTask":
        """The parameters and BN statistics of a checkpoint (.npz) or a .safetensors file (save_weights', or
        a torch nn.Sequential's), into this compiled task, which may be built on other data or optimizer:
        the model must match. Training state (moments, history, data order) is not loaded: ``load_state``
        resumes a run. ``ema=True`` takes a checkpoint's EMA weights instead (saved with ``ema()`` on)."""
        from .export import read_weights
        self._require("load_weights", Phase.COMPILED, hint="Call task.compile() first.")
        ema = as_flag(ema, "load_weights", "ema", ConfigError, "pass task.load_weights(path, ema=True)")
        self.load_state_dict(read_weights(path, self._inference("load_weights").param_shapes(), ema=ema))
        return self
    save_weights = save_safetensors  # (path, *, ema=False): the weights as .safetensors (export/weights.py)
    export_onnx = export_onnx  # (path, *, ema=False): the inference graph as ONNX (export/onnx_export.py)

    # ---- checkpoints --------------------------------------------------------------------------------
    def save(self, path: str) -> str:
        """Write what continuing needs (state regions, data position, history) atomically to one .npz
        file with a JSON header (the config as data) and a checksum (runtime/checkpoint.py)."""
        from .runtime import checkpoint
        return checkpoint.save(self, path)

    def load_state(self, path: str, *, strict: bool = True) -> "DeepLearningTask":
        """Restore a checkpoint into this compiled task; validated fully before anything changes."""
        from .runtime import checkpoint
        checkpoint.load_state(self, path, strict=strict)
        return self

    @classmethod
    def load(cls, path: str, data: Any, *, strict: bool = True) -> "DeepLearningTask":
        """A task rebuilt from a checkpoint's config around ``data``, compiled, its state restored: run() on."""
        from .runtime import rebuild
        as_flag(strict, "load", "strict", CheckpointError, "pass strict=False to allow other settings, or leave it out")
        return cls(config=rebuild.config_for(path, data)).compile().load_state(path, strict=strict)

    # ---- read-only views ------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._config.name

    @name.setter
    def name(self, name: str) -> None:
        self._config = self._config.with_(name=check.task_name(name))

    @property
    def result(self) -> TrainingResult:
        return self.run_state.result

    # settings the views read by their own names (BluePrint | None, DataSplits | None, int, int)
    blueprint = property(lambda self: self._config.model)
    splits = property(lambda self: self._config.data)
    steps_per_epoch = property(lambda self: self._config.steps_per_epoch)
    total_steps = property(lambda self: self._config.total_steps)

    @property
    def settings(self) -> dict[str, Any]:
        """Every setting, by name (what the BluePrint and Training views show)."""
        return self._config.as_settings()

    # the stage values by their parts, as the views and notebooks read them (None before their stage)
    arch = property(lambda self: None if self.planned is None else self.planned.arch)
    shapes = property(lambda self: None if self.planned is None else self.planned.shapes)
    max_slot_bytes = property(lambda self: None if self.planned is None else list(self.planned.max_slot_bytes))
    graphs = property(lambda self: None if self.locked is None else self.locked.graphs)
    plans = property(lambda self: {} if self.locked is None else self.locked.plans)
    executor = property(lambda self: None if self.runner is None else self.runner.executor)
    arena = property(lambda self: None if self.runner is None else self.runner.arena)
    device_kind = property(lambda self: None if self.runner is None else self.runner.device_kind)
    memory_inspector = property(MemoryInspector.of, doc="Peak, what-if plans, diffs and fit (inspector/).")

    @property
    def memory(self) -> MemoryPlan:
        """The train_base plan (an empty one before lock_memory())."""
        return self.locked.memory if self.locked is not None else MemoryPlan(self.name)

    @property
    def arena_bytes(self) -> int:
        return self.locked.memory.total_bytes if self.locked is not None else 0

    @property
    def registered_graphs(self) -> dict[str, tuple[list[Any], Any]]:
        """The built graphs by GraphId, as TaskBase lists hand-registered ones: name -> (nodes, stream)."""
        return {} if self.locked is None else self.locked.registered_graphs()

    @property
    def skipped_updates(self) -> int:
        """Updates skipped by nan_policy='skip' so far."""
        return int(self.runner.view("nan.skipped")[0]) if self.runner else 0

    def read(self, tensor: DTensor | int | str) -> np.ndarray:
        """A copy of the bytes at a tensor's place in the arena (train_base's view), now: see TaskBase.read
        for what a dead temporary holds."""
        return self._tensors("read").read(tensor)

    def write(self, tensor: DTensor | int | str, value: Any) -> None:
        """Set a tensor's value (broadcast like NumPy; the shape is the plan's)."""
        self._tensors("write").write(tensor, value)

    def _tensors(self, op: str) -> TensorIO:
        self._require(op, Phase.COMPILED, hint="Tensors hold values only once the arena exists (compile()).")
        assert self.runner is not None and self.locked is not None
        return TensorIO(self.locked.memory, self.runner.executor.views["train_base"])

    @property
    def config(self) -> TaskConfig:
        """Every setting, as one frozen value (builder calls replace it)."""
        return self._config

    def lr_table(self) -> np.ndarray:
        """The learning rate of every step (the scheduler's table over the optimizer's lr), read-only: plan()'s,
        or before it one computed per settings (the views read it often; at 2**26 steps it takes seconds)."""
        if self.planned is not None:
            return self.planned.lr_table
        c = self._config
        key = learning_rates_key(c)
        if self._lr_cache is None or self._lr_cache[0] != key:
            self._lr_cache = (key, learning_rates(c))
        return self._lr_cache[1]

    def summary(self) -> str:
        """Plan summary: arena by family, reuse, distinct bound graphs, collapsed variants."""
        return describe_task(self.name, self.phase, self.planned, self.locked, self.compiled, self.runner)

    def inspect(self):  # type: ignore[no-untyped-def]
        """The dashboard widget (needs the notebook extra)."""
        from .display import dashboard
        return dashboard(self)

    def _ipython_display_(self) -> None:  # the static dashboard, then the live one (display.show)
        from .display import show
        show(self)

    def _repr_mimebundle_(self, include=None, exclude=None):  # type: ignore[no-untyped-def]
        try:
            from .display import dashboard_bundle
        except ImportError:
            return {"text/plain": repr(self)}
        return dashboard_bundle(self)

    def __repr__(self) -> str:
        bits = [f"phase {self.phase}"]
        if self.locked is not None:
            bits.append(f"arena {human_bytes(self.locked.memory.total_bytes)}")
        if self.result.history:
            bits.append(f"{plural(len(self.result.history), 'epoch')} trained")
        return f"<DeepLearningTask {self.name!r}: " + ", ".join(bits) + ">"


def _by_hand(op: str, does: str, fix: str) -> PlanError:
    """TaskBase's hand-driven calls, asked of a DeepLearningTask."""
    return PlanError(f"{op}: a DeepLearningTask {does} from the model. Fix: use TaskBase() to {fix} by hand.")


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=-1, keepdims=True)
    return z

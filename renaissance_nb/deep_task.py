"""DeepLearningTask: the fluent builder on top of the phase machine.

    task.plan()          PLANNING       ArchPlan + the tensors of all six variants
    task.lock_memory()   MEMORY_LOCKED  graphs built, six MemoryPlans finalized
    task.compile()       COMPILED       atlas filled, graphs bound, arena initialised
    task.run()                          replay of the compiled step, epoch by epoch

Each step is a pure compiler stage (compiler/stages.py) whose value stays on the
task for inspection: ``task.arch``, ``task.shapes``, ``task.plans``, ``task.graphs``,
``task.compiled.atlas``.
"""
from __future__ import annotations

import inspect
import math
import os
import signal
import threading
import time
import warnings
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence, cast

import numpy as np

from .blueprint import BluePrint
from .checks import arguments_checked, as_flag, as_float, as_int
from .data.arrays import (DataSplits, Dataset, channels_first, checked_splits, held_out, looks_channels_last,
                          make_splits, moved_to_channels_first, validate_arrays)
from .errors import (CheckpointError, ConfigError, DataError, DeviceError, NumericalError, PhaseError, PlanError,
                     RenaissanceError, bad_argument)
from .compiler.stages import (AllShapes, CompiledPlan, Graphs, build_computation_graph, compute_max_slot_bytes,
                             create_memory_plans, derive_all_shapes, graph_lifetimes, share_or_clone,
                             variant_specs)
from .compiler.ids import GraphId
from .compiler.layers import ArchPlan, StepOptions, plan_architecture
from .kernels import blas, fused
from .kernels.cpu import BindEnv
from .memory.dtensor import arena_layout, torch_layout
from .text import bytes_versus, human_bytes, plural
from .progress import make_progress
from .result import EpochRecord, TrainingResult
from .runtime.arena import Arena
from .runtime.replay import Executor, StepPrograms, batch_variants
from .task import Phase, TaskBase, Transition
from .train.losses import CrossEntropyLoss
from .train.optimizers import AdamW, Optimizer
from .train.rng import Philox, StreamId
from .train.callbacks import StopTraining, lacking_field
from .train.schedulers import ReduceLROnPlateau, Scheduler, metric_direction, plateau_step
from .train.settings import LR_MAX, Settings


def _progress_kind(progress: Any) -> str:
    """run()'s progress argument as one of "auto", "bar", "lines", "none"."""
    if progress is None or (isinstance(progress, (bool, np.bool_, int, np.integer)) and progress in (0, 1)):
        return "auto" if progress else "none"
    if isinstance(progress, str) and progress in ("auto", "bar", "lines", "none"):
        return progress
    raise bad_argument(ConfigError, "run", "progress", progress, "'auto' (or True), 'bar', 'lines', or False/None",
                       "e.g. run(progress=False) for no output, run(progress='lines') for plain lines")


def _foreign(obj: Any) -> str:
    """What a same-named object from another library is, for the errors of loss()/optimizer()/scheduler()."""
    module = str(getattr(obj, "__module__", "") or "")  # an instance's class's module, or a class's own
    if module.split(".")[0] not in ("torch", "tensorflow", "keras", "tf_keras", "jax", "optax", "flax"):
        return ""
    name = getattr(obj, "__name__", type(obj).__name__)
    return (f" (this is {module}.{name}: the task compiles its own, with PyTorch's names and formulas, "
            "from renaissance_nb)")


INT_SETTING_MAX = 2**31 - 1
"""The largest count a setting takes (epochs, batch sizes, pixels): the kernels index with 32-bit
ints, and a larger value would fail later, deep inside NumPy or numba, instead of here."""


def _int_setting(where: str, name: str, v: Any, low: int = 1, high: int = INT_SETTING_MAX) -> int:
    n = as_int(v)
    if n is None or not low <= n <= high:
        raise bad_argument(ConfigError, where, name, v, f"an int in [{low}, {high}]",
                           f"pass a whole number >= {low}" + ("" if high == INT_SETTING_MAX else f" and <= {high}"))
    return n


def _callbacks(callbacks: Any) -> tuple[Callable[[str, Any], None], ...]:
    """run()'s callbacks: a sequence of callables ``cb(kind, info)``, checked before the run changes anything."""
    fix = "pass callbacks=[fn] with def fn(kind, info): ..."
    if callable(callbacks):
        raise bad_argument(ConfigError, "run", "callbacks", callbacks, "a list of callables", f"wrap it: {fix}")
    try:
        out = tuple(callbacks)
    except TypeError:
        raise bad_argument(ConfigError, "run", "callbacks", callbacks, "a list of callables", fix) from None
    for cb in out:
        if not callable(cb):
            raise bad_argument(ConfigError, "run", "callbacks", callbacks, f"a list of callables; {cb!r} is not one",
                               fix)
        if isinstance(cb, type):  # EarlyStopping, the class, not an instance
            raise bad_argument(ConfigError, "run", "callbacks", callbacks,
                               f"callables taking (kind, info); {cb.__name__} is a class",
                               f"{cb.__name__}() makes one")
        try:
            inspect.signature(cb).bind("start", {})
        except TypeError:  # lambda: ...
            raise bad_argument(ConfigError, "run", "callbacks", callbacks,
                               f"callables taking (kind, info); {cb!r} does not", fix) from None
        except ValueError:  # no signature to read (some builtins): called as it is
            pass
    return out


def _call_each(callbacks: Sequence[Callable[[str, Any], None]], kind: str, info: Any) -> str | None:
    """Every callback, in order, even after one raised StopTraining (each sees the event); the first
    StopTraining's message, or None. Any other exception stops the calls and propagates."""
    why = None
    for cb in callbacks:
        try:
            cb(kind, info)
        except StopTraining as exc:
            why = (str(exc) or f"StopTraining from a {kind!r} callback") if why is None else why
    return why


def _flag(where: str, name: str, v: Any) -> bool:
    """A True/False setting (NumPy's bools too, as NumPy code hands them over)."""
    return as_flag(v, where, name, ConfigError)


def _check_path_template(where: str, path: Any, example: str) -> None:
    """A checkpoint path template must format with {name} and {epoch} now, not at the first autosave mid-run."""
    try:
        ok = isinstance(path, str) and bool(path) and bool(path.format(name="task", epoch=1)) and "\0" not in path
    except (KeyError, IndexError, ValueError, AttributeError):
        ok = False
    if not ok:
        raise bad_argument(ConfigError, where, "path", path, "a file name that may use {name} and {epoch}",
                           f"{example} (double braces for a literal brace)")


_arguments_checked = arguments_checked(ConfigError, call="task.")
"""Task builders: a misspelt keyword or a setting passed by position is a ConfigError."""


def _sample_shape_of(data: Any) -> tuple[int, ...] | None:
    """The sample shape of what ``DeepLearningTask.load`` was given, when it says (a DataSplits,
    a Dataset, or an (X, y) pair of arrays)."""
    if isinstance(data, (DataSplits, Dataset)):
        return tuple(data.sample_shape)
    if isinstance(data, tuple) and data and hasattr(data[0], "shape"):
        return tuple(int(d) for d in data[0].shape[1:])
    return None


_NO_DATA = "plan: no data was set. Fix: task.data(datasets.default_mnist()) or task.data(train=(X, y))."


MAX_STEPS = 2**26
"""The most training steps a task plans: its per-step learning-rate table and its per-step loss log
(float32 each, in the arena, and in a checkpoint) are then 256 MiB each. 67 million steps is
140,000 epochs of full MNIST at batch 128."""


class DeepLearningTask(TaskBase):
    """Model, data, loss, optimizer and schedule, compiled into one replayable step."""

    def __init__(self, name: str = "task") -> None:
        super().__init__(name)
        self._model: BluePrint | None = None
        self._splits: DataSplits | None = None
        self._channels_last: bool | None = None
        self._batch = 128
        self._val_batch: int | None = None
        self._shuffle = True
        self._loss = CrossEntropyLoss()
        self._optimizer: Optimizer = AdamW()
        self._scheduler: Scheduler | None = None
        self._epochs = 1
        self._seed = 0
        self._fuse = True
        self._liveness = True
        self._pad_rows = True
        self._nan_check = True
        self._nan_policy = "raise"
        self._zero_grad = False
        self._ema: float | None = None
        self._clip_norm: float | None = None
        self._val_fraction: float | None = None  # data(val_fraction=): the share held out of the arrays given
        self._resolution: tuple[tuple[int, int], tuple[int, int], int] | None = None
        self._crop_pad = 0
        self._flip = False
        # The background loader overlaps the next batch's gather with compute; with two cores
        # or fewer OpenBLAS already uses them all and the extra thread measured slower.
        self._prefetch = (os.cpu_count() or 1) > 2
        self._save_every: tuple[int, str] | None = None
        self._save_best: str | None = None
        self._save_best_by: tuple[str, str] | None = None  # (EpochRecord field, 'min' or 'max'); None: top-1
        self._device = "cpu"
        self._device_data = "auto"
        self._device_capture = "entry"
        self.device_kind: str | None = None  # what compile() resolved the device to
        self._runner: StepPrograms | None = None  # who replays steps: the CPU executor or the GPU one
        self.arch: ArchPlan | None = None
        self.shapes: AllShapes | None = None
        self.max_slot_bytes: list[int] | None = None
        self.graphs: Graphs | None = None
        self.plans: dict[str, Any] = {}
        self.compiled: CompiledPlan | None = None
        self.executor: Executor | None = None
        self.result = TrainingResult()
        self._epoch = 0          # epochs finished
        self._resume_at: tuple[int, int] | None = None  # (epoch, next step) after an interrupt
        self._live_at: tuple[int, int] | None = None  # (epoch, next step) while run() calls a step callback
        self._epoch_t0 = 0.0  # perf_counter() when the running epoch started, less the seconds carried into it
        self._partial_seconds = 0.0  # the seconds the epoch _resume_at points into ran before it stopped
        self._torn_at: tuple[int, int] | None = None  # (epoch, step) a run stopped inside of: not resumable
        self._plateau: dict[str, float] | None = None  # ReduceLROnPlateau's state (best, bad, cooldown, lr)
        self._running = False  # run() is on the stack: no second run() or reset() from a callback

    # ---- settings (PLANNING, before plan()) ----------------------------------------------
    def _setting(self, name: str) -> None:
        if self._phase is not Phase.PLANNING or self.arch is not None:
            state = f"{self._phase} (planned)" if self._phase is Phase.PLANNING else str(self._phase)
            keep = (" and the trained weights (keep them: sd = task.state_dict(), then task.load_state_dict(sd) "
                    "after compile(); the optimizer's moments start over)"
                    if self.result.history and name != "model" else "")
            raise PhaseError(name, state, "PLANNING (before plan())",
                             f"The setting {name} can no longer change: the task's plan is made from it. "
                             f"Fix: create a new DeepLearningTask, or call task.reset() to discard the plan{keep}.")

    @_arguments_checked
    def model(self, blueprint: BluePrint) -> "DeepLearningTask":
        self._setting("model")
        if not isinstance(blueprint, BluePrint):
            raise bad_argument(ConfigError, "model", "blueprint", blueprint, "a BluePrint such as seq(fc(10))",
                               "build the model with seq(...), fc(...), relu() ...")
        self._model = blueprint
        return self

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
        self._setting("data")
        if channels_last is not None and not isinstance(channels_last, bool):
            raise bad_argument(ConfigError, "data", "channels_last", channels_last, "True, False or None",
                               "pass channels_last=True for (N, H, W, C) images")
        if splits is not None and train is not None:
            raise ConfigError("data: got both a data set and train=. Fix: pass one of them.")
        if isinstance(splits, (DataSplits, Dataset)) and val is not None:
            raise ConfigError("data: got a data set and val=; val= goes with train=(X, y) or a tuple (X, y). "
                              "Fix: task.data(train=(X, y), val=(Xv, yv)), or one DataSplits holding both, "
                              "datasets.from_arrays((X, y), (Xv, yv)).")
        if (isinstance(splits, tuple) and len(splits) == 2  # ((X, y), (Xv, yv)), not (X, y) of two samples
                and all(isinstance(p, (tuple, list)) and len(p) == 2 and np.ndim(p[1]) >= 1 for p in splits)):
            raise bad_argument(DataError, "data", "data", "((X, y), (Xv, yv))", "one (X, y) pair, or DataSplits",
                               "pass task.data(train=(X, y), val=(Xv, yv))")
        fraction = None
        if val_fraction is not None:
            fraction = as_float(val_fraction)
            if fraction is None or not 0.0 < fraction < 1.0:
                raise bad_argument(DataError, "data", "val_fraction", val_fraction, "a number in (0, 1)",
                                   "pass e.g. val_fraction=0.1, or None for no held-out set")
            if val is not None or (isinstance(splits, DataSplits) and splits.val is not None):
                raise ConfigError("data: got val_fraction= and a validation set. Fix: pass one of them.")
        if isinstance(splits, DataSplits):
            s = checked_splits(splits)
        elif isinstance(splits, Dataset):
            s = checked_splits(DataSplits(splits, None, splits.name))
        elif isinstance(splits, tuple) or train is not None:
            s = make_splits(train if train is not None else splits, val, num_classes=num_classes)
        else:
            raise bad_argument(DataError, "data", "data", splits, "DataSplits, a Dataset, or train=(X, y)",
                               "e.g. task.data(datasets.default_mnist()) or task.data(train=(X, y))")
        if fraction is not None:
            s = held_out(s.train, fraction, s.name)
        b = _int_setting("data", "batch_size", batch_size)
        if b > len(s.train):
            raise bad_argument(DataError, "data", "batch_size", batch_size,
                               f"at most the number of training samples ({len(s.train)})", "use a smaller batch size")
        vb = b if val_batch_size is None else _int_setting("data", "val_batch_size", val_batch_size)
        shuffle = _flag("data", "shuffle", shuffle)
        if channels_last:
            s = channels_first(s)
        self._splits, self._batch, self._val_batch, self._shuffle = s, b, vb, shuffle
        self._channels_last, self._val_fraction = channels_last, fraction
        return self

    @_arguments_checked
    def loss(self, loss: CrossEntropyLoss) -> "DeepLearningTask":
        self._setting("loss")
        if not isinstance(loss, CrossEntropyLoss):
            raise bad_argument(ConfigError, "loss", "loss", loss,
                               "renaissance_nb's CrossEntropyLoss()" + _foreign(loss),
                               "pass a loss object, e.g. CrossEntropyLoss().label_smoothing(0.1)")
        self._loss = loss
        return self

    @_arguments_checked
    def optimizer(self, optimizer: Optimizer) -> "DeepLearningTask":
        self._setting("optimizer")
        if not isinstance(optimizer, Optimizer):
            raise bad_argument(ConfigError, "optimizer", "optimizer", optimizer,
                               "renaissance_nb's SGD(), Adam() or AdamW()" + _foreign(optimizer),
                               "pass an optimizer object, e.g. AdamW().weight_decay(1e-4)")
        self._optimizer = optimizer
        return self

    @_arguments_checked
    def scheduler(self, scheduler: Scheduler | None) -> "DeepLearningTask":
        """The learning-rate schedule over the optimizer's lr; None for a constant lr (the default)."""
        self._setting("scheduler")
        if scheduler is not None and not isinstance(scheduler, Scheduler):
            raise bad_argument(ConfigError, "scheduler", "scheduler", scheduler,
                               "a Scheduler such as CosineAnnealingLR(), or None" + _foreign(scheduler),
                               "pass a scheduler object, e.g. CosineAnnealingLR().base_lr(1e-3)")
        self._scheduler = scheduler
        return self

    @_arguments_checked
    def total_epochs(self, epochs: int) -> "DeepLearningTask":
        self._setting("total_epochs")
        self._epochs = _int_setting("total_epochs", "epochs", epochs)
        return self

    @_arguments_checked
    def seed(self, seed: int) -> "DeepLearningTask":
        self._setting("seed")
        v = as_int(seed)
        if v is None or not 0 <= v < 2**64:  # Philox's key is 64 bits
            raise bad_argument(ConfigError, "seed", "seed", seed, "an int in [0, 2**64)", "pass e.g. seed=0")
        self._seed = v
        return self

    @_arguments_checked
    def ema(self, decay: float = 0.999) -> "DeepLearningTask":
        """Keep exponential-moving-average weights (E_ regions), evaluated each epoch next to the raw ones;
        ``evaluate``/``predict*``/``state_dict(..., ema=True)`` use them.

        After each update: ``E = d * E + (1 - d) * W`` with ``d = min(decay, (1 + t) / (10 + t))``, t the
        finished updates (TensorFlow's ExponentialMovingAverage with ``num_updates``), for the weights and
        the batch-norm running statistics alike; E starts as the initial weights. The warm-up keeps early
        averages from clinging to the random start: ``d`` reaches 0.9 at t = 80 and 0.999 only at t = 8,990,
        so short runs average faster than a plain ``decay`` (torch's ``AveragedModel`` with
        ``get_ema_multi_avg_fn(decay)``) would."""
        self._setting("ema")
        d = as_float(decay)
        if d is None or not 0.0 < d < 1.0:
            raise bad_argument(ConfigError, "ema", "decay", decay, "a float in (0, 1)", "use e.g. ema(0.999)")
        self._ema = d
        return self

    @_arguments_checked
    def clip_grad_norm(self, max_norm: float | None) -> "DeepLearningTask":
        """Clip the gradients' total 2-norm to ``max_norm`` before every update, as
        ``torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)`` between ``backward()`` and
        ``step()``: one pass over the G range, compiled into the step; None turns it off."""
        self._setting("clip_grad_norm")
        if max_norm is not None:
            v = as_float(max_norm)
            if v is None or not 0.0 < v <= LR_MAX:
                raise bad_argument(ConfigError, "clip_grad_norm", "max_norm", max_norm,
                                   "a finite number > 0 (or None for no clipping)", "use e.g. clip_grad_norm(1.0)")
            max_norm = v
        self._clip_norm = max_norm
        return self

    @_arguments_checked
    def train_resolution(self, begin: int | tuple[int, int], end: int | tuple[int, int],
                         boundary_epoch: int) -> "DeepLearningTask":
        """Progressive resizing: train at ``begin`` (H, W) before ``boundary_epoch``, at ``end`` after.

        Both use the same graph; the atlas binds one copy per distinct ShapeId.
        """
        self._setting("train_resolution")

        def hw(name: str, v: Any) -> tuple[int, int]:
            pair = (v, v) if as_int(v) is not None else v
            dims = [as_int(d) for d in pair] if isinstance(pair, (tuple, list)) and len(pair) == 2 else []
            good = [d for d in dims if d is not None and 1 <= d <= 32768]
            if len(good) != 2:  # dims is empty or a pair
                raise bad_argument(ConfigError, "train_resolution", name, v, "an int or (H, W) of ints in [1, 32768]",
                                   "e.g. train_resolution(24, 28, boundary_epoch=3)")
            return (good[0], good[1])
        b = _int_setting("train_resolution", "boundary_epoch", boundary_epoch, low=0)
        self._resolution = (hw("begin", begin), hw("end", end), b)
        return self

    @_arguments_checked
    def augment(self, crop_pad: int = 0, flip: bool = False) -> "DeepLearningTask":
        """On-the-fly augmentation of image data, drawn from Philox's AUGMENT stream (deterministic)."""
        self._setting("augment")
        pad = _int_setting("augment", "crop_pad", crop_pad, low=0, high=1024)
        self._crop_pad, self._flip = pad, _flag("augment", "flip", flip)  # both checked before either is set
        return self

    @_arguments_checked
    def options(self, *, fuse: bool | None = None, liveness: bool | None = None, nan_check: bool | None = None,
                zero_grad: bool | None = None, nan_policy: str | None = None,
                prefetch: bool | None = None, pad_rows: bool | None = None) -> "DeepLearningTask":
        """Compiler switches, each testable against the plain path (like tinygrad's flags).

        pad_rows (default True): weight matrices whose rows are a multiple of 4 KiB (1024 floats)
        are stored with 64 bytes more per row, and so are their gradients, moments and EMA copies:
        rows at such strides alias in the cache and slow the matrix products (oneMKL's guide says so).

        nan_policy: "raise" (default) stops at a non-finite gradient or loss, naming it;
        "skip" skips that update and counts it (task.skipped_updates). A skipped update is not a
        step: Adam's step count (as torch's, whose GradScaler skips ``optimizer.step()``) and the
        schedule both index finished updates, so the lr table is not advanced by a skipped batch (as
        DeepSpeed skips its scheduler on overflow; a torch AMP loop that calls ``scheduler.step()``
        every batch would advance it), and a run with skips ends before the table's last entries.
        """
        self._setting("options")
        if nan_policy is not None and (not isinstance(nan_policy, str) or nan_policy not in ("raise", "skip")):
            raise bad_argument(ConfigError, "options", "nan_policy", nan_policy, "'raise' or 'skip'",
                               "pass nan_policy='raise' or nan_policy='skip'")
        flags = {k: _flag("options", k, v) for k, v in (("fuse", fuse), ("liveness", liveness),
                                                         ("nan_check", nan_check), ("zero_grad", zero_grad),
                                                         ("prefetch", prefetch), ("pad_rows", pad_rows))
                 if v is not None}
        for k, flag in flags.items():  # every argument checked first: a bad one changes nothing
            setattr(self, f"_{k}", flag)
        if nan_policy is not None:
            self._nan_policy = nan_policy
        return self

    @_arguments_checked
    def device(self, device: str = "auto", *, data: str = "auto", capture: str = "entry") -> "DeepLearningTask":
        """Where the step replays: "cpu" (a task's default until device() is called), "cuda" (CUDA graphs
        through CuPy; an error if there is no GPU) or "auto" (this method's default: the GPU when CuPy
        finds one and the model's ops all have GPU kernels, else the CPU). The plan, offsets and atlas are
        the same on both.

        data (GPU only): "device" copies the data sets to GPU memory once and gathers each
        batch there; "pinned" keeps them on the host and streams each batch through
        page-locked staging, the copy overlapping the step before; "auto" picks "device"
        when the data take under a quarter of the free GPU memory.

        capture (GPU only): "entry" replays one CUDA graph per atlas entry, a handful per step;
        "step" also captures each distinct step program as one graph, so a step is one launch.
        """
        from .gpu.device import CHOICES
        from .gpu.executor import CAPTURE_MODES, DATA_MODES
        self._setting("device")
        if device not in CHOICES:
            raise bad_argument(DeviceError, "device", "device", device, f"one of {CHOICES}",
                               "pass 'auto' (GPU when CuPy finds one), 'cuda' or 'cpu'")
        if data not in DATA_MODES:
            raise bad_argument(DeviceError, "device", "data", data, f"one of {DATA_MODES}",
                               "pass 'device' (data sets in GPU memory), 'pinned' (streamed from the host) or 'auto'")
        if capture not in CAPTURE_MODES:
            raise bad_argument(DeviceError, "device", "capture", capture, f"one of {CAPTURE_MODES}",
                               "pass 'entry' (one CUDA graph per atlas entry) or 'step' (one per step)")
        self._device, self._device_data, self._device_capture = device, data, capture
        return self

    @_arguments_checked
    def save_every(self, epochs: int | None, path: str = "checkpoints/{name}-epoch{epoch}.npz") -> "DeepLearningTask":
        """Checkpoint every ``epochs`` epochs (None: stop); ``path`` may use {name} and {epoch}. Not part of
        the plan, so it can change in any phase; checkpoints record it, and ``load()`` keeps saving."""
        if epochs is None:
            self._save_every = None
            return self
        n = _int_setting("save_every", "epochs", epochs)
        _check_path_template("save_every", path, "e.g. 'checkpoints/{name}-epoch{epoch}.npz'")
        self._save_every = (n, path)
        return self

    @_arguments_checked
    def save_best(self, path: str | None = "checkpoints/{name}-best.npz", *, monitor: str | None = None,
                  mode: str | None = None) -> "DeepLearningTask":
        """Checkpoint whenever an epoch is the best so far (None: stop): by validation top-1 (train top-1
        without val data), or by ``monitor``, an EpochRecord field such as 'val_loss' (Lightning's
        ModelCheckpoint(monitor=...)), lowest best for a loss and highest for a top-k unless ``mode``
        says 'min' or 'max'. Like save_every, it can change in any phase."""
        from .train.schedulers import PLATEAU_METRICS
        by = None
        if monitor is not None:
            if monitor not in PLATEAU_METRICS:
                raise bad_argument(ConfigError, "save_best", "monitor", monitor,
                                   "None or one of " + ", ".join(map(repr, PLATEAU_METRICS)), "pass monitor='val_loss'")
            mode = mode if mode is not None else metric_direction(monitor)
            if mode not in ("min", "max"):
                raise bad_argument(ConfigError, "save_best", "mode", mode, "'min', 'max' or None (by the monitor)",
                                   "pass mode='min' for a loss")
            by = (monitor, mode)
        elif mode is not None:
            raise bad_argument(ConfigError, "save_best", "mode", mode, "None without a monitor",
                               "pass monitor='val_loss' too, or drop mode")
        if path is not None:
            _check_path_template("save_best", path, "e.g. 'checkpoints/{name}-best.npz'")
        self._save_best, self._save_best_by = path, (by if path is not None else None)
        return self

    def _autosave(self, rec: EpochRecord) -> None:
        due = []
        if self._save_every and rec.epoch % self._save_every[0] == 0:
            due.append(("save_every", self._save_every[1]))
        by = self._save_best_by  # a field the records have: run() checked it before its first step
        best = self.result.best_epoch if by is None else self.result.best_by(*by)
        if self._save_best and best == rec.epoch:
            due.append(("save_best", self._save_best))
        for setting, template in due:
            p = template.format(name=self.name, epoch=rec.epoch)
            folder = os.path.dirname(os.path.abspath(p))
            try:
                os.makedirs(folder, exist_ok=True)
            except OSError as exc:
                raise CheckpointError(f"{setting}: cannot make the folder {folder!r} for {p!r} ({exc.strerror}). "
                                      f"Fix: task.{setting}(...) with a path in a folder you can write to.") from None
            self.save(p)

    def _not_running(self, operation: str) -> None:
        """run() and reset() from inside a run (a callback, a widget message pumped by one) would
        interleave two loops over one arena."""
        if getattr(self, "_running", False):
            raise PhaseError(operation, f"{self._phase} (running)", f"{self._phase} (not running)",
                             f"{operation}() was called while run() is training (from a callback?). Fix: call it "
                             "after run() returns, or stop the run first (Ctrl-C / the stop button).")

    def reset(self) -> "DeepLearningTask":
        """Discard the plan, arena and history; settings stay. Back to PLANNING."""
        self._not_running("reset")
        settings = ("_model", "_splits", "_channels_last", "_batch", "_val_batch", "_shuffle", "_loss", "_optimizer",
                    "_scheduler", "_epochs", "_seed", "_fuse", "_liveness", "_pad_rows", "_nan_check", "_nan_policy", "_zero_grad",
                    "_save_every",
                    "_ema", "_clip_norm", "_val_fraction", "_resolution", "_crop_pad", "_flip", "_prefetch", "_device",
                    "_device_data",
                    "_device_capture", "_save_best", "_save_best_by", "name")
        keep = {k: getattr(self, k) for k in settings}
        self.__init__(self.name)  # type: ignore[misc]
        self.__dict__.update(keep)
        return self

    @contextmanager
    def _unchanged_on_error(self) -> Iterator[None]:
        """A stage that fails (a bad setting found late, no GPU, no memory, Ctrl-C) leaves the task
        as it was: phase, plan, arena and transitions. The stages assign new objects rather than
        change old ones, so a shallow copy of the attributes is the whole state."""
        saved, transitions = dict(self.__dict__), list(self.transitions)
        try:
            yield
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(saved)
            self.transitions = transitions
            raise

    # ---- read-only views of the settings ----------------------------------------------------------
    @property
    def blueprint(self) -> BluePrint | None:
        return self._model

    @property
    def splits(self) -> DataSplits | None:
        return self._splits

    @property
    def settings(self) -> dict[str, Any]:
        """Every setting, by name (what the BluePrint and Training views show)."""
        return {"model": self._model, "data": self._splits, "channels_last": self._channels_last,
                "batch_size": self._batch,
                "val_batch_size": self._val_batch or self._batch, "shuffle": self._shuffle, "loss": self._loss,
                "optimizer": self._optimizer, "scheduler": self._scheduler, "total_epochs": self._epochs,
                "seed": self._seed, "device": self._device, "ema": self._ema, "clip_grad_norm": self._clip_norm,
                "train_resolution": self._resolution,
                "augment": {"crop_pad": self._crop_pad, "flip": self._flip},
                "options": {"fuse": self._fuse, "liveness": self._liveness, "pad_rows": self._pad_rows,
                            "nan_check": self._nan_check,
                            "nan_policy": self._nan_policy, "zero_grad": self._zero_grad, "prefetch": self._prefetch}}

    # ---- the stages' values: None before their stage, typed here for the code that runs after it --------
    @property
    def _data(self) -> DataSplits:
        """The data; every stage from plan() on has it (plan() refuses a task without)."""
        if self._splits is None:
            raise ConfigError(_NO_DATA)
        return self._splits

    def _planned(self, operation: str) -> tuple[ArchPlan, AllShapes, list[int]]:
        """What plan() made (it sets all three together), for the stages after it (the error is not
        reached: each caller has planned or checked a later phase first)."""
        arch, shapes, slots = self.arch, self.shapes, self.max_slot_bytes
        if arch is None or shapes is None or slots is None:
            raise PhaseError(operation, f"{self._phase} (not planned)", "PLANNING (planned)",
                             "Fix: call task.plan() first.")
        return arch, shapes, slots

    def _compiled_parts(self, operation: str, hint: str = "Call task.compile() first."
                        ) -> tuple[CompiledPlan, Executor, StepPrograms]:
        """What compile() made: the plan, the host executor (views) and who replays the steps; before
        compile(), the PhaseError of ``operation``'s phase check."""
        compiled, ex, rx = self.compiled, self.executor, self._runner
        if compiled is None or ex is None or rx is None:
            self._require(operation, Phase.COMPILED, hint=hint)
            # not reached: compile() sets all three as it enters COMPILED
            raise PhaseError(operation, f"{self._phase} (not compiled)", str(Phase.COMPILED), hint)
        return compiled, ex, rx

    # ---- derived quantities ------------------------------------------------------------------
    @property
    def steps_per_epoch(self) -> int:
        return -(-len(self._splits.train) // self._batch) if self._splits else 0

    @property
    def total_steps(self) -> int:
        return self.steps_per_epoch * self._epochs

    def lr_table(self) -> np.ndarray:
        """The learning rate of every step: the scheduler's table over the optimizer's lr (or its own base_lr).
        Read-only, and computed once per settings (plan(), compile() and the views all read it; at
        2**26 steps one computation takes seconds)."""
        key = (self._scheduler, type(self._optimizer), self._optimizer.lr_, self.steps_per_epoch, self._epochs)
        cached = getattr(self, "_lr_cache", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        table = self._lr_table()
        table.flags.writeable = False
        self._lr_cache = (key, table)
        return table

    def _lr_table(self) -> np.ndarray:
        spe = self.steps_per_epoch
        if self.total_steps > MAX_STEPS:
            raise bad_argument(ConfigError, "total_epochs", "epochs", self._epochs,
                               f"at most {MAX_STEPS // spe} epochs of {spe} steps: the step reads its learning rate "
                               f"from a float32 table of one value per step and logs its loss in another, and "
                               f"{self.total_steps} steps would need {human_bytes(8 * self.total_steps)}",
                               "train for fewer epochs, or with a larger batch size")
        if self._scheduler is None:
            return np.full(self.total_steps, self._optimizer.lr_, np.float32)
        opt, base = self._optimizer, self._scheduler.base_lr_
        if base is not None and opt.lr_ not in (base, type(opt)().lr_):
            raise ConfigError(f"plan: two learning rates: {type(opt).__name__}(lr={opt.lr_!r}) and "
                              f"{type(self._scheduler).__name__}(base_lr={base!r}); the schedule would scale "
                              "base_lr and ignore the optimizer's. Fix: drop base_lr to schedule the optimizer's lr "
                              "(as PyTorch does), or set the same value in both.")
        return self._scheduler.table(self.steps_per_epoch, self._epochs, opt.lr_)

    # ---- PLANNING: plan() ----------------------------------------------------------------------
    def plan(self) -> ArchPlan:
        """Stages 1-2: ArchPlan and the tensors of all six variants (inspect task.shapes)."""
        self._require("plan", Phase.PLANNING)
        if self.arch is not None:
            return self.arch
        with self._unchanged_on_error():
            return self._plan()

    def _plan(self) -> ArchPlan:
        started = time.time()
        if self._model is None:
            raise ConfigError("plan: no model was set. Fix: task.model(seq(fc(128), relu(), fc(10))).")
        if self._splits is None:
            raise ConfigError(_NO_DATA)
        self.lr_table()  # validates the schedule against the data (e.g. warmup longer than training)
        s = self._splits
        if isinstance(self._scheduler, ReduceLROnPlateau) and self._scheduler.monitor_ not in self._record_fields():
            raise lacking_field(f"plan: {self._scheduler!r}", self._scheduler.monitor_)
        arch = plan_architecture(self._model, self._fuse)
        n_val = len(s.val) if s.val is not None else 0
        sample = tuple(s.train.sample_shape)
        first = low = None
        if self._resolution is not None:
            if len(sample) != 3:
                raise ConfigError(f"plan: train_resolution needs image data (N, C, H, W); the samples are {sample}. "
                                  "Fix: load images with layout='image', or drop train_resolution().")
            (h0, w0), (h1, w1), _ = self._resolution
            first, low = (sample[0], h0, w0), (sample[0], h1, w1)
        if arch.reads_image_layout and self._channels_last is None and looks_channels_last(sample):
            c, h, w = sample
            raise ConfigError(f"plan: the training images are shaped {sample}, which looks like channels-last "
                              f"(H, W, C) = ({c}, {h}, {w}); the model reads (N, C, H, W) as PyTorch does, so it "
                              f"would see {c} channels of {h}x{w} images. Fix: task.data(..., channels_last=True) "
                              "converts them; task.data(..., channels_last=False) says they are (N, C, H, W).")
        if (self._crop_pad or self._flip) and len(sample) != 3:
            raise ConfigError(f"plan: augment(crop_pad={self._crop_pad}, flip={self._flip}) needs image data "
                              f"(N, C, H, W); the samples are {sample}. Fix: load images with layout='image', or "
                              "drop augment().")
        specs = variant_specs(len(s.train), n_val, self._batch, self._val_batch or self._batch, sample,
                              lowres_shape=low, train_shape=first)
        weights = self._loss.weight_
        if weights is not None and len(weights) != s.train.num_classes:
            raise ConfigError(f"plan: the loss has {len(weights)} class weights (CrossEntropyLoss(weight=...)); the "
                              f"data has {s.train.num_classes} classes. Fix: give one weight per class, in class order.")
        shapes = derive_all_shapes(arch, specs, s.train.num_classes, self._optimizer.state, self.total_steps,
                                   ema=self._ema is not None, clip=self._clip_norm is not None,
                                   class_weights=weights is not None)
        self._check_batch_norm_values(arch, shapes)
        max_slots = compute_max_slot_bytes(shapes)
        self.arch, self.shapes, self.max_slot_bytes = arch, shapes, max_slots
        self.transitions.append(_note("plan", started))
        return arch

    def _check_batch_norm_values(self, arch: ArchPlan, shapes: AllShapes) -> None:
        """Batch norm in training needs more than one value per channel in every batch, as in PyTorch
        (one value normalises to 0 and passes no gradient): a training batch of one sample is
        refused where a BN sees no spatial extent (after fc or gap, or at 1x1 maps)."""
        bns = {layer.name for layer in arch.layers if layer.kind == "bn"}
        trains: tuple[str, ...] = ("train_base", "train_last", "train_lowres", "train_lowres_last")
        if self._resolution is not None:  # epochs before the boundary train at the first size, the rest at the second
            boundary = self._resolution[2]
            trains = trains[:2] * (boundary > 0) + trains[2:] * (boundary < self._epochs)
        for v in trains:
            spec = shapes.specs[v]
            if not spec.used or spec.batch > 1:
                continue
            for name, x, _ in shapes.tables[v].layer_shapes:
                if name in bns and math.prod(x[:-1]) == 1:
                    if spec.batch == self._batch:
                        where, fix = f"with batch_size={self._batch},", "a batch size above 1"
                    else:
                        where = (f"batch_size={self._batch} leaves a last training batch of 1 sample "
                                 f"({len(self._data.train)} samples), where")
                        fix = "a batch size that does not divide len(train) - 1, or drop one training sample"
                    size = "" if self._resolution is None else f" at the training size {spec.input_shape[-2:]}"
                    raise ConfigError(f"plan: {where} {name} would see one value per channel{size}: batch norm "
                                      f"needs more than one in training (as in PyTorch). Fix: {fix}.")

    def alloc(self, *args: Any, **kwargs: Any):  # type: ignore[override]
        raise PlanError("alloc: a DeepLearningTask plans its memory from the model. "
                        "Fix: use TaskBase() to allocate tensors by hand.")

    def add_graph(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        raise PlanError("add_graph: a DeepLearningTask builds its graphs from the model. "
                        "Fix: use TaskBase() to register hand-built graphs.")

    # ---- MEMORY_LOCKED ----------------------------------------------------------------------
    def lock_memory(self) -> "DeepLearningTask":
        """Stages 4 and 3: build the zero-shape graphs, then finalize the six MemoryPlans."""
        self._require("lock_memory", Phase.PLANNING)
        with self._unchanged_on_error():
            return self._lock_memory()

    def _lock_memory(self) -> "DeepLearningTask":
        started = time.time()
        self.plan()
        arch, shapes, max_slots = self._planned("lock_memory")
        ids = shapes.tables["train_base"].ids
        opts = StepOptions(self._loss.label_smoothing_, tuple(sorted(self._optimizer.graph_params().items())),
                           zero_grad=self._zero_grad, nan_check=self._nan_check, nan_policy=self._nan_policy,
                           ema_decay=self._ema, clip_norm=self._clip_norm,
                           image=len(self._data.train.sample_shape) == 3,
                           crop_pad=self._crop_pad, flip=self._flip, prefetch=self._prefetch)
        graphs = build_computation_graph(arch, ids, opts, ("G_BN_BIAS", "G_DEEP_CONV"))
        lifetimes = graph_lifetimes(graphs) if self._liveness else None
        plans = create_memory_plans(shapes, max_slots, lifetimes, self._pad_rows)
        self.graphs, self.plans = graphs, plans
        self.memory = plans["train_base"]
        self._graphs = {f"train/{g.name}": (graphs.train.nodes(g), g.stream) for g in graphs.train.ids()}
        self._graphs.update({f"inference/{g.name}": (graphs.inference.nodes(g), g.stream)
                             for g in graphs.inference.ids()})
        self._advance(Phase.MEMORY_LOCKED, "lock_memory", started)
        return self

    # ---- COMPILED ------------------------------------------------------------------------------
    def compile(self) -> "DeepLearningTask":  # type: ignore[override]
        """Stage 5 and binding: fill the atlas, create the arena, bind, initialise weights."""
        if self._phase is Phase.COMPILED:
            return self
        with self._unchanged_on_error():  # from PLANNING too: a missing GPU or memory undoes lock_memory()
            return self._compile()

    def _compile(self) -> "DeepLearningTask":
        if self._phase is Phase.PLANNING:
            self.lock_memory()
        started = time.time()
        from .gpu.device import resolve_device
        kind = resolve_device(self._device)
        arch, shapes, max_slots = self._planned("compile")
        graphs = self.graphs
        if graphs is None:  # lock_memory() built them on its way to MEMORY_LOCKED
            raise PhaseError("compile", self._phase, str(Phase.MEMORY_LOCKED), "Fix: call task.lock_memory() first.")
        specs = shapes.specs
        atlas = share_or_clone(specs, graphs, self.plans, self._zero_grad, self._nan_check)
        ids = shapes.tables["train_base"].ids
        compiled = CompiledPlan(arch, shapes, max_slots, self.memory.lifetimes, self.plans,
                                graphs, atlas, ids, shapes.tables["train_base"].params)
        arena = Arena(self.memory)
        s = self._data
        sources = {"train": (s.train.x, s.train.y)}
        perms = {"train": np.arange(len(s.train), dtype=np.int64)}
        if s.val is not None:
            sources["val"] = (s.val.x, s.val.y)
            perms["val"] = np.arange(len(s.val), dtype=np.int64)
        env = BindEnv(self._seed, sources, perms, arena.range_view, arena.locate)
        if self._device == "auto" and kind == "cpu":
            from .gpu.device import probe
            compiled.notes.append(f"device: auto chose the CPU: {probe()[1]}.")
        if not self._zero_grad:
            compiled.notes.append("ZERO_GRAD elided: every gradient is written exactly once per step (the GEMM "
                                  "overwrites it), so zeroing the G range would be a wasted pass; "
                                  "options(zero_grad=True) puts it back.")
        padded = [t for t in self.memory if t.pitch is not None and t.region.family == "W"]
        if padded:
            rows = ", ".join(f"{t.name} {t.shape[1]} -> {t.pitch}" for t in padded)
            compiled.notes.append(f"padded rows: {rows} floats per row, and alike in their gradient, moment and EMA "
                                  "copies (rows a multiple of 4 KiB apart alias in the cache and slow the matrix "
                                  "products); options(pad_rows=False) stores them contiguous.")
        if self._liveness:
            m = self.memory
            compiled.notes.append("liveness reuse: F/T tensors whose lifetimes never meet share bytes: arena "
                                  f"{bytes_versus(m.total_bytes, m.bytes_without_reuse, 'without reuse')}.")
        executor = Executor(compiled, arena, env)
        self._initialise(executor, compiled)
        runner: StepPrograms = executor
        if kind == "cuda":
            from .gpu.executor import GpuExecutor
            try:  # the probe found a GPU; the backend can still fail to start (no NVRTC, cuBLAS, memory)
                runner = GpuExecutor(compiled, executor, env, self._nan_policy, self._device_data,
                                     capture=self._device_capture)
            except Exception as exc:  # noqa: BLE001 - auto falls back on any of them, and says why
                if self._device == "cuda":
                    if isinstance(exc, DeviceError):
                        raise
                    raise DeviceError(f"device('cuda'): the GPU backend failed to start: {type(exc).__name__}: "
                                      f"{exc}. Fix: check CuPy's install (python -c 'import cupy; cupy.show_config()')"
                                      ", or use device('auto') to fall back to the CPU.") from exc
                kind = "cpu"
                compiled.notes.append(f"device: auto chose the CPU: {exc}")
        if kind == "cpu":
            compiled.notes.append(f"device: CPU, {blas.describe()}.")
        else:
            gpu = cast(GpuExecutor, runner)  # kind is still "cuda": the GpuExecutor started
            compiled.notes.append(f"device: CUDA, {len(gpu.atlas.captures)} atlas entries captured as CUDA "
                                  f"graphs on one device arena, data={gpu.data}, capture={gpu.capture}; "
                                  "the host arena mirrors the device's at epoch ends.")
        self.compiled, self.executor, self._arena = compiled, executor, arena
        self._runner, self.device_kind = runner, kind
        self._views = executor.views["train_base"]
        self._env = env
        self._advance(Phase.COMPILED, "compile", started)
        return self

    def _initialise(self, ex: Executor, compiled: CompiledPlan) -> None:
        """PyTorch's default init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for fc and conv weights and
        biases, drawn from Philox's INIT stream; BN weight 1, bias 0, running stats 0 and 1;
        EMA weights start equal to the weights."""
        rng = Philox(self._seed)
        offset = 0
        for p in compiled.params:
            view = ex.view("train_base", p.name)
            if p.init == "uniform":
                bound = 1.0 / math.sqrt(p.fan_in)
                u = rng.uniform(view.size, int(StreamId.INIT), offset)
                view[...] = ((2.0 * u.astype(np.float64) - 1.0) * bound).astype(np.float32).reshape(view.shape)
                offset += Philox.blocks_needed(view.size)
            else:
                view.fill(1.0 if p.init == "ones" else 0.0)
            if self._ema is not None:
                ex.view("train_base", f"{p.name}@ema")[...] = view
        for v in ex.views.values():
            v[compiled.ids["ones"]].fill(1.0)
        ex.view("train_base", "lr_table")[: self.total_steps] = self.lr_table()
        if isinstance(self._scheduler, ReduceLROnPlateau):
            self._plateau = self._plateau_start()
        if self._loss.weight_ is not None:
            ex.view("train_base", "loss.weight")[...] = self._loss.class_weights

    # ---- training --------------------------------------------------------------------------------
    @_arguments_checked
    def run(self, epochs: int | None = None, *, progress: str | bool = "auto", resume: bool = True,
            callbacks: Sequence[Callable[[str, Any], None]] = ()) -> TrainingResult:  # type: ignore[override]
        """Train to total_epochs (or ``epochs`` more). Compiles first if needed.

        Ctrl-C (the notebook's stop button) ends the run at a step boundary; the task
        stays COMPILED, the history is complete up to that step, and ``run()`` (resume=True)
        continues from the next step, ending with the same weights as an uninterrupted
        run. ``resume=False`` starts the interrupted epoch over instead, on the weights as they are, with
        its step count, schedule and loss log back at the epoch's start. An exception from a
        callback stops the same way (and is raised), unless it is StopTraining, which ends the run cleanly
        (``result.stopped``; see EarlyStopping); ``callbacks`` are called as ``cb(kind, info)`` with kind
        "start", "step" (at steps 16, 32, ... of each epoch: none in an epoch of fewer steps), "epoch" and
        "end".
        ``progress``: "auto" or True (a tqdm bar in a notebook, lines in a terminal: one per epoch,
        and inside a long epoch one every 20 s with the step, loss and time per step), "bar",
        "lines", or False/None/0 for none.
        """
        progress = _progress_kind(progress)
        resume = _flag("run", "resume", resume)
        callbacks = _callbacks(callbacks)
        self._not_running("run")
        self._running = True
        try:
            return self._run(epochs, progress, resume, callbacks)
        finally:
            self._running = False

    def _run(self, epochs: int | None, progress: str | bool, resume: bool,
             callbacks: Sequence[Callable[[str, Any], None]]) -> TrainingResult:
        more = None if epochs is None else _int_setting("run", "epochs", epochs)  # before anything changes
        if self._phase is not Phase.COMPILED:
            self._require("run", Phase.PLANNING, Phase.MEMORY_LOCKED, Phase.COMPILED)
            self.compile()
        # the "start" callbacks may refuse (EarlyStopping's monitor) or stop: before anything below changes
        fields = self._record_fields()
        by = self._save_best_by
        if self._save_best and by is not None and by[0] not in fields:
            raise lacking_field("save_best", by[0])
        stopped = _call_each(callbacks, "start", {"epoch": self._epoch, "total_epochs": self._epochs,
                                                  "steps_per_epoch": self.steps_per_epoch, "fields": fields,
                                                  "task": self})
        if stopped is None:  # a run refused or stopped at "start" leaves an interrupted one interrupted
            self.result.interrupted = False
        self.result.stopped = stopped
        if not resume:
            self._resume_at = None
        if self._torn_at is not None:
            e, i = self._torn_at
            self._torn_at = None
            warnings.warn(f"run: the last run stopped inside step {i + 1} of epoch {e + 1} (a second Ctrl-C, or an "
                          "error raised by a kernel such as the NaN check), so that step is half done; epoch "
                          f"{e + 1} starts over from its first batch on the weights as they are, and this run will "
                          "not reproduce an uninterrupted one. Fix: task.load_state(path) from a checkpoint to "
                          "continue exactly, or task.reset() to train from the start.", stacklevel=4)
        end = self._epochs if more is None else min(self._epochs, self._epoch + more)
        if stopped is not None:  # a callback stopped the run before its first step
            end = self._epoch
        elif end <= self._epoch and self._resume_at is None:
            warnings.warn(f"run: all total_epochs={self._epochs} epochs are trained, so there is nothing to run: the "
                          "learning-rate schedule and the plan are compiled for that many. Fix: to train longer, build "
                          "a task with a larger total_epochs and copy the weights in with "
                          "new_task.load_state_dict(task.state_dict()) (the optimizer's moments and any EMA start "
                          "over from them).", stacklevel=4)
        # ex: host views, what the loop reads and writes; rx: who replays, ex itself on the CPU, the
        # captured graphs on a GPU
        _, ex, rx = self._compiled_parts("run")
        s = self._data
        sched_base = rx.train_schedule(batch_variants(len(s.train), self._batch, "train_base", "train_last"))
        sched_low = sched_base
        boundary = self._epochs + 1
        if self._resolution is not None:
            boundary = self._resolution[2]
            sched_low = rx.train_schedule(batch_variants(len(s.train), self._batch, "train_lowres",
                                                         "train_lowres_last"))
        sched = sched_base
        val_sched = ema_sched = None
        if s.val is not None:
            val_vs = batch_variants(len(s.val), self._val_batch or self._batch, "val_base", "val_last")
            val_sched = rx.eval_schedule(val_vs)
            if self._ema is not None:
                ema_sched = rx.eval_schedule(val_vs, ema=True)
        aug_offset = ex.view("train_base", "aug.offset")
        cursor = ex.view("train_base", "cursor")
        acc = ex.view("train_base", "metrics.sum")
        step_counter = ex.view("train_base", "step")
        lr_table = ex.view("train_base", "lr_table")
        result_view = ex.view("train_base", "result")
        nan_flag = ex.view("train_base", "nan.flag")  # 2: a device backend stopped updating at a non-finite value
        # what a device backend copies back every 16 steps, in one hand-over: the loss and the NaN
        # flag, and for callbacks the step counter, the loss log (the live monitor reads it) and the
        # clip's last norm
        seen = [step_counter, ex.view("train_base", "loss_log")]
        if self._clip_norm is not None:
            seen.append(ex.view("train_base", "clip.norm"))
        watched = (result_view, nan_flag) + (tuple(seen) if callbacks else ())
        rx.upload_all()
        stop = _StopFlag()
        done = self._resume_at[1] if self._resume_at is not None and self._resume_at[0] == self._epoch else 0
        prog = make_progress(progress, total=(end - self._epoch) * sched.batches, desc=self.name,
                             steps_per_epoch=sched.batches, epoch=self._epoch + 1, step=done)
        # prog.armed(): a first step that compiles the kernels says so instead of looking hung
        first = True
        # Where run() resumes after a failure: step ``pos`` of ``epoch`` (the last step boundary reached;
        # None between epochs), unless ``inside`` a step's kernels, which leaves that step half done.
        pos: int | None = None
        inside = False
        with stop, blas.own_cores(), prog.armed():
            try:
                while self._epoch < end:
                    epoch = self._epoch
                    sched = sched_low if epoch >= boundary else sched_base
                    self._epoch_t0 = time.perf_counter()
                    start = 0
                    if self._resume_at is not None and self._resume_at[0] == epoch:
                        start = self._resume_at[1]
                        self._epoch_t0 -= self._partial_seconds  # the epoch's time includes its steps before the stop
                        rx.set_perm("train", self._env.perms["train"])  # a load_state wrote the host's order only
                    else:
                        self._shuffle_into(self._env.perms["train"], epoch)
                        rx.set_perm("train", self._env.perms["train"])
                        cursor[0] = 0
                        aug_offset[0] = epoch * len(s.train)
                        rx.push(cursor, aug_offset)
                        began = self._steps_before(epoch, int(step_counter[0]))
                        if began != step_counter[0]:  # an epoch begun before (a stop or a torn step inside it,
                            step_counter[0] = began    # then a load): the schedule, the loss log and the step
                            rx.push(step_counter)      # counts replay its positions
                        for k in sched.prologue:
                            k()
                    self._resume_at, self._partial_seconds = None, 0.0
                    pos = shown = start  # shown: the steps of this epoch the progress has counted
                    steps = sched.steps
                    for i in range(start, sched.batches):
                        inside = True
                        for k in steps[i]:
                            k()
                        inside, pos = False, i + 1
                        if first:  # the kernels are compiled or loaded now
                            prog.disarm()
                            first = False
                        if (i & 15) == 15:
                            rx.pull(*watched)
                            if nan_flag[0] == 2:
                                self._raise_halted()
                            loss = float(result_view[0])
                            prog.update(pos - shown, loss)
                            shown = pos
                            self._live_at = (epoch, pos)  # a save() from a callback records where to resume
                            why = _call_each(callbacks, "step", {"epoch": epoch + 1, "step": int(step_counter[0]),
                                                                 "loss": loss})
                            if why is not None:  # a stop at this step boundary, as Ctrl-C's
                                self.result.stopped, stop.requested = why, True
                            self._live_at = None
                        if stop.requested:
                            self._resume_at = (epoch, i + 1)
                            self._partial_seconds = time.perf_counter() - self._epoch_t0
                            break
                    if self._resume_at is not None:
                        self.result.interrupted = True
                        prog.stopped(epoch + 1, pos, sched.batches, self.result.stopped or "Ctrl-C")
                        break
                    rx.pull(result_view, acc, step_counter, nan_flag)
                    if nan_flag[0] == 2:
                        self._raise_halted()
                    prog.update(sched.batches - shown, float(result_view[0]))
                    train = acc.copy()
                    try:
                        val = self._run_eval(val_sched) if val_sched else None
                        emav = self._run_eval(ema_sched) if ema_sched else None
                    finally:  # the val passes share the metric sums: a resume after a failure here reads them
                        acc[...] = train
                        rx.push(acc)
                    lr = float(lr_table[min(int(step_counter[0]), len(lr_table)) - 1]) if step_counter[0] else 0.0
                    rec = EpochRecord(epoch + 1, train[0] / train[3], train[1] / train[3], train[2] / train[3],
                                      None if val is None else val[0] / val[3], None if val is None else val[1] / val[3],
                                      None if val is None else val[2] / val[3], lr,
                                      time.perf_counter() - self._epoch_t0,
                                      int(step_counter[0]),
                                      *((None, None, None) if emav is None else (emav[0] / emav[3], emav[1] / emav[3],
                                                                                 emav[2] / emav[3])))
                    self.result.history.append(rec)
                    self._epoch += 1
                    pos = None
                    self._plateau_step(rec, lr_table, step_counter, rx)
                    rx.download_all()
                    self._autosave(rec)
                    prog.epoch(rec)
                    why = _call_each(callbacks, "epoch", rec)
                    if why is not None:  # after this epoch, which is whole
                        self.result.stopped = why
                        prog.note(why)
                        break
            except BaseException as exc:  # a callback, a save or a second Ctrl-C failed between two steps
                self._live_at = None
                # inside a step, or a device halt found at a check (the steps since ran without updates)
                if pos is not None and (inside or isinstance(exc, NumericalError)):
                    self._torn_at, pos = (epoch, pos), None
                if pos is not None:
                    try:
                        rx.download_all()  # a device backend's state is what resumes
                    except Exception:  # noqa: BLE001 - the host copy is stale: the epoch starts over
                        pos = None
                if pos is not None:
                    self._resume_at = (epoch, pos)
                    self._partial_seconds = time.perf_counter() - self._epoch_t0
                    self.result.interrupted = True
                prog.close()
                raise
        prog.close()
        rx.download_all()
        self._drain_transfers()
        self.result.step_losses = ex.view("train_base", "loss_log")[: int(step_counter[0])].copy()
        why = _call_each(callbacks, "end", {"epoch": self._epoch, "interrupted": self.result.interrupted,
                                            "stopped": self.result.stopped})
        self.result.stopped = self.result.stopped or why
        return self.result

    def _record_fields(self) -> tuple[str, ...]:
        """The EpochRecord fields this task's epochs will fill: train_ always, val_ with validation
        data, ema_ with validation data and ema() (the EMA is scored on the validation set)."""
        val = self._data.val is not None if self._splits is not None else False
        return ("train_loss", "train_top1", "train_top5") + (
            ("val_loss", "val_top1", "val_top5") if val else ()) + (
            ("ema_loss", "ema_top1", "ema_top5") if val and self._ema is not None else ())

    def _plateau_start(self, lr: float | None = None) -> dict[str, float]:
        """ReduceLROnPlateau's first state: the rate in force ``lr``, by default the schedule's base."""
        sched = cast(ReduceLROnPlateau, self._scheduler)
        base = (self._optimizer.lr_ if sched.base_lr_ is None else sched.base_lr_) if lr is None else lr
        return sched.initial_state(base)

    def _plateau_step(self, rec: EpochRecord, lr_table: np.ndarray, step: np.ndarray, rx: StepPrograms) -> None:
        """ReduceLROnPlateau at an epoch's end: feed it the record's metric; a reduction rewrites the
        arena's table from the next step on (and the device's copy)."""
        sched = self._scheduler
        if not isinstance(sched, ReduceLROnPlateau) or self._plateau is None:
            return
        state = plateau_step(sched, self._plateau, float(getattr(rec, sched.monitor_)))
        if state["lr"] != self._plateau["lr"]:
            lr_table[int(step[0]):] = np.float32(state["lr"])
            rx.push(lr_table)
        self._plateau = state

    def _steps_before(self, epoch: int, now: int) -> int:
        """The finished updates before ``epoch`` (0-based): the last record's running total, or ``now``
        when the history does not end just before it (edited by hand)."""
        h = self.result.history
        if not h:
            return 0 if epoch == 0 else now
        return h[-1].steps if h[-1].epoch == epoch else now

    def _drain_transfers(self) -> None:
        """Wait for background batch copies still writing an input buffer (after a stop, before a save)."""
        if self.executor is None or not self._prefetch:
            return
        from .kernels.transfer import buffer_slot
        for name in ("I_A.data", "I_B.data"):
            buffer_slot(self.executor.view("train_base", name)).wait()

    def _fold_bn(self, runner: StepPrograms) -> None:
        for k in runner.kernels("val_base", GraphId.UPDATE_BN_INF_PARAMS):
            k()

    def _run_eval(self, sched) -> np.ndarray:  # type: ignore[no-untyped-def]
        _, ex, rx = self._compiled_parts("run")
        self._fold_bn(rx)
        cursor, aug = ex.view("val_base", "cursor"), ex.view("val_base", "aug.offset")
        sums = ex.view("val_base", "metrics.sum")
        cursor[0] = 0
        aug[0] = 0
        rx.push(cursor, aug)
        sched.replay()
        rx.pull(sums)
        return sums.copy()

    def _raise_halted(self) -> None:
        """A device backend stopped updating at a non-finite value (its NaN flag is 2): report it, and
        clear the flag so that the task can train again (the epoch starts over, as after a CPU halt)."""
        _, ex, rx = self._compiled_parts("run")
        rx.download_all()
        flag = ex.view("train_base", "nan.flag")
        flag[0] = 0
        rx.push(flag)
        step = int(ex.view("train_base", "step")[0])
        raise NumericalError(f"step {step + 1}: a non-finite gradient or loss (found on the GPU, which stopped "
                             "updating there; the host checks every 16 steps, and the steps run since then replaced "
                             "that step's gradients and loss, so they are not named). The weights and moments are "
                             f"those before step {step + 1}; the EMA weights, batch-norm statistics and dropout "
                             "offsets moved on with those steps' forward passes. Fix: lower the learning rate, check "
                             "the data for extreme values, or use options(nan_policy='skip'); task.load_state(path) "
                             "of a checkpoint continues exactly.")

    def _shuffle_into(self, perm: np.ndarray, epoch: int) -> None:
        n = perm.shape[0]
        if self._shuffle:
            offset = epoch * Philox.blocks_needed(n, words_per_item=2)
            perm[:] = Philox(self._seed).permutation(n, int(StreamId.SHUFFLE), offset)
        else:
            perm[:] = np.arange(n)

    # ---- inference on any data ---------------------------------------------------------------------
    def _forward_batches(self, x: np.ndarray, y: np.ndarray | None, ema: bool = False):  # type: ignore[no-untyped-def]
        """Run INF_MAIN_A (INF_EMA_A with ``ema``) over x in batches of the val batch size (a partial
        batch is padded)."""
        self._require("evaluate", Phase.COMPILED, hint="Call task.compile() first.")
        _, ex, rx = self._compiled_parts("evaluate")
        arch = self._planned("evaluate")[0]
        variant = "val_base"
        data, labels = ex.view(variant, "I_A.data"), ex.view(variant, "I_A.label")
        n_layers = len(arch.layers)
        logits_name = f"{arch.layers[n_layers - 1].name}.out"
        logits = ex.view(variant, logits_name)
        prog = [k for k in ex.kernels(variant, GraphId.INF_EMA_A if ema else GraphId.INF_MAIN_A)]
        if self._prefetch and data.ndim == 4:
            prog = prog[1:]  # no transfer was submitted: skip the transfer_wait that heads the graph
        self._fold_bn(ex)
        bsz = data.shape[0]
        image = data.ndim == 4
        # Between two steps the input buffer holds the next training batch (prefetched) and R_RESULT
        # the last step's loss: both are training state, put back afterwards.
        self._drain_transfers()
        if self._live_at is not None:
            rx.download_all()  # called from a step callback on a device: its weights are current
        keep = [(v, v.copy()) for v in (data, labels, ex.view(variant, "result"))]
        try:
            for start in range(0, len(x), bsz):
                n = min(bsz, len(x) - start)
                chunk = x[start:start + n]
                data[:n] = chunk.transpose(0, 2, 3, 1) if image else chunk.reshape((n, *data.shape[1:]))
                data[n:] = 0
                labels[:n] = 0 if y is None else y[start:start + n]
                labels[n:] = 0
                with blas.own_cores():
                    for k in prog:
                        k()
                yield start, n, logits[:n]
        finally:
            for view, saved in keep:
                view[...] = saved

    def evaluate(self, x: Any, y: Any, *, ema: bool = False) -> dict[str, float]:
        """Loss (the task's, label smoothing and class weights included; averaged over batches of the
        validation batch size by their sizes, as the epochs' val loss), top-1 and top-5 on any labelled
        data; ``ema=True`` evaluates the EMA weights (``ema()`` on), as the epochs' ema columns do."""
        self._require("evaluate", Phase.COMPILED, hint="Call task.compile() first.")
        ema = self._ema_flag("evaluate", ema)
        ds = self._inputs_as_trained("evaluate", validate_arrays(
            x, y, what="evaluate", num_classes=self._data.train.num_classes, where="evaluate", names=("x", "y")))
        sums = np.zeros(3)
        res = np.zeros(3, np.float32)
        for start, n, logits in self._forward_batches(ds.x, ds.y, ema):
            fused.softmax_xent(logits, ds.y[start:start + n], float(self._loss.label_smoothing_),
                               self._loss.class_weights, res,
                               np.zeros((0, 0), np.float32), False)
            sums += (res[0] * n, res[1], res[2])
        n = len(ds)
        return {"loss": sums[0] / n, "top1": sums[1] / n, "top5": sums[2] / n, "n": n}

    def predict(self, x: Any, *, ema: bool = False) -> np.ndarray:
        """Predicted class of each row of x (int64, shape (N,)); ``ema=True``: by the EMA weights."""
        count, batches = self._inference("predict", x, ema)
        out = np.empty(count, np.int64)
        for start, n, logits in batches:
            out[start:start + n] = logits.argmax(axis=1)
        return out

    def predict_logits(self, x: Any, *, ema: bool = False) -> np.ndarray:
        """The model's outputs for each row of x, before softmax (float32, shape (N, classes)):
        what ``model(x)`` returns in PyTorch, in eval mode (dropout off, batch norm's running statistics);
        ``ema=True``: the EMA model's."""
        return self._gathered("predict_logits", x, lambda logits: logits, ema)

    def predict_proba(self, x: Any, *, ema: bool = False) -> np.ndarray:
        """Class probabilities for each row of x (float32, shape (N, classes), rows summing to 1):
        ``softmax(predict_logits(x, ema=ema))``, computed in float64."""
        def softmax(logits: np.ndarray) -> np.ndarray:
            z = logits.astype(np.float64)
            z -= z.max(axis=1, keepdims=True)
            np.exp(z, out=z)
            z /= z.sum(axis=1, keepdims=True)
            return z
        return self._gathered("predict_proba", x, softmax, ema)

    def _gathered(self, op: str, x: Any, f: Callable[[np.ndarray], np.ndarray], ema: bool) -> np.ndarray:
        count, batches = self._inference(op, x, ema)
        out = np.empty((count, self._data.train.num_classes), np.float32)
        for start, n, logits in batches:
            out[start:start + n] = f(logits)
        return out

    def _inference(self, op: str, x: Any, ema: bool) -> tuple[int, Iterator[tuple[int, int, np.ndarray]]]:
        """The rows of x, checked and moved as evaluate() does, and (start, n, logits) per batch."""
        self._require(op, Phase.COMPILED, hint="Call task.compile() first.")
        ema = self._ema_flag(op, ema)
        try:  # without converting x: validate_arrays turns a ragged or odd input into the library's error
            rows = len(x)
        except TypeError:  # a 0-d array or a scalar: validate_arrays refuses it by name
            rows = 0
        ds = self._inputs_as_trained(op, validate_arrays(x, np.zeros(rows, np.int64), what=op, where=op,
                                                         names=("x", "y")))
        return len(ds), self._forward_batches(ds.x, None, ema)

    def _ema_flag(self, op: str, ema: Any) -> bool:
        """``ema=`` of the inference calls: a bool, and True only for a task compiled with ``ema()``."""
        ema = as_flag(ema, op, "ema", ConfigError, f"pass task.{op}(..., ema=True)")
        if ema and self._ema is None:
            raise ConfigError(f"{op}: ema=True, but this task keeps no EMA weights. Fix: call task.ema(0.999) "
                              "before compile() and train, or drop ema=True.")
        return bool(ema)

    def _inputs_as_trained(self, op: str, ds: Dataset) -> Dataset:
        """``ds`` in the layout the model was trained on: for a task given channels-last images, arrays
        shaped (N, H, W, C) are moved as data() moved them (those already (N, C, H, W), such as
        ``task.splits``' own, are taken as they are, unless C == H == W says nothing); any other shape
        than training's is refused."""
        c, h, w = (self._data.train.sample_shape + (0, 0, 0))[:3]
        if self._channels_last and ds.x.shape[1:] == (h, w, c):  # C == H == W: moved, as data() moved them
            ds = moved_to_channels_first(ds)
        self._check_sample_shape(op, ds.x)
        return ds

    def _check_sample_shape(self, op: str, x: np.ndarray) -> None:
        want = tuple(self._data.train.sample_shape)
        got = tuple(x.shape[1:])
        if got == want:
            return
        if len(want) == 3 and self._channels_last:
            c, h, w = want
            raise bad_argument(DataError, op, "x", x, f"images shaped (N, {h}, {w}, {c}) as given to data() with "
                               f"channels_last=True, or (N, {c}, {h}, {w})", "pass images of the training size")
        if len(want) == 3:  # image models read (N, C, H, W) as such: a flat or channels-last batch is not it
            raise bad_argument(DataError, op, "x", x, f"images shaped (N, {', '.join(map(str, want))}) as in "
                               "training (N, C, H, W)", f"reshape it, e.g. X.reshape(-1, {', '.join(map(str, want))})"
                               " for flat rows, or X.transpose(0, 3, 1, 2) for channels-last images")
        if int(np.prod(got)) != int(np.prod(want)):
            raise bad_argument(DataError, op, "x", x, f"samples shaped {want}",
                               "pass data shaped like the training data")

    # ---- parameters ---------------------------------------------------------------------------------
    def _param_names(self) -> dict[str, tuple[int, ...]]:
        """State-dict names and PyTorch shapes (conv weights (out, in, k, k))."""
        out = {}
        for p in self._compiled_parts("load_state_dict")[0].params:
            shape = p.shape
            if len(shape) == 4:
                shape = (shape[0], shape[3], shape[1], shape[2])
            out[p.name] = shape
        return out

    def state_dict(self, *, ema: bool = False) -> dict[str, np.ndarray]:
        """Parameters and BN buffers by layer name, in PyTorch's layouts: 'fc1.weight' is
        (out, in), 'conv1.weight' is (out, in, k, k), 'bn1.running_mean' ... ``ema=True``: the EMA
        model's (``ema()`` on), under the same names, ready for ``load_state_dict`` of a task or a
        torch module."""
        self._require("state_dict", Phase.COMPILED, hint="Parameters exist once the task is compiled.")
        ema = self._ema_flag("state_dict", ema)
        compiled, ex, _ = self._compiled_parts("state_dict", hint="Parameters exist once the task is compiled.")
        out = {}
        for p in compiled.params:
            v = ex.view("train_base", p.name + ("@ema" if ema else ""))
            out[p.name] = torch_layout(v).copy()
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Set parameters; every key and shape is checked before anything is written. With ema() on,
        the EMA copies start from them too, as they start from the initial weights."""
        self._require("load_state_dict", Phase.COMPILED, hint="Call task.compile() first.")
        expected = self._param_names()
        if not isinstance(state, dict):
            raise bad_argument(CheckpointError, "load_state_dict", "state", state, "a dict name -> array",
                               "pass the dict from task.state_dict()")
        missing = sorted(set(expected) - set(state))
        extra = sorted(set(state) - set(expected), key=str)  # a key of another type is unexpected too
        if missing or extra:
            raise CheckpointError(f"load_state_dict: keys differ: missing {missing}, unexpected {extra}. "
                                  "Fix: load a state dict made for this model.")
        arrays = {}
        for k, shape in expected.items():
            try:
                source = np.asarray(state[k])
                if source.dtype.kind not in "iuf":
                    raise TypeError(source.dtype)
                with np.errstate(over="ignore"):
                    a = source.astype(np.float32)
            except (TypeError, ValueError):
                raise bad_argument(CheckpointError, "load_state_dict", k, state[k],
                                   f"a real-valued array of shape {shape}",
                                   "load a state dict made for this model (task.state_dict())") from None
            if a.shape != shape:
                raise CheckpointError(f"load_state_dict: {k} has shape {a.shape}, the model needs {shape}. "
                                      "Fix: load a state dict made for this model.")
            if not np.isfinite(a).all():
                why = ("values beyond float32's range (|x| > 3.4e38), which the weights are stored in"
                       if np.isfinite(source).all() else "non-finite values")
                raise CheckpointError(f"load_state_dict: {k} holds {why}. Fix: check the source.")
            arrays[k] = arena_layout(a)
        ex = self._compiled_parts("load_state_dict")[1]
        for k, a in arrays.items():
            ex.view("train_base", k)[...] = a
            if self._ema is not None:
                ex.view("train_base", f"{k}@ema")[...] = a

    def _seconds_into_epoch(self) -> float:
        """Wall seconds the epoch a resume would continue has run: after a stop, or from a step
        callback inside run() (what a checkpoint keeps, so a resumed epoch reports its whole time)."""
        if self._resume_at is not None:
            return self._partial_seconds
        return time.perf_counter() - self._epoch_t0 if self._live_at is not None else 0.0

    def load_weights(self, path: str, *, ema: bool = False) -> "DeepLearningTask":
        """The parameters and batch-norm statistics of a checkpoint, into this compiled task, which may
        be built on other data or another optimizer (inference, fine-tuning): the model must match.
        Training state (moments, history, data order) is not loaded: ``load_state`` resumes a run.
        ``ema=True`` takes the checkpoint's EMA weights instead (a task saved with ``ema()`` on)."""
        from .checkpoint import read_state_dict
        self._require("load_weights", Phase.COMPILED, hint="Call task.compile() first.")
        ema = as_flag(ema, "load_weights", "ema", ConfigError, "pass task.load_weights(path, ema=True)")
        self.load_state_dict(read_state_dict(path, ema=ema, op="load_weights"))
        return self

    @property
    def skipped_updates(self) -> int:
        """Updates skipped by nan_policy='skip' so far."""
        return int(self.executor.view("train_base", "nan.skipped")[0]) if self.executor else 0

    # ---- checkpoints ------------------------------------------------------------------------------
    def save(self, path: str) -> str:
        """Write everything needed to continue (state-carrying regions, RNG and data position,
        history) atomically to one .npz file with a JSON header and a checksum."""
        from .checkpoint import save
        self._drain_transfers()
        if self._live_at is not None:  # called from a step callback on a device: its state is current
            self._compiled_parts("save")[2].download_all()
        return save(self, path)

    def load_state(self, path: str, *, strict: bool = True) -> "DeepLearningTask":
        """Restore a checkpoint into this compiled task; validated fully before anything changes."""
        from .checkpoint import load_state
        load_state(self, path, strict=strict)
        return self

    @classmethod
    def load(cls, path: str, data: Any, *, strict: bool = True) -> "DeepLearningTask":
        """Rebuild a task from a checkpoint's model and settings around ``data``, compile it,
        and restore its state, ready to ``run()`` on."""
        from . import checkpoint
        as_flag(strict, "load", "strict", CheckpointError, "pass strict=False to allow other settings, or leave it out")
        header = checkpoint.read_header(path)
        sp = header.get("spec")
        if not sp:
            raise CheckpointError(f"load: {path!r} holds no task spec. Fix: build the task yourself and call "
                                  "task.load_state(path).")
        needed = ("blueprint", "loss", "optimizer", "scheduler", "total_epochs", "seed", "batch_size",
                  "val_batch_size", "shuffle", "options")
        lacking = [k for k in needed if k not in sp] if isinstance(sp, dict) else list(needed)
        if lacking:  # a header edited by hand: the checksum covers the arrays only
            raise CheckpointError(f"load: the task spec in {path!r} lacks {', '.join(lacking)}. Fix: build the task "
                                  "yourself and call task.load_state(path).")
        try:  # a spec edited by hand (the checksum covers the arrays only): any shape it has is this error
            task = cls._from_spec(sp, header, data, path)
        except RenaissanceError:
            raise
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
            raise CheckpointError(f"load: the task spec in {path!r} is malformed ({type(exc).__name__}: {exc}). "
                                  "Fix: build the task yourself and call task.load_state(path).") from None
        return task.compile().load_state(path, strict=strict)

    @classmethod
    def _from_spec(cls, sp: dict[str, Any], header: dict[str, Any], data: Any, path: str) -> "DeepLearningTask":
        """The task a checkpoint's spec describes, built around ``data`` (PLANNING, not yet loaded)."""
        from . import checkpoint
        import renaissance_nb as rnb

        def build(d: Any) -> Any:
            if d is None:
                return None
            try:
                cls_ = getattr(rnb, d["class"], None)
                if not (isinstance(cls_, type) and issubclass(cls_, Settings)):
                    raise TypeError(f"{d['class']!r} is no loss, optimizer or scheduler")
                return cls_(**{k: tuple(v) if isinstance(v, list) else v for k, v in d["settings"].items()})
            except (TypeError, KeyError, AttributeError, RenaissanceError) as exc:
                raise CheckpointError(f"load: {path!r} records a setting this library cannot rebuild ({exc}). "
                                      "Fix: build the task yourself and call task.load_state(path).") from None

        task = cls(sp.get("name", "task")).model(BluePrint.from_dict(sp["blueprint"]))
        # channels_last: a checkpoint from before it existed trained on its data as given (False); a task's
        # own splits, already moved, are taken as they are (the trained sample shape is in the spec)
        cl, trained = sp.get("channels_last", False), tuple(sp.get("sample_shape") or ())
        moved = cl and _sample_shape_of(data) == trained and len(set(trained)) > 1  # C == H == W: follow the flag
        # a validation set held out by val_fraction= is held out again, unless data brings one (task.splits)
        fraction = sp.get("val_fraction") if not (isinstance(data, DataSplits) and data.val is not None) else None
        task.data(data, batch_size=sp["batch_size"], val_batch_size=sp["val_batch_size"], shuffle=sp["shuffle"],
                  channels_last=False if moved else cl, val_fraction=fraction)
        task._channels_last = cl
        saved = header.get("settings", {})
        sizes = (saved.get("n_train"), saved.get("n_val"))
        now = (len(task._data.train), 0 if task._data.val is None else len(task._data.val))
        if None not in sizes and sizes != now:  # the plan's shapes (the loss log, the last batches) follow them
            raise CheckpointError(f"load: {path!r} was trained on {sizes[0]} training and {sizes[1]} validation "
                                  f"samples; data has {now[0]} and {now[1]}, and the plan's shapes follow the data. "
                                  "Fix: pass the data it was trained on to resume (the saved task's splits, "
                                  "validation set included); for the weights alone (inference, fine-tuning), build a "
                                  "task on this data and call task.load_weights(path).")
        task.loss(build(sp["loss"])).optimizer(build(sp["optimizer"])).total_epochs(sp["total_epochs"]).seed(sp["seed"])
        if sp["scheduler"]:
            task.scheduler(build(sp["scheduler"]))
        # a checkpoint from before padded rows existed holds contiguous rows
        task.options(**{"pad_rows": False, **sp["options"]})
        extras = {**checkpoint.EXTRAS_OFF, **{k: sp[k] for k in checkpoint.EXTRAS_OFF if k in sp}}
        if extras["ema"] is not None:
            task.ema(extras["ema"])
        task.clip_grad_norm(extras["clip_grad_norm"])
        if extras["train_resolution"] is not None:
            begin, end, boundary = extras["train_resolution"]
            task.train_resolution(tuple(begin), tuple(end), boundary)
        task.augment(**extras["augment"])
        autosave = sp.get("autosave") or {}  # a run resumed from a checkpoint keeps saving as it did
        if autosave.get("every"):
            task.save_every(*autosave["every"])
        if autosave.get("best"):
            by = autosave.get("best_by") or (None, None)
            task.save_best(autosave["best"], monitor=by[0], mode=by[1])
        return task

    # ---- summaries ------------------------------------------------------------------------------------
    def summary(self) -> str:
        """Plan summary: arena by family, reuse, distinct bound graphs, collapsed variants."""
        lines = [f"{self.name}: phase {self._phase}"]
        if self.arch is not None:
            lines.append(repr(self.arch))
        if self.memory.finalized:
            lines.append(self.memory.summary())
        if self.compiled is not None:
            a = self.compiled.atlas
            lines.append(f"atlas: {len(a.entries)} entries over {len(a.variants)} variants -> "
                         f"{len(a.captures)} distinct bound graphs; ShapeIds "
                         + ", ".join(f"s{k}={'any' if v is None else v}" for k, v in a.shape_ids.items()))
            if a.collapsed:
                lines.append("variants collapsed: " + ", ".join(f"{k} -> {v}" for k, v in a.collapsed.items()))
            lines += [f"note: {n}" for n in self.compiled.notes]
        return "\n".join(lines)

    def inspect(self):  # type: ignore[no-untyped-def]
        """The dashboard widget (needs the notebook extra)."""
        from .display import dashboard
        return dashboard(self)

    def _repr_mimebundle_(self, include=None, exclude=None):  # type: ignore[no-untyped-def]
        try:
            from .display import dashboard_bundle
        except ImportError:
            return {"text/plain": repr(self)}
        return dashboard_bundle(self)

    def __repr__(self) -> str:
        bits = [f"phase {self._phase}"]
        if self.memory.finalized:
            bits.append(f"arena {human_bytes(self.memory.total_bytes)}")
        if self.result.history:
            bits.append(f"{plural(len(self.result.history), 'epoch')} trained")
        return f"<DeepLearningTask {self.name!r}: " + ", ".join(bits) + ">"


def _note(operation: str, started: float):  # type: ignore[no-untyped-def]
    """A step within PLANNING (plan()), timed like the phase changes, for the phase view's history."""
    now = time.time()
    return Transition(Phase.PLANNING, Phase.PLANNING, operation, now, now - started)


class _StopFlag:
    """Turns Ctrl-C into a request to stop at the next step boundary (main thread only)."""

    def __init__(self) -> None:
        self.requested = False
        self._old: Any = None

    def _handler(self, signum, frame) -> None:  # type: ignore[no-untyped-def]
        if self.requested:  # a second Ctrl-C interrupts at once
            signal.signal(signal.SIGINT, self._old)
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self) -> "_StopFlag":
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)

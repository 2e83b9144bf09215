"""The builder's argument checks: one pure function per builder call, returning the TaskConfig
fields it sets. Every argument is checked before any is returned, so a bad one changes nothing;
``TaskConfig.from_dict`` runs the same checks on a checkpoint's record."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .blueprint import BluePrint
from .checks import as_flag, as_float, as_int
from .data.arrays import DataSplits, Dataset, channels_first, checked_splits, held_out, make_splits
from .errors import ConfigError, DataError, DeviceError, bad_argument
from .train.losses import CrossEntropyLoss
from .train.optimizers import Optimizer
from .train.plateau import PLATEAU_METRICS, metric_direction
from .train.schedulers import Scheduler
from .train.settings import LR_MAX

Fields = dict[str, Any]

INT_SETTING_MAX = 2**31 - 1
"""The largest count a setting takes (epochs, batch sizes, pixels): the kernels index with 32-bit
ints, and a larger value would fail later, deep inside NumPy or numba, instead of here."""


def int_setting(where: str, name: str, v: Any, low: int = 1, high: int = INT_SETTING_MAX) -> int:
    n = as_int(v)
    if n is None or not low <= n <= high:
        raise bad_argument(ConfigError, where, name, v, f"an int in [{low}, {high}]",
                           f"pass a whole number >= {low}" + ("" if high == INT_SETTING_MAX else f" and <= {high}"))
    return n


def flag(where: str, name: str, v: Any) -> bool:
    """A True/False setting (NumPy's bools too, as NumPy code hands them over)."""
    return as_flag(v, where, name, ConfigError)


def foreign(obj: Any) -> str:
    """What a same-named object from another library is, for the errors of loss()/optimizer()/scheduler()."""
    module = str(getattr(obj, "__module__", "") or "")  # an instance's class's module, or a class's own
    if module.split(".")[0] not in ("torch", "tensorflow", "keras", "tf_keras", "jax", "optax", "flax"):
        return ""
    name = getattr(obj, "__name__", type(obj).__name__)
    return (f" (this is {module}.{name}: the task compiles its own, with PyTorch's names and formulas, "
            "from renaissance_nb)")


def path_template(where: str, path: Any, example: str) -> None:
    """A checkpoint path template must format with {name} and {epoch} now, not at the first autosave mid-run."""
    try:
        ok = isinstance(path, str) and bool(path) and bool(path.format(name="task", epoch=1)) and "\0" not in path
    except (KeyError, IndexError, ValueError, AttributeError):
        ok = False
    if not ok:
        raise bad_argument(ConfigError, where, "path", path, "a file name that may use {name} and {epoch}",
                           f"{example} (double braces for a literal brace)")


def task_name(name: Any) -> str:
    """A task's name: a non-empty str (it names its checkpoints, 'checkpoints/{name}-best.npz'; a '/' in it makes
    folders there, as autosave makes them), without NUL, which no file name holds."""
    if not isinstance(name, str) or not name or "\0" in name:
        raise bad_argument(ConfigError, "DeepLearningTask", "name", name, "a non-empty str",
                           "name it e.g. DeepLearningTask('mnist-mlp')")
    return name


def model(blueprint: Any) -> Fields:
    if not isinstance(blueprint, BluePrint):
        raise bad_argument(ConfigError, "model", "blueprint", blueprint, "a BluePrint such as seq(fc(10))",
                           "build the model with seq(...), fc(...), relu() ...")
    return {"model": blueprint}


def _data_shape_errors(splits: Any, train: Any, val: Any, channels_last: Any) -> None:
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


def _val_fraction(val_fraction: Any, splits: Any, val: Any) -> float | None:
    if val_fraction is None:
        return None
    fraction = as_float(val_fraction)
    if fraction is None or not 0.0 < fraction < 1.0:
        raise bad_argument(DataError, "data", "val_fraction", val_fraction, "a number in (0, 1)",
                           "pass e.g. val_fraction=0.1, or None for no held-out set")
    if val is not None or (isinstance(splits, DataSplits) and splits.val is not None):
        raise ConfigError("data: got val_fraction= and a validation set. Fix: pass one of them.")
    return fraction


def data(splits: Any = None, *, train: Any = None, val: Any = None, batch_size: Any = 128,
         val_batch_size: Any = None, shuffle: Any = True, num_classes: Any = None, channels_last: Any = None,
         val_fraction: Any = None) -> Fields:
    _data_shape_errors(splits, train, val, channels_last)
    fraction = _val_fraction(val_fraction, splits, val)
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
    b = int_setting("data", "batch_size", batch_size)
    if b > len(s.train):
        raise bad_argument(DataError, "data", "batch_size", batch_size,
                           f"at most the number of training samples ({len(s.train)})", "use a smaller batch size")
    vb = b if val_batch_size is None else int_setting("data", "val_batch_size", val_batch_size)
    shuffled = flag("data", "shuffle", shuffle)
    if channels_last:
        s = channels_first(s)
    return {"data": s, "batch_size": b, "val_batch_size": vb, "shuffle": shuffled, "channels_last": channels_last,
            "val_fraction": fraction}


def loss(value: Any) -> Fields:
    if not isinstance(value, CrossEntropyLoss):
        raise bad_argument(ConfigError, "loss", "loss", value, "renaissance_nb's CrossEntropyLoss()" + foreign(value),
                           "pass a loss object, e.g. CrossEntropyLoss().label_smoothing(0.1)")
    return {"loss": value}


def optimizer(value: Any) -> Fields:
    if not isinstance(value, Optimizer):
        raise bad_argument(ConfigError, "optimizer", "optimizer", value,
                           "renaissance_nb's SGD(), Adam(), AdamW() or LARS()" + foreign(value),
                           "pass an optimizer object, e.g. AdamW().weight_decay(1e-4)")
    return {"optimizer": value}


def scheduler(value: Any) -> Fields:
    if value is not None and not isinstance(value, Scheduler):
        raise bad_argument(ConfigError, "scheduler", "scheduler", value,
                           "a Scheduler such as CosineAnnealingLR(), or None" + foreign(value),
                           "pass a scheduler object, e.g. CosineAnnealingLR().base_lr(1e-3)")
    return {"scheduler": value}


def total_epochs(epochs: Any) -> Fields:
    return {"total_epochs": int_setting("total_epochs", "epochs", epochs)}


def seed(value: Any) -> Fields:
    v = as_int(value)
    if v is None or not 0 <= v < 2**64:  # Philox's key is 64 bits
        raise bad_argument(ConfigError, "seed", "seed", value, "an int in [0, 2**64)", "pass e.g. seed=0")
    return {"seed": v}


INIT_SCHEMES: dict[str, tuple[str, ...]] = {
    "kaiming_uniform": ("a", "mode", "nonlinearity"), "kaiming_normal": ("a", "mode", "nonlinearity"),
    "xavier_uniform": ("gain",), "xavier_normal": ("gain",), "orthogonal": ("gain",), "zeros": ()}
"""init()'s schemes (torch.nn.init's functions, named without the trailing underscore) and their keywords."""

NONLINEARITIES = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                  "conv_transpose3d", "sigmoid", "tanh", "relu", "leaky_relu", "selu")
"""torch.nn.init.calculate_gain's names: kaiming's ``nonlinearity=``."""

KAIMING_UNIFORM_A = math.sqrt(5)
"""kaiming_uniform's default negative slope: nn.Linear and nn.Conv2d initialise their weights with
``kaiming_uniform_(w, a=math.sqrt(5))`` (a bound of 1/sqrt(fan_in)); kaiming_uniform_'s own default is 0."""


def init_defaults(scheme: str) -> dict[str, Any]:
    """The keywords ``scheme`` uses when init() is not given them (torch.nn.init's defaults)."""
    return {"a": KAIMING_UNIFORM_A if scheme == "kaiming_uniform" else 0.0, "mode": "fan_in",
            "nonlinearity": "leaky_relu", "gain": 1.0}


def _init_scheme(scheme: Any) -> str:
    if isinstance(scheme, str) and scheme in INIT_SCHEMES:
        return scheme
    named = scheme if isinstance(scheme, str) else str(getattr(scheme, "__name__", ""))
    fix = (f"pass the name, init({named.rstrip('_')!r}) (torch.nn.init's {named.rstrip('_')}_)"
           if named.rstrip("_") in INIT_SCHEMES else "pass e.g. init('kaiming_normal', nonlinearity='relu')")
    raise bad_argument(ConfigError, "init", "scheme", scheme, "one of " + ", ".join(map(repr, INIT_SCHEMES)), fix)


def _init_keyword(scheme: str, name: str, v: Any) -> Any:
    """One keyword of init(), checked: gain > 0, a >= 0 (finite), mode and nonlinearity by name."""
    takes = INIT_SCHEMES[scheme]
    if name not in takes:
        others = " or ".join(repr(k) for k, ks in INIT_SCHEMES.items() if name in ks)
        raise bad_argument(ConfigError, "init", name, v, f"no {name}= with {scheme!r} (it takes "
                           + (", ".join(f"{k}=" for k in takes) or "no keywords") + ")",
                           f"remove {name}=, or use a scheme that takes it ({others})" if name != "gain" else
                           "remove gain=: kaiming's scale follows nonlinearity= (and a= for leaky_relu)")
    if name in ("gain", "a"):
        x = as_float(v)
        if x is None or not (0.0 < x <= 1e6 if name == "gain" else 0.0 <= x <= 1e6):  # 1e6: sqrt(2/(1+a^2)) stays finite
            what = "a number in (0, 1e6]" if name == "gain" else "a number in [0, 1e6] (leaky_relu's negative slope)"
            raise bad_argument(ConfigError, "init", name, v, what, "pass e.g. gain=1.0" if name == "gain" else
                               "pass e.g. a=0.01, the slope of the leaky_relu(...) after the layer")
        return x
    choices = ("fan_in", "fan_out") if name == "mode" else NONLINEARITIES
    if not isinstance(v, str) or v not in choices:
        raise bad_argument(ConfigError, "init", name, v, "one of " + ", ".join(map(repr, choices)),
                           "pass mode='fan_in' (forward variance) or 'fan_out' (backward)" if name == "mode" else
                           "pass the activation after the layer, e.g. nonlinearity='relu' (calculate_gain's "
                           "names; 'relu' is the usual stand-in for gelu and silu)")
    return v


def init(scheme: Any = "kaiming_uniform", *, gain: Any = None, a: Any = None, mode: Any = None,
         nonlinearity: Any = None) -> Fields:
    """The scheme and the keywords given that differ from its defaults, sorted by name, so that one
    initialisation has one config (``init('xavier_uniform', gain=1)`` is ``init('xavier_uniform')``)."""
    s = _init_scheme(scheme)
    given = {k: _init_keyword(s, k, v) for k, v in (("a", a), ("gain", gain), ("mode", mode),
                                                     ("nonlinearity", nonlinearity)) if v is not None}
    if "a" in given and given.get("nonlinearity", "leaky_relu") != "leaky_relu":
        raise bad_argument(ConfigError, "init", "a", a, f"no a= with nonlinearity={given['nonlinearity']!r} "
                           "(a is leaky_relu's negative slope)", "remove a=, or pass nonlinearity='leaky_relu'")
    defaults = init_defaults(s)
    return {"init": s, "init_args": tuple((k, v) for k, v in given.items() if v != defaults[k])}


def ema(decay: Any) -> Fields:
    d = as_float(decay)
    if d is None or not 0.0 < d < 1.0:
        raise bad_argument(ConfigError, "ema", "decay", decay, "a float in (0, 1)", "use e.g. ema(0.999)")
    return {"ema": d}


def precision(name: Any) -> Fields:
    names = ("bf16", "fp16", "fp32")  # config.PRECISIONS' keys (config imports this module)
    if not isinstance(name, str) or name not in names:
        raise bad_argument(ConfigError, "precision", "name", name, f"one of {list(names)}",
                           "use precision('bf16') for bfloat16 mixed precision (fp32 master weights), "
                           "precision('fp16') for float16 with loss scaling, or precision('fp32')")
    return {"precision": name}


def clip_grad_norm(max_norm: Any) -> Fields:
    if max_norm is not None:
        v = as_float(max_norm)
        if v is None or not 0.0 < v <= LR_MAX:
            raise bad_argument(ConfigError, "clip_grad_norm", "max_norm", max_norm,
                               "a finite number > 0 (or None for no clipping)", "use e.g. clip_grad_norm(1.0)")
        max_norm = v
    return {"clip_grad_norm": max_norm}


def _hw(name: str, v: Any) -> tuple[int, int]:
    pair = (v, v) if as_int(v) is not None else v
    dims = [as_int(d) for d in pair] if isinstance(pair, (tuple, list)) and len(pair) == 2 else []
    good = [d for d in dims if d is not None and 1 <= d <= 32768]
    if len(good) != 2:  # dims is empty or a pair
        raise bad_argument(ConfigError, "train_resolution", name, v, "an int or (H, W) of ints in [1, 32768]",
                           "e.g. train_resolution(24, 28, boundary_epoch=3)")
    return (good[0], good[1])


def train_resolution(begin: Any, end: Any, boundary_epoch: Any) -> Fields:
    b = int_setting("train_resolution", "boundary_epoch", boundary_epoch, low=0)
    return {"train_resolution": (_hw("begin", begin), _hw("end", end), b)}


def augment(crop_pad: Any = 0, flip: Any = False) -> Fields:
    pad = int_setting("augment", "crop_pad", crop_pad, low=0, high=1024)
    return {"crop_pad": pad, "flip": flag("augment", "flip", flip)}


def options(*, fuse: Any = None, liveness: Any = None, nan_check: Any = None, zero_grad: Any = None,
            nan_policy: Any = None, prefetch: Any = None, pad_rows: Any = None, fold_bn: Any = None,
            recompute: Any = None) -> Fields:
    if nan_policy is not None and (not isinstance(nan_policy, str) or nan_policy not in ("raise", "skip")):
        raise bad_argument(ConfigError, "options", "nan_policy", nan_policy, "'raise' or 'skip'",
                           "pass nan_policy='raise' or nan_policy='skip'")
    out: Fields = {k: flag("options", k, v) for k, v in (("fuse", fuse), ("liveness", liveness),
                                                        ("nan_check", nan_check), ("zero_grad", zero_grad),
                                                        ("prefetch", prefetch), ("pad_rows", pad_rows),
                                                        ("fold_bn", fold_bn), ("recompute", recompute))
                   if v is not None}
    if nan_policy is not None:
        out["nan_policy"] = nan_policy
    return out


def device(device: Any = "auto", *, data: Any = "auto", capture: Any = "entry") -> Fields:
    from .gpu.device import CHOICES
    from .gpu.executor import CAPTURE_MODES, DATA_MODES
    if device not in CHOICES:
        raise bad_argument(DeviceError, "device", "device", device, f"one of {CHOICES}",
                           "pass 'auto' (GPU when CuPy finds one), 'cuda' or 'cpu'")
    if data not in DATA_MODES:
        raise bad_argument(DeviceError, "device", "data", data, f"one of {DATA_MODES}",
                           "pass 'device' (data sets in GPU memory), 'pinned' (streamed from the host) or 'auto'")
    if capture not in CAPTURE_MODES:
        raise bad_argument(DeviceError, "device", "capture", capture, f"one of {CAPTURE_MODES}",
                           "pass 'entry' (one CUDA graph per atlas entry) or 'step' (one per step)")
    return {"device": device, "device_data": data, "device_capture": capture}


def save_every(epochs: Any, path: Any = "checkpoints/{name}-epoch{epoch}.npz") -> Fields:
    if epochs is None:
        return {"save_every": None}
    n = int_setting("save_every", "epochs", epochs)
    path_template("save_every", path, "e.g. 'checkpoints/{name}-epoch{epoch}.npz'")
    return {"save_every": (n, path)}


def save_best(path: Any = "checkpoints/{name}-best.npz", *, monitor: Any = None, mode: Any = None) -> Fields:
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
        path_template("save_best", path, "e.g. 'checkpoints/{name}-best.npz'")
    return {"save_best": path, "save_best_by": by if path is not None else None}


def distributed(backend: Any = "mpi", ranks: Any = None, allreduce: Any = "buckets") -> Fields:
    """'mpi': data-parallel over COMM_WORLD (MPI starts here, on the first call), or planned for ``ranks``
    without starting MPI (a plan read in a notebook; compile() then needs that many ranks); None: one process."""
    from .mpi import check_allreduce, check_backend, check_ranks, world
    if check_backend(backend) is None:
        return {"distributed": None, "ranks": 1}
    how = check_allreduce(allreduce)
    return {"distributed": backend, "ranks": world().size if ranks is None else check_ranks(ranks), "allreduce": how}

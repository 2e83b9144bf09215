"""TaskConfig: every setting of a DeepLearningTask, written once.

The fluent builder (``task.model(...).data(...)``) checks each call's arguments
(config_checks.py) and replaces the task's config with a new frozen one; the
compiler stages read it; checkpoints store ``to_dict()`` (JSON data, never a repr)
and rebuild it with ``from_dict``, which checks every value as the builder does.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

from .blueprint import BluePrint
from .data.arrays import DataSplits
from .errors import ConfigError, RenaissanceError
from .train.epochs import EpochBatches
from .train.losses import CrossEntropyLoss
from .train.optimizers import AdamW, Optimizer
from .train.schedulers import Scheduler
from .train.settings import Settings

PRECISIONS: dict[str, str | None] = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}
"""``task.precision(name)`` -> the storage dtype of its low-precision tensors (None: everything fp32)."""

PLAN_OPTIONS = ("fuse", "liveness", "pad_rows", "fold_bn")
"""The options() switches that change the plan's layout, which a checkpoint's bytes follow."""

STRICT_FIELDS = ("seed", "optimizer", "loss", "scheduler", "total_epochs", "batch_size", "val_batch_size", "shuffle",
                 "n_train", "n_val", "ema", "clip_grad_norm", "train_resolution", "augment", "precision")
"""What ``load_state(strict=True)`` compares: the settings a resumed run must share to reproduce the saved one."""


def _default_prefetch() -> bool:
    # The background loader overlaps the next batch's gather with compute; with two cores
    # or fewer OpenBLAS already uses them all and the extra thread measured slower.
    return (os.cpu_count() or 1) > 2


@dataclass(frozen=True)
class TaskConfig:
    """Model, data, loss, optimizer, schedule and switches of one task (the data is held, not stored)."""

    name: str = "task"
    model: BluePrint | None = None
    data: DataSplits | None = None
    channels_last: bool | None = None
    val_fraction: float | None = None
    batch_size: int = 128
    val_batch_size: int | None = None
    shuffle: bool = True
    loss: CrossEntropyLoss = field(default_factory=CrossEntropyLoss)
    optimizer: Optimizer = field(default_factory=AdamW)
    scheduler: Scheduler | None = None
    total_epochs: int = 1
    seed: int = 0
    init: str = "kaiming_uniform"  # weight initialisation: a torch.nn.init scheme (config_checks.INIT_SCHEMES)
    init_args: tuple[tuple[str, float | str], ...] = ()  # its keywords that differ from the defaults, by name
    ema: float | None = None
    clip_grad_norm: float | None = None
    train_resolution: tuple[tuple[int, int], tuple[int, int], int] | None = None
    crop_pad: int = 0
    flip: bool = False
    fuse: bool = True
    liveness: bool = True
    pad_rows: bool = True
    fold_bn: bool = False  # conv + bn as one convolution at inference (ops/conv_bn.py)
    recompute: bool = False  # each block's activations recomputed before its backward (compiler/recompute.py)
    precision: str = "fp32"  # 'bf16' | 'fp16': mixed precision (compiler/autocast.py)
    nan_check: bool = True
    nan_policy: str = "raise"
    zero_grad: bool = False
    prefetch: bool = field(default_factory=_default_prefetch)
    device: str = "cpu"
    device_data: str = "auto"
    device_capture: str = "entry"
    save_every: tuple[int, str] | None = None
    save_best: str | None = None
    save_best_by: tuple[str, str] | None = None  # (EpochRecord field, 'min' or 'max'); None: top-1
    distributed: str | None = None  # 'mpi': data-parallel over the MPI ranks (renaissance_nb/mpi.py)
    ranks: int = 1  # the ranks the global batch is split over (COMM_WORLD's size when distributed)
    allreduce: str = "buckets"  # 'buckets': an Iallreduce per layer as backward writes it; 'slab': one at the end

    def with_(self, **changes: Any) -> "TaskConfig":
        return replace(self, **changes)

    # ---- derived ----------------------------------------------------------------------------------
    @property
    def init_text(self) -> str:
        """The initialisation as init() is called, e.g. ``kaiming_normal(mode='fan_out', nonlinearity='relu')``."""
        args = ", ".join(f"{k}={v!r}" for k, v in self.init_args)
        return f"{self.init}({args})" if args else self.init

    @property
    def val_batch(self) -> int:
        return self.val_batch_size or self.batch_size

    @property
    def local_batch(self) -> int:
        """The samples one rank takes of each global batch (``batch_size`` on one process)."""
        return self.train_batches.shard(self.ranks).batch

    @property
    def train_batches(self) -> EpochBatches:
        """The global batches of a training epoch (no samples without data)."""
        return EpochBatches(len(self.data.train) if self.data else 0, self.batch_size)

    @property
    def val_batches(self) -> EpochBatches:
        """The batches of a validation pass (no samples without validation data)."""
        return EpochBatches(len(self.data.val) if self.data and self.data.val is not None else 0, self.val_batch)

    @property
    def steps_per_epoch(self) -> int:
        return self.train_batches.steps

    @property
    def base_lr(self) -> float:
        """The rate the schedule scales, or every step's without one: the scheduler's ``base_lr`` where
        set, else the optimizer's ``lr`` (as PyTorch's schedulers scale the optimizer's). The one owner:
        the plan's table (compiler/pipeline.py) and ReduceLROnPlateau's first rate (runtime/trainer.py)."""
        sched = self.scheduler
        return self.optimizer.lr_ if sched is None or sched.base_lr_ is None else sched.base_lr_

    @property
    def total_steps(self) -> int:
        return self.steps_per_epoch * self.total_epochs

    @property
    def has_val(self) -> bool:
        return self.data is not None and self.data.val is not None

    @property
    def save_best_field(self) -> str | None:
        """The EpochRecord field save_best() watches, when it watches one (None: off, or top-1 by default)."""
        return self.save_best_by[0] if self.save_best and self.save_best_by is not None else None

    def record_fields(self) -> tuple[str, ...]:
        """The EpochRecord fields this task's epochs will fill: train_ always, val_ with validation
        data, ema_ with validation data and ema() (the EMA is scored on the validation set)."""
        val = self.has_val
        ppl = self.data is not None and self.data.train.is_tokens  # perplexity: a language model's figure
        return ("train_loss", "train_top1", "train_top5") + (("train_ppl",) if ppl else ()) + (
            ("val_loss", "val_top1", "val_top5") if val else ()) + (("val_ppl",) if val and ppl else ()) + (
            ("ema_loss", "ema_top1", "ema_top5") if val and self.ema is not None else ())

    def as_settings(self) -> dict[str, Any]:
        """Every setting by the builder's names (what the BluePrint and Training views show)."""
        return {"model": self.model, "data": self.data, "channels_last": self.channels_last,
                "batch_size": self.batch_size, "val_batch_size": self.val_batch, "shuffle": self.shuffle,
                "loss": self.loss, "optimizer": self.optimizer, "scheduler": self.scheduler,
                "total_epochs": self.total_epochs, "seed": self.seed, "init": self.init_text, "device": self.device,
                "precision": self.precision,
                "ema": self.ema, "clip_grad_norm": self.clip_grad_norm, "train_resolution": self.train_resolution,
                "augment": {"crop_pad": self.crop_pad, "flip": self.flip}, "options": self.options()}

    def options(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in ("fuse", "liveness", "pad_rows", "fold_bn", "nan_check", "nan_policy",
                                                 "zero_grad", "prefetch")},
                **({"recompute": True} if self.recompute else {})}  # named only when on: older records lack it

    # ---- as data ----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Every setting as JSON-ready data; the data set by its sizes and sample shape."""
        d = self.data
        r = self.train_resolution
        return {
            "name": self.name, "blueprint": None if self.model is None else self.model.to_dict(),
            "loss": _setting_dict(self.loss), "optimizer": _setting_dict(self.optimizer),
            "scheduler": _setting_dict(self.scheduler), "total_epochs": self.total_epochs, "seed": self.seed,
            "init": {"scheme": self.init, **dict(self.init_args)},
            "batch_size": self.batch_size, "val_batch_size": self.val_batch_size, "shuffle": self.shuffle,
            "channels_last": self.channels_last, "val_fraction": self.val_fraction,
            "sample_shape": None if d is None else list(d.train.sample_shape),
            "n_train": None if d is None else len(d.train), "n_val": None if d is None else len(d.val or ()),
            "ema": self.ema, "clip_grad_norm": self.clip_grad_norm,
            "train_resolution": None if r is None else [list(r[0]), list(r[1]), r[2]],
            "augment": {"crop_pad": self.crop_pad, "flip": self.flip},
            **({"precision": self.precision} if self.precision != "fp32" else {}),  # older records lack it
            "options": {k: v for k, v in self.options().items() if k != "prefetch"},
            "device": {"device": self.device, "data": self.device_data, "capture": self.device_capture},
            "distributed": None if self.distributed is None else {"backend": self.distributed, "ranks": self.ranks,
                                                                      "allreduce": self.allreduce},
            "autosave": {"every": None if self.save_every is None else list(self.save_every),
                         "best": self.save_best,
                         "best_by": None if self.save_best_by is None else list(self.save_best_by)},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TaskConfig":
        """The config ``to_dict`` wrote, each value checked as the builder checks it (a file edited by
        hand gets the builder's errors); without data: the caller attaches it with ``data``. The device
        is a record of where it ran, not applied: a checkpoint loads on the CPU, as a new task starts."""
        from . import config_checks as check
        rebuilt = {k: setting_from_dict(d.get(k)) for k in ("loss", "optimizer", "scheduler")}
        fields_: dict[str, Any] = {"name": str(d.get("name", "task")),
                                   **check.model(BluePrint.from_dict(d["blueprint"])),
                                   **check.loss(rebuilt["loss"]), **check.optimizer(rebuilt["optimizer"]),
                                   **check.scheduler(rebuilt["scheduler"]),
                                   **check.total_epochs(d["total_epochs"]), **check.seed(d["seed"])}
        fields_.update(check.init(**(d.get("init") or {})))  # a checkpoint from before init(): kaiming_uniform
        if d.get("ema") is not None:
            fields_.update(check.ema(d["ema"]))
        fields_.update(check.clip_grad_norm(d.get("clip_grad_norm")))
        if d.get("train_resolution") is not None:
            begin, end, boundary = d["train_resolution"]
            fields_.update(check.train_resolution(tuple(begin), tuple(end), boundary))
        fields_.update(check.augment(**d.get("augment", {})))
        fields_.update(check.precision(d.get("precision", "fp32")))
        fields_.update(check.options(**{"pad_rows": False, **d["options"]}))  # before padded rows: contiguous
        autosave = d.get("autosave") or {}  # a run resumed from a checkpoint keeps saving as it did
        if autosave.get("every"):
            fields_.update(check.save_every(*autosave["every"]))
        if autosave.get("best"):
            by = autosave.get("best_by") or (None, None)
            fields_.update(check.save_best(autosave["best"], monitor=by[0], mode=by[1]))
        return cls(**fields_)


def _setting_dict(obj: Settings | None) -> dict[str, Any] | None:
    if obj is None:
        return None
    later = getattr(obj, "added_later", {})  # settings newer than saved checkpoints: recorded only when set
    return {"class": type(obj).__name__, "settings": {k: (list(v) if isinstance(v, tuple) else v)
                                                     for k, v in obj.settings().items() if later.get(k, object()) != v}}


def setting_from_dict(d: Any) -> Any:
    """A loss, optimizer or scheduler from its ``{"class", "settings"}`` record (None stays None)."""
    if d is None:
        return None
    import renaissance_nb as rnb
    try:
        cls_ = getattr(rnb, d["class"], None)
        if not (isinstance(cls_, type) and issubclass(cls_, Settings)):
            raise TypeError(f"{d['class']!r} is no loss, optimizer or scheduler")
        return cls_(**{k: tuple(v) if isinstance(v, list) else v for k, v in d["settings"].items()})
    except (TypeError, KeyError, AttributeError, RenaissanceError) as exc:
        raise ConfigError(f"a setting this library cannot rebuild ({exc})") from None


def describe_value(v: Any, limit: int = 160) -> str:
    """A to_dict() value for a message, cut short (a loss with 1,000 class weights is 20,000 characters)."""
    if isinstance(v, dict) and set(v) == {"class", "settings"}:
        text = f"{v['class']}(" + ", ".join(f"{k}={w!r}" for k, w in v["settings"].items()) + ")"
    else:
        text = repr(v)
    return text if len(text) <= limit else text[: limit - 5] + " ...)"

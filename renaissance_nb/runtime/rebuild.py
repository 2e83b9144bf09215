"""A task's config rebuilt from a checkpoint, around the data it is given: what
``DeepLearningTask.load(path, data)`` builds, compiles and restores into.

The checkpoint records every setting as data (``TaskConfig.to_dict()``); ``TaskConfig.from_dict``
checks each value as the builder does, and the data is attached as the saved task held its own:
the same batch sizes, held-out share and layout, and the same sample counts (the plan's shapes
follow them).
"""
from __future__ import annotations

import os
from typing import Any

from ..config import TaskConfig
from ..errors import CheckpointError
from .checkpoint import saved_config


def _sample_shape_of(data: Any) -> tuple[int, ...] | None:
    """The sample shape of what a load was given, when it says (a DataSplits, a Dataset, or an (X, y) pair)."""
    from ..data.arrays import DataSplits, Dataset
    if isinstance(data, (DataSplits, Dataset)):
        return tuple(data.sample_shape)
    if isinstance(data, tuple) and data and hasattr(data[0], "shape"):
        return tuple(int(d) for d in data[0].shape[1:])
    return None


def _with_data(cfg: TaskConfig, record: dict[str, Any], data: Any, p: str) -> TaskConfig:
    """``cfg`` around ``data`` as the saved task held its own: same batch sizes, held-out share and layout."""
    from .. import config_checks as check
    from ..data.arrays import DataSplits
    # channels_last: a checkpoint from before it existed trained on its data as given (False); a task's
    # own splits, already moved, are taken as they are (the trained sample shape is in the record)
    cl, trained = record.get("channels_last", False), tuple(record.get("sample_shape") or ())
    moved = cl and _sample_shape_of(data) == trained and len(set(trained)) > 1  # C == H == W: follow the flag
    # a validation set held out by val_fraction= is held out again, unless data brings one (task.splits)
    fraction = record.get("val_fraction") if not (isinstance(data, DataSplits) and data.val is not None) else None
    fields = check.data(data, batch_size=record["batch_size"], val_batch_size=record["val_batch_size"],
                        shuffle=record["shuffle"], channels_last=False if moved else cl, val_fraction=fraction)
    cfg = cfg.with_(**{**fields, "channels_last": cl})
    sizes = (record.get("n_train"), record.get("n_val"))
    s = cfg.data
    assert s is not None
    now = (len(s.train), 0 if s.val is None else len(s.val))
    if None not in sizes and tuple(sizes) != now:  # the plan's shapes (the loss log, the last batches) follow them
        raise CheckpointError(f"load: {p!r} was trained on {sizes[0]} training and {sizes[1]} validation "
                              f"samples; data has {now[0]} and {now[1]}, and the plan's shapes follow the data. "
                              "Fix: pass the data it was trained on to resume (the saved task's splits, "
                              "validation set included); for the weights alone (inference, fine-tuning), build a "
                              "task on this data and call task.load_weights(path).")
    return cfg


def _on_its_ranks(cfg: TaskConfig, record: dict[str, Any]) -> TaskConfig:
    """A checkpoint of a data-parallel run, rebuilt under mpiexec with the rank count that wrote it, trains on
    those ranks again (from_dict keeps no device or launch setting; without this, load() under mpiexec -n 2
    built a one-process task that the checkpoint's rank check then refused). Elsewhere the config stays one
    process's, and load_state says which rank count the checkpoint needs."""
    from .. import config_checks as check
    from ..mpi import under_mpiexec
    dist = record.get("distributed")
    if not isinstance(dist, dict) or int(dist.get("ranks", 1)) < 2 or not under_mpiexec():
        return cfg
    return cfg.with_(**check.distributed(dist.get("backend", "mpi"), None, dist.get("allreduce", "buckets")))


def config_for(path: str | os.PathLike, data: Any) -> TaskConfig:
    """The config a checkpoint records, around ``data``: what ``DeepLearningTask.load`` builds and compiles."""
    from ..errors import ConfigError, RenaissanceError
    p, record = os.fspath(path), saved_config(path)
    try:  # a config edited by hand: any shape it has is this error
        return _with_data(_on_its_ranks(TaskConfig.from_dict(record), record), record, data, p)
    except ConfigError as exc:
        if "cannot rebuild" not in str(exc):
            raise
        raise CheckpointError(f"load: {p!r} records {exc}. Fix: build the task yourself and call "
                              "task.load_state(path).") from None
    except RenaissanceError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
        raise CheckpointError(f"load: the task config in {p!r} is malformed ({type(exc).__name__}: {exc}). "
                              "Fix: build the task yourself and call task.load_state(path).") from None

"""A compiled task rebuilt from a checkpoint alone, for exporting its model: no training data needed.

``DeepLearningTask.load(path, data)`` resumes a run and needs the data it was trained on (the plan's
shapes follow it). An export needs only the model and its weights: the task here is compiled on a
tiny synthetic data set of the recorded sample shape and class count (zeros, one sample per class),
with the checkpoint's settings otherwise, and the weights are read through the saved plan
(``read_state_dict``), so its own arena's layout does not matter.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..data.arrays import DataSplits, Dataset
from ..errors import CheckpointError, RenaissanceError


def _recorded(path: str) -> tuple[dict[str, Any], tuple[int, ...], int, bool]:
    """The checkpoint's config record, its sample shape, its class count (the output's width in the saved plan)
    and whether it read token windows (int32 input ids), or a CheckpointError saying what the header lacks."""
    from ..blueprint import BluePrint
    from ..compiler.layers import plan_architecture
    from ..runtime.checkpoint import read_header
    header = read_header(path)
    record = header.get("config")
    try:
        assert isinstance(record, dict)
        sample = tuple(int(d) for d in record["sample_shape"])
        fuse = bool((record.get("options") or {}).get("fuse", True))
        output = plan_architecture(BluePrint.from_dict(record["blueprint"]), fuse=fuse).output
        shapes = {t["name"]: t["shape"] for t in header["fingerprint"]["tensors"]}
        classes = int(shapes[output][-1])
        tokens = any(t["name"] == "I_A.data" and t.get("dtype") == "int32" for t in header["fingerprint"]["tensors"])
    except (AssertionError, KeyError, TypeError, ValueError, IndexError) as exc:
        raise CheckpointError(f"export: the header of {path!r} does not record the model's input and output "
                              f"shapes ({type(exc).__name__}: {exc}). Fix: rebuild the task yourself, "
                              "task.load_weights(path), then task.export_onnx(...).") from None
    return record, sample, classes, tokens


def task_from_checkpoint(path: str | os.PathLike, *, ema: bool = False) -> Any:
    """A compiled DeepLearningTask holding a checkpoint's model and weights (``ema=True``: its EMA
    weights), built on synthetic data: for ``export_onnx`` and ``save_weights``, not for training."""
    from ..config import TaskConfig
    from ..task import DeepLearningTask
    p = os.fspath(path)
    record, sample, classes, tokens = _recorded(p)
    n = max(classes, 2)
    try:
        config = TaskConfig.from_dict({**record, "train_resolution": None})  # the recorded input size is the model's
    except (RenaissanceError, TypeError, ValueError, KeyError, AttributeError) as exc:  # a header edited by hand
        raise CheckpointError(f"export: {p!r} records a task config this library cannot rebuild ({exc}). Fix: rebuild "
                              "the task yourself, task.load_weights(path), then task.export_onnx(...).") from None
    task = DeepLearningTask(config=config)
    if tokens:  # a language model: windows of ids, a target per position
        ids = np.zeros((2, *sample), np.int32)
        task.data(DataSplits(Dataset(ids, ids, classes, "export"), None, "export"), batch_size=2)
    else:
        task.data(train=(np.zeros((n, *sample), np.float32), np.arange(n) % classes), batch_size=n,
                  num_classes=classes, channels_last=False if len(sample) == 3 else None)
    return task.compile().load_weights(p, ema=ema)

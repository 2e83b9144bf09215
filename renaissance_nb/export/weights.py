"""Weights as ``.safetensors`` files, the Hugging Face stack's (and tinygrad's) weight format, and the
one place that tells a weights file's kind: ``load_weights`` reads a checkpoint ``.npz`` or a
``.safetensors`` file through ``read_weights``.

Why safetensors: the file is a JSON header plus raw little-endian tensors, so loading it runs no code
(unlike a pickled ``torch.save``), and ``safetensors.torch.load_file`` gives a dict that
``nn.Module.load_state_dict`` takes as it is. The names and layouts are ``task.state_dict()``'s:
PyTorch's ('fc1.weight' (out, in), 'conv1.weight' (out, in, k, k), 'bn1.running_mean' ...).

A file written from a PyTorch ``nn.Sequential`` (``safetensors.torch.save_file(net.state_dict(),
...)``) names its tensors by position ('0.weight', '3.running_var'); those are matched to this task's
layers in order, module by module, each module's roles and shapes checked ('num_batches_tracked' is
left out: nothing here reads it).
"""
from __future__ import annotations

import json
import os
import re
from typing import Any

import numpy as np

from ..errors import CheckpointError, ExportError
from ..files import write_atomically
from .packages import need

FORMAT_METADATA = {"format": "pt"}
"""What transformers' loaders look for in a safetensors header: PyTorch's layouts."""


def save_safetensors(task: Any, path: str | os.PathLike, *, ema: bool = False) -> str:
    """Write the parameters and batch-norm statistics (``task.state_dict(ema=ema)``: PyTorch's names
    and layouts) to ``path`` as safetensors, atomically; returns the path. ``load_weights(path)`` and
    ``safetensors.torch.load_file(path)`` read it back. The header's metadata also records the model
    (``BluePrint.to_dict()`` as JSON, under 'renaissance_nb.blueprint'). Needs the ``[export]`` extra."""
    state = task.state_dict(ema=ema)  # first: a task not compiled is told so, whatever is installed
    st = need("safetensors.numpy", "save_weights")
    state = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in state.items()}
    meta = dict(FORMAT_METADATA)
    if task.blueprint is not None:
        meta["renaissance_nb.blueprint"] = json.dumps(task.blueprint.to_dict(), sort_keys=True)
    blob = st.save(state, metadata=meta)
    return write_atomically(path, lambda f: f.write(blob), op="save_weights", error=ExportError,
                            example="model.safetensors")


def is_safetensors(path: str) -> bool:
    """Whether ``path`` holds a safetensors file: an 8-byte header size, then a JSON object; the
    ``.safetensors`` name says so too (read then, so a damaged one gets safetensors' error)."""
    if path.endswith(".safetensors"):
        return True
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError:
        return False
    return len(head) == 9 and head[8:9] == b"{" and not head.startswith(b"PK")  # .npz files are zip archives


def read_safetensors(path: str, op: str) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file as float32 arrays, or a CheckpointError that says why not."""
    st = need("safetensors.numpy", op)
    if not os.path.isfile(path):
        raise CheckpointError(f"{op}: no file at {path!r}. Fix: check the path; write one with "
                              "task.save_weights(path).")
    try:
        with open(path, "rb") as f:
            tensors = st.load(f.read())
    except OSError as exc:
        raise CheckpointError(f"{op}: cannot read {path!r}: {exc}. Fix: check the file's permissions.") from None
    except Exception as exc:  # noqa: BLE001 - safetensors' own error types, bf16 numpy cannot hold...
        raise CheckpointError(f"{op}: {path!r} is not a readable safetensors file ({type(exc).__name__}: {exc}). "
                              "Fix: pass a file written by task.save_weights() or safetensors' save_file (float32 "
                              "or float16 tensors).") from None
    return {k: v for k, v in tensors.items() if not k.endswith("num_batches_tracked")}


def _module_of(key: str) -> tuple[str, str]:
    prefix, _, role = key.rpartition(".")
    return prefix, role


def _natural(prefix: str) -> list[Any]:
    """'10.1' after '9.0': a Sequential's positions as numbers."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in prefix.split(".")]


def _by_position(op: str, path: str, found: dict[str, np.ndarray], expected: dict[str, tuple[int, ...]]
                 ) -> dict[str, np.ndarray] | None:
    """``found``'s tensors renamed to ``expected``'s names, module by module in order, when the file
    names its tensors by position (a PyTorch nn.Sequential's) and every module's roles match; else None."""
    if not all(re.fullmatch(r"\d+(\.\d+)*(\.[A-Za-z_]\w*)*", _module_of(k)[0]) for k in found):  # 2.fc1: se's parts
        return None
    modules: dict[str, dict[str, np.ndarray]] = {}
    for k in sorted(found, key=lambda k: _natural(_module_of(k)[0])):
        prefix, role = _module_of(k)
        modules.setdefault(prefix, {})[role] = found[k]
    ours: dict[str, list[str]] = {}
    for name in expected:
        layer, role = _module_of(name)
        ours.setdefault(layer, []).append(role)
    if [sorted(v) for v in modules.values()] != [sorted(v) for v in ours.values()]:
        raise CheckpointError(f"{op}: {path!r} names its tensors by position, and its modules "
                              f"{_roles(modules)} do not match this model's layers {_roles(ours)} in order. "
                              "Fix: load weights saved from the same model.")
    return {f"{layer}.{role}": tensors[role] for (layer, _), tensors in zip(ours.items(), modules.values())
            for role in tensors}


def _roles(modules: dict[str, Any]) -> str:
    return ", ".join(f"{name}({'/'.join(sorted(roles))})" for name, roles in modules.items())


def matched_state(op: str, path: str, found: dict[str, np.ndarray], expected: dict[str, tuple[int, ...]]
                  ) -> dict[str, np.ndarray]:
    """``found`` checked against the model's names and shapes: a CheckpointError names every missing,
    unexpected or mis-shaped tensor; nothing is loaded until all fit."""
    if set(found) != set(expected):
        renamed = _by_position(op, path, found, expected)
        if renamed is not None:
            found = renamed
    missing, extra = sorted(set(expected) - set(found)), sorted(set(found) - set(expected))
    if missing or extra:
        raise CheckpointError(f"{op}: {path!r} does not fit this model: missing {missing}, unexpected {extra}. "
                              "Fix: load weights saved from the same model (task.save_weights).")
    wrong = [f"{k} is {tuple(found[k].shape)}, the model needs {shape}" for k, shape in expected.items()
             if tuple(found[k].shape) != tuple(shape)]
    if wrong:
        raise CheckpointError(f"{op}: {path!r} does not fit this model: " + "; ".join(wrong) +
                              ". Fix: load weights saved from the same model (same layer sizes).")
    return found


def read_weights(path: Any, expected: dict[str, tuple[int, ...]], *, ema: bool = False,
                 op: str = "load_weights") -> dict[str, np.ndarray]:
    """The weights in ``path`` under the model's names: a checkpoint ``.npz`` (``ema=True``: its EMA
    weights) or a ``.safetensors`` file (one set of weights: ``ema`` must be False); ``expected``
    maps the model's names to their shapes."""
    from ..runtime.checkpoint import read_state_dict
    try:
        p = os.fspath(path)
    except TypeError:
        p = None
    if not isinstance(p, str) or not is_safetensors(p):
        return read_state_dict(path, ema=ema, op=op)  # its own errors name a bad path
    if ema:
        raise CheckpointError(f"{op}: {p!r} is a safetensors file, which holds one set of weights; ema=True "
                              "reads a checkpoint's EMA weights. Fix: drop ema=True (save the EMA weights with "
                              "task.save_weights(path, ema=True) to have them in such a file).")
    return matched_state(op, p, read_safetensors(p, op), expected)

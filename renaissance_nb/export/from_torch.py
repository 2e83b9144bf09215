"""A PyTorch ``nn.Sequential`` as a BluePrint description (``BluePrint.to_dict()``'s form) and, on
request, its weights under the names a compiled task gives them.

Why a description and not BluePrint objects: ``BluePrint.from_torch`` rebuilds it through
``BluePrint.from_dict``, so every layer gets the builders' own checks. Each module class is read by
the op that declares it (``Op.torch_modules``, ``Op.from_torch``); this module registers itself as
blueprint_nodes' "torch" reader, since the node classes cannot import the ops (which import them). torch is imported by the caller's
module object only: nothing here imports torch, so ``import renaissance_nb`` never needs it.

Layer names follow the compiler's (compiler/layers.py): the n-th Linear is ``fc<n>``, the n-th
Conv2d ``conv<n>``, the n-th BatchNorm ``bn<n>``, in the order the Sequential runs them.
"""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ..blueprint_nodes import READERS
from ..errors import BluePrintError
from ..ops.registry import BY_LAYER, BY_TORCH, Refused
from .from_gpt import describe_gpt, looks_like_gpt


def supported() -> str:
    """The torch.nn classes some op reads (ops/registry.py BY_TORCH), for the error messages."""
    return ", ".join(sorted(BY_TORCH)) + " and nested nn.Sequential"


def _layer(m: Any) -> dict[str, Any]:
    """One module's description ({"layer": kind, "params": {...}}), or Refused."""
    op = BY_TORCH.get(type(m).__name__)
    if op is None:
        raise Refused("it has no counterpart here")
    return op.from_torch(m)


class _Walk:
    """The Sequential's modules in running order: descriptions, and the weights under the compiler's names."""

    def __init__(self, weights: bool) -> None:
        self.weights, self.counts, self.state = weights, {}, {}  # type: ignore[var-annotated]

    def seq(self, module: Any, path: str) -> dict[str, Any]:
        children = []
        for i, (key, child) in enumerate(_children(module)):
            where = f"{path}{key}" if path else key
            if _is_sequential(child):
                children.append(self.seq(child, where + "."))
                continue
            try:
                desc = _layer(child)
            except Refused as why:
                at = f"#{i}" if not path else f"#{i} of the nn.Sequential at {path.rstrip('.')!r} ({where!r})"
                raise BluePrintError(f"from_torch: layer {at} is {type(child).__name__}: {why}. Supported: "
                                     f"{supported()}. Fix: replace or remove that layer (or write the model with "
                                     "seq(...)).") from None
            self.take_weights(desc["layer"], child)
            children.append(desc)
        if not children:
            raise BluePrintError(f"from_torch: the nn.Sequential {path.rstrip('.') or 'given'!r} has no layers. "
                                 "Fix: pass a Sequential with at least one layer, e.g. nn.Sequential(nn.Linear(784, 10)).")
        return {"seq": children}

    def take_weights(self, kind: str, m: Any) -> None:
        """Count the layers with weights as the compiler names them (``<label><n>``: fc1, conv2...)."""
        if not BY_LAYER[kind].parametrized:
            return
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if not self.weights:
            return
        name = f"{kind}{self.counts[kind]}"
        for role, value in m.state_dict().items():
            if role != "num_batches_tracked":  # a count of training steps: nothing here reads it
                self.state[f"{name}.{role}"] = value.detach().cpu().float().numpy().copy()


def _children(module: Any) -> list[tuple[str, Any]]:
    """A Sequential's direct children in running order, a module used twice listed twice: the same
    nn.ReLU() instance at two places runs twice (named_children() would list it once)."""
    return [(name, m) for name, m in module.named_modules(remove_duplicate=False) if name and "." not in name]


def _is_sequential(module: Any) -> bool:
    """Whether ``module`` is a torch.nn.Sequential (a subclass too), asked of the torch already loaded:
    a module object comes from it, and anything else is not one."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(module, torch.nn.Sequential)


def describe_sequential(module: Any, weights: bool) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(BluePrint description, state dict) of an ``nn.Sequential``; the state dict is empty unless
    ``weights``. Errors are BluePrintErrors naming the layer's position and class."""
    if not _is_sequential(module) and looks_like_gpt(module):  # nanoGPT's or minGPT's GPT (from_gpt.py)
        if not isinstance(weights, bool):
            raise BluePrintError(f"from_torch: weights={weights!r} is invalid; expected True or False. Fix: pass "
                                 "weights=True to copy the module's weights too.")
        return describe_gpt(module, weights)
    if not _is_sequential(module):
        raise BluePrintError(f"from_torch: module={type(module).__name__} is invalid; expected a torch.nn.Sequential "
                             f"of {supported()}. Fix: pass an nn.Sequential (a custom nn.Module's forward() cannot be "
                             "read; write its layers as an nn.Sequential).")
    if not isinstance(weights, bool):
        raise BluePrintError(f"from_torch: weights={weights!r} is invalid; expected True or False. Fix: pass "
                             "weights=True to copy the module's weights too.")
    walk = _Walk(weights)
    return walk.seq(module, ""), walk.state


READERS["torch"] = describe_sequential

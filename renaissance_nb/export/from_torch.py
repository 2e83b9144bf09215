"""A PyTorch ``nn.Sequential`` as a BluePrint description (``BluePrint.to_dict()``'s form) and, on
request, its weights under the names a compiled task gives them.

Why a description and not BluePrint objects: ``BluePrint.from_torch`` rebuilds it through
``BluePrint.from_dict``, so every layer gets the builders' own checks, and this module needs no
import of blueprint.py (which imports it lazily): no import cycle. torch is imported by the caller's
module object only: nothing here imports torch, so ``import renaissance_nb`` never needs it.

Layer names follow the compiler's (compiler/layers.py): the n-th Linear is ``fc<n>``, the n-th
Conv2d ``conv<n>``, the n-th BatchNorm ``bn<n>``, in the order the Sequential runs them.
"""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ..errors import BluePrintError

SUPPORTED = ("Linear, Conv2d, BatchNorm1d/2d, ReLU, GELU, SiLU, Tanh, Sigmoid, LeakyReLU, MaxPool2d, AvgPool2d, "
             "AdaptiveAvgPool2d(1), Flatten, Dropout, Identity and nested nn.Sequential")
PLAIN = {"ReLU": "relu", "SiLU": "silu", "Tanh": "tanh", "Sigmoid": "sigmoid", "Identity": "identity"}
"""Parameter-free modules and the layer kind each is."""


class _Refused(Exception):
    """A module this library has no layer for, or one with settings it does not support: why."""


def _square(value: Any, what: str) -> int:
    """A PyTorch int-or-pair argument as one int: only square kernels, strides and paddings exist here."""
    if isinstance(value, (tuple, list)):
        if len(set(value)) != 1:
            raise _Refused(f"{what}={tuple(value)} is not square (this library's layers take one size for both axes)")
        value = value[0]
    if not isinstance(value, int):
        raise _Refused(f"{what}={value!r} is not a whole number of pixels")
    return value


def _conv(m: Any) -> dict[str, Any]:
    if m.groups != 1 or _square(m.dilation, "dilation") != 1 or m.padding_mode != "zeros":
        raise _Refused(f"groups={m.groups}, dilation={m.dilation}, padding_mode={m.padding_mode!r} (only groups=1, "
                       "dilation=1 and zero padding are supported)")
    return {"out": m.out_channels, "k": _square(m.kernel_size, "kernel_size"), "s": _square(m.stride, "stride"),
            "p": _square(m.padding, "padding"), "bias": m.bias is not None}


def _bn(m: Any) -> dict[str, Any]:
    if not (m.affine and m.track_running_stats) or m.momentum is None:
        raise _Refused("affine=False, track_running_stats=False or momentum=None (a cumulative average) "
                       "has no counterpart in bn()")
    return {"momentum": float(m.momentum), "eps": float(m.eps)}


def _pool(m: Any, kind: str) -> dict[str, Any]:
    if m.ceil_mode or (kind == "maxpool" and (_square(m.dilation, "dilation") != 1 or m.return_indices)):
        raise _Refused("ceil_mode=True, dilation or return_indices is not supported")
    if kind == "avgpool" and (not m.count_include_pad or m.divisor_override is not None):
        raise _Refused("count_include_pad=False or divisor_override is not supported (avgpool counts the padding)")
    k = _square(m.kernel_size, "kernel_size")
    return {"k": k, "s": _square(m.stride if m.stride is not None else k, "stride"), "p": _square(m.padding, "padding")}


def _layer(m: Any) -> dict[str, Any]:
    """One module's description ({"layer": kind, "params": {...}}), or _Refused."""
    name = type(m).__name__
    if name in PLAIN:
        return {"layer": PLAIN[name], "params": {}}
    if name == "Linear":
        return {"layer": "fc", "params": {"out": m.out_features, "bias": m.bias is not None}}
    if name == "Conv2d":
        return {"layer": "conv", "params": _conv(m)}
    if name in ("BatchNorm2d", "BatchNorm1d"):
        return {"layer": "bn", "params": _bn(m)}
    if name in ("MaxPool2d", "AvgPool2d"):
        kind = name[:3].lower() + "pool"
        return {"layer": kind, "params": _pool(m, kind)}
    if name == "AdaptiveAvgPool2d":
        if _square(m.output_size, "output_size") != 1:
            raise _Refused(f"output_size={m.output_size!r}; only AdaptiveAvgPool2d(1) (global average pooling) is")
        return {"layer": "gap", "params": {}}
    if name == "GELU":
        if m.approximate != "none":
            raise _Refused(f"approximate={m.approximate!r}; gelu() is the exact erf form (approximate='none')")
        return {"layer": "gelu", "params": {}}
    if name == "LeakyReLU":
        return {"layer": "leaky_relu", "params": {"negative_slope": float(m.negative_slope)}}
    if name == "Flatten":
        if (m.start_dim, m.end_dim) != (1, -1):
            raise _Refused(f"start_dim={m.start_dim}, end_dim={m.end_dim}; flatten() keeps the batch axis only "
                           "(start_dim=1, end_dim=-1)")
        return {"layer": "flatten", "params": {}}
    if name == "Dropout":
        return {"layer": "dropout", "params": {"p": float(m.p)}}
    raise _Refused("it has no counterpart here")


class _Walk:
    """The Sequential's modules in running order: descriptions, and the weights under the compiler's names."""

    def __init__(self, weights: bool) -> None:
        self.weights, self.counts, self.state = weights, {"fc": 0, "conv": 0, "bn": 0}, {}  # type: ignore[var-annotated]

    def seq(self, module: Any, path: str) -> dict[str, Any]:
        children = []
        for i, (key, child) in enumerate(module.named_children()):
            where = f"{path}{key}" if path else key
            if _is_sequential(child):
                children.append(self.seq(child, where + "."))
                continue
            try:
                desc = _layer(child)
            except _Refused as why:
                at = f"#{i}" if not path else f"#{i} of the nn.Sequential at {path.rstrip('.')!r} ({where!r})"
                raise BluePrintError(f"from_torch: layer {at} is {type(child).__name__}: {why}. Supported: "
                                     f"{SUPPORTED}. Fix: replace or remove that layer (or write the model with "
                                     "seq(...)).") from None
            self.take_weights(desc["layer"], child)
            children.append(desc)
        if not children:
            raise BluePrintError(f"from_torch: the nn.Sequential {path.rstrip('.') or 'given'!r} has no layers. "
                                 "Fix: pass a Sequential with at least one layer, e.g. nn.Sequential(nn.Linear(784, 10)).")
        return {"seq": children}

    def take_weights(self, kind: str, m: Any) -> None:
        if kind not in self.counts:
            return
        self.counts[kind] += 1
        if not self.weights:
            return
        name = f"{kind}{self.counts[kind]}"
        for role, value in m.state_dict().items():
            if role != "num_batches_tracked":  # a count of training steps: nothing here reads it
                self.state[f"{name}.{role}"] = value.detach().cpu().float().numpy().copy()


def _is_sequential(module: Any) -> bool:
    """Whether ``module`` is a torch.nn.Sequential (a subclass too), asked of the torch already loaded:
    a module object comes from it, and anything else is not one."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(module, torch.nn.Sequential)


def describe_sequential(module: Any, weights: bool) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(BluePrint description, state dict) of an ``nn.Sequential``; the state dict is empty unless
    ``weights``. Errors are BluePrintErrors naming the layer's position and class."""
    if not _is_sequential(module):
        raise BluePrintError(f"from_torch: module={type(module).__name__} is invalid; expected a torch.nn.Sequential "
                             f"of {SUPPORTED}. Fix: pass an nn.Sequential (a custom nn.Module's forward() cannot be "
                             "read; write its layers as an nn.Sequential).")
    if not isinstance(weights, bool):
        raise BluePrintError(f"from_torch: weights={weights!r} is invalid; expected True or False. Fix: pass "
                             "weights=True to copy the module's weights too.")
    walk = _Walk(weights)
    return walk.seq(module, ""), walk.state

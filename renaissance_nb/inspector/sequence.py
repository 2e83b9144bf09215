"""The memory inspector's answers for sequence models: live bytes by kind and by block, and the
what-if changes a transformer needs (context length, heads, attention form, recompute).

Why a module of its own: a transformer's memory questions are not an image model's. Attention's
scores grow as T squared per head, activations as batch x T, weights not at all; "does a context of
1024 fit" is asked as often as "does a batch of 64". The kinds come from the ops themselves
(``Op.tensor_kinds``: attention names its scores), so a new layer kind says what its tensors are.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from ..blueprint_nodes import BluePrint
from ..errors import ConfigError, bad_argument
from ..ops.registry import op_of

if TYPE_CHECKING:
    from .planview import LiveTensor, MemoryInspector

KIND_OF_CATEGORY = {"optimizer state": "moments"}
"""The by-kind report's word for a category where it differs (M and V are Adam's moments)."""
SEQUENCE_WHAT_IF = ("context", "heads", "attention", "recompute")


def tensor_kind(t: "LiveTensor", kinds: dict[str, str]) -> str:
    """What a live tensor is for: its op's own word for it (attention scores), else its category."""
    base = t.name.split("@", 1)[0]
    layer, _, role = base.partition(".")
    kind = op_of(kinds[layer]).tensor_kinds.get(role) if layer in kinds else None
    return kind or KIND_OF_CATEGORY.get(t.category, t.category)


def peak_by_kind(inspector: "MemoryInspector", variant: str = "train_base") -> dict[str, int]:
    """Bytes live at the peak by kind: weights, gradients, moments, activations, attention scores, ..."""
    kinds = {layer.name: layer.kind for layer in inspector.planned.arch.layers}
    out: dict[str, int] = {}
    for t in inspector.peak(variant).tensors:
        k = tensor_kind(t, kinds)
        out[k] = out.get(k, 0) + t.nbytes
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def peak_by_block(inspector: "MemoryInspector", variant: str = "train_base") -> dict[str, int]:
    """Bytes live at the peak by the block whose layers own them (a parameter's copies count with it);
    tensors of no layer (inputs, scalars, results) under "(task)", layers outside blocks under their name."""
    blocks = {layer.name: layer.block or layer.name for layer in inspector.planned.arch.layers}
    out: dict[str, int] = {}
    for t in inspector.peak(variant).tensors:
        owner = blocks.get(t.name.split("@", 1)[0].split(".", 1)[0], "(task)")
        out[owner] = out.get(owner, 0) + t.nbytes
    return out


# ---- what-if changes of a sequence model ---------------------------------------------------------
def with_layer_params(model: BluePrint, kind: str, change: dict[str, Any]) -> BluePrint:
    """The model with every layer of ``kind`` given ``change`` (through from_dict, so the builders check it)."""
    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            if node.get("layer") == kind:
                return {"layer": kind, "params": {**node["params"], **change}}
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node
    return BluePrint.from_dict(walk(model.to_dict()))


def _has_layer(node: Any, kind: str) -> bool:
    """Whether a BluePrint's dict holds a layer of ``kind``."""
    if isinstance(node, dict):
        return node.get("layer") == kind or any(_has_layer(v, kind) for v in node.values())
    return isinstance(node, list) and any(_has_layer(v, kind) for v in node)


def _scaled_context(res: Any, old: int, new: int) -> Any:
    """A progressive context (train_resolution on token windows) for windows of ``new`` positions instead of
    ``old``: begin and end scaled alike (at least 1), none left when nothing would grow any more."""
    if res is None:
        return None
    (b, _), (e, _), epoch = res
    nb, ne = max(1, b * new // old), max(1, e * new // old)
    return ((nb, nb), (ne, ne), epoch) if nb < ne else None


def _windows(data: Any, t: int) -> Any:
    """Token data with windows of ``t`` positions, for planning only (zero-stride arrays: no memory)."""
    def resized(ds: Any) -> Any:
        if ds is None:
            return None
        z = np.broadcast_to(np.zeros((), np.int32), (len(ds), t))
        return dataclasses.replace(ds, x=z, y=z)
    return dataclasses.replace(data, train=resized(data.train), val=resized(data.val))


def sequence_changes(config: Any, key: str, value: Any) -> dict[str, Any]:
    """The TaskConfig fields a sequence what-if sets: ``context`` (token windows of that length and a
    position table as long), ``heads``, ``attention`` ("materialized" or "flash"), ``recompute``."""
    data, model = config.data, config.model
    if key == "context":
        if data is None or not data.train.is_tokens:
            raise bad_argument(ConfigError, "memory.what_if", "context", value, "a what-if of a language model "
                               "(token data)", "ask for context= only for a model trained on token windows")
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise bad_argument(ConfigError, "memory.what_if", "context", value, "an int >= 1", "pass context=256")
        table = with_layer_params(model, "pos_embedding", {"context": int(value)})  # the position table grows too
        return {"data": _windows(data, int(value)), "model": table,
                "train_resolution": _scaled_context(config.train_resolution, data.train.sample_shape[0], int(value))}
    if key in ("heads", "attention") and not _has_layer(model.to_dict(), "attention"):
        raise bad_argument(ConfigError, "memory.what_if", key, value, "a what-if of a model with attention layers",
                           "ask for heads= or attention= only for a transformer (gpt(...), transformer_block(...))")
    if key == "heads":
        return {"model": with_layer_params(model, "attention", {"heads": value})}
    if key == "attention":
        flash = {"dropout": 0.0} if value == "flash" else {}  # the flash form keeps no dropout mask
        return {"model": with_layer_params(model, "attention", {"form": value, **flash})}
    assert key == "recompute"
    if not isinstance(value, (bool, np.bool_)):
        raise bad_argument(ConfigError, "memory.what_if", "recompute", value, "True or False", "pass recompute=True")
    return {"recompute": bool(value)}

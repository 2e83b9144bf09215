"""Activation recompute per block (``options(recompute=True)``): keep only the blocks' inputs and outputs
from the forward pass, and run each block's forward again right before its backward.

Why the plan changes and not just the schedule: liveness (memory/liveness.py) keeps a tensor from the first
node that touches it to the last. If the recomputed forward wrote the same tensors, the backward's reads
would keep the forward's copies alive all the same. So each feature map a block's layers produce (their
outputs and what they save for the backward: attention's q, k, v and probabilities, layer norm's
statistics...) gets a twin, ``<name>@recompute``, which the second forward writes and the backward reads.
The originals then die inside the forward, the twins live through one block's backward only, and the
packing lets every block's twins share the same bytes: the plan shows what is freed (``memory.what_if(
recompute=True)``), the measured step what it costs (one more forward of every block).

Dropout is not drawn again: the recomputed forward multiplies by the mask the first one drew (its S_MASK
tensor is not a feature map, and stays), so the two forwards agree and the step gives the same bytes.
"""
from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from ..memory.region import Region
from ..ops.registry import op_of

SUFFIX = "@recompute"
FEATURE_MAPS = (Region.F_FEATURE_FP32, Region.F_FEATURE_FP16)


def recomputed_layers(arch: Any) -> dict[str, list[Any]]:
    """The deep layers (after the first, which reads the data) of each block, by block, in forward order."""
    out: dict[str, list[Any]] = {}
    for layer in arch.layers[1:]:
        if layer.block:
            out.setdefault(layer.block, []).append(layer)
    return out


def twins(arch: Any, specs: list[Any]) -> list[Any]:
    """The feature maps the recomputed layers write (F_FEATURE_FP32 tensors named after them, and under a 16-bit
    precision their F_FEATURE_FP16 outputs: a twin missing there kept every block's 16-bit maps alive from the
    first forward to the backward) and the scratch only their forwards work in (``Op.forward_scratch``), in
    table order,
    but for the outputs a layer outside the block reads (the block's output, the next block's input): those
    are the checkpoints the recompute starts from, and stay as they are."""
    block_of = {layer.name: b for b, layers in recomputed_layers(arch).items() for layer in layers}
    scratch = {layer.name: op_of(layer.kind).forward_scratch for layer in arch.layers if layer.name in block_of}
    leaves = {t for layer in arch.layers for t in layer.inputs
              if t.endswith(".out") and block_of.get(t[:-4]) not in (None, block_of.get(layer.name))}

    def twinned(s: Any) -> bool:
        layer, _, role = s.name.partition(".")
        if layer not in block_of or "@" in s.name or s.name in leaves:
            return False
        return s.region in FEATURE_MAPS or (s.region is Region.T_TEMP_FP32 and role in scratch[layer])
    return [s for s in specs if twinned(s)]


def twin_ids(ids: dict[str, int]) -> dict[str, int]:
    """``ids`` with every twinned name resolving to its twin: what the recomputed forward and the
    backward of the block read and write."""
    return {**ids, **{n[:-len(SUFFIX)]: i for n, i in ids.items() if n.endswith(SUFFIX)}}


def check_recompute(arch: Any) -> None:
    """options(recompute=True) needs blocks to recompute, and none holding batch norm: its forward in training
    updates the running statistics, which a second forward would update twice."""
    blocks = recomputed_layers(arch)
    if not blocks:
        raise ConfigError("options(recompute=True): the model has no blocks to recompute (recompute works per "
                          "block: transformer_block, block(...), cbr...). Fix: build it of blocks, or drop recompute.")
    for name, layers in blocks.items():
        for layer in layers:
            if op_of(layer.kind).batch_statistics:
                raise ConfigError(f"options(recompute=True): {name} holds {layer.name}, a batch norm, whose running "
                                  "statistics a second forward would update twice. Fix: drop recompute for this "
                                  "model (it is meant for transformer blocks), or use layernorm().")

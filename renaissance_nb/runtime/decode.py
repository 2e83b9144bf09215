"""Static decoding: a language model's one-token step, planned and bound once, replayed per token.

Why a step of its own: the training and validation programs run whole (B, T) windows; generating
text runs one position at a time and reads the keys and values of every earlier position. LLM servers
capture that decode step once (a CUDA graph of fixed shapes) and replay it; here it is the same idea
on the CPU: a small MemoryPlan of its own (``DecodeStep.plan``: the token, the position, each layer's
one-position features and scratch, and each attention layer's KV cache, (1, H, context, hd) for keys and
for values), a list of graph nodes bound once to views of that arena and of the task's weights, and a
replay that only writes the token and the position first. Shapes never change: the attention scores
cover the whole context, masked past the position, so nothing is allocated per token.

Each layer kind says how it decodes (``Op.decode``); a model with a layer that cannot decode one
position at a time (a convolution, batch norm) is refused by name.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..compiler.graph import GraphNode, node
from ..errors import ConfigError, PlanError
from ..kernels.cpu import BindEnv
from ..memory.plan import MemoryPlan
from ..memory.region import Region
from ..ops.registry import op_of
from ..text import human_bytes
from .arena import Arena
from .bind import BoundGraph, bind


@dataclass
class DecodeContext:
    """What an op's ``decode`` hook declares: tensors of the decode arena (one position, batch 1) and
    nodes over them, naming tensors (a weight by its task name: it is read in the task's arena)."""

    context: int
    specs: list[tuple[str, tuple[int, ...], str, Region]] = field(default_factory=list)
    nodes: list[tuple[str, list[str], list[str], dict[str, Any], str]] = field(default_factory=list)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def add(self, name: str, shape: tuple[int, ...], region: Region = Region.F_FEATURE_FP32,
            dtype: str = "float32") -> str:
        self.specs.append((name, tuple(shape), dtype, region))
        self.shapes[name] = tuple(shape)
        return name

    def emit(self, op: str, ins: list[str], outs: list[str], layer: str, **params: Any) -> None:
        self.nodes.append((op, ins, outs, params, layer))


class DecodeStep:
    """The bound one-token step of a compiled language model. ``run(token, position)`` writes the
    token and its position, replays the step and returns the next-token logits (a view: copy it to
    keep it past the next step)."""

    def __init__(self, arch: Any, weight: Callable[[str], np.ndarray], context: int) -> None:
        d = DecodeContext(context)
        d.add("token", (1, 1), Region.I_A_DATA, "int32")
        d.add("position", (1,), Region.S_SCALAR_INT32, "int64")
        for layer in arch.layers:
            xs = ["token" if t == "input" else t for t in layer.inputs]
            op_of(layer.kind).decode(d, layer, xs, layer.output)  # a layer that cannot decode says so
        self.arch, self.output = arch, arch.output
        self.plan = MemoryPlan("decode")
        for name, shape, dtype, region in d.specs:
            self.plan.alloc(shape, dtype, region, name)
        self.plan.finalize(None)  # no reuse: the KV cache lives from one token to the next
        self.arena = Arena(self.plan)
        views = self.arena.views(self.plan)
        index = {t.name: t.id for t in self.plan}
        weights: list[np.ndarray] = []
        for _, ins, outs, _, _ in d.nodes:
            for name in (*ins, *outs):
                if name not in index:
                    index[name] = len(views) + len(weights)
                    weights.append(weight(name))
        nodes: list[GraphNode] = [node(op, [index[n] for n in ins], [index[n] for n in outs], layer, **params)
                                  for op, ins, outs, params, layer in d.nodes]
        self.graph: BoundGraph = bind("decode", nodes, [*views, *weights], BindEnv())
        self.token, self.position = views[index["token"]], views[index["position"]]
        self.logits = views[index[self.output]].reshape(-1)
        self.context = context

    def reset(self) -> None:
        """Forget every cached key and value (a new prompt)."""
        self.arena.bytes.fill(0)

    def run(self, token: int, position: int) -> np.ndarray:
        if not 0 <= position < self.context:  # the kernels index the KV cache by it (C and numba: unchecked)
            raise PlanError(f"decode: position {position} is outside the context [0, {self.context}). Fix: "
                            "generate at most context tokens per window (generate() slides the window).")
        self.token[0, 0] = token
        self.position[0] = position
        self.graph()
        return self.logits

    def by_kind(self) -> dict[str, int]:
        """The decode arena's bytes by what they are for: the KV cache, attention scores, activations..."""
        kinds = {layer.name: layer.kind for layer in self.arch.layers}
        out: dict[str, int] = {}
        for t in self.plan:
            layer, _, role = t.name.partition(".")
            kind = op_of(kinds[layer]).tensor_kinds.get(role) if layer in kinds else None
            kind = kind or ("inputs" if t.region.family == "I" else "scalars" if t.region.family == "S" else
                            "activations" if t.region.family == "F" else "temporaries")
            out[kind] = out.get(kind, 0) + t.storage_bytes
        return out

    @property
    def cache_bytes(self) -> int:
        return sum(t.nbytes for t in self.plan if t.name.endswith("_cache"))

    def __repr__(self) -> str:
        return (f"<DecodeStep: {len(self.graph.kernels)} kernels, context {self.context}, arena "
                f"{human_bytes(self.plan.total_bytes)} of which KV cache {human_bytes(self.cache_bytes)}>")


def decode_context(arch: Any, splits: Any) -> int:
    """The positions a decode step can hold: the model's position table (pos_embedding's context),
    else the training windows' length."""
    for layer in arch.layers:
        if "context" in layer.p:
            return int(layer.p["context"])
    return int(splits.train.sample_shape[0])


def check_prompt_ids(ids: np.ndarray, vocab: int) -> None:
    """The prompt's ids lie in [0, vocab) (and there is one)."""
    if ids.size == 0:
        raise ConfigError("generate: the prompt is empty. Fix: pass at least one token (a character of the corpus).")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise ConfigError(f"generate: the prompt's token ids must lie in [0, {vocab}); got {int(ids.min())}.."
                          f"{int(ids.max())}. Fix: encode it with the task's tokenizer.")

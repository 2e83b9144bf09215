"""embedding and pos_embedding: a language model's first layers (nn.Embedding, and GPT's learned
position table added to it).

``embedding(vocab, d)`` reads the int32 token ids of a sequence (T,) and gathers rows of its weight
(vocab, d) into (T, d). Its backward is a scatter-add into the weight's gradient in (sample, position)
order: every row's sum is added in one fixed order, so the bytes are the same on every run (PyTorch's
CPU embedding_backward sorts the indices instead; the sums agree to rounding). The numba loop does it
serially; its C twin (kernels/gpt_native.c, which every kernel here binds first) by blocks of the
vocabulary, each row's sums in the same order.
``pos_embedding(context)`` adds row t of its table (context, d) to position t: a sequence shorter than
``context`` uses the first T rows; its gradient is the sum over the batch, samples in order.

Parameters live with the fc weights (W_FC_WEIGHT): an embedding is a matrix read by rows. Their
initialisation is N(0, std^2): nn.Embedding's std is 1, GPT-2's 0.02 (``gpt()`` passes that).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numba
import numpy as np

from ..blueprint_nodes import Layer, layer_args, positive_int
from ..checks import as_float
from ..errors import BluePrintError, ShapeError, bad_argument
from ..kernels import gpt_native
from ..kernels.fused import chunk, jit, par
from ..kernels.operands import PAR_CHUNKS
from ..memory.region import Region
from .common import threaded
from .registry import Op, register


def _std(where: str, std: Any) -> float:
    s = as_float(std)
    if s is None or not math.isfinite(s) or s <= 0:
        raise bad_argument(BluePrintError, where, "std", std, "a finite float > 0",
                           "pass the initial weights' standard deviation, e.g. std=0.02")
    return s


@layer_args
def embedding(vocab: int, d: int, std: float = 1.0) -> Layer:
    """Token embedding: ids (T,) -> rows of a (vocab, d) table, (T, d), as nn.Embedding(vocab, d).
    The first layer of a language model; initialised N(0, std^2) (nn.Embedding: std=1)."""
    return Layer("embedding", (("vocab", positive_int("embedding", "vocab", vocab, "embedding(65, 128)")),
                               ("d", positive_int("embedding", "d", d, "embedding(65, 128)")),
                               ("std", _std("embedding", std))))


@layer_args
def pos_embedding(context: int, std: float = 1.0) -> Layer:
    """Learned position embedding: adds row t of a (context, d) table to position t of (T, d)."""
    return Layer("pos_embedding", (("context", positive_int("pos_embedding", "context", context,
                                                            "pos_embedding(128)")),
                                   ("std", _std("pos_embedding", std))))


# ---- kernels -------------------------------------------------------------------------------------
@jit
def gather_rows_(ids, w, y, lo, hi):
    """y[n, t] = w[ids[n, t]] for samples lo <= n < hi (ids in [0, vocab): checked where they enter)."""
    for n in range(lo, hi):
        for t in range(ids.shape[1]):
            r = ids[n, t]
            for k in range(w.shape[1]):
                y[n, t, k] = w[r, k]


@par
def gather_par_(ids, w, y):
    for c in numba.prange(PAR_CHUNKS):
        lo, hi = chunk(ids.shape[0], c)
        gather_rows_(ids, w, y, lo, hi)


@jit
def scatter_add_(ids, dy, dw, acc):
    """dw = sum over (n, t) of dy[n, t] into row ids[n, t], in float64 (``acc``), samples and positions
    in order, rounded once."""
    acc[:] = 0.0
    for n in range(ids.shape[0]):
        for t in range(ids.shape[1]):
            r = ids[n, t]
            for k in range(dy.shape[2]):
                acc[r, k] += dy[n, t, k]
    for r in range(dw.shape[0]):
        for k in range(dw.shape[1]):
            dw[r, k] = np.float32(acc[r, k])


@jit
def add_rows_(x, table, y):
    """y[n, t] = x[n, t] + table[t]."""
    for n in range(x.shape[0]):
        for t in range(x.shape[1]):
            for k in range(x.shape[2]):
                y[n, t, k] = x[n, t, k] + table[t, k]


@jit
def batch_sum_(dy, dtable, dx):
    """dtable[t] = sum over samples of dy[n, t] (float64, samples in order; rows past T zero); dx = dy."""
    dtable[:] = 0.0
    for t in range(dy.shape[1]):
        for k in range(dy.shape[2]):
            z = 0.0
            for n in range(dy.shape[0]):
                z += dy[n, t, k]
            dtable[t, k] = np.float32(z)
    if dx.size:
        dx[...] = dy


def bind_embed_fwd(outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Callable[[], None]:
    """The gather. The ids are not checked per step: they were where they enter (task.data's token check,
    predict's and generate's), and the transfer copies only rows of that data."""
    (ids, w), (y,) = ins, outs
    bound = gpt_native.bind_embed_fwd(ids, w, y, gpt_native.threads_for(y.size))
    if bound is not None:
        return bound
    n_rows = ids.shape[0]
    if threaded(y.size):
        return lambda: gather_par_(ids, w, y)
    return lambda: gather_rows_(ids, w, y, 0, n_rows)


def bind_embed_bwd(outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Callable[[], None]:
    (dy, ids), (dw, acc) = ins, outs
    bound = gpt_native.bind_embed_bwd(ids, dy, dw, acc, gpt_native.threads_for(acc.size + dy.size))
    if bound is not None:
        return bound
    return lambda: scatter_add_(ids, dy, dw, acc)


def bind_pos_fwd(outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Callable[[], None]:
    (x, table), (y,) = ins, outs
    bound = gpt_native.bind_pos_fwd(x, table, y, gpt_native.threads_for(y.size))
    if bound is not None:
        return bound
    return lambda: add_rows_(x, table, y)


def bind_pos_bwd(outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Callable[[], None]:
    (dy,), dtable = ins, outs[0]
    dx = outs[1] if len(outs) > 1 else np.empty((0, 0, 0), np.float32)
    bound = gpt_native.bind_pos_bwd(dy, dtable, dx, gpt_native.threads_for(dy.size))
    if bound is not None:
        return bound
    rows = dtable[:dy.shape[1]]
    rest = dtable[dy.shape[1]:]

    def run() -> None:
        batch_sum_(dy, rows, dx)
        rest.fill(0.0)
    return run


@jit
def add_row_at_(x, table, position, y):
    """y[0, 0] = x[0, 0] + table[position]: one token's position embedding (runtime/decode.py)."""
    p = position[0]
    for k in range(x.shape[2]):
        y[0, 0, k] = x[0, 0, k] + table[p, k]


def bind_pos_decode(outs: Any, ins: Any, p: dict[str, Any], env: Any) -> Callable[[], None]:
    (x, table, position), (y,) = ins, outs
    return gpt_native.bind_add_row_at(x, table, position, y) or (lambda: add_row_at_(x, table, position, y))


# ---- the ops -------------------------------------------------------------------------------------
@register
class Embedding(Op):
    autocast = "fp32"
    kind = "embedding"
    builders = (embedding,)
    torch_modules = ("Embedding",)
    parametrized = True
    decay_exempt = True
    layout = "flat"
    cpu_kernels = {"embedding_fwd": bind_embed_fwd, "embedding_bwd": bind_embed_bwd}

    def describe(self, p: dict[str, Any]) -> str:
        return f"embedding({p['vocab']}, {p['d']})"

    def tensors(self, ctx: Any, idx: int, layer: Any, ins: list[tuple[int, ...]]) -> tuple[int, ...]:
        x = ins[0]
        if len(x) != 1 or layer.inputs != ("input",):
            raise ShapeError(f"plan: {layer.name} (embedding) reads token ids (T,) of the data, got {x}. Fix: make "
                             "embedding() the model's first layer, on token data (datasets.tokens(...)).")
        p = layer.p
        ctx.param(layer.name, "weight", (p["vocab"], p["d"]), "FC_WEIGHT", p["d"], "normal", std=p["std"])
        ctx.t.add(f"{layer.name}.acc", (p["vocab"], p["d"]), "float64", Region.T_TEMP_FP32)
        return (x[0], p["d"])

    def forward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, training: bool,
                ema: bool) -> None:
        e.emit(g, gid, "embedding_fwd", [xs[0], e.weight(layer, "weight", ema)], [y], layer.name)

    def backward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, dy: int,
                 dxs: list[int | None]) -> None:
        n = layer.name
        e.emit(g, gid, "embedding_bwd", [dy, xs[0]], [e.ids[f"{n}.weight@grad"], e.ids[f"{n}.acc"]], n,
               scratch=("acc",))

    def decode(self, d: Any, layer: Any, xs: list[str], y: str) -> None:
        d.add(y, (1, 1, layer.p["d"]))
        d.emit("embedding_fwd", [xs[0], f"{layer.name}.weight"], [y], layer.name)

    def onnx(self, g: Any, layer: Any, xs: list[str], out: str) -> str:
        return g.node("Gather", [g.weight(layer.name, "weight"), xs[0]], out, axis=0)

    def from_torch(self, m: Any) -> dict[str, Any]:
        return {"layer": "embedding", "params": {"vocab": m.num_embeddings, "d": m.embedding_dim, "std": 1.0}}


@register
class PositionEmbedding(Op):
    autocast = "fp32"
    kind = "pos_embedding"
    builders = (pos_embedding,)
    parametrized = True
    decay_exempt = True
    layout = "flat"
    cpu_kernels = {"pos_embedding_fwd": bind_pos_fwd, "pos_embedding_bwd": bind_pos_bwd,
                   "pos_embedding_decode": bind_pos_decode}

    def describe(self, p: dict[str, Any]) -> str:
        return f"pos_embedding({p['context']})"

    def tensors(self, ctx: Any, idx: int, layer: Any, ins: list[tuple[int, ...]]) -> tuple[int, ...]:
        x, ctxlen = ins[0], layer.p["context"]
        if len(x) != 2:
            raise ShapeError(f"plan: {layer.name} (pos_embedding) needs (T, d) features, got {x}. Fix: put it "
                             "right after embedding(vocab, d).")
        if x[0] > ctxlen:
            raise ShapeError(f"plan: {layer.name} has {ctxlen} positions, but the sequences are {x[0]} long. "
                             f"Fix: pos_embedding({x[0]}) (or gpt(..., context={x[0]})), or shorter windows.")
        ctx.param(layer.name, "weight", (ctxlen, x[1]), "FC_WEIGHT", x[1], "normal", std=layer.p["std"])
        return x

    def forward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, training: bool,
                ema: bool) -> None:
        e.emit(g, gid, "pos_embedding_fwd", [xs[0], e.weight(layer, "weight", ema)], [y], layer.name)

    def backward(self, e: Any, g: Any, gid: Any, layer: Any, xs: list[int], y: int, dy: int,
                 dxs: list[int | None]) -> None:
        outs = [e.ids[f"{layer.name}.weight@grad"]] + ([dxs[0]] if dxs[0] is not None else [])
        e.emit(g, gid, "pos_embedding_bwd", [dy], outs, layer.name)

    def decode(self, d: Any, layer: Any, xs: list[str], y: str) -> None:
        d.add(y, d.shapes[xs[0]])
        d.emit("pos_embedding_decode", [xs[0], f"{layer.name}.weight", "position"], [y], layer.name)

    def onnx(self, g: Any, layer: Any, xs: list[str], out: str) -> str:
        rows = g.const(f"{layer.name}.rows", g.state[f"{layer.name}.weight"][:g.positions])  # the T positions used
        return g.node("Add", [xs[0], rows], out)

"""Stage 3's graphs: the zero-shape training and inference ComputationGraphs built from an ArchPlan.

Why a module of its own: layers.py says what the layers are and which tensors each variant
allocates (the descriptors and the tensor table); this module turns those into node patterns
(forward, backward, loss, optimizer, metrics, BN folding), naming tensors by the ids the table
gave them. The graphs carry no shapes: every variant reuses them with its own table.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .recompute import recomputed_layers, twin_ids
from .graph import ComputationGraph, node
from .ids import GraphId
from ..ops import conv_bn, pool
from ..ops.registry import op_of
from .layers import ArchLayer, ArchPlan


@dataclass(frozen=True)
class StepOptions:
    """What the step graphs contain besides forward/backward."""

    smoothing: float
    optimizer: tuple[tuple[str, Any], ...]  # ('kind', 'adamw'), hyper-parameters
    zero_grad: bool = False
    nan_check: bool = True
    nan_policy: str = "raise"  # or "skip": skip the update and count it (what loss scaling needs)
    ema_decay: float | None = None
    clip_norm: float | None = None  # clip_grad_norm's max_norm: scale the gradients to this total 2-norm
    image: bool = False  # NCHW data gathered into channels-last buffers (with augmentation, prefetch)
    crop_pad: int = 0
    flip: bool = False
    prefetch: bool = True
    ranks: int = 1  # data-parallel ranks: above 1, the gradients are all-reduced (_start_bucket, DEEP_COMM)
    allreduce: str = "buckets"  # per layer as backward writes it ('buckets') or the whole G range at once ('slab')
    recompute: bool = False  # each block's forward again before its backward, into twins (compiler/recompute.py)
    elide_outputs: bool = True  # an op may make another's output values itself (ops/registry.py pooled_from); off
    # under mixed precision (the output would be rounded to 16 bits in between) and with liveness=False (every
    # temporary kept, to read after a step)


class _Emitter:
    """Emits each layer's node patterns; tensor names resolve to ids, "input" to the data buffer."""

    def __init__(self, arch: ArchPlan, ids: dict[str, int], recomputing: bool = False,
                 elide_outputs: bool = True, recompute: bool = False) -> None:
        self.arch = arch
        self.ids = ids
        self.consumers = arch.consumers()
        self.recomputing = recomputing
        """A block's second forward (compiler/recompute.py): dropout reuses its mask instead of drawing."""
        self.elide_outputs = elide_outputs
        """Whether an op may make another's output values itself, so that output is never written in training
        (ops/registry.py pooled_from; StepOptions.elide_outputs says when not)."""
        self.recompute = recompute
        """options(recompute=True): the blocks' forwards run again before their backward (compiler/recompute.py)."""
        self._by_pool = {layer.output for layer in arch.layers
                         if pool.grad_from_pool(arch, elide_outputs, layer, recompute) is not None}
        """Outputs with no gradient tensor: their layer's backward makes it from a max pool's (ops/pool.py)."""

    def grad_id(self, tensor: str, j: int = 0) -> int | None:
        """The id of ``tensor``'s j-th gradient slot; None for one a max pool's gradient stands in for
        (grad_from_pool: the tensor table has none). Any other missing slot is a KeyError, as a bug should be."""
        if tensor in self._by_pool:
            return None
        return self.ids[f"{tensor}@grad" if j == 0 else f"{tensor}@grad#{j}"]

    def dropout(self, g: ComputationGraph, gid: GraphId, x: int, y: int, mask: int, layer: str, p: float) -> None:
        """Inverted dropout of x into y: a fresh Philox mask, or the one already drawn when recomputing."""
        if self.recomputing:
            self.emit(g, gid, "mul", [x, mask], [y], layer)
        else:
            self.emit(g, gid, "dropout_fwd", [x, self.ids["rng.offset"]], [y, mask], layer, p=p)

    def tid(self, name: str, data: int) -> int:
        return data if name == "input" else self.ids[name]

    def scratch(self, layer: str, roles: tuple[str, ...]) -> tuple[str, ...]:
        """Those of a kernel's scratch roles the tensor table planned for this layer."""
        return tuple(r for r in roles if f"{layer}.{r}" in self.ids)

    def weight(self, layer: ArchLayer, role: str, ema: bool) -> int:
        return self.ids[f"{layer.name}.{role}" + ("@ema" if ema else "")]

    def emit(self, g: ComputationGraph, gid: GraphId, op: str, ins: list[int], outs: list[int], name: str,
             **params: Any) -> None:
        """What an op's emission calls: one node appended to ``gid``."""
        g.append(gid, node(op, ins, outs, name, **params))

    @staticmethod
    def gid(name: str) -> GraphId:
        """A GraphId by name, for ops that add to a graph of their own (batch norm's folding)."""
        return GraphId[name]

    def forward(self, g: ComputationGraph, gid: GraphId, layer: ArchLayer, data: int, training: bool,
                ema: bool = False) -> None:
        xs = [self.tid(t, data) for t in layer.inputs]
        op_of(layer.kind).forward(self, g, gid, layer, xs, self.ids[layer.output], training, ema)

    def backward(self, g: ComputationGraph, gid: GraphId, layer: ArchLayer, data: int,
                 seen: dict[str, int]) -> None:
        """Gradients of one layer. ``seen`` counts gradient contributions per tensor so a
        tensor read by several layers gets one slot per reader, summed before its producer."""
        ids, op = self.ids, op_of(layer.kind)
        dy = self.grad_id(layer.output)
        for j in range(1, self.consumers.get(layer.output, 0)):
            g.append(gid, node("add", [dy, ids[f"{layer.output}@grad#{j}"]], [dy], layer.name))

        def slot(name: str) -> int | None:
            if name == "input":  # the data: no gradient, unless the op's backward writes one anyway (bn)
                return ids.get("input@grad") if op.first_layer_dx else None
            j = seen.get(name, 0)
            seen[name] = j + 1
            return self.grad_id(name, j)

        xs = [self.tid(t, data) for t in layer.inputs]
        op.backward(self, g, gid, layer, xs, ids[layer.output], dy, [slot(t) for t in layer.inputs])

    def loss(self, g: ComputationGraph, gid: GraphId, smoothing: float, grad: bool) -> None:
        logits = self.ids[self.arch.output]
        outs = [self.ids["result"]] + ([self.ids[f"{self.arch.output}@grad"]] if grad else [])
        weight = [self.ids["loss.weight"]] if "loss.weight" in self.ids else []
        g.append(gid, node("softmax_xent", [logits, self.ids["labels"], *weight], outs, "loss", smoothing=smoothing,
                           grad=grad))


def _grads(ids: dict[str, int], layer: str) -> list[int]:
    """A layer's parameter gradients (its bucket): weight, then bias, where it has them, then those of
    its named parts in table order (se's ``se1.fc1.weight@grad``...); never its output's gradient slots."""
    first = [ids[n] for n in (f"{layer}.weight@grad", f"{layer}.bias@grad") if n in ids]
    out = f"{layer}.out@"
    parts = [i for n, i in ids.items() if n.startswith(f"{layer}.") and n.endswith("@grad") and not n.startswith(out)
             and i not in first and "@" not in n[:-len("@grad")]]
    return first + sorted(parts)


def _start_bucket(g: ComputationGraph, gid: GraphId, ids: dict[str, int], layer: str, ranks: int) -> None:
    """Right after ``layer``'s backward wrote its gradients: their non-blocking all-reduce starts (late
    layers first, so the reduction of one overlaps the backward of the layers before it); DEEP_COMM's
    ``allreduce_wait`` of the same bucket completes it before the optimizer reads it."""
    if _grads(ids, layer):
        g.append(gid, node("allreduce_start", _grads(ids, layer), [], layer, bucket=layer, ranks=ranks))


def _transfer(g: ComputationGraph, ids: dict[str, int], ab: str, source: str, opts: StepOptions,
              augment: bool) -> None:
    data, label = ids[f"I_{ab}.data"], ids[f"I_{ab}.label"]
    gid = GraphId[f"TRANSFER_{ab}"]
    if not opts.image:
        g.append(gid, node("transfer", [ids["cursor"]], [data, label], "data", source=source))
        return
    if opts.prefetch:  # the claimed batch's (start, aug_base), kept for the background gather
        g.append(gid, node("transfer_image_async", [ids["cursor"], ids["aug.offset"]],
                           [data, label, ids[f"I_{ab}.claim"]], "data", source=source,
                           crop_pad=opts.crop_pad if augment else 0, flip=opts.flip if augment else False,
                           scratch=("claim",)))
        return
    g.append(gid, node("transfer_image", [ids["cursor"], ids["aug.offset"]], [data, label], "data", source=source,
                       crop_pad=opts.crop_pad if augment else 0, flip=opts.flip if augment else False))


def _first_forward(g: ComputationGraph, gid: GraphId, ids: dict[str, int], ab: str, opts: StepOptions) -> None:
    if opts.image and opts.prefetch:
        g.append(gid, node("transfer_wait", [ids[f"I_{ab}.data"]], [], "data"))
    g.append(gid, node("copy", [ids[f"I_{ab}.label"]], [ids["labels"]], "data"))


def _inference_folds(g: ComputationGraph, arch: ArchPlan, e: _Emitter, ema: bool) -> None:
    """UPDATE_BN_INF_PARAMS: the inference parameters each op derives from its training ones, then the
    folded convolutions' weights from those (options(fold_bn=True))."""
    for layer in arch.layers:
        op_of(layer.kind).inference_fold(e, g, layer, ema)
    by_name = {layer.name: layer for layer in arch.layers}
    for conv, norm in arch.folded:
        conv_bn.fold_nodes(e, g, by_name[conv], by_name[norm], ema)


def _inference_forward(g: ComputationGraph, gid: GraphId, arch: ArchPlan, e: _Emitter, data: int, ema: bool) -> None:
    """The whole forward at inference: a folded conv + bn pair as one convolution, the rest layer by layer."""
    by_name = {layer.name: layer for layer in arch.layers}
    folds = dict(arch.folded)
    skip = set(folds.values())
    for layer in arch.layers:
        if layer.name in folds:
            conv_bn.forward(e, g, gid, layer, by_name[folds[layer.name]], [e.tid(t, data) for t in layer.inputs], ema)
        elif layer.name not in skip:
            e.forward(g, gid, layer, data, training=False, ema=ema)


def emit_training_graph(arch: ArchPlan, ids: dict[str, int], opts: StepOptions,
                        g_range: tuple[str, str]) -> ComputationGraph:
    """The training graph: transfer, first-layer fwd/bwd (A and B), deep fwd+bwd, metrics, optimizer."""
    g = ComputationGraph("train")
    e = _Emitter(arch, ids, elide_outputs=opts.elide_outputs, recompute=opts.recompute)
    first, deep = arch.layers[0], arch.layers[1:]
    for ab in ("A", "B"):
        data = ids[f"I_{ab}.data"]
        _transfer(g, ids, ab, "train", opts, augment=True)
        fwd = GraphId[f"FIRST_LAYER_FWD_{ab}"]
        _first_forward(g, fwd, ids, ab, opts)
        e.forward(g, fwd, first, data, training=True)
    gid = GraphId.DEEP_FWD_BWD
    data_any = ids["I_A.data"]  # deep layers never read the input buffer
    for layer in deep:
        e.forward(g, gid, layer, data_any, training=True)
    e.loss(g, gid, opts.smoothing, grad=True)
    seen: dict[str, int] = {}
    buckets = opts.ranks > 1 and opts.allreduce == "buckets"
    blocks = recomputed_layers(arch) if opts.recompute else {}
    again = (_Emitter(arch, twin_ids(ids), recomputing=True, elide_outputs=opts.elide_outputs, recompute=True)
             if blocks else e)
    for layer in reversed(deep):
        if layer.block in blocks and layer is blocks[layer.block][-1]:  # its block's backward starts: forward again
            for twin in blocks[layer.block]:
                again.forward(g, gid, twin, data_any, training=True)
        (again if layer.block in blocks else e).backward(g, gid, layer, data_any, seen)
        if buckets:
            _start_bucket(g, gid, ids, layer.name, opts.ranks)
    for ab in ("A", "B"):
        e.backward(g, GraphId[f"FIRST_LAYER_BWD_{ab}"], first, ids[f"I_{ab}.data"], dict(seen))
        if buckets:
            _start_bucket(g, GraphId[f"FIRST_LAYER_BWD_{ab}"], ids, first.name, opts.ranks)
    if buckets:
        for layer in reversed(arch.layers):  # waited in the order they started, all before the NaN check
            if _grads(ids, layer.name):
                g.append(GraphId.DEEP_COMM, node("allreduce_wait", _grads(ids, layer.name), [], layer.name,
                                                 bucket=layer.name, ranks=opts.ranks))
    elif opts.ranks > 1:  # one slab: every gradient (the G range) summed over the ranks and scaled by 1/ranks
        g.append(GraphId.DEEP_COMM, node("allreduce_mean", [], [], "grads", first=g_range[0], last=g_range[1],
                                         ranks=opts.ranks))
    if opts.zero_grad:
        g.append(GraphId.ZERO_GRAD, node("zero_range", [], [], "grads", first=g_range[0], last=g_range[1]))
    if opts.nan_check:
        g.append(GraphId.CAST_AND_CHECK, node("nan_check", [ids["result"], ids["step"]],
                                              [ids["nan.flag"], ids["nan.skipped"], ids["nan.partials"]], "grads",
                                              policy=opts.nan_policy, first=g_range[0], last=g_range[1],
                                              scratch=("partials",)))
    if opts.clip_norm is not None:
        g.append(GraphId.CAST_AND_CHECK, node("clip_grad_norm", [ids["nan.flag"]],
                                              [ids["clip.norm"], ids["clip.partials"]], "grads",
                                              max_norm=opts.clip_norm, first=g_range[0], last=g_range[1]))
    acc_in = [ids["result"], ids["step"]]
    acc_out = [ids["metrics.sum"], ids["loss_log"]]
    for gid in (GraphId.ACCUM_METRICS, GraphId.ACCUM_METRICS_TRAIN_LAST):
        g.append(gid, node("accum_metrics", acc_in, acc_out, "metrics", log=True))
    g.append(GraphId.CLEAR_METRICS, node("fill", [], [ids["metrics.sum"]], "metrics", value=0.0))
    from ..optim import definition  # the optimizer's own nodes (optim/, which binds kernels): imported here
    p = dict(opts.optimizer)
    ema = opts.ema_decay is not None
    for gid, op, ins, outs, params in definition(p["kind"]).update_nodes(ids, p):  # LARS: LARS_NORMS first
        keep = {"keep_flag": True} if ema and op == "optimizer" else {}  # the EMA after it reads the flag too
        g.append(GraphId[gid], node(op, ins, outs, "optimizer", **params, **keep))
    if ema:  # skips a step the NaN check skipped, as the optimizer does, then clears the flag
        g.append(GraphId.EMA_UPDATE, node("ema_update", [ids["step"], ids["nan.flag"]], [], "ema",
                                          decay=opts.ema_decay))
    return g


def emit_inference_graph(arch: ArchPlan, ids: dict[str, int], opts: StepOptions) -> ComputationGraph:
    """The inference graph: transfer, whole forward (dropout off, BN folded), loss and metrics;
    INF_EMA runs the same forward on the EMA weights."""
    g = ComputationGraph("inference")
    e = _Emitter(arch, ids)
    ema = opts.ema_decay is not None
    for ab in ("A", "B"):
        data = ids[f"I_{ab}.data"]
        _transfer(g, ids, ab, "val", opts, augment=False)
        for kind in ("MAIN", "EMA") if ema else ("MAIN",):
            gid = GraphId[f"INF_{kind}_{ab}"]
            _first_forward(g, gid, ids, ab, opts)
            _inference_forward(g, gid, arch, e, data, ema=kind == "EMA")
            e.loss(g, gid, opts.smoothing, grad=False)
    for gid in (GraphId.ACCUM_METRICS, GraphId.ACCUM_METRICS_VAL_LAST):
        g.append(gid, node("accum_metrics", [ids["result"], ids["step"]], [ids["metrics.sum"]], "metrics", log=False))
    g.append(GraphId.CLEAR_METRICS, node("fill", [], [ids["metrics.sum"]], "metrics", value=0.0))
    _inference_folds(g, arch, e, ema)
    return g

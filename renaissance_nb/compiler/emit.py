"""Stage 3's graphs: the zero-shape training and inference ComputationGraphs built from an ArchPlan.

Why a module of its own: layers.py says what the layers are and which tensors each variant
allocates (the descriptors and the tensor table); this module turns those into node patterns
(forward, backward, loss, optimizer, metrics, BN folding), naming tensors by the ids the table
gave them. The graphs carry no shapes: every variant reuses them with its own table.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .graph import ComputationGraph, node
from .ids import GraphId
from .layers import BN_BWD_SCRATCH, BN_FWD_SCRATCH, ArchLayer, ArchPlan


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


class _Emitter:
    """Emits each layer's node patterns; tensor names resolve to ids, "input" to the data buffer."""

    def __init__(self, arch: ArchPlan, ids: dict[str, int]) -> None:
        self.arch = arch
        self.ids = ids
        self.consumers = arch.consumers()

    def tid(self, name: str, data: int) -> int:
        return data if name == "input" else self.ids[name]

    def scratch(self, layer: str, roles: tuple[str, ...]) -> tuple[str, ...]:
        """Those of a kernel's scratch roles the tensor table planned for this layer."""
        return tuple(r for r in roles if f"{layer}.{r}" in self.ids)

    def weight(self, layer: ArchLayer, role: str, ema: bool) -> int:
        return self.ids[f"{layer.name}.{role}" + ("@ema" if ema else "")]

    def forward(self, g: ComputationGraph, gid: GraphId, layer: ArchLayer, data: int, training: bool,
                ema: bool = False) -> None:
        ids, p = self.ids, layer.p
        xs = [self.tid(t, data) for t in layer.inputs]
        x, y = xs[0], ids[layer.output]
        k = layer.kind
        if k == "fc":
            ins = [x, self.weight(layer, "weight", ema)] + ([self.weight(layer, "bias", ema)] if p["bias"] else [])
            g.append(gid, node("fc_fwd", ins, [y], layer.name, act=p["act"], slope=p["slope"]))
        elif k == "conv":
            ins = [x, self.weight(layer, "weight", ema)] + ([self.weight(layer, "bias", ema)] if p["bias"] else [])
            g.append(gid, node("conv_fwd", ins, [y, ids[f"{layer.name}.cols"]], layer.name, k=p["k"], s=p["s"],
                               p=p["p"], bias=p["bias"], act=p["act"]))
        elif k == "bn":
            if training:
                g.append(gid, node("bn_fwd", [x, ids[f"{layer.name}.weight"], ids[f"{layer.name}.bias"]],
                                   [y, ids[f"{layer.name}.mean"], ids[f"{layer.name}.invstd"],
                                    ids[f"{layer.name}.running_mean"], ids[f"{layer.name}.running_var"]]
                                   + [ids[f"{layer.name}.{r}"] for r in BN_FWD_SCRATCH],
                                   layer.name, momentum=p["momentum"], eps=p["eps"], act=p["act"],
                                   scratch=BN_FWD_SCRATCH))
            else:
                sfx = "@ema" if ema else ""
                g.append(gid, node("bn_inf", [x, ids[f"{layer.name}.eq_scale{sfx}"], ids[f"{layer.name}.eq_bias{sfx}"]],
                                   [y], layer.name, act=p["act"]))
        elif k == "act":
            g.append(gid, node("act_fwd", [x], [y], layer.name, act=p["act"], slope=p["slope"]))
        elif k == "flatten":
            g.append(gid, node("reshape_copy", [x], [y], layer.name))
        elif k == "dropout":
            if training and p["p"] > 0:
                m = ids[f"{layer.name}.mask"]
                g.append(gid, node("dropout_fwd", [x, ids["rng.offset"]], [y, m], layer.name, p=p["p"]))
            else:
                g.append(gid, node("copy", [x], [y], layer.name))
        elif k == "maxpool":
            g.append(gid, node("maxpool_fwd", [x], [y, ids[f"{layer.name}.argmax"]], layer.name,
                               k=p["k"], s=p["s"], p=p["p"]))
        elif k == "avgpool":
            g.append(gid, node("avgpool_fwd", [x], [y], layer.name, k=p["k"], s=p["s"], p=p["p"]))
        elif k == "gap":
            g.append(gid, node("gap_fwd", [x], [y], layer.name))
        elif k == "add":
            g.append(gid, node("add", xs, [y], layer.name))

    def backward(self, g: ComputationGraph, gid: GraphId, layer: ArchLayer, data: int,
                 seen: dict[str, int]) -> None:
        """Gradients of one layer. ``seen`` counts gradient contributions per tensor so a
        tensor read by several layers gets one slot per reader, summed before its producer."""
        ids, p = self.ids, layer.p
        y = ids[layer.output]
        dy = ids[f"{layer.output}@grad"]
        for j in range(1, self.consumers.get(layer.output, 0)):
            g.append(gid, node("add", [dy, ids[f"{layer.output}@grad#{j}"]], [dy], layer.name))

        def slot(name: str) -> int | None:
            if name == "input":
                return ids.get("input@grad") if layer.kind == "bn" else None
            j = seen.get(name, 0)
            seen[name] = j + 1
            return ids[f"{name}@grad" if j == 0 else f"{name}@grad#{j}"]

        xs = [self.tid(t, data) for t in layer.inputs]
        x = xs[0]
        k = layer.kind
        if k == "add":
            for t in layer.inputs:
                d = slot(t)
                if d is not None:
                    g.append(gid, node("copy", [dy], [d], layer.name))
            return
        dx = slot(layer.inputs[0])
        if k == "fc":
            outs = [ids[f"{layer.name}.weight@grad"]] + ([ids[f"{layer.name}.bias@grad"]] if p["bias"] else [])
            outs += [dx] if dx is not None else []
            scratch = self.scratch(layer.name, ("bias_partials",) if p["bias"] else ())
            g.append(gid, node("fc_bwd", [dy, x, ids[f"{layer.name}.weight"], y, ids["ones"]],
                               outs + [ids[f"{layer.name}.{r}"] for r in scratch], layer.name, act=p["act"],
                               slope=p["slope"], bias=p["bias"], need_dx=dx is not None, scratch=scratch))
        elif k == "conv":
            outs = [ids[f"{layer.name}.weight@grad"]] + ([ids[f"{layer.name}.bias@grad"]] if p["bias"] else [])
            own = ids.get(f"{layer.name}.bwd_cols")  # a tiled conv's backward: its own scratch for both column tiles
            cols = own if own is not None else ids[f"{layer.name}.cols"]  # else the forward's whole matrix
            if dx is not None:
                outs += [dx, own if own is not None else ids[f"{layer.name}.dcols"]]
            scratch = self.scratch(layer.name, ("bias_partials", "dw_partials"))
            g.append(gid, node("conv_bwd", [dy, x, ids[f"{layer.name}.weight"], cols, y],
                               outs + [ids[f"{layer.name}.{r}"] for r in scratch], layer.name, k=p["k"], s=p["s"],
                               p=p["p"], bias=p["bias"], act=p["act"], need_dx=dx is not None, scratch=scratch))
        elif k == "bn":
            g.append(gid, node("bn_bwd", [dy, x, y, ids[f"{layer.name}.weight"], ids[f"{layer.name}.mean"],
                                          ids[f"{layer.name}.invstd"]],
                               [dx, ids[f"{layer.name}.weight@grad"], ids[f"{layer.name}.bias@grad"]]
                               + [ids[f"{layer.name}.{r}"] for r in BN_BWD_SCRATCH], layer.name,
                               act=p["act"], scratch=BN_BWD_SCRATCH))
        elif dx is None:
            return  # a parameter-free first layer has nothing to compute backwards
        elif k == "act":
            g.append(gid, node("act_bwd", [dy, x], [dx], layer.name, act=p["act"], slope=p["slope"]))
        elif k == "flatten":
            g.append(gid, node("reshape_copy", [dy], [dx], layer.name))
        elif k == "dropout":
            if p["p"] > 0:
                g.append(gid, node("mul", [dy, ids[f"{layer.name}.mask"]], [dx], layer.name))
            else:
                g.append(gid, node("copy", [dy], [dx], layer.name))
        elif k == "maxpool":
            g.append(gid, node("maxpool_bwd", [dy, ids[f"{layer.name}.argmax"]], [dx], layer.name,
                               k=p["k"], s=p["s"], p=p["p"]))
        elif k == "avgpool":
            g.append(gid, node("avgpool_bwd", [dy], [dx], layer.name, k=p["k"], s=p["s"], p=p["p"]))
        elif k == "gap":
            g.append(gid, node("gap_bwd", [dy], [dx], layer.name))

    def loss(self, g: ComputationGraph, gid: GraphId, smoothing: float, grad: bool) -> None:
        logits = self.ids[self.arch.output]
        outs = [self.ids["result"]] + ([self.ids[f"{self.arch.output}@grad"]] if grad else [])
        weight = [self.ids["loss.weight"]] if "loss.weight" in self.ids else []
        g.append(gid, node("softmax_xent", [logits, self.ids["labels"], *weight], outs, "loss", smoothing=smoothing,
                           grad=grad))


def _grads(ids: dict[str, int], layer: str) -> list[int]:
    """A layer's parameter gradients (its bucket): weight, then bias, where it has them."""
    return [ids[n] for n in (f"{layer}.weight@grad", f"{layer}.bias@grad") if n in ids]


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


def _bn_fold(g: ComputationGraph, arch: ArchPlan, ids: dict[str, int], ema: bool) -> None:
    for layer in arch.layers:
        if layer.kind != "bn":
            continue
        n = layer.name
        for sfx in ("", "@ema") if ema else ("",):
            g.append(GraphId.UPDATE_BN_INF_PARAMS, node(
                "bn_fold", [ids[f"{n}.weight{sfx}"], ids[f"{n}.bias{sfx}"], ids[f"{n}.running_mean{sfx}"],
                            ids[f"{n}.running_var{sfx}"]], [ids[f"{n}.eq_scale{sfx}"], ids[f"{n}.eq_bias{sfx}"]], n,
                eps=layer.p["eps"]))


def emit_training_graph(arch: ArchPlan, ids: dict[str, int], opts: StepOptions,
                        g_range: tuple[str, str]) -> ComputationGraph:
    """The training graph: transfer, first-layer fwd/bwd (A and B), deep fwd+bwd, metrics, optimizer."""
    g = ComputationGraph("train")
    e = _Emitter(arch, ids)
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
    for layer in reversed(deep):
        e.backward(g, gid, layer, data_any, seen)
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
    g.append(GraphId.OPTIMIZER, node("optimizer", [ids["lr_table"], ids["nan.flag"]], [ids["step"]], "optimizer",
                                     **dict(opts.optimizer)))
    if opts.ema_decay is not None:
        g.append(GraphId.EMA_UPDATE, node("ema_update", [ids["step"]], [], "ema", decay=opts.ema_decay))
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
            for layer in arch.layers:
                e.forward(g, gid, layer, data, training=False, ema=kind == "EMA")
            e.loss(g, gid, opts.smoothing, grad=False)
    for gid in (GraphId.ACCUM_METRICS, GraphId.ACCUM_METRICS_VAL_LAST):
        g.append(gid, node("accum_metrics", [ids["result"], ids["step"]], [ids["metrics.sum"]], "metrics", log=False))
    g.append(GraphId.CLEAR_METRICS, node("fill", [], [ids["metrics.sum"]], "metrics", value=0.0))
    _bn_fold(g, arch, ids, ema)
    return g

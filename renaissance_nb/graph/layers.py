"""Per-layer descriptors: which tensors a layer needs, and its forward, backward
and inference node patterns.

``plan_architecture`` turns a BluePrint into an ArchPlan: the executable layers,
named like PyTorch modules would be (fc1, fc2, ...), with an activation that
directly follows an fc fused into it (one pass for bias + activation instead of
two, and one feature map fewer). ``tensor_table`` lists every tensor of a task for
one variant; it runs the same code for every variant, which is what guarantees
the same tensors in the same order, names and regions, with only shapes differing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..blueprint import ACTIVATIONS, BluePrint, Layer
from ..errors import ShapeError
from ..memory.region import Region
from .graph import ComputationGraph, node
from .ids import GraphId

# activations whose derivative can be written from the output alone (fusable into fc)
FUSABLE = ("relu", "tanh", "sigmoid", "leaky_relu")


@dataclass(frozen=True)
class ArchLayer:
    """One executable layer after fusion."""

    name: str
    kind: str  # fc | act | dropout | flatten | identity
    params: tuple[tuple[str, Any], ...]
    blueprint_index: tuple[int, ...]

    @property
    def p(self) -> dict[str, Any]:
        return dict(self.params)

    def describe(self) -> str:
        p = self.p
        if self.kind == "fc":
            act = p.get("act", "none")
            return f"{self.name}: fc({p['out']}, bias={p['bias']})" + (f" + {act} (fused)" if act != "none" else "")
        if self.kind == "act":
            return f"{self.name}: {p['act']}"
        if self.kind == "dropout":
            return f"{self.name}: dropout(p={p['p']})"
        return f"{self.name}: {self.kind}"


@dataclass(frozen=True)
class ArchPlan:
    """The BluePrint as executable layers, with the fusions the compiler made."""

    blueprint: BluePrint
    layers: tuple[ArchLayer, ...]
    fused: tuple[str, ...]

    @property
    def param_layers(self) -> list[ArchLayer]:
        return [l for l in self.layers if l.kind == "fc"]

    def __repr__(self) -> str:
        lines = [f"ArchPlan: {len(self.layers)} executable layers from {len(self.blueprint.leaves())} declared"]
        lines += [f"  {l.describe()}" for l in self.layers]
        if self.fused:
            lines.append("  fused: " + ", ".join(self.fused))
        return "\n".join(lines)


def plan_architecture(bp: BluePrint, fuse: bool = True) -> ArchPlan:
    """Unroll containers, name the layers, fuse fc + following activation."""
    leaves = bp.leaves()
    counters: dict[str, int] = {}
    out: list[ArchLayer] = []
    fused: list[str] = []

    def name_for(kind: str) -> str:
        counters[kind] = counters.get(kind, 0) + 1
        return f"{kind}{counters[kind]}"

    i = 0
    while i < len(leaves):
        leaf: Layer = leaves[i]
        k = leaf.kind
        if k == "fc":
            params = dict(leaf.params)
            idx: tuple[int, ...] = (i,)
            nxt = leaves[i + 1] if i + 1 < len(leaves) else None
            if fuse and nxt is not None and nxt.kind in FUSABLE:
                params["act"] = nxt.kind
                params["slope"] = dict(nxt.params).get("negative_slope", 0.0)
                idx = (i, i + 1)
                i += 1
            else:
                params["act"] = "none"
                params["slope"] = 0.0
            nm = name_for("fc")
            if params["act"] != "none":
                fused.append(f"{nm}+{params['act']}")
            out.append(ArchLayer(nm, "fc", tuple(sorted(params.items())), idx))
        elif k in ACTIVATIONS:
            slope = dict(leaf.params).get("negative_slope", 0.0)
            out.append(ArchLayer(name_for(k), "act", (("act", k), ("slope", slope)), (i,)))
        elif k in ("dropout", "flatten", "identity"):
            out.append(ArchLayer(name_for(k), k, leaf.params, (i,)))
        else:
            raise ShapeError(f"plan: layer kind {k!r} is not supported by the CPU engine yet. "
                             "Fix: use fc, activations, dropout, flatten or identity.")
        i += 1
    return ArchPlan(bp, tuple(out), tuple(fused))


@dataclass(frozen=True)
class TensorSpec:
    """A tensor before placement: the unit the compiler compares across variants."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    region: Region


@dataclass(frozen=True)
class ParamInfo:
    """A trainable parameter: where it lives and how it is initialised."""

    layer: str
    role: str  # weight | bias
    shape: tuple[int, ...]
    fan_in: int


@dataclass
class TensorTable:
    """The ordered tensor list of one variant, plus ids by name and per-layer shapes."""

    specs: list[TensorSpec] = field(default_factory=list)
    ids: dict[str, int] = field(default_factory=dict)
    layer_shapes: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    params: list[ParamInfo] = field(default_factory=list)

    def add(self, name: str, shape: tuple[int, ...], dtype: str, region: Region) -> int:
        self.ids[name] = len(self.specs)
        self.specs.append(TensorSpec(name, tuple(int(d) for d in shape), dtype, region))
        return self.ids[name]


def _prod(shape: tuple[int, ...]) -> int:
    return int(math.prod(shape))


def tensor_table(arch: ArchPlan, batch: int, sample_shape: tuple[int, ...], num_classes: int,
                 opt_state: tuple[str, ...], total_steps: int) -> TensorTable:
    """Every tensor of a task for one variant, in a fixed order.

    ``opt_state`` lists the optimizer families needed besides W and G ("M", "V").
    """
    t = TensorTable()
    f32, i32 = "float32", "int32"
    t.add("I_A.label", (batch,), i32, Region.I_A_LABEL)
    t.add("I_A.data", (batch, *sample_shape), f32, Region.I_A_DATA)
    t.add("I_B.label", (batch,), i32, Region.I_B_LABEL)
    t.add("I_B.data", (batch, *sample_shape), f32, Region.I_B_DATA)
    t.add("labels", (batch,), i32, Region.T_TEMP_INT32)
    shape = tuple(sample_shape)
    for layer in arch.layers:
        p = layer.p
        in_shape = shape
        if layer.kind == "fc":
            if len(shape) != 1:
                raise ShapeError(f"plan: {layer.name} (fc) gets input of shape {shape}; fc needs flat features. "
                                 "Fix: put flatten() before it.")
            fan_in, out = shape[0], p["out"]
            for role, pshape in (("bias", (out,)), ("weight", (out, fan_in))):
                if role == "bias" and not p["bias"]:
                    continue
                kind = "FC_BIAS" if role == "bias" else "FC_WEIGHT"
                base = f"{layer.name}.{role}"
                t.add(base, pshape, f32, Region[f"W_{kind}"])
                t.add(f"{base}@grad", pshape, f32, Region[f"G_{kind}"])
                for fam in opt_state:
                    t.add(f"{base}@{fam.lower()}", pshape, f32, Region[f"{fam}_{kind}"])
                t.params.append(ParamInfo(layer.name, role, pshape, fan_in))
            shape = (out,)
        elif layer.kind == "flatten":
            shape = (_prod(shape),)
        elif layer.kind == "dropout":
            t.add(f"{layer.name}.mask", (batch, *shape), f32, Region.S_MASK)
        if layer.kind != "identity":
            t.add(f"{layer.name}.out", (batch, *shape), f32, Region.F_FEATURE_FP32)
            t.add(f"{layer.name}.out@grad", (batch, *shape), f32, Region.F_GRAD_SLOT_FP32)
        t.layer_shapes.append((layer.name, in_shape, shape))
    if shape != (num_classes,):
        raise ShapeError(f"plan: the model outputs shape {shape} per sample, but the data has {num_classes} classes. "
                         f"Fix: end the model with fc({num_classes}).")
    t.add("result", (3,), f32, Region.R_RESULT)
    t.add("metrics.sum", (4,), "float64", Region.R_RESULT_ACCUMULATED)
    t.add("loss_log", (max(total_steps, 1),), f32, Region.R_RESULT_ACCUMULATED)
    t.add("lr_table", (max(total_steps, 1),), f32, Region.S_SCALAR_FP32)
    t.add("ones", (batch,), f32, Region.S_SCALAR_FP32)
    t.add("step", (1,), "int64", Region.S_SCALAR_INT32)
    t.add("cursor", (1,), "int64", Region.S_SCALAR_INT32)
    t.add("rng.offset", (1,), "int64", Region.S_SCALAR_INT32)
    t.add("nan.flag", (1,), "int64", Region.S_SCALAR_INT32)
    t.add("nan.skipped", (1,), "int64", Region.S_SCALAR_INT32)
    return t


# ---- graph building ----------------------------------------------------------------------
def _act_name(layer: ArchLayer) -> str:
    return layer.p.get("act", "none")


class _Emitter:
    """Walks the layers and appends their node patterns to a graph."""

    def __init__(self, arch: ArchPlan, ids: dict[str, int]) -> None:
        self.arch = arch
        self.ids = ids

    def out_of(self, index: int, data: int) -> int:
        """The id of the tensor layer ``index`` writes; identity layers alias their input."""
        while index >= 0 and self.arch.layers[index].kind == "identity":
            index -= 1
        return data if index < 0 else self.ids[f"{self.arch.layers[index].name}.out"]

    def grad_of(self, index: int) -> int | None:
        while index >= 0 and self.arch.layers[index].kind == "identity":
            index -= 1
        return None if index < 0 else self.ids[f"{self.arch.layers[index].name}.out@grad"]

    def forward(self, g: ComputationGraph, gid: GraphId, index: int, data: int, training: bool) -> None:
        layer = self.arch.layers[index]
        x = self.out_of(index - 1, data)
        p = layer.p
        if layer.kind == "identity":
            return
        y = self.ids[f"{layer.name}.out"]
        if layer.kind == "fc":
            w = self.ids[f"{layer.name}.weight"]
            ins = [x, w] + ([self.ids[f"{layer.name}.bias"]] if p["bias"] else [])
            g.append(gid, node("fc_fwd", ins, [y], layer.name, act=p["act"], slope=p["slope"]))
        elif layer.kind == "act":
            g.append(gid, node("act_fwd", [x], [y], layer.name, act=p["act"], slope=p["slope"]))
        elif layer.kind == "flatten":
            g.append(gid, node("reshape_copy", [x], [y], layer.name))
        elif layer.kind == "dropout":
            if training and p["p"] > 0:
                m = self.ids[f"{layer.name}.mask"]
                g.append(gid, node("dropout_fwd", [x, self.ids["rng.offset"]], [y, m], layer.name, p=p["p"]))
            else:
                g.append(gid, node("copy", [x], [y], layer.name))

    def backward(self, g: ComputationGraph, gid: GraphId, index: int, data: int) -> None:
        """Gradients of layer ``index``; the first layer computes no input gradient."""
        layer = self.arch.layers[index]
        if layer.kind == "identity":
            return
        p = layer.p
        x = self.out_of(index - 1, data)
        dy = self.ids[f"{layer.name}.out@grad"]
        dx = self.grad_of(index - 1)
        y = self.ids[f"{layer.name}.out"]
        if layer.kind == "fc":
            w = self.ids[f"{layer.name}.weight"]
            dw = self.ids[f"{layer.name}.weight@grad"]
            ins = [dy, x, w, y, self.ids["ones"]]
            outs = [dw] + ([self.ids[f"{layer.name}.bias@grad"]] if p["bias"] else [])
            outs += [dx] if dx is not None else []
            g.append(gid, node("fc_bwd", ins, outs, layer.name, act=p["act"], slope=p["slope"],
                               bias=p["bias"], need_dx=dx is not None))
        elif dx is None:
            return  # a parameter-free first layer has nothing to compute backwards
        elif layer.kind == "act":
            g.append(gid, node("act_bwd", [dy, x], [dx], layer.name, act=p["act"], slope=p["slope"]))
        elif layer.kind == "flatten":
            g.append(gid, node("reshape_copy", [dy], [dx], layer.name))
        elif layer.kind == "dropout":
            if p["p"] > 0:
                g.append(gid, node("mul", [dy, self.ids[f"{layer.name}.mask"]], [dx], layer.name))
            else:
                g.append(gid, node("copy", [dy], [dx], layer.name))

    def loss(self, g: ComputationGraph, gid: GraphId, data: int, smoothing: float, grad: bool) -> None:
        n = len(self.arch.layers)
        logits = self.out_of(n - 1, data)
        outs = [self.ids["result"]] + ([self.grad_of(n - 1)] if grad else [])
        g.append(gid, node("softmax_xent", [logits, self.ids["labels"]], outs, "loss",
                           smoothing=smoothing, grad=grad))


@dataclass(frozen=True)
class StepOptions:
    """What the step graphs contain besides forward/backward."""

    smoothing: float
    optimizer: tuple[tuple[str, Any], ...]  # ('kind', 'adamw'), hyper-parameters
    zero_grad: bool = False
    nan_check: bool = True
    nan_policy: str = "raise"  # or "skip": skip the update and count it (what loss scaling needs)


def emit_training_graph(arch: ArchPlan, ids: dict[str, int], opts: StepOptions,
                        g_range: tuple[str, str]) -> ComputationGraph:
    """The training graph: transfer, first-layer fwd/bwd (A and B), deep fwd+bwd, metrics, optimizer."""
    g = ComputationGraph("train")
    e = _Emitter(arch, ids)
    bufs = {"A": (ids["I_A.data"], ids["I_A.label"]), "B": (ids["I_B.data"], ids["I_B.label"])}
    for ab, (data, label) in bufs.items():
        g.append(GraphId[f"TRANSFER_{ab}"], node("transfer", [ids["cursor"]], [data, label], "data", source="train"))
        fwd = GraphId[f"FIRST_LAYER_FWD_{ab}"]
        g.append(fwd, node("copy", [label], [ids["labels"]], "data"))
        e.forward(g, fwd, 0, data, training=True)
        e.backward(g, GraphId[f"FIRST_LAYER_BWD_{ab}"], 0, data)
    deep = GraphId.DEEP_FWD_BWD
    data_any = ids["I_A.data"]  # unused by deep layers: layer 0's output is their input
    for i in range(1, len(arch.layers)):
        e.forward(g, deep, i, data_any, training=True)
    e.loss(g, deep, data_any, opts.smoothing, grad=True)
    for i in range(len(arch.layers) - 1, 0, -1):
        e.backward(g, deep, i, data_any)
    if opts.zero_grad:
        g.append(GraphId.ZERO_GRAD, node("zero_range", [], [], "grads", first=g_range[0], last=g_range[1]))
    if opts.nan_check:
        g.append(GraphId.CAST_AND_CHECK, node("nan_check", [ids["result"], ids["step"]],
                                              [ids["nan.flag"], ids["nan.skipped"]], "grads", policy=opts.nan_policy,
                                              first=g_range[0], last=g_range[1]))
    acc_in = [ids["result"], ids["step"]]
    acc_out = [ids["metrics.sum"], ids["loss_log"]]
    for gid in (GraphId.ACCUM_METRICS, GraphId.ACCUM_METRICS_TRAIN_LAST):
        g.append(gid, node("accum_metrics", acc_in, acc_out, "metrics", log=True))
    g.append(GraphId.CLEAR_METRICS, node("fill", [], [ids["metrics.sum"]], "metrics", value=0.0))
    g.append(GraphId.OPTIMIZER, node("optimizer", [ids["lr_table"], ids["nan.flag"]], [ids["step"]], "optimizer",
                                     **dict(opts.optimizer)))
    return g


def emit_inference_graph(arch: ArchPlan, ids: dict[str, int], smoothing: float) -> ComputationGraph:
    """The inference graph: transfer, whole forward (dropout off), loss and metrics."""
    g = ComputationGraph("inference")
    e = _Emitter(arch, ids)
    for ab in ("A", "B"):
        data, label = ids[f"I_{ab}.data"], ids[f"I_{ab}.label"]
        g.append(GraphId[f"TRANSFER_{ab}"], node("transfer", [ids["cursor"]], [data, label], "data", source="val"))
        gid = GraphId[f"INF_MAIN_{ab}"]
        g.append(gid, node("copy", [label], [ids["labels"]], "data"))
        for i in range(len(arch.layers)):
            e.forward(g, gid, i, data, training=False)
        e.loss(g, gid, data, smoothing, grad=False)
    for gid in (GraphId.ACCUM_METRICS, GraphId.ACCUM_METRICS_VAL_LAST):
        g.append(gid, node("accum_metrics", [ids["result"], ids["step"]], [ids["metrics.sum"]], "metrics", log=False))
    g.append(GraphId.CLEAR_METRICS, node("fill", [], [ids["metrics.sum"]], "metrics", value=0.0))
    return g

"""Per-layer descriptors: which tensors a layer needs, and its forward, backward
and inference node patterns.

``plan_architecture`` turns a BluePrint into an ArchPlan: executable layers in
topological order, each naming the tensors it reads (``"input"`` or another
layer's output), named like PyTorch modules would be (conv1, bn1, fc1, ...).
Residual ``add2`` makes the graph a DAG: a tensor read by two layers gets its
gradient from both, summed before its producer's backward runs. An activation
that directly follows an fc, conv or bn whose output nothing else reads is fused
into it (one pass fewer, one feature map fewer).

``tensor_table`` lists every tensor of a task for one variant; it runs the same
code for every variant, which is what guarantees the same tensors in the same
order, names and regions, with only shapes differing. Feature maps are
channels-last (N, H, W, C): see kernels/conv.py for why.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from ..blueprint import ACTIVATIONS, Add2, BluePrint, Layer, Named, Repeat, Seq
from ..errors import ShapeError
from ..memory.region import Region
from .graph import ComputationGraph, node
from .ids import GraphId

FUSABLE = {"fc": ("relu", "tanh", "sigmoid", "leaky_relu"), "conv": ("relu",), "bn": ("relu",)}
PARAM_KINDS = ("fc", "conv", "bn")


@dataclass(frozen=True)
class ArchLayer:
    """One executable layer after fusion; reads ``inputs``, writes ``<name>.out``."""

    name: str
    kind: str  # fc | act | dropout | flatten | conv | bn | maxpool | avgpool | gap | add
    params: tuple[tuple[str, Any], ...]
    inputs: tuple[str, ...] = ("input",)

    @property
    def p(self) -> dict[str, Any]:
        return dict(self.params)

    @property
    def output(self) -> str:
        return f"{self.name}.out"

    def describe(self) -> str:
        p = self.p
        act = p.get("act", "none")
        fused = f" + {act} (fused)" if act != "none" and self.kind != "act" else ""
        src = ", ".join(self.inputs)
        if self.kind == "fc":
            core = f"fc({p['out']}, bias={p['bias']})"
        elif self.kind == "conv":
            core = f"conv({p['out']}, k={p['k']}, s={p['s']}, p={p['p']}" + ("" if p["bias"] else ", bias=False") + ")"
        elif self.kind == "act":
            core = p["act"]
        elif self.kind == "dropout":
            core = f"dropout(p={p['p']})"
        elif self.kind in ("maxpool", "avgpool"):
            core = f"{self.kind}(k={p['k']}, s={p['s']}, p={p['p']})"
        else:
            core = self.kind
        return f"{self.name}: {core}{fused}  <- {src}"


@dataclass(frozen=True)
class ArchPlan:
    """The BluePrint as executable layers, with the fusions the compiler made."""

    blueprint: BluePrint
    layers: tuple[ArchLayer, ...]
    fused: tuple[str, ...]

    @property
    def param_layers(self) -> list[ArchLayer]:
        return [l for l in self.layers if l.kind in PARAM_KINDS]

    @property
    def reads_image_layout(self) -> bool:
        """Whether which input axis holds the channels changes the result: some layer other than
        flatten or fc reads the input through element-wise layers only (act, dropout, add)."""
        agnostic = {"input"}
        for layer in self.layers:
            if not agnostic.intersection(layer.inputs):
                continue
            if layer.kind in ("act", "dropout", "add"):
                agnostic.add(layer.name)
            elif layer.kind not in ("flatten", "fc"):
                return True
        return False

    @property
    def output(self) -> str:
        return self.layers[-1].output

    def consumers(self) -> dict[str, int]:
        """How many layers read each tensor."""
        c: dict[str, int] = {}
        for l in self.layers:
            for t in l.inputs:
                c[t] = c.get(t, 0) + 1
        return c

    def __repr__(self) -> str:
        lines = [f"ArchPlan: {len(self.layers)} executable layers from {len(self.blueprint.leaves())} declared"]
        lines += [f"  {l.describe()}" for l in self.layers]
        if self.fused:
            lines.append("  fused: " + ", ".join(self.fused))
        return "\n".join(lines)


def plan_architecture(bp: BluePrint, fuse: bool = True) -> ArchPlan:
    """Walk the BluePrint into named layers (a DAG for add2), then fuse activations."""
    counters: dict[str, int] = {}
    layers: list[ArchLayer] = []

    def add(kind: str, label: str, params: tuple, inputs: tuple[str, ...]) -> str:
        counters[label] = counters.get(label, 0) + 1
        layer = ArchLayer(f"{label}{counters[label]}", kind, params, inputs)
        layers.append(layer)
        return layer.output

    def walk(b: BluePrint, x: str) -> str:
        if isinstance(b, Layer):
            k = b.kind
            if k == "identity":
                return x
            if k in ACTIVATIONS:
                slope = b.p.get("negative_slope", 0.0)
                return add("act", k, (("act", k), ("slope", slope)), (x,))
            if k in ("fc", "conv", "bn"):
                return add(k, k, tuple(sorted({**b.p, "act": "none", "slope": 0.0}.items())), (x,))
            if k in ("dropout", "flatten", "maxpool", "avgpool", "gap"):
                return add(k, k, b.params, (x,))
            raise ShapeError(f"plan: layer kind {k!r} is not supported by the CPU engine. "
                             "Fix: use fc, conv, bn, pooling, activations, dropout, flatten or identity.")
        if isinstance(b, Seq):
            for c in b.children:
                x = walk(c, x)
            return x
        if isinstance(b, Repeat):
            for _ in range(b.n):
                x = walk(b.body, x)
            return x
        if isinstance(b, Add2):
            a = walk(b.shortcut, x)
            m = walk(b.main, x)
            return add("add", "add", (), (a, m))
        if isinstance(b, Named):
            return walk(b.body, x)
        raise ShapeError(f"plan: {type(b).__name__} is not a BluePrint node the compiler knows.")

    walk(bp, "input")
    if not layers:
        raise ShapeError("plan: the model has no executable layers (only identity). Fix: add at least fc(classes).")
    fused: list[str] = []
    if fuse:
        layers, fused = _fuse_activations(layers)
    return ArchPlan(bp, tuple(layers), tuple(fused))


def _fuse_activations(layers: list[ArchLayer]) -> tuple[list[ArchLayer], list[str]]:
    """Fold an activation into the fc/conv/bn right before it when nothing else reads that output."""
    consumers: dict[str, int] = {}
    for l in layers:
        for t in l.inputs:
            consumers[t] = consumers.get(t, 0) + 1
    by_out = {l.output: i for i, l in enumerate(layers)}
    out: list[ArchLayer | None] = list(layers)
    rename: dict[str, str] = {}
    fused = []
    for i, l in enumerate(layers):
        if l.kind != "act" or len(l.inputs) != 1:
            continue
        src = l.inputs[0]
        j = by_out.get(src)
        if j is None or consumers.get(src) != 1:
            continue
        prod = out[j]
        if prod is None or prod.kind not in FUSABLE or prod.p.get("act") != "none":
            continue
        if l.p["act"] not in FUSABLE[prod.kind]:
            continue
        params = dict(prod.params)
        params.update(act=l.p["act"], slope=l.p["slope"])
        out[j] = replace(prod, params=tuple(sorted(params.items())))
        out[i] = None
        rename[l.output] = prod.output
        fused.append(f"{prod.name}+{l.p['act']}")
    result = []
    for l in out:
        if l is None:
            continue
        result.append(replace(l, inputs=tuple(rename.get(t, t) for t in l.inputs)))
    return result, fused


@dataclass(frozen=True)
class TensorSpec:
    """A tensor before placement: the unit the compiler compares across variants."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    region: Region


@dataclass(frozen=True)
class ParamInfo:
    """A parameter or buffer: where it lives and how it is initialised."""

    layer: str
    role: str  # weight | bias | running_mean | running_var
    shape: tuple[int, ...]
    fan_in: int
    init: str = "uniform"  # uniform(+-1/sqrt(fan_in)) | ones | zeros
    trainable: bool = True

    @property
    def name(self) -> str:
        return f"{self.layer}.{self.role}"


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


def internal_sample_shape(sample_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Data samples are (C, H, W) like PyTorch; the arena keeps them channels-last (H, W, C)."""
    if len(sample_shape) == 3:
        c, h, w = sample_shape
        return (h, w, c)
    return tuple(sample_shape)


def _pool_out(where: str, n: int, k: int, s: int, p: int) -> int:
    o = (n + 2 * p - k) // s + 1
    if o < 1:
        raise ShapeError(f"plan: {where} gets spatial size {n}, too small for k={k}, s={s}, p={p}. "
                         "Fix: use a larger input, a smaller kernel, or fewer downsampling layers.")
    return o


CLIP_BLOCKS = 264
"""Blocks of the CUDA backend's gradient-norm sum (two per SM of an H100/H200): a fixed count, so
its partial sums, added in block order, give the same norm on every GPU."""


def tensor_table(arch: ArchPlan, batch: int, sample_shape: tuple[int, ...], num_classes: int,
                 opt_state: tuple[str, ...], total_steps: int, ema: bool = False, clip: bool = False,
                 class_weights: bool = False) -> TensorTable:
    """Every tensor of a task for one variant, in a fixed order.

    ``opt_state`` lists the optimizer families needed besides W and G ("M", "V");
    ``ema`` adds E_ copies of the parameters (and EMA-folded BN parameters); ``clip`` the
    gradient-norm scalars of clip_grad_norm; ``class_weights`` the loss's per-class weights.
    """
    t = TensorTable()
    f32, i32 = "float32", "int32"
    xshape = internal_sample_shape(sample_shape)
    t.add("I_A.label", (batch,), i32, Region.I_A_LABEL)
    t.add("I_A.data", (batch, *xshape), f32, Region.I_A_DATA)
    t.add("I_B.label", (batch,), i32, Region.I_B_LABEL)
    t.add("I_B.data", (batch, *xshape), f32, Region.I_B_DATA)
    t.add("labels", (batch,), i32, Region.T_TEMP_INT32)
    shapes: dict[str, tuple[int, ...]] = {"input": xshape}
    consumers = arch.consumers()
    if consumers.get("input", 0) != 1 or arch.layers[0].inputs != ("input",):
        raise ShapeError("plan: the model's input must be read by exactly one first layer (the original's "
                         "FIRST_LAYER graphs). Fix: start the model with one layer, e.g. a conv or fc, before add2.")

    def param(layer: str, role: str, shape: tuple[int, ...], kind: str, fan_in: int, init: str) -> None:
        base = f"{layer}.{role}"
        t.add(base, shape, f32, Region[f"W_{kind}"])
        t.add(f"{base}@grad", shape, f32, Region[f"G_{kind}"])
        for fam in opt_state:
            t.add(f"{base}@{fam.lower()}", shape, f32, Region[f"{fam}_{kind}"])
        if ema:
            t.add(f"{base}@ema", shape, f32, Region[f"E_{kind}"])
        t.params.append(ParamInfo(layer, role, shape, fan_in, init))

    for idx, layer in enumerate(arch.layers):
        p = layer.p
        ins = [shapes[x] for x in layer.inputs]
        x = ins[0]
        if layer.kind == "fc":
            if len(x) != 1:
                raise ShapeError(f"plan: {layer.name} (fc) gets input of shape {x}; fc needs flat features. "
                                 "Fix: put flatten() or gap() before it.")
            fan_in, out = x[0], p["out"]
            if p["bias"]:
                param(layer.name, "bias", (out,), "FC_BIAS", fan_in, "uniform")
            param(layer.name, "weight", (out, fan_in), "FC_WEIGHT", fan_in, "uniform")
            y = (out,)
        elif layer.kind == "conv":
            if len(x) != 3:
                raise ShapeError(f"plan: {layer.name} (conv) gets input of shape {x}; conv needs images. "
                                 "Fix: load the data with layout='image' (N, C, H, W).")
            h, w, c = x
            k, s, pad, out = p["k"], p["s"], p["p"], p["out"]
            ho, wo = _pool_out(layer.name, h, k, s, pad), _pool_out(layer.name, w, k, s, pad)
            kind = "FIRST_CONV" if layer.inputs == ("input",) else "DEEP_CONV"
            if p["bias"]:
                param(layer.name, "bias", (out,), "FC_BIAS", c * k * k, "uniform")
            param(layer.name, "weight", (out, k, k, c), kind, c * k * k, "uniform")
            t.add(f"{layer.name}.cols", (batch * ho * wo, k * k * c), f32, Region.T_TEMP_FP32)
            if idx > 0:
                t.add(f"{layer.name}.dcols", (batch * ho * wo, k * k * c), f32, Region.T_TEMP_FP32)
            y = (ho, wo, out)
        elif layer.kind == "bn":
            c = x[-1]
            param(layer.name, "bias", (c,), "BN_BIAS", c, "zeros")
            param(layer.name, "weight", (c,), "BN_WEIGHT", c, "ones")
            t.add(f"{layer.name}.running_mean", (c,), f32, Region.B_PREV_MEAN)
            t.add(f"{layer.name}.running_var", (c,), f32, Region.B_PREV_VAR)
            t.params.append(ParamInfo(layer.name, "running_mean", (c,), c, "zeros", False))
            t.params.append(ParamInfo(layer.name, "running_var", (c,), c, "ones", False))
            t.add(f"{layer.name}.mean", (c,), f32, Region.T_TEMP_FP32)
            t.add(f"{layer.name}.invstd", (c,), f32, Region.T_TEMP_FP32)
            t.add(f"{layer.name}.eq_scale", (c,), f32, Region.W_EQ_SCALE)
            t.add(f"{layer.name}.eq_bias", (c,), f32, Region.W_EQ_BIAS)
            if ema:  # the EMA model's own running statistics (an EMA of the model's), folded separately
                t.add(f"{layer.name}.running_mean@ema", (c,), f32, Region.B_NEXT_MEAN)
                t.add(f"{layer.name}.running_var@ema", (c,), f32, Region.B_NEXT_VAR)
                t.add(f"{layer.name}.eq_scale@ema", (c,), f32, Region.W_EQ_SCALE)
                t.add(f"{layer.name}.eq_bias@ema", (c,), f32, Region.W_EQ_BIAS)
            if idx == 0:
                t.add("input@grad", (batch, *x), f32, Region.F_GRAD_SLOT_FP32)
            y = x
        elif layer.kind in ("maxpool", "avgpool"):
            if len(x) != 3:
                raise ShapeError(f"plan: {layer.name} ({layer.kind}) needs image features, got shape {x}. "
                                 "Fix: pool before flatten.")
            h, w, c = x
            y = (_pool_out(layer.name, h, p["k"], p["s"], p["p"]), _pool_out(layer.name, w, p["k"], p["s"], p["p"]), c)
            if layer.kind == "maxpool":
                t.add(f"{layer.name}.argmax", (batch, *y), i32, Region.T_TEMP_INT32)
        elif layer.kind == "gap":
            if len(x) != 3:
                raise ShapeError(f"plan: {layer.name} (gap) needs image features, got shape {x}.")
            y = (x[-1],)
        elif layer.kind == "flatten":
            y = (int(math.prod(x)),)
        elif layer.kind == "add":
            if ins[0] != ins[1]:
                raise ShapeError(f"plan: {layer.name} (add2) sums shapes {ins[0]} and {ins[1]}. "
                                 "Fix: make the shortcut match the main branch (e.g. a strided 1x1 conv).")
            y = x
        elif layer.kind == "dropout":
            t.add(f"{layer.name}.mask", (batch, *x), f32, Region.S_MASK)
            y = x
        else:  # act
            y = x
        shapes[layer.output] = y
        t.add(layer.output, (batch, *y), f32, Region.F_FEATURE_FP32)
        t.add(f"{layer.output}@grad", (batch, *y), f32, Region.F_GRAD_SLOT_FP32)
        for j in range(1, consumers.get(layer.output, 0)):
            t.add(f"{layer.output}@grad#{j}", (batch, *y), f32, Region.F_GRAD_SLOT_FP32)
        t.layer_shapes.append((layer.name, x, y))
    if shapes[arch.output] != (num_classes,):
        raise ShapeError(f"plan: the model outputs shape {shapes[arch.output]} per sample, but the data has "
                         f"{num_classes} classes. Fix: end the model with fc({num_classes}).")
    t.add("result", (3,), f32, Region.R_RESULT)
    t.add("metrics.sum", (4,), "float64", Region.R_RESULT_ACCUMULATED)
    t.add("loss_log", (max(total_steps, 1),), f32, Region.R_RESULT_ACCUMULATED)
    t.add("lr_table", (max(total_steps, 1),), f32, Region.S_SCALAR_FP32)
    t.add("ones", (batch,), f32, Region.S_SCALAR_FP32)
    if class_weights:  # CrossEntropyLoss(weight=...), written at compile time like lr_table
        t.add("loss.weight", (num_classes,), f32, Region.S_SCALAR_FP32)
    for name in ("step", "cursor", "rng.offset", "aug.offset", "nan.flag", "nan.skipped"):
        t.add(name, (1,), "int64", Region.S_SCALAR_INT32)
    if clip:  # [total norm before clipping, the factor applied] of the last step; the GPU's partial sums
        t.add("clip.norm", (2,), f32, Region.S_SCALAR_FP32)
        t.add("clip.partials", (CLIP_BLOCKS,), "float64", Region.R_RESULT_ACCUMULATED)
    return t


# ---- graph building ----------------------------------------------------------------------
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


class _Emitter:
    """Emits each layer's node patterns; tensor names resolve to ids, "input" to the data buffer."""

    def __init__(self, arch: ArchPlan, ids: dict[str, int]) -> None:
        self.arch = arch
        self.ids = ids
        self.consumers = arch.consumers()

    def tid(self, name: str, data: int) -> int:
        return data if name == "input" else self.ids[name]

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
                                    ids[f"{layer.name}.running_mean"], ids[f"{layer.name}.running_var"]],
                                   layer.name, momentum=p["momentum"], eps=p["eps"], act=p["act"]))
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
            g.append(gid, node("fc_bwd", [dy, x, ids[f"{layer.name}.weight"], y, ids["ones"]], outs, layer.name,
                               act=p["act"], slope=p["slope"], bias=p["bias"], need_dx=dx is not None))
        elif k == "conv":
            outs = [ids[f"{layer.name}.weight@grad"]] + ([ids[f"{layer.name}.bias@grad"]] if p["bias"] else [])
            if dx is not None:
                outs += [dx, ids[f"{layer.name}.dcols"]]
            g.append(gid, node("conv_bwd", [dy, x, ids[f"{layer.name}.weight"], ids[f"{layer.name}.cols"], y], outs,
                               layer.name, k=p["k"], s=p["s"], p=p["p"], bias=p["bias"], act=p["act"],
                               need_dx=dx is not None))
        elif k == "bn":
            g.append(gid, node("bn_bwd", [dy, x, y, ids[f"{layer.name}.weight"], ids[f"{layer.name}.mean"],
                                          ids[f"{layer.name}.invstd"]],
                               [dx, ids[f"{layer.name}.weight@grad"], ids[f"{layer.name}.bias@grad"]], layer.name,
                               act=p["act"]))
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


def _transfer(g: ComputationGraph, ids: dict[str, int], ab: str, source: str, opts: StepOptions,
              augment: bool) -> None:
    data, label = ids[f"I_{ab}.data"], ids[f"I_{ab}.label"]
    gid = GraphId[f"TRANSFER_{ab}"]
    if not opts.image:
        g.append(gid, node("transfer", [ids["cursor"]], [data, label], "data", source=source))
        return
    op = "transfer_image_async" if opts.prefetch else "transfer_image"
    g.append(gid, node(op, [ids["cursor"], ids["aug.offset"]], [data, label], "data", source=source,
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
    for layer in reversed(deep):
        e.backward(g, gid, layer, data_any, seen)
    for ab in ("A", "B"):
        e.backward(g, GraphId[f"FIRST_LAYER_BWD_{ab}"], first, ids[f"I_{ab}.data"], dict(seen))
    if opts.zero_grad:
        g.append(GraphId.ZERO_GRAD, node("zero_range", [], [], "grads", first=g_range[0], last=g_range[1]))
    if opts.nan_check:
        g.append(GraphId.CAST_AND_CHECK, node("nan_check", [ids["result"], ids["step"]],
                                              [ids["nan.flag"], ids["nan.skipped"]], "grads", policy=opts.nan_policy,
                                              first=g_range[0], last=g_range[1]))
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

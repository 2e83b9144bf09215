"""Per-layer descriptors and the tensors each variant allocates for them; emit.py builds
the layers' forward, backward and inference node patterns from these.

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
from ..kernels.operands import CONV_THREADS, PAR_CHUNKS, conv_scratch_shape, conv_tiles
from ..memory.region import Region

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


CONV_DW_PARTIALS = CONV_THREADS - 1
"""Weight-gradient partials of a tiled conv backward (kernels/conv_tiled.py): one per numba thread
after the first, so the tiled backward runs on at most CONV_DW_PARTIALS + 1 threads."""
CLIP_BLOCKS = 264
"""Blocks of the CUDA backend's gradient-norm sum (two per SM of an H100/H200): a fixed count, so
its partial sums, added in block order, give the same norm on every GPU."""


BN_SCRATCH = (("stat_sums", (PAR_CHUNKS + 1, 2), "float64"), ("affine", (2,), "float32"),
              ("grad_sums", (PAR_CHUNKS + 1, 2), "float64"), ("grad_coef", (3,), "float64"))
"""A batch norm's scratch, (role, leading shape, dtype), C channels last: the forward's shifted
sums (row 0 the total, then one row per block) and affine scale/shift; the backward's gradient
sums and dx coefficients."""
BN_FWD_SCRATCH = ("stat_sums", "affine")
BN_BWD_SCRATCH = ("grad_sums", "grad_coef")



class _LayerTensors:
    """The tensors one layer adds to a variant's table besides its output and gradient slots:
    parameters (with their gradient, optimizer-state and EMA copies), scratch and BN buffers."""

    def __init__(self, t: TensorTable, batch: int, opt_state: tuple[str, ...], ema: bool) -> None:
        self.t, self.batch, self.opt_state, self.ema = t, batch, opt_state, ema

    def param(self, layer: str, role: str, shape: tuple[int, ...], kind: str, fan_in: int, init: str) -> None:
        t, f32 = self.t, "float32"
        base = f"{layer}.{role}"
        t.add(base, shape, f32, Region[f"W_{kind}"])
        t.add(f"{base}@grad", shape, f32, Region[f"G_{kind}"])
        for fam in self.opt_state:
            t.add(f"{base}@{fam.lower()}", shape, f32, Region[f"{fam}_{kind}"])
        if self.ema:
            t.add(f"{base}@ema", shape, f32, Region[f"E_{kind}"])
        t.params.append(ParamInfo(layer, role, shape, fan_in, init))

    def layer(self, idx: int, layer: ArchLayer, ins: list[tuple[int, ...]]) -> tuple[int, ...]:
        """Add ``layer``'s own tensors; return its per-sample output shape."""
        p, x, t, batch = layer.p, ins[0], self.t, self.batch
        if layer.kind == "fc":
            return self.fc(layer, x)
        if layer.kind == "conv":
            return self.conv(idx, layer, x)
        if layer.kind == "bn":
            return self.bn(idx, layer, x)
        if layer.kind in ("maxpool", "avgpool"):
            if len(x) != 3:
                raise ShapeError(f"plan: {layer.name} ({layer.kind}) needs image features, got shape {x}. "
                                 "Fix: pool before flatten.")
            h, w, c = x
            y = (_pool_out(layer.name, h, p["k"], p["s"], p["p"]), _pool_out(layer.name, w, p["k"], p["s"], p["p"]), c)
            if layer.kind == "maxpool":
                t.add(f"{layer.name}.argmax", (batch, *y), "int32", Region.T_TEMP_INT32)
            return y
        if layer.kind == "gap":
            if len(x) != 3:
                raise ShapeError(f"plan: {layer.name} (gap) needs image features, got shape {x}.")
            return (x[-1],)
        if layer.kind == "flatten":
            return (int(math.prod(x)),)
        if layer.kind == "add" and ins[0] != ins[1]:
            raise ShapeError(f"plan: {layer.name} (add2) sums shapes {ins[0]} and {ins[1]}. "
                             "Fix: make the shortcut match the main branch (e.g. a strided 1x1 conv).")
        if layer.kind == "dropout":
            t.add(f"{layer.name}.mask", (batch, *x), "float32", Region.S_MASK)
        return x  # add, dropout, act

    def fc(self, layer: ArchLayer, x: tuple[int, ...]) -> tuple[int, ...]:
        if len(x) != 1:
            raise ShapeError(f"plan: {layer.name} (fc) gets input of shape {x}; fc needs flat features. "
                             "Fix: put flatten() or gap() before it.")
        p = layer.p
        fan_in, out = x[0], p["out"]
        if p["bias"]:
            self.param(layer.name, "bias", (out,), "FC_BIAS", fan_in, "uniform")
        self.param(layer.name, "weight", (out, fan_in), "FC_WEIGHT", fan_in, "uniform")
        if p["bias"]:
            self.bias_partials(layer.name, out)
        return (out,)

    def conv(self, idx: int, layer: ArchLayer, x: tuple[int, ...]) -> tuple[int, ...]:
        if len(x) != 3:
            raise ShapeError(f"plan: {layer.name} (conv) gets input of shape {x}; conv needs images. "
                             "Fix: load the data with layout='image' (N, C, H, W).")
        p, t, batch = layer.p, self.t, self.batch
        h, w, c = x
        k, s, pad, out = p["k"], p["s"], p["p"], p["out"]
        ho, wo = _pool_out(layer.name, h, k, s, pad), _pool_out(layer.name, w, k, s, pad)
        kind = "FIRST_CONV" if layer.inputs == ("input",) else "DEEP_CONV"
        if p["bias"]:
            self.param(layer.name, "bias", (out,), "FC_BIAS", c * k * k, "uniform")
        self.param(layer.name, "weight", (out, k, k, c), kind, c * k * k, "uniform")
        cols = conv_scratch_shape(batch, ho, wo, k, s, pad, c)  # the tiles' columns, not the whole im2col matrix
        t.add(f"{layer.name}.cols", cols, "float32", Region.T_TEMP_FP32)
        if conv_tiles(k, s, pad, c):  # the backward makes its columns again, a tile at a time: x's, then dy W's
            t.add(f"{layer.name}.bwd_cols", cols, "float32", Region.T_TEMP_FP32)
        elif idx > 0:
            t.add(f"{layer.name}.dcols", cols, "float32", Region.T_TEMP_FP32)
        if p["bias"]:
            self.bias_partials(layer.name, out)
        if conv_tiles(k, s, pad, c):
            t.add(f"{layer.name}.dw_partials", (CONV_DW_PARTIALS, out, k * k * c), "float32", Region.T_TEMP_FP32)
        return (ho, wo, out)

    def bias_partials(self, layer: str, out: int) -> None:
        """The float64 row-block sums of a bias gradient (the backward pre-pass's scratch)."""
        self.t.add(f"{layer}.bias_partials", (PAR_CHUNKS, out), "float64", Region.T_TEMP_FP32)

    def bn(self, idx: int, layer: ArchLayer, x: tuple[int, ...]) -> tuple[int, ...]:
        t, f32, n = self.t, "float32", layer.name
        c = x[-1]
        self.param(n, "bias", (c,), "BN_BIAS", c, "zeros")
        self.param(n, "weight", (c,), "BN_WEIGHT", c, "ones")
        t.add(f"{n}.running_mean", (c,), f32, Region.B_PREV_MEAN)
        t.add(f"{n}.running_var", (c,), f32, Region.B_PREV_VAR)
        t.params.append(ParamInfo(n, "running_mean", (c,), c, "zeros", False))
        t.params.append(ParamInfo(n, "running_var", (c,), c, "ones", False))
        t.add(f"{n}.mean", (c,), f32, Region.T_TEMP_FP32)
        t.add(f"{n}.invstd", (c,), f32, Region.T_TEMP_FP32)
        for role, shape, dtype in BN_SCRATCH:  # the kernels' sums and coefficients
            t.add(f"{n}.{role}", (*shape, c), dtype, Region.T_TEMP_FP32)
        t.add(f"{n}.eq_scale", (c,), f32, Region.W_EQ_SCALE)
        t.add(f"{n}.eq_bias", (c,), f32, Region.W_EQ_BIAS)
        if self.ema:  # the EMA model's own running statistics (an EMA of the model's), folded separately
            t.add(f"{n}.running_mean@ema", (c,), f32, Region.B_NEXT_MEAN)
            t.add(f"{n}.running_var@ema", (c,), f32, Region.B_NEXT_VAR)
            t.add(f"{n}.eq_scale@ema", (c,), f32, Region.W_EQ_SCALE)
            t.add(f"{n}.eq_bias@ema", (c,), f32, Region.W_EQ_BIAS)
        if idx == 0:
            t.add("input@grad", (self.batch, *x), f32, Region.F_GRAD_SLOT_FP32)
        return x


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
    alloc = _LayerTensors(t, batch, opt_state, ema)
    for idx, layer in enumerate(arch.layers):
        ins = [shapes[x] for x in layer.inputs]
        x = ins[0]
        y = alloc.layer(idx, layer, ins)
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
    t.add("nan.partials", (PAR_CHUNKS,), f32, Region.T_TEMP_FP32)  # the NaN probe's per-block results
    if len(sample_shape) == 3:  # image batches: each buffer's claimed (start, aug_base) for prefetching
        t.add("I_A.claim", (2,), "int64", Region.S_SCALAR_INT32)
        t.add("I_B.claim", (2,), "int64", Region.S_SCALAR_INT32)
    if clip:  # [total norm before clipping, the factor applied] of the last step; the GPU's partial sums
        t.add("clip.norm", (2,), f32, Region.S_SCALAR_FP32)
        t.add("clip.partials", (CLIP_BLOCKS,), "float64", Region.R_RESULT_ACCUMULATED)
    return t

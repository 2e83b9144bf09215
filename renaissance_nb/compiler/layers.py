"""Per-layer descriptors and the tensors each variant allocates for them; emit.py builds
the layers' forward, backward and inference node patterns from these.

``plan_architecture`` turns a BluePrint into an ArchPlan: executable layers in
topological order, each naming the tensors it reads (``"input"`` or another
layer's output), named like PyTorch modules would be (conv1, bn1, fc1, ...).
Residual ``add2`` makes the graph a DAG: a tensor read by two layers gets its
gradient from both, summed before its producer's backward runs. An activation
that directly follows an fc, conv or bn (or a ReLU after an add) whose output nothing else reads is fused
into it (one pass fewer, one feature map fewer).

``tensor_table`` lists every tensor of a task for one variant; it runs the same
code for every variant, which is what guarantees the same tensors in the same
order, names and regions, with only shapes differing. Feature maps are
channels-last (N, H, W, C): see kernels/conv.py for why.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from ..blueprint_nodes import Add2, BluePrint, Layer, Named, Repeat, Seq
from ..errors import ShapeError
from ..kernels.operands import PAR_CHUNKS
from ..memory.region import Region
from ..ops import conv_bn, pool
from .autocast import feature_regions, output_dtype
from .recompute import SUFFIX as RECOMPUTE
from .recompute import twins as recompute_twins
from ..ops.registry import op_for_layer, op_of


@dataclass(frozen=True)
class ArchLayer:
    """One executable layer after fusion; reads ``inputs``, writes ``<name>.out``."""

    name: str
    kind: str  # an op's kind (ops/registry.py): fc, act, conv, bn, maxpool, add...
    params: tuple[tuple[str, Any], ...]
    inputs: tuple[str, ...] = ("input",)
    block: str = ""
    """The outermost pre-fused block it came from, numbered ("transformer_block(128, 4) #2"), or "" (the
    memory inspector groups live bytes by it)."""

    @property
    def p(self) -> dict[str, Any]:
        return dict(self.params)

    @property
    def output(self) -> str:
        return f"{self.name}.out"

    @property
    def fused_act(self) -> str:
        """The activation the compiler folded into this layer's pass ("none" when none was)."""
        op = op_of(self.kind)
        act = self.p.get("act", "none")
        return act if op.fuses else "none"

    def describe(self) -> str:
        act = self.fused_act
        fused = f" + {act} (fused)" if act != "none" else ""
        return f"{self.name}: {op_of(self.kind).describe(self.p)}{fused}  <- {', '.join(self.inputs)}"


@dataclass(frozen=True)
class ArchPlan:
    """The BluePrint as executable layers, with the fusions the compiler made."""

    blueprint: BluePrint
    layers: tuple[ArchLayer, ...]
    fused: tuple[str, ...]
    folded: tuple[tuple[str, str], ...] = ()
    """(conv, bn) pairs that run as one convolution at inference (options(fold_bn=True), ops/conv_bn.py)."""
    expects: tuple[tuple[str, str, int], ...] = ()
    """(tensor, block label, channels): a block built for an input width (MBCONV's cin) reads that tensor."""
    merged: tuple[tuple[str, str], ...] = ()
    """(a fused activation's output, the producer's output that holds its value): relu5.out -> add2.out; the
    memory plans name them where a name that fusion removed is asked for."""

    @property
    def param_layers(self) -> list[ArchLayer]:
        return [l for l in self.layers if op_of(l.kind).parametrized]

    @property
    def reads_image_layout(self) -> bool:
        """Whether which input axis holds the channels changes the result: some layer that is not a
        flat one (flatten, fc) reads the input through element-wise layers only (act, dropout, add)."""
        agnostic = {"input"}
        for layer in self.layers:
            if not agnostic.intersection(layer.inputs):
                continue
            layout = op_of(layer.kind).layout
            if layout == "elementwise":
                agnostic.add(layer.name)
            elif layout != "flat":
                return True
        return False

    @property
    def output(self) -> str:
        return self.layers[-1].output

    @cached_property
    def relu_pools(self) -> dict[str, str]:
        """{layer: max pool} whose ReLU the pool's backward differentiates (ops/pool.py relu_pool_pairs), once
        per plan: emission asks for every conv, batch norm and pool."""
        return pool.relu_pool_pairs(self)

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
        pooled = self.relu_pools
        if pooled:
            pairs = ", ".join(f"{a} -> {b}" for a, b in pooled.items())
            lines.append(f"  relu gradient in the pool's backward: {pairs}")
        if self.folded:
            lines.append("  folded at inference: " + ", ".join(f"{c}+{b}" for c, b in self.folded))
        return "\n".join(lines)


def plan_architecture(bp: BluePrint, fuse: bool = True, fold_bn: bool = False) -> ArchPlan:
    """Walk the BluePrint into named layers (a DAG for add2), then fuse activations; with ``fold_bn``,
    name the conv + bn pairs that inference runs as one convolution."""
    counters: dict[str, int] = {}
    layers: list[ArchLayer] = []
    expects: list[tuple[str, str, int]] = []
    blocks: list[str] = []  # the outermost Named block being walked, numbered ([] outside any)

    def add(kind: str, label: str, params: tuple, inputs: tuple[str, ...]) -> str:
        counters[label] = counters.get(label, 0) + 1
        sep = "_" if label[-1].isdigit() else ""  # relu6's first is relu6_1, not relu61
        layer = ArchLayer(f"{label}{sep}{counters[label]}", kind, params, inputs, blocks[0] if blocks else "")
        layers.append(layer)
        return layer.output

    def walk(b: BluePrint, x: str) -> str:
        if isinstance(b, Layer):
            op = op_for_layer(b.kind).plans_into(b)
            planned = op.arch(b)
            if planned is None:  # identity: the next layer reads x itself
                return x
            label, params = planned
            return add(op.kind, label, params, (x,))
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
            if b.channels is not None:
                expects.append((x, b.label, b.channels))
            if blocks:
                return walk(b.body, x)
            counters[f"block:{b.label}"] = counters.get(f"block:{b.label}", 0) + 1
            blocks.append(f"{b.label} #{counters[f'block:{b.label}']}")
            try:
                return walk(b.body, x)
            finally:
                blocks.pop()
        raise ShapeError(f"plan: {type(b).__name__} is not a BluePrint node the compiler knows.")

    walk(bp, "input")
    if not layers:
        raise ShapeError("plan: the model has no executable layers (only identity). Fix: add at least fc(classes).")
    fused: list[str] = []
    merged: dict[str, str] = {}
    if fuse:
        layers, fused, merged = _fuse_activations(layers)
    expects = [(merged.get(t, t), label, channels) for t, label, channels in expects]  # fused away: the producer's
    plan = ArchPlan(bp, tuple(layers), tuple(fused), expects=tuple(expects), merged=tuple(merged.items()))
    return replace(plan, folded=conv_bn.pairs(plan.layers, plan.consumers())) if fold_bn else plan


def _fuse_activations(layers: list[ArchLayer]) -> tuple[list[ArchLayer], list[str], dict[str, str]]:
    """Fold an activation into the fc/conv/bn/add right before it when nothing else reads that output; also
    returns which outputs went into which."""
    consumers: dict[str, int] = {}
    for l in layers:
        for t in l.inputs:
            consumers[t] = consumers.get(t, 0) + 1
    by_out = {l.output: i for i, l in enumerate(layers)}
    out: list[ArchLayer | None] = list(layers)
    rename: dict[str, str] = {}
    fused = []
    for i, l in enumerate(layers):
        if not op_of(l.kind).folds or len(l.inputs) != 1:
            continue
        act = l.p["act"]
        src = l.inputs[0]
        j = by_out.get(src)
        if j is None or consumers.get(src) != 1:
            continue
        prod = out[j]
        if prod is None or prod.p.get("act", "none") != "none" or act not in op_of(prod.kind).fuses:
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
    return result, fused, rename


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
    init: str = "uniform"  # uniform(+-1/sqrt(fan_in)) | ones | zeros | normal (N(0, std^2): embeddings)
    trainable: bool = True
    std: float = 0.0

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


CLIP_BLOCKS = 264
"""Blocks of the CUDA backend's gradient-norm sum (two per SM of an H100/H200): a fixed count, so
its partial sums, added in block order, give the same norm on every GPU."""


def _sum_gradient_slot(layer: ArchLayer, consumers: dict[str, int], t: TensorTable, dtype: str) -> int | None:
    """For a sum (an op that ``hands_dy_through``: add), the gradient slot of an input only it reads, of its
    dtype: the sum's own output gradient is then that slot. A sum hands dy unchanged to each branch, so that
    branch's copy would be the same bytes; only the other branch gets one (ops/add.py). Safe because the slot
    has no other writer, and the sum's backward, which copies dy to the other branch, runs before that
    input's producer, the only reader, which may then write into it."""
    if not op_of(layer.kind).hands_dy_through:
        return None
    for x in layer.inputs:
        slot = t.ids.get(f"{x}@grad")
        if x != "input" and consumers.get(x, 0) == 1 and slot is not None and t.specs[slot].dtype == dtype:
            return slot
    return None


class _LayerTensors:
    """The tensors one layer adds to a variant's table besides its output and gradient slots:
    parameters (with their gradient, optimizer-state and EMA copies), scratch and BN buffers."""

    def __init__(self, t: TensorTable, batch: int, opt_state: tuple[str, ...], ema: bool) -> None:
        self.t, self.batch, self.opt_state, self.ema = t, batch, opt_state, ema

    def param(self, layer: str, role: str, shape: tuple[int, ...], kind: str, fan_in: int, init: str,
              std: float = 0.0) -> None:
        t, f32 = self.t, "float32"
        base = f"{layer}.{role}"
        t.add(base, shape, f32, Region[f"W_{kind}"])
        t.add(f"{base}@grad", shape, f32, Region[f"G_{kind}"])
        for fam in self.opt_state:  # a family of per-tensor records (N) has regions for weights only
            region = Region.__members__.get(f"{fam}_{kind}")
            if region is not None:
                t.add(f"{base}@{fam.lower()}", region.record_shape or shape, f32, region)
        if self.ema:
            t.add(f"{base}@ema", shape, f32, Region[f"E_{kind}"])
        t.params.append(ParamInfo(layer, role, shape, fan_in, init, std=std))

    def buffer(self, layer: str, role: str, shape: tuple[int, ...], fan_in: int, init: str) -> None:
        """A layer's state that is not trained (batch norm's running statistics): initialised, never updated."""
        self.t.params.append(ParamInfo(layer, role, shape, fan_in, init, False))

    def layer(self, idx: int, layer: ArchLayer, ins: list[tuple[int, ...]]) -> tuple[int, ...]:
        """Add ``layer``'s own tensors (its op decides which); return its per-sample output shape."""
        return op_of(layer.kind).tensors(self, idx, layer, ins)


def _check_block_width(arch: ArchPlan, tensors: tuple[str, ...], shapes: dict[str, tuple[int, ...]]) -> None:
    """A block built for ``cin`` input channels (arch.expects) against the width its input has: said when a
    layer first reads that input, before the block's residual add meets shapes it cannot sum."""
    for tensor, label, channels in arch.expects:
        if tensor in tensors and shapes[tensor][-1] != channels:
            raise ShapeError(f"plan: {label} was built for {channels} input channels, but {tensor} has "
                             f"{shapes[tensor][-1]}. Fix: pass cin={shapes[tensor][-1]} to the block (its expansion and "
                             "residual are sized by it).")


def tensor_table(arch: ArchPlan, batch: int, sample_shape: tuple[int, ...], num_classes: int,
                 opt_state: tuple[str, ...], total_steps: int, ema: bool = False, clip: bool = False,
                 class_weights: bool = False, tokens: bool = False, recompute: bool = False,
                 lowp: str | None = None, scaling: bool = False, elide: bool = False) -> TensorTable:
    """Every tensor of a task for one variant, in a fixed order.

    ``opt_state`` lists the optimizer families needed besides W and G ("M", "V");
    ``ema`` adds E_ copies of the parameters (and EMA-folded BN parameters); ``clip`` the
    gradient-norm scalars of clip_grad_norm; ``class_weights`` the loss's per-class weights.
    ``tokens``: the samples are token sequences (T,) of int32 ids, each position with its own
    target (a language model's next token), so the labels are (batch, T) and the loss has batch x T rows.
    ``recompute``: each block's feature maps get a twin the recomputed forward writes (compiler/recompute.py).
    ``lowp``: mixed precision's storage dtype ("bfloat16", "float16"): layer outputs take their op's
    autocast policy (compiler/autocast.py adds the weights' copies and the casts); ``scaling``: fp16's
    loss scale and its growth counter. ``elide``: StepOptions.elide_outputs, under which a batch norm before a
    max pool makes the pool's input gradient itself and has no dy tensor (ops/pool.py grad_from_pool).
    """
    t = TensorTable()
    f32, i32 = "float32", "int32"
    xshape = internal_sample_shape(sample_shape)
    label = (batch, *xshape) if tokens else (batch,)
    t.add("I_A.label", label, i32, Region.I_A_LABEL)
    t.add("I_A.data", (batch, *xshape), i32 if tokens else f32, Region.I_A_DATA)
    t.add("I_B.label", label, i32, Region.I_B_LABEL)
    t.add("I_B.data", (batch, *xshape), i32 if tokens else f32, Region.I_B_DATA)
    t.add("labels", label, i32, Region.T_TEMP_INT32)
    shapes: dict[str, tuple[int, ...]] = {"input": xshape}
    dtypes: dict[str, str] = {"input": "int32" if tokens else f32}
    consumers = arch.consumers()
    if consumers.get("input", 0) != 1 or arch.layers[0].inputs != ("input",):
        raise ShapeError("plan: the model's input must be read by exactly one first layer (the original's "
                         "FIRST_LAYER graphs). Fix: start the model with one layer, e.g. a conv or fc, before add2.")
    alloc = _LayerTensors(t, batch, opt_state, ema)
    for idx, layer in enumerate(arch.layers):
        _check_block_width(arch, layer.inputs, shapes)  # before the layers it sizes meet a shape they cannot take
        ins = [shapes[x] for x in layer.inputs]
        x = ins[0]
        y = alloc.layer(idx, layer, ins)
        shapes[layer.output] = y
        dt = dtypes[layer.output] = output_dtype(op_of(layer.kind).autocast, [dtypes[i] for i in layer.inputs], lowp)
        feature, slot = feature_regions(dt)
        t.add(layer.output, (batch, *y), dt, feature)
        shared = _sum_gradient_slot(layer, consumers, t, dt)
        if shared is not None:  # add's dy is that input's gradient: one buffer, no copy
            t.ids[f"{layer.output}@grad"] = shared
        elif pool.grad_from_pool(arch, elide, layer, recompute) is None:  # else its backward reads a max pool's
            t.add(f"{layer.output}@grad", (batch, *y), dt, slot)
        for j in range(1, consumers.get(layer.output, 0)):
            t.add(f"{layer.output}@grad#{j}", (batch, *y), dt, slot)
        t.layer_shapes.append((layer.name, x, y))
    if recompute:
        for spec in recompute_twins(arch, list(t.specs)):
            t.add(f"{spec.name}{RECOMPUTE}", spec.shape, spec.dtype, spec.region)
    for conv, _ in arch.folded:  # the folded weights the inference graph's convolutions read
        conv_bn.tensors(alloc, conv, t.specs[t.ids[f"{conv}.weight"]].shape, shapes[f"{conv}.out"][-1])
    want = (*xshape, num_classes) if tokens else (num_classes,)
    if shapes[arch.output] != want:
        if tokens:
            raise ShapeError(f"plan: the model outputs shape {shapes[arch.output]} per sequence, but a language "
                             f"model's data needs {want}: one row of {num_classes} token scores per position. "
                             f"Fix: end the model with fc({num_classes}) on the (T, d) features.")
        flat = "flatten() before the first fc, and " if len(shapes[arch.output]) > 1 else ""
        raise ShapeError(f"plan: the model outputs shape {shapes[arch.output]} per sample, but the data has "
                         f"{num_classes} classes. Fix: {flat}end the model with fc({num_classes}).")
    _step_scalars(t, batch * (xshape[0] if tokens else 1), num_classes, total_steps, class_weights, scaling,
                  len(sample_shape) == 3, clip)
    return t


def _step_scalars(t: TensorTable, rows: int, num_classes: int, total_steps: int, class_weights: bool, scaling: bool,
                  image: bool, clip: bool) -> None:
    """The step's results, metrics, schedule, counters and flags (after every layer's tensors)."""
    f32 = "float32"
    t.add("result", (3,), f32, Region.R_RESULT)
    t.add("metrics.sum", (4,), "float64", Region.R_RESULT_ACCUMULATED)
    t.add("loss_log", (max(total_steps, 1),), f32, Region.R_RESULT_ACCUMULATED)
    t.add("lr_table", (max(total_steps, 1),), f32, Region.S_SCALAR_FP32)
    t.add("ones", (rows,), f32, Region.S_SCALAR_FP32)  # a GEMV operand per row
    if class_weights:  # CrossEntropyLoss(weight=...), written at compile time like lr_table
        t.add("loss.weight", (num_classes,), f32, Region.S_SCALAR_FP32)
    for name in ("step", "cursor", "rng.offset", "aug.offset", "nan.flag", "nan.skipped"):
        t.add(name, (1,), "int64", Region.S_SCALAR_INT32)
    if scaling:  # GradScaler's state: the loss scale and the clean steps since it last changed
        t.add("amp.scale", (1,), f32, Region.S_SCALAR_FP32)
        t.add("amp.growth", (1,), "int64", Region.S_SCALAR_INT32)
    t.add("nan.partials", (PAR_CHUNKS,), f32, Region.T_TEMP_FP32)  # the NaN probe's per-block results
    if image:  # image batches: each buffer's claimed (start, aug_base) for prefetching
        t.add("I_A.claim", (2,), "int64", Region.S_SCALAR_INT32)
        t.add("I_B.claim", (2,), "int64", Region.S_SCALAR_INT32)
    if clip:  # [total norm before clipping, the factor applied] of the last step; the GPU's partial sums
        t.add("clip.norm", (2,), f32, Region.S_SCALAR_FP32)
        t.add("clip.partials", (CLIP_BLOCKS,), "float64", Region.R_RESULT_ACCUMULATED)

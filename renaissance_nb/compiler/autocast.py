"""Mixed precision as a compiler stage: which tensors live in bf16/fp16, and the casts the graph needs.

Why a stage: ``torch.autocast`` decides at every call whether an op runs in low precision and casts
its operands there and then. Here the same decisions are made once, before training: each layer's
output gets a dtype from its op's ``autocast`` policy (ops/registry.py), the matrix products read
low-precision working copies of the weights (A_ regions) and write low-precision weight gradients
(G_*_FP16), and every cast is a node of the graph, with its fp32 buffer a planned tensor of its
own. So the memory plan shows what moved to half precision and what each cast costs, and the
kernels stay the fp32 kernels they were: a node reads fp32 buffers that ``cast`` nodes fill.

The rules, after PyTorch's autocast (CPU, bf16):
- ``LOWP_NODES`` (linear and convolution, forward and backward) compute in low precision: their
  activation operands are rounded to it (a fp32 one through a round-trip cast), their weights are
  the A_ copies (``CAST_MAIN_FP32_TO_FP16`` rounds W into them before each step and each validation
  pass), their weight gradients land in G_*_FP16. Products of bf16/fp16 values are exact in fp32,
  and the fp32 kernels accumulate in fp32: the semantics of a low-precision GEMM with fp32
  accumulation. Biases stay fp32 (their gradients too).
- A layer's output dtype follows its op's policy: "lowp" (fc, conv, attention: its output is a
  projection), "fp32" (layer norm, embeddings: reductions and lookups torch keeps in fp32),
  "follow" (the first input's: activations, dropout, pooling, batch norm), "promote" (add: fp32
  when any input is fp32). The loss reads the logits widened to fp32.
- Every other node reading or writing a low-precision tensor gets fp32 buffers: a widening cast
  before it, a rounding cast after it (round to nearest even, as ``tensor.to(torch.bfloat16)``).
- fp16 adds GradScaler's dynamic loss scaling: the logits' gradient is multiplied by ``amp.scale``;
  in CAST_AND_CHECK the gradients are widened into G and unscaled (``amp_unscale``), the NaN check
  finds an overflow and the step is skipped, and ``amp_update_scale`` backs the scale off (x0.5) or
  grows it (x2 after ``GROWTH_INTERVAL`` clean steps): the original's NAN_CHECK_AND_GRAD_SCALING.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..kernels.operands import backward_workspace, forward_workspace
from ..memory.region import Region
from .graph import ComputationGraph, GraphNode, node
from .ids import GraphId


LOWP_NODES = frozenset({"fc_fwd", "fc_bwd", "conv_fwd", "conv_bwd", "grouped_conv_fwd", "grouped_conv_bwd"})
"""The node ops that run in low precision (torch.autocast's linear and conv lists)."""

MATRIX_KINDS = ("FC_WEIGHT", "FIRST_CONV", "DEEP_CONV")
"""Parameter kinds with low-precision working copies: the original's A_ regions."""

INIT_SCALE, GROWTH_FACTOR, BACKOFF_FACTOR, GROWTH_INTERVAL = 2.0 ** 16, 2.0, 0.5, 2000
"""torch.amp.GradScaler's defaults."""

G_RANGE = ("G_BN_BIAS", "G_DEEP_CONV")


def output_dtype(policy: str, in_dtypes: list[str], lowp: str | None) -> str:
    """A layer output's dtype under ``lowp`` (None: fp32) by its op's autocast policy."""
    if lowp is None or policy == "fp32":
        return "float32"
    if policy == "lowp":
        return lowp
    if policy == "promote":
        return lowp if all(d == lowp for d in in_dtypes) else "float32"
    assert policy == "follow", policy
    return in_dtypes[0] if in_dtypes and in_dtypes[0] == lowp else "float32"


def feature_regions(dtype: str) -> tuple[Region, Region]:
    """(feature map region, gradient slot region) for a layer output of ``dtype``."""
    if dtype == "float32":
        return Region.F_FEATURE_FP32, Region.F_GRAD_SLOT_FP32
    return Region.F_FEATURE_FP16, Region.F_GRAD_SLOT_FP16


@dataclass(frozen=True)
class TensorInfo:
    """What the rewrite needs of the tensor table (train_base's: names, dtypes and regions agree
    over the variants)."""

    names: list[str]
    dtypes: list[str]
    regions: list[Region]

    @classmethod
    def of(cls, table: Any) -> "TensorInfo":
        return cls([s.name for s in table.specs], [s.dtype for s in table.specs], [s.region for s in table.specs])


Sizer = Callable[[Callable[[int], tuple[int, ...]]], tuple[int, ...]]
"""A new tensor's shape from other tensors' shapes (by id) in one variant: a kernel's workspace."""
NewTensor = Callable[..., int]
"""(name, the tensor whose shape it takes, dtype, region[, sizer]) -> its id."""

NATIVE_NODES = {"fc_fwd": "fc_fwd_lowp", "fc_bwd": "fc_bwd_lowp"}
"""Low-precision nodes whose CPU kernels read 16-bit operands themselves (kernels/fc_lowp.py): no fp32
copies of their operands, only fp32 sums the size of the output and a GEMM workspace."""


@dataclass
class _Rewrite:
    """One pass over a graph: the renamed operands of low-precision nodes and the casts around nodes."""

    info: TensorInfo
    lowp: str
    scaling: bool
    new: NewTensor
    ids: dict[str, int]
    logits_grad: int | None
    counter: list[int] = field(default_factory=lambda: [0])

    def copy_of(self, tid: int, suffix: str, family: str) -> int | None:
        """The low-precision copy (``@a``, ``@grad16``, ``@ema16``) of a matrix parameter's tensor."""
        name, _, region = self.meta(tid)
        kind = region.name.split("_", 1)[1]
        if kind not in MATRIX_KINDS:
            return None
        base = name.split("@", 1)[0]
        target = Region[f"{family}_{kind}"] if family == "A" else Region[f"{family}_{kind}_FP16"]
        return self.new(f"{base}@{suffix}", tid, self.lowp, target)

    def rename(self, n: GraphNode) -> GraphNode:
        """A low-precision node reads the weights' working copies and writes their gradients' copies."""
        if n.op not in LOWP_NODES:
            return n
        fam = {Region.W_FC_WEIGHT: "A", Region.W_FIRST_CONV: "A", Region.W_DEEP_CONV: "A",
               Region.E_FC_WEIGHT: "E", Region.E_FIRST_CONV: "E", Region.E_DEEP_CONV: "E"}
        ins = []
        for t in n.inputs:
            f = fam.get(self.meta(t)[2])
            c = self.copy_of(t, "a" if f == "A" else "ema16", f) if f else None
            ins.append(t if c is None else c)
        outs = []
        for t in n.outputs:
            is_grad = self.meta(t)[2].family == "G"
            c = self.copy_of(t, "grad16", "G") if is_grad else None
            outs.append(t if c is None else c)
        return GraphNode(n.op, tuple(ins), tuple(outs), n.params, n.layer)

    def meta(self, tid: int) -> tuple[str, str, Region]:
        """(name, dtype, region) of a table tensor or of one made during this pass."""
        if tid < len(self.info.names):
            return self.info.names[tid], self.info.dtypes[tid], self.info.regions[tid]
        name, _, dtype, region = getattr(self.new, "made")[tid - len(self.info.names)][:4]
        return name, dtype, region

    def native(self, n: GraphNode) -> list[GraphNode]:
        """A node whose kernel reads 16-bit operands (NATIVE_NODES): an fp32 operand of its products (an fp32
        activation, an attention layer's inner tensors) rounded into a 16-bit buffer (T_TEMP_FP16) first, an
        fp32 result written through one and widened, and its scratch planned."""
        swap: dict[int, int] = {}
        pre: list[GraphNode] = []
        post: list[GraphNode] = []
        p = n.p
        if n.op == "fc_fwd":  # the operands the products read or write: x, W -> y
            sixteen = {*n.inputs[:2], n.outputs[0]}
        else:  # dy, x, W, y -> dW (and dx); db stays fp32
            sixteen = {*n.inputs[:4], n.outputs[0]} | ({n.outputs[2 if p["bias"] else 1]} if p["need_dx"] else set())
        for t in dict.fromkeys((*n.inputs, *n.outputs)):
            name, dt, region = self.meta(t)
            if dt != "float32" or t not in sixteen:
                continue
            self.counter[0] += 1
            s = self.new(f"{name}@16.{self.counter[0]}", t, self.lowp, Region.T_TEMP_FP16)
            swap[t] = s
            if t in n.inputs:
                pre.append(node("cast", [t], [s], n.layer))
            if t in n.outputs:
                post.append(node("cast", [s], [t], n.layer))
        ins, outs = [swap.get(t, t) for t in n.inputs], [swap.get(t, t) for t in n.outputs]
        roles = tuple(p.get("scratch", ()))
        x, w = ins[1] if n.op == "fc_bwd" else ins[0], ins[2] if n.op == "fc_bwd" else ins[1]
        self.counter[0] += 1
        tag = f"{n.layer}.{n.op}.{self.counter[0]}"
        if n.op == "fc_fwd":
            extra = {"sums": self.new(f"{tag}.sums", outs[0], "float32", Region.T_TEMP_FP32)}
            sizer: Sizer = lambda shape: (forward_workspace(shape(x), shape(w)),)  # noqa: E731
        else:
            extra = {"grads": self.new(f"{tag}.grads", ins[0], "float32", Region.T_TEMP_FP32)}
            if p.get("act", "none") != "none":  # the activation's gradient reads the output in fp32
                extra["outputs"] = self.new(f"{tag}.outputs", ins[3], "float32", Region.T_TEMP_FP32)
            sizer = lambda shape: (backward_workspace(shape(x), shape(w)),)  # noqa: E731
        extra["work"] = self.new(f"{tag}.work", w, "float32", Region.T_TEMP_FP32, sizer)
        p["scratch"] = roles + tuple(extra)
        body = GraphNode(NATIVE_NODES[n.op], tuple(ins), tuple(outs) + tuple(extra.values()),
                         tuple(sorted(p.items())), n.layer)
        return [*pre, body, *post]

    def around(self, n: GraphNode) -> list[GraphNode]:
        """The node with its casts: fp32 buffers for its low-precision operands (and, in a
        low-precision node, round-trips for its fp32 activations)."""
        n = self.rename(n)
        if n.op in NATIVE_NODES:
            return self.native(n)
        rounds = n.op in LOWP_NODES
        swap: dict[int, int] = {}
        pre: list[GraphNode] = []
        post: list[GraphNode] = []
        for t in dict.fromkeys((*n.inputs, *n.outputs)):
            name, dt, region = self.meta(t)
            if dt == self.lowp:
                via = None
            elif rounds and dt == "float32" and region.family in ("I", "F"):
                via = self.lowp  # an fp32 activation read by a low-precision product: rounded first
            else:
                continue
            self.counter[0] += 1
            s = self.new(f"{name}@f32.{self.counter[0]}", t, "float32", Region.T_TEMP_FP32)
            swap[t] = s
            if t in n.inputs:
                pre.append(node("cast", [t], [s], n.layer, **({"via": via} if via else {})))
            if t in n.outputs:
                scaled = self.scaling and n.op == "softmax_xent" and t == self.logits_grad
                post.append(node("cast", [s, self.ids["amp.scale"]] if scaled else [s], [t], n.layer,
                                 **({"via": via} if via else {})))
        if (self.scaling and n.op == "softmax_xent" and self.logits_grad in n.outputs
                and self.logits_grad not in swap):  # fp32 logits: the gradient scaled in place
            post.append(node("cast", [self.logits_grad, self.ids["amp.scale"]], [self.logits_grad], n.layer))
        body = GraphNode(n.op, tuple(swap.get(t, t) for t in n.inputs), tuple(swap.get(t, t) for t in n.outputs),
                         n.params, n.layer)
        return [*pre, body, *post]

    def graph(self, g: ComputationGraph) -> ComputationGraph:
        out = ComputationGraph(g.name)
        for gid in g.ids():
            for n in g.nodes(gid):
                for m in self.around(n):
                    out.append(gid, m)
        return out


def _copies(info: TensorInfo, g: ComputationGraph, suffix: str) -> list[tuple[int, int]]:
    """(source, copy) id pairs of the copies with ``suffix`` that ``g``'s nodes use."""
    ids = {name: i for i, name in enumerate(info.names)}
    used = {t for _, n in g for t in (*n.inputs, *n.outputs)}
    out = []
    for name, i in ids.items():
        if name.endswith(f"@{suffix}") and i in used:
            src = name[: -len(suffix) - 1] + {"a": "", "grad16": "@grad", "ema16": "@ema"}[suffix]
            out.append((ids[src], i))
    return out


def _weight_casts(g: ComputationGraph, info: TensorInfo, ema: bool) -> None:
    """CAST_MAIN_FP32_TO_FP16 (W -> A) and, with the EMA, CAST_EMA_FP32_TO_FP16 (E -> E16)."""
    for src, a in _copies(info, g, "a"):
        g.append(GraphId.CAST_MAIN_FP32_TO_FP16, node("cast", [src], [a], "weights"))
    if ema:
        for src, e in _copies(info, g, "ema16"):
            g.append(GraphId.CAST_EMA_FP32_TO_FP16, node("cast", [src], [e], "ema"))


def _check_and_scale(g: ComputationGraph, info: TensorInfo, ids: dict[str, int], scaling: bool) -> None:
    """CAST_AND_CHECK: the low-precision gradients widened into G (unscaled with fp16), then the NaN
    check as built, then GradScaler's update of the scale from the check's flag."""
    casts = [node("cast", [g16], [gw], "grads") for gw, g16 in _copies(info, g, "grad16")]
    if scaling:
        casts.append(node("amp_unscale", [ids["amp.scale"]], [], "grads", first=G_RANGE[0], last=G_RANGE[1]))
    rest = list(g.nodes(GraphId.CAST_AND_CHECK))
    if scaling:
        rest.append(node("amp_update_scale", [ids["nan.flag"]], [ids["amp.scale"], ids["amp.growth"]], "grads",
                         growth=GROWTH_FACTOR, backoff=BACKOFF_FACTOR, interval=GROWTH_INTERVAL))
    g.buckets[GraphId.CAST_AND_CHECK] = casts + rest


def rewrite(graphs: Any, info: TensorInfo, ids: dict[str, int], logits: str, lowp: str, scaling: bool,
            ema: bool, new: NewTensor) -> tuple[ComputationGraph, ComputationGraph]:
    """The training and inference graphs with low-precision operands and their casts. ``new`` gives a
    new tensor's id: at plan() it appends to the tables (plan_tables), at lock_memory() it finds the
    tensor plan() appended by its name (the same pass over the same graphs names them alike)."""
    def pass_over(g: ComputationGraph) -> ComputationGraph:
        r = _Rewrite(info, lowp, scaling, new, ids, ids.get(f"{logits}@grad"), counter)
        return r.graph(g)
    counter = [0]
    train, inference = pass_over(graphs.train), pass_over(graphs.inference)
    grown = TensorInfo(*_grown(info, new))
    _weight_casts(train, grown, False)
    _weight_casts(inference, grown, ema)
    _check_and_scale(train, grown, ids, scaling)
    train.names, inference.names = graphs.train.names, graphs.inference.names
    return train, inference


def _grown(info: TensorInfo, new: NewTensor) -> tuple[list[str], list[str], list[Region]]:
    """The tensor info with the tensors ``new`` has made so far (its ``made`` list)."""
    made = getattr(new, "made", [])
    return (info.names + [m[0] for m in made], info.dtypes + [m[2] for m in made],
            info.regions + [m[3] for m in made])


class Collector:
    """``new`` at plan(): records each new tensor once (by name) and numbers it after the table's."""

    def __init__(self, first_id: int) -> None:
        self.first_id = first_id
        self.made: list[tuple[str, int, str, Region, Sizer | None]] = []
        self.index: dict[str, int] = {}

    def __call__(self, name: str, like: int, dtype: str, region: Region, sizer: Sizer | None = None) -> int:
        if name not in self.index:
            self.index[name] = self.first_id + len(self.made)
            self.made.append((name, like, dtype, region, sizer))
        return self.index[name]


def _shape_like(table: Any, like: int) -> tuple[int, ...]:
    return tuple(table.specs[like].shape)


def extend_tables(shapes: Any, graphs: Any, lowp: str, scaling: bool, ema: bool, logits: str) -> None:
    """plan(): append to every variant's table the tensors mixed precision adds (the weights' working
    copies, their gradients' and EMA copies, every cast's fp32 buffer), in one order for all variants."""
    ref = shapes.tables["train_base"]
    made = Collector(len(ref.specs))
    rewrite(graphs, TensorInfo.of(ref), ref.ids, logits, lowp, scaling, ema, made)
    for table in shapes.tables.values():
        for name, like, dtype, region, sizer in made.made:
            shape = sizer(lambda tid: tuple(table.specs[tid].shape)) if sizer else _shape_like(table, like)
            table.add(name, shape, dtype, region)


def lock_graphs(graphs: Any, table: Any, lowp: str, scaling: bool, ema: bool, logits: str) -> tuple[Any, Any]:
    """lock_memory(): the graphs rewritten over the tensors plan() appended (found by name)."""
    def existing(name: str, like: int, dtype: str, region: Region, sizer: Sizer | None = None) -> int:
        tid = table.ids[name]
        assert (table.specs[tid].dtype, table.specs[tid].region) == (dtype, region), name
        return tid
    return rewrite(graphs, TensorInfo.of(table), table.ids, logits, lowp, scaling, ema, existing)

"""The op registry: every layer kind's definition, found by the kind a BluePrint or ArchPlan holds.

Why: a layer kind used to be spread over a dozen modules, each choosing by comparing kind strings
(the builder, the walk into executable layers, the tensor table, forward and backward emission,
ONNX, from_torch). Now one ``Op`` subclass per kind (one module each under ops/) says all of it, and
the compiler, the exporters and the kernel tables ask this registry. Nothing here imports an op
module or the compiler: op modules register themselves when ``renaissance_nb.ops`` loads them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from ..blueprint_nodes import register_layer
from ..errors import ExportError, ShapeError

if TYPE_CHECKING:
    from ..blueprint_nodes import Layer
    from ..compiler.layers import ArchLayer

Shape = tuple[int, ...]


class Refused(Exception):
    """A PyTorch module an op cannot read (settings it does not support): why, for from_torch's error."""


class Op:
    """One layer kind, in one place. Subclasses set the class attributes and override the methods
    their kind has; the defaults describe a parameter-free op that keeps the input's shape.

    Emission (``forward``/``backward``) receives the compiler's emitter ``e``: ``e.emit(g, gid, op, ins,
    outs, layer_name, **params)`` appends a node, ``e.ids`` maps tensor names to ids, ``e.weight(layer,
    role, ema)`` a parameter's id. Tensors (``tensors``) receive the tensor-table context ``ctx``:
    ``ctx.t.add(name, shape, dtype, region)``, ``ctx.param(layer, role, shape, family, fan_in, init)``
    (a parameter with its gradient, optimizer-state and EMA copies in the regions of ``family``),
    ``ctx.batch``. Neither object is imported here: ops never import the compiler."""

    kind: str = ""
    """The ArchLayer kind: the key of the compiler's dispatch."""
    layer_kinds: tuple[str, ...] = ()
    """The BluePrint Layer kinds that plan into this op (default: ``(kind,)``); ``builders`` builds them."""
    builders: tuple[Callable[..., "Layer"], ...] = ()
    torch_modules: tuple[str, ...] = ()
    """``torch.nn`` class names ``from_torch`` reads as this op."""
    parametrized: bool = False
    """Has weights: from_torch names its n-th one ``<kind><n>``, as the compiler does."""
    fuses: tuple[str, ...] = ()
    """Activations folded into this op's pass when nothing else reads its output."""
    folds: bool = False
    """An activation a producer can absorb (its ``act`` and ``slope`` parameters move onto the producer)."""
    layout: str = "spatial"
    """How it reads an image's axes: "elementwise" (any layout), "flat" (needs flat features), "spatial"."""
    batch_statistics: bool = False
    """Normalises over the batch in training (batch norm): a batch of one value per channel is refused."""
    tensor_kinds: dict[str, str] = {}
    """Its own tensors' roles -> what the memory inspector calls them (attention: "attention scores");
    the rest are counted by their region's category."""
    forward_scratch: tuple[str, ...] = ()
    """Roles of its T_TEMP tensors that only its forward works in: under recompute they get twins, so the first
    forward's and the recomputed one's each live inside their own node (compiler/recompute.py)."""
    decay_exempt: bool = False
    """Its weights are no matrices weight decay should reach under ``decay="matrices"`` (embeddings)."""
    first_layer_dx: bool = False
    """Its backward writes the input's gradient even as the first layer (``input@grad``)."""
    relu_grad_movable: bool = False
    """With a fused ReLU, its backward can leave the ReLU's gradient to a max pool that alone reads its output
    (ops/pool.py relu_through_pool): the node then reads dy already masked, and not y."""
    grad_from_pool: bool = False
    """Where a max pool makes its relu output (pooled_from) from windows that do not overlap, its backward can
    make the pool's input gradient itself from the pool's gradient, argmax and output (ops/pool.py
    grad_from_pool): no maxpool_bwd node, and its own dy is never made (no tensor)."""
    hands_dy_through: bool = False
    """Its backward gives every input dy itself (a sum): the compiler may make its output's gradient the slot
    of an input only it reads, and its backward then copies dy to the other inputs only (compiler/layers.py)."""
    autocast: str = "follow"
    """Its output's dtype under mixed precision (compiler/autocast.py): "lowp" (a matrix product's),
    "fp32" (reductions and lookups torch keeps in fp32), "follow" (the first input's), "promote"
    (fp32 when any input is fp32)."""
    cpu_kernels: dict[str, Any] = {}
    """Node op -> CPU kernel factory (kernels/base.py's contract) for ops this kind alone emits."""
    gpu_kernels: dict[str, Any] = {}
    """Node op -> GPU launcher factory (gpu/kernels.py's contract)."""
    cuda_source: str = ""
    """CUDA C++ of this op's own __global__ kernels, appended to the package's source."""

    # ---- declaring and planning ----------------------------------------------------------
    def signature(self, p: dict[str, Any]) -> str | None:
        """How the builder call reads in a BluePrint tree; None: ``kind(name=value, ...)``."""
        return None

    def plans_into(self, layer: "Layer") -> "Op":
        """The op that runs this layer: itself, or another op for a variant with kernels of its own
        (a grouped conv plans into ops/grouped_conv.py's op, named in the same count as the others)."""
        return self

    def arch(self, layer: "Layer") -> tuple[str, tuple[tuple[str, Any], ...]] | None:
        """(label, params) of the executable layer ``layer`` becomes; None: it plans to nothing."""
        return layer.kind, layer.params

    def describe(self, p: dict[str, Any]) -> str:
        """The layer's call as the ArchPlan prints it (fused activations are added by the caller)."""
        args = ", ".join(f"{k}={v}" for k, v in p.items() if k not in ("act", "slope"))
        return f"{self.kind}({args})" if args else self.kind

    def tensors(self, ctx: Any, idx: int, layer: "ArchLayer", ins: list[Shape]) -> Shape:
        """Add the layer's own tensors (parameters, scratch) to the table; return its per-sample output shape."""
        return ins[0]

    # ---- graph emission --------------------------------------------------------------------
    def forward(self, e: Any, g: Any, gid: Any, layer: "ArchLayer", xs: list[int], y: int, training: bool,
                ema: bool) -> None:
        raise NotImplementedError(self.kind)

    def backward(self, e: Any, g: Any, gid: Any, layer: "ArchLayer", xs: list[int], y: int, dy: int,
                 dxs: list[int | None]) -> None:
        """Gradients: ``dxs[i]`` is the slot of input i's gradient (None: the data, nothing to write)."""
        raise NotImplementedError(self.kind)

    def decode(self, d: Any, layer: "ArchLayer", xs: list[str], y: str) -> None:
        """Declare the layer's one-position tensors and nodes for runtime/decode.py's step (batch 1,
        one token): ``d.add(name, shape, region)``, ``d.emit(op, ins, outs, layer, **params)``, tensor
        names (weights by their task names), ``d.shapes`` the shapes declared so far."""
        raise ShapeError(f"generate: layer {layer.name} ({self.kind}) has no one-token decode step. Fix: generate() "
                         "runs decoder-only language models (embedding, pos_embedding, layernorm, attention, fc, "
                         "activations, dropout, residual adds).")

    def pooled_from(self, e: Any, layer: "ArchLayer") -> tuple[int, int] | None:
        """In training, (its input, a per-channel (2, C) affine) from which the max pool that alone reads its relu
        output makes that output's values itself, relu(x * aff[0] + aff[1]), so the layer never writes it
        (ops/pool.py relu_pool_pairs); None: the layer writes its output (every op but batch norm)."""
        return None

    def inference_fold(self, e: Any, g: Any, layer: "ArchLayer", ema: bool) -> None:
        """Nodes of UPDATE_BN_INF_PARAMS (inference parameters derived from training ones)."""

    # ---- export --------------------------------------------------------------------------
    def onnx(self, g: Any, layer: "ArchLayer", xs: list[str], out: str) -> str:
        """ONNX nodes computing the layer (without a fused activation) into ``out``; returns the value."""
        raise ExportError(f"export_onnx: layer {layer.name} ({self.kind}) has no ONNX form here. Fix: report it.")

    def from_torch(self, module: Any) -> dict[str, Any]:
        """``{"layer": kind, "params": {...}}`` for a module of ``torch_modules``, or raise Refused."""
        return {"layer": self.layer_kinds[0] if self.layer_kinds else self.kind, "params": {}}


OPS: dict[str, Op] = {}
"""ArchLayer kind -> its op."""
BY_LAYER: dict[str, Op] = {}
"""BluePrint Layer kind -> the op it plans into."""
BY_TORCH: dict[str, Op] = {}
"""torch.nn class name -> the op from_torch reads it as."""


def register(cls: type[Op]) -> type[Op]:
    """Class decorator: make an op known to the BluePrint, the compiler, the exporters and the kernel tables."""
    op = cls()
    assert op.kind and op.kind not in OPS, f"op kind {op.kind!r} missing or registered twice"
    OPS[op.kind] = op
    layer_kinds = op.layer_kinds or ((op.kind,) if op.builders else ())
    assert len(layer_kinds) == len(op.builders), f"{op.kind}: one builder per layer kind"
    for kind, build in zip(layer_kinds, op.builders):
        register_layer(kind, build, op.signature)
        BY_LAYER[kind] = op
    for name in op.torch_modules:
        assert name not in BY_TORCH, f"torch module {name} read by two ops"
        BY_TORCH[name] = op
    return cls


def op_of(kind: str) -> Op:
    """The op of an ArchLayer kind."""
    op = OPS.get(kind)
    if op is None:
        raise ShapeError(f"plan: layer kind {kind!r} has no op definition. Fix: use one of {', '.join(sorted(OPS))}.")
    return op


def op_for_layer(layer_kind: str) -> Op:
    """The op a BluePrint Layer kind plans into."""
    op = BY_LAYER.get(layer_kind)
    if op is None:
        raise ShapeError(f"plan: layer kind {layer_kind!r} is not supported by the engine. Fix: use one of "
                         f"{', '.join(sorted(BY_LAYER))}.")
    return op


def cpu_kernels() -> dict[str, Any]:
    """Every op's own CPU kernels, joined (kernels/cpu.py's table holds the shared ones)."""
    out: dict[str, Any] = {}
    for op in OPS.values():
        for name, factory in op.cpu_kernels.items():
            assert name not in out, f"CPU kernel {name} defined by two ops"
            out[name] = factory
    return out


def gpu_kernels() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for op in OPS.values():
        for name, factory in op.gpu_kernels.items():
            assert name not in out, f"GPU kernel {name} defined by two ops"
            out[name] = factory
    return out


def cuda_sources() -> str:
    return "\n".join(op.cuda_source for op in OPS.values() if op.cuda_source)

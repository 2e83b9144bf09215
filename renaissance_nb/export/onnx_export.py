"""The compiled inference graph as an ONNX model, for onnxruntime, TensorRT, OpenVINO or a browser.

The graph is read from ``task.compiled.arch`` (the ArchPlan the inference graph was emitted from:
layers in order, fused activations marked on their producer, add2's residual sums as ``add``
layers) and the weights from ``task.state_dict()`` (PyTorch's layouts, which are ONNX's: Gemm
with transB=1 for fc, Conv's (out, in, k, k)). Dropout is the identity in inference and emits
nothing; batch norm is a BatchNormalization node on its running statistics, as ``predict_logits``
uses them.

The model takes what ``predict_logits`` takes, as the model was trained: ``input`` shaped
(N, *sample_shape), images (N, C, H, W) as in PyTorch (the arena's channels-last layout is internal),
with a dynamic batch dimension ``N``, and gives ``logits`` (N, classes) before softmax.

Opset 17 (onnxruntime 1.13 and later, every runtime of the last years): GELU is written as its erf
form and SiLU as x * sigmoid(x), since their own ops came in opsets 20 and 22.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..errors import ExportError
from ..files import write_atomically
from ..ops.activation import act_onnx
from ..ops.registry import op_of
from .packages import need

OPSET = 17
INPUT, OUTPUT = "input", "logits"


class _Graph:
    """Nodes and initializers of the ONNX graph, built layer by layer from the ArchPlan."""

    def __init__(self, helper: Any, numpy_helper: Any, state: dict[str, np.ndarray], positions: int = 0) -> None:
        self.h, self.nh, self.state = helper, numpy_helper, state
        self.positions = positions
        """A language model's window length T (its values are (N, T, ...)), 0 for one row per sample."""
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.names: dict[str, str] = {"input": INPUT}  # ArchPlan tensor -> ONNX value

    def node(self, op: str, ins: list[str], out: str, **attrs: Any) -> str:
        self.nodes.append(self.h.make_node(op, ins, [out], name=out, **attrs))
        return out

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(self.nh.from_array(np.ascontiguousarray(value, dtype=np.float32), name))
        return name

    def ints(self, name: str, values: Any) -> str:
        """An int64 initializer (shapes, indices, axes)."""
        self.inits.append(self.nh.from_array(np.asarray(values, dtype=np.int64), name))
        return name

    def weight(self, layer: str, role: str) -> str:
        return self.const(f"{layer}.{role}", self.state[f"{layer}.{role}"])

    def layer(self, layer: Any) -> None:
        """Emit one ArchLayer through its op (ops/); its output is ``layer.output`` (the input's value
        where it is the identity), a fused activation applied after the op's own nodes."""
        xs = [self.names[t] for t in layer.inputs]
        fused = layer.fused_act  # an activation the compiler fused into it
        out = layer.output if fused == "none" else f"{layer.output}.pre"
        y = op_of(layer.kind).onnx(self, layer, xs, out)
        self.names[layer.output] = y if fused == "none" else act_onnx(self, fused, layer.p["slope"], y, layer.output)


def onnx_model(task: Any, *, ema: bool = False) -> Any:
    """The ONNX ModelProto of a compiled task's inference graph, checked by
    ``onnx.checker.check_model(full_check=True)``."""
    state = task.state_dict(ema=ema)  # first: a task not compiled is told so, whatever is installed
    onnx = need("onnx", "export_onnx")
    from onnx import helper, numpy_helper
    sample, classes = tuple(task.splits.train.sample_shape), task.splits.train.num_classes
    tokens = task.splits.train.is_tokens  # a language model: int64 ids (N, T) in, logits (N, T, vocab) out
    g = _Graph(helper, numpy_helper, state, sample[0] if tokens else 0)
    arch = task.compiled.arch
    for layer in arch.layers:
        g.layer(layer)
    g.node("Identity", [g.names[arch.output]], OUTPUT)
    kind = onnx.TensorProto.INT64 if tokens else onnx.TensorProto.FLOAT
    graph = helper.make_graph(
        g.nodes, task.name or "renaissance_nb", [helper.make_tensor_value_info(INPUT, kind, ["N", *sample])],
        [helper.make_tensor_value_info(OUTPUT, onnx.TensorProto.FLOAT, ["N", *sample[:1] * tokens, classes])],
        g.inits)
    from .. import __version__
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="renaissance_nb",
                              producer_version=__version__, doc_string=repr(arch.blueprint))
    model.ir_version = 8  # opset 17's IR version: the oldest runtimes that run opset 17 read it
    onnx.checker.check_model(model, full_check=True)
    return model


def export_onnx(task: Any, path: str | os.PathLike, *, ema: bool = False) -> str:
    """Write the compiled task's inference graph to ``path`` as ONNX (opset 17): input ``input``
    shaped (N, *sample_shape), images (N, C, H, W), N dynamic; output ``logits`` (N, classes), as
    ``predict_logits`` gives them; dropout removed, batch norm on its running statistics. Written
    atomically; returns the path. ``ema=True``: with the EMA weights. Needs the ``[export]`` extra."""
    model = onnx_model(task, ema=ema)
    blob = model.SerializeToString()
    return write_atomically(path, lambda f: f.write(blob), op="export_onnx", error=ExportError,
                            example="model.onnx")

"""Models and weights to and from other frameworks: safetensors weights (``save_safetensors``,
``read_weights``), the inference graph as ONNX (``export_onnx``), BluePrints from PyTorch
modules (``from_torch``, behind ``BluePrint.from_torch``), and a task rebuilt from a checkpoint
without its data (``task_from_checkpoint``, for the ``export`` command). The packages each format
needs (the ``[export]`` extra, and torch for PyTorch modules) are imported only when used."""
from .onnx_export import OPSET, export_onnx, onnx_model
from .weights import read_weights, save_safetensors

__all__ = ["OPSET", "export_onnx", "onnx_model", "read_weights", "save_safetensors"]

"""The optional packages the exports need (the ``[export]`` extra), imported when first used, so
``import renaissance_nb`` never needs them."""
from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import ExportError

PACKAGES = {"safetensors": "safetensors", "onnx": "onnx", "onnxruntime": "onnxruntime"}
"""Import name -> the package pip installs it from."""


def need(module: str, op: str) -> ModuleType:
    """``module`` imported, or an ExportError naming the call and the install command."""
    try:
        return importlib.import_module(module)
    except ImportError:
        top = module.split(".")[0]
        raise ExportError(f"{op}: needs the {PACKAGES.get(top, top)!r} package, which is not installed. Fix: pip "
                          "install 'renaissance_nb[export]' (safetensors, onnx and onnxruntime).") from None

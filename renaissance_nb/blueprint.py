"""BluePrint: an immutable declaration of a model, built from small layer builders.

``seq(fc(1024), relu(), fc(10))`` says what the model is and nothing about how it
runs: the compiler turns it into tensors, regions and graph nodes. BluePrints are
frozen values: they compare by content, hash, and print as a readable tree.

This module is the builders' public address: the node classes and containers live in
blueprint_nodes.py, each layer's builder with the rest of its definition in ops/.
"""
from __future__ import annotations

from .export import from_torch as _torch_reader  # noqa: F401 - registers BluePrint.from_torch's reader
from .blueprint_nodes import (LAYER_BUILDERS, SIZE_MAX, Add2, BluePrint, Layer, Named, Repeat, Seq, add2, repeat,
                              seq)
from .ops import *  # noqa: F401,F403 - every op's builder and block kind (ops.__all__)
from .ops import __all__ as LAYER_NAMES

__all__ = ["LAYER_BUILDERS", "SIZE_MAX", "Add2", "BluePrint", "Layer", "Named", "Repeat", "Seq", "add2", "repeat",
           "seq", *LAYER_NAMES]

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
from .ops import (BOTTLENECK, BOTTLENECK_DS, RESNET_3_3, RESNET_3_3_DS, avgpool, block, bn, cbr, conv, dropout, elu,
                  fc, flatten, gap, gelu, hardswish, identity, leaky_relu, maxpool, relu, relu6, se, sigmoid, silu,
                  tanh)

__all__ = ["LAYER_BUILDERS", "SIZE_MAX", "Add2", "BluePrint", "Layer", "Named", "Repeat", "Seq", "add2", "repeat",
           "seq", "BOTTLENECK", "BOTTLENECK_DS", "RESNET_3_3", "RESNET_3_3_DS", "avgpool", "block", "bn", "cbr",
           "conv", "dropout", "elu", "fc",
           "flatten", "gap", "gelu", "hardswish", "identity", "leaky_relu", "maxpool", "relu", "relu6", "se", "sigmoid",
           "silu", "tanh"]

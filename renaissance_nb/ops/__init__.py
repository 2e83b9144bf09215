"""Every layer kind in one module each: its BluePrint builder and checks, its shapes, the tensors it
needs and their region family, its forward and backward emission, kernels of its own, its ONNX and
from_torch mappings. The compiler, the exporters and the kernel tables iterate ``registry``;
nothing outside an op's own module compares layer-kind strings (tests/test_architecture.py).

Adding a layer: a module here with a builder and an ``@register``-ed ``Op`` subclass, its import
line below, its tests, and its name in blueprint.py's exports (docs/architecture.md walks through it).
"""
from . import registry
from .activation import gelu, leaky_relu, relu, sigmoid, silu, tanh
from .add import Add
from .blocks import RESNET_3_3, RESNET_3_3_DS, block, cbr
from .bottleneck import BOTTLENECK, BOTTLENECK_DS
from .bn import bn
from .conv import conv
from .dropout import dropout
from .elu import elu
from .fc import fc
from .flatten import flatten
from .gap import gap
from .grouped_conv import GroupedConvolution  # conv(..., groups=g > 1) plans into it
from .hardswish import hardswish
from .identity import identity
from .pool import avgpool, maxpool
from .relu6 import relu6
from .se import se

__all__ = ["registry", "Add", "BOTTLENECK", "BOTTLENECK_DS", "RESNET_3_3", "RESNET_3_3_DS", "avgpool", "block", "bn", "cbr", "conv", "dropout", "elu",
           "fc", "flatten", "gap", "gelu", "hardswish", "identity", "leaky_relu", "maxpool", "relu", "relu6", "se", "sigmoid",
           "silu", "tanh"]

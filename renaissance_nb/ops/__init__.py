"""Every layer kind in one module each: its BluePrint builder and checks, its shapes, the tensors it
needs and their region family, its forward and backward emission, kernels of its own, its ONNX and
from_torch mappings. The compiler, the exporters and the kernel tables iterate ``registry``;
nothing outside an op's own module compares layer-kind strings (tests/test_op_registry.py).

Adding a layer: a module here with a builder and an ``@register``-ed ``Op`` subclass, and its import
line below; ``__all__`` (and so ``renaissance_nb.blueprint`` and ``renaissance_nb``, which export it)
lists every registered builder and block kind by itself. docs/architecture.md walks through it.
"""
from . import registry
from .activation import gelu, leaky_relu, relu, sigmoid, silu, tanh
from .add import Add  # noqa: F401 - add2's residual sum (no builder of its own)
from .attention import attention
from .blocks import BLOCK_KINDS, RESNET_3_3, RESNET_3_3_DS, block, cbr
from .bn import bn
from .bottleneck import BOTTLENECK, BOTTLENECK_DS
from .conv import conv
from .conv_bn import ConvBatchNormFold  # noqa: F401 - options(fold_bn=True): its fold kernels
from .dropout import dropout
from .elu import elu
from .embedding import embedding, pos_embedding
from .fc import fc
from .flatten import flatten
from .gap import gap
from .gelu_tanh import gelu_tanh
from .gpt import gpt, transformer_block
from .grouped_conv import GroupedConvolution  # noqa: F401 - conv(..., groups=g > 1) plans into it
from .hardswish import hardswish
from .identity import identity
from .layernorm import layernorm
from .mbconv import MBCONV
from .pool import avgpool, maxpool
from .relu6 import relu6
from .se import se

BUILDERS = tuple(sorted({b.__name__ for op in registry.OPS.values() for b in op.builders}))
"""Every layer builder a registered op declares (fc, conv, relu6...)."""
__all__ = [*BUILDERS, "block", "cbr", "gpt", "transformer_block", *BLOCK_KINDS]
_missing = [name for name in __all__ if name not in globals()]
assert not _missing, f"import {_missing} in renaissance_nb/ops/__init__.py: registered but not exported"

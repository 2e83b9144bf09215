"""BluePrint: an immutable declaration of a model, built from small layer builders.

``seq(fc(1024), relu(), fc(10))`` says what the model is and nothing about how it
runs: the compiler turns it into tensors, regions and graph nodes. BluePrints are
frozen values: they compare by content, hash, and print as a readable tree.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from .checks import arguments_checked, as_float, as_int
from .errors import BluePrintError, bad_argument

ACTIVATIONS = ("relu", "tanh", "sigmoid", "silu", "leaky_relu", "gelu")


@dataclass(frozen=True)
class BluePrint:
    """Base of every node of a model declaration."""

    def leaves(self) -> list["Layer"]:
        """The layers in execution order, containers unrolled."""
        raise NotImplementedError

    def tree(self) -> str:
        return "\n".join(self._lines())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able description; ``from_dict`` rebuilds the same BluePrint."""
        if isinstance(self, Layer):
            return {"layer": self.kind, "params": dict(self.params)}
        if isinstance(self, Seq):
            return {"seq": [c.to_dict() for c in self.children]}
        if isinstance(self, Repeat):
            return {"repeat": self.body.to_dict(), "n": self.n}
        if isinstance(self, Add2):
            return {"add2": [self.shortcut.to_dict(), self.main.to_dict()]}
        if isinstance(self, Named):
            return {"named": self.label, "body": self.body.to_dict()}
        raise TypeError(type(self).__name__)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "BluePrint":
        """Rebuild what ``to_dict`` wrote, through the builders (fc, conv...), so a description read
        from a file (a checkpoint's spec) gets the same checks as code that declares a model."""
        if not isinstance(d, dict):
            raise BluePrintError(f"from_dict: {d!r} is not a BluePrint description. Fix: pass BluePrint.to_dict() "
                                 "output.")
        if "layer" in d:
            build = LAYER_BUILDERS.get(d["layer"]) if isinstance(d["layer"], str) else None
            params = d.get("params", {})
            if build is None or not isinstance(params, dict):
                raise BluePrintError(f"from_dict: layer {d.get('layer')!r} with params {params!r} is not one this "
                                     f"library builds ({', '.join(sorted(LAYER_BUILDERS))}). Fix: pass "
                                     "BluePrint.to_dict() output.")
            try:
                return build(**params)
            except TypeError as exc:
                raise BluePrintError(f"from_dict: layer {d['layer']!r} got params {params!r}: {exc}. Fix: pass "
                                     "BluePrint.to_dict() output.") from None
        if "seq" in d:
            return Seq(tuple(BluePrint.from_dict(c) for c in d["seq"]))
        if "repeat" in d:
            return repeat(BluePrint.from_dict(d["repeat"]), d["n"])
        if "add2" in d:
            return Add2(BluePrint.from_dict(d["add2"][0]), BluePrint.from_dict(d["add2"][1]))
        if "named" in d:
            return Named(d["named"], BluePrint.from_dict(d["body"]))
        raise BluePrintError(f"from_dict: {d!r} is not a BluePrint description. Fix: pass BluePrint.to_dict() output.")

    @staticmethod
    def from_torch(module: Any, weights: bool = False) -> Any:
        """The BluePrint of a ``torch.nn.Sequential`` of Linear, Conv2d, BatchNorm1d/2d, activations
        (ReLU, GELU, SiLU, Tanh, Sigmoid, LeakyReLU), MaxPool2d/AvgPool2d, AdaptiveAvgPool2d(1),
        Flatten, Dropout (nested Sequentials too), to plan and inspect a model written in PyTorch. With
        ``weights=True``: ``(blueprint, state_dict)``, the module's weights under this library's names
        for ``task.load_state_dict(state_dict)`` once the task is compiled (same logits in eval mode).
        Any other layer is a BluePrintError naming its position and class."""
        from .export.from_torch import describe_sequential
        description, state = describe_sequential(module, weights)
        blueprint = BluePrint.from_dict(description)
        return (blueprint, state) if weights else blueprint

    def _lines(self) -> list[str]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.tree()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # IPython
        p.text(self.tree())


@dataclass(frozen=True, repr=False)
class Layer(BluePrint):
    """A leaf layer: a kind and its parameters."""

    kind: str
    params: tuple[tuple[str, Any], ...] = ()

    @property
    def p(self) -> dict[str, Any]:
        return dict(self.params)

    def leaves(self) -> list["Layer"]:
        return [self]

    def signature(self) -> str:
        p = self.p
        if self.kind == "fc":
            return f"fc({p['out']}, bias={p['bias']})"
        if self.kind == "conv":
            return f"conv({p['out']}, k={p['k']}, s={p['s']}, p={p['p']}" + ("" if p["bias"] else ", bias=False") + ")"
        args = ", ".join(f"{k}={v}" for k, v in self.params)
        return f"{self.kind}({args})"

    def _lines(self) -> list[str]:
        return [self.signature()]


@dataclass(frozen=True, repr=False)
class Seq(BluePrint):
    """Layers applied one after the other."""

    children: tuple[BluePrint, ...]

    def leaves(self) -> list[Layer]:
        return [leaf for c in self.children for leaf in c.leaves()]

    def _lines(self) -> list[str]:
        out = ["seq"]
        for i, c in enumerate(self.children):
            last = i == len(self.children) - 1
            sub = c._lines()
            out.append(("└─ " if last else "├─ ") + sub[0])
            out.extend(("   " if last else "│  ") + s for s in sub[1:])
        return out

    def __iter__(self) -> Iterator[BluePrint]:
        return iter(self.children)

    def __len__(self) -> int:
        return len(self.children)


@dataclass(frozen=True, repr=False)
class Repeat(BluePrint):
    """A body repeated n times; each copy has its own parameters."""

    body: BluePrint
    n: int

    def leaves(self) -> list[Layer]:
        return [leaf for _ in range(self.n) for leaf in self.body.leaves()]

    def _lines(self) -> list[str]:
        sub = self.body._lines()
        return [f"repeat x{self.n}"] + ["└─ " + sub[0]] + ["   " + s for s in sub[1:]]


@dataclass(frozen=True, repr=False)
class Add2(BluePrint):
    """Residual sum: shortcut(x) + main(x), both fed the same input."""

    shortcut: BluePrint
    main: BluePrint

    def leaves(self) -> list[Layer]:
        return self.shortcut.leaves() + self.main.leaves()

    def _lines(self) -> list[str]:
        out = ["add2"]
        for tag, c, last in (("shortcut", self.shortcut, False), ("main", self.main, True)):
            sub = c._lines()
            out.append(("└─ " if last else "├─ ") + f"{tag}: " + sub[0])
            out.extend(("   " if last else "│  ") + s for s in sub[1:])
        return out


@dataclass(frozen=True, repr=False)
class Named(BluePrint):
    """A pre-fused building block (cbr, ResNet block): a label over its expansion."""

    label: str
    body: BluePrint

    def leaves(self) -> list[Layer]:
        return self.body.leaves()

    def _lines(self) -> list[str]:
        sub = self.body._lines()
        return [f"{self.label}"] + ["   " + s for s in sub[1:]] if sub[0] == "seq" else [self.label] + ["   " + s for s in sub]


# ---- validation helpers ---------------------------------------------------------------
SIZE_MAX = 2**31 - 1
"""The largest layer size, kernel, stride or padding a builder takes: shapes are indexed with
32-bit ints on the GPU, and no arena holds a layer that wide anyway."""


def _positive_int(where: str, name: str, v: Any, example: str) -> int:
    n = as_int(v)
    if n is None or not 0 < n <= SIZE_MAX:
        raise bad_argument(BluePrintError, where, name, v, f"a positive int up to {SIZE_MAX}",
                           f"pass a whole number >= 1, e.g. {example}")
    return n


def _probability(where: str, name: str, v: Any, *, allow_one: bool = False) -> float:
    f = as_float(v)
    if f is None or f < 0 or f > 1 or (f == 1 and not allow_one):
        raise bad_argument(BluePrintError, where, name, v, "a float in [0, 1)",
                           "use a drop probability such as 0.1 or 0.5")
    return f


def _bool(where: str, name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise bad_argument(BluePrintError, where, name, v, "True or False", f"pass {name}=True or {name}=False")
    return v


# ---- builders -------------------------------------------------------------------------
NOT_HERE = {
    "num_features": "drop num_features=: channels are read from the input",
    "in_features": "drop in_features=: sizes are read from the input at plan()",
    "in_channels": "drop in_channels=: sizes are read from the input at plan()",
    "inplace": "drop inplace=: every layer writes its own region of the arena",
}
"""Keywords PyTorch users bring to any layer builder that have no counterpart here, and why."""
CONV_NAMES = {"out_channels": "out", "kernel_size": "k", "stride": "s", "padding": "p"}
"""nn.Conv2d's and the pools' keywords, and their names here (only where the meaning is the same:
dropout's p is a probability, not a padding)."""
_layer_args = arguments_checked(BluePrintError, aliases=NOT_HERE)
_conv_args = arguments_checked(BluePrintError, aliases={**NOT_HERE, **CONV_NAMES})
_fc_args = arguments_checked(BluePrintError, aliases={**NOT_HERE, "out_features": "out"})


@_fc_args
def fc(out: int, bias: bool = True) -> Layer:
    """Fully connected layer y = x W^T + b, W shaped (out, in) as in PyTorch's nn.Linear."""
    size = as_int(bias)  # nn.Linear(784, 10) (as_int takes no bools)
    if size is not None:
        fix = (f"write fc({size}) for PyTorch's nn.Linear({out}, {size})" if size >= 1 else
               "write fc(out) with the output size only") + ": the input size comes from the layer before"
        raise bad_argument(BluePrintError, "fc", "bias", bias, "True or False (fc takes the output size only)", fix)
    return Layer("fc", (("out", _positive_int("fc", "out", out, "fc(128)")), ("bias", _bool("fc", "bias", bias))))


@_layer_args
def relu() -> Layer:
    return Layer("relu")


@_layer_args
def tanh() -> Layer:
    return Layer("tanh")


@_layer_args
def sigmoid() -> Layer:
    return Layer("sigmoid")


@_layer_args
def silu() -> Layer:
    return Layer("silu")


@_layer_args
def gelu() -> Layer:
    """GELU with the exact erf form (PyTorch's default, approximate='none')."""
    return Layer("gelu")


@_layer_args
def leaky_relu(negative_slope: float = 0.01) -> Layer:
    slope = as_float(negative_slope)
    if slope is None or slope < 0:
        raise bad_argument(BluePrintError, "leaky_relu", "negative_slope", negative_slope,
                           "a finite float >= 0", "use a small slope such as 0.01")
    return Layer("leaky_relu", (("negative_slope", slope),))


@_layer_args
def dropout(p: float = 0.5) -> Layer:
    """Inverted dropout: zero each element with probability p in training, identity in inference."""
    return Layer("dropout", (("p", _probability("dropout", "p", p)),))


@_layer_args
def flatten() -> Layer:
    """Collapse every dimension but the batch into one."""
    return Layer("flatten")


@_layer_args
def identity() -> Layer:
    return Layer("identity")


@_layer_args
def seq(*layers: BluePrint) -> Seq:
    """Layers applied in order. ``seq(fc(10))``; nested seqs are allowed."""
    if len(layers) == 1 and isinstance(layers[0], (list, tuple)):
        layers = tuple(layers[0])
    if not layers:
        raise BluePrintError("seq: got no layers; expected at least one layer. "
                             "Fix: pass layers, e.g. seq(fc(10)).")
    for i, layer in enumerate(layers):
        if not isinstance(layer, BluePrint):
            hint = " (did you forget the parentheses, e.g. relu() instead of relu?)" if callable(layer) else ""
            raise bad_argument(BluePrintError, "seq", f"layer #{i}", layer, "a layer such as fc(10) or relu()",
                               "build every element with a layer builder" + hint)
    return Seq(tuple(layers))


@_layer_args
def repeat(body: BluePrint, n: int) -> Repeat:
    """``body`` applied n times in sequence, each copy with its own weights."""
    if not isinstance(body, BluePrint):
        raise bad_argument(BluePrintError, "repeat", "body", body, "a layer or seq",
                           "pass a BluePrint, e.g. repeat(seq(fc(64), relu()), 3)")
    return Repeat(body, _positive_int("repeat", "n", n, "repeat(seq(fc(64), relu()), 3)"))


# ---- image layers (issue 4) -----------------------------------------------------------
def _nonneg_int(where: str, name: str, v: Any) -> int:
    n = as_int(v)
    if n is None or not 0 <= n <= SIZE_MAX:
        raise bad_argument(BluePrintError, where, name, v, f"an int from 0 to {SIZE_MAX}",
                           f"pass a whole number, e.g. {name}=1")
    return n


@_conv_args
def conv(out: int, k: int, s: int = 1, p: int = 0, bias: bool = True) -> Layer:
    """2-D convolution (square kernel k, stride s, zero padding p), like nn.Conv2d(in, out, k, s, p)."""
    return Layer("conv", (("bias", _bool("conv", "bias", bias)), ("k", _positive_int("conv", "k", k, "conv(64, 3)")),
                          ("out", _positive_int("conv", "out", out, "conv(64, 3)")), ("p", _nonneg_int("conv", "p", p)),
                          ("s", _positive_int("conv", "s", s, "conv(64, 3, s=2)"))))


@_layer_args
def bn(momentum: float = 0.1, eps: float = 1e-5) -> Layer:
    """Batch normalisation over channels (nn.BatchNorm2d / BatchNorm1d semantics)."""
    m, e = as_float(momentum), as_float(eps)
    if m is None or not 0 <= m <= 1:
        raise bad_argument(BluePrintError, "bn", "momentum", momentum, "a float in [0, 1]", "use e.g. 0.1")
    if e is None or e <= 0:
        raise bad_argument(BluePrintError, "bn", "eps", eps, "a float > 0", "use e.g. 1e-5")
    return Layer("bn", (("eps", e), ("momentum", m)))


def _pool(kind: str, k: int, s: int | None, p: int) -> Layer:
    """maxpool/avgpool: checks p <= k/2 here, as PyTorch does, instead of failing later at compile."""
    k, p = _positive_int(kind, "k", k, f"{kind}(2)"), _nonneg_int(kind, "p", p)
    if 2 * p > k:
        raise bad_argument(BluePrintError, kind, "p", p,
                           f"at most half the kernel size k (as in PyTorch), here p <= {k // 2} for k={k}",
                           f"use {kind}({k}, p={k // 2}) or less padding, or a larger kernel size k")
    return Layer(kind, (("k", k), ("p", p), ("s", k if s is None else _positive_int(kind, "s", s, f"{kind}(2, s=2)"))))


@_conv_args
def maxpool(k: int = 2, s: int | None = None, p: int = 0) -> Layer:
    """Max pooling, k x k windows, stride s (default k), padding p <= k/2 (like nn.MaxPool2d)."""
    return _pool("maxpool", k, s, p)


@_conv_args
def avgpool(k: int = 2, s: int | None = None, p: int = 0) -> Layer:
    """Average pooling (count_include_pad=True, padding p <= k/2, like nn.AvgPool2d)."""
    return _pool("avgpool", k, s, p)


@_layer_args
def gap() -> Layer:
    """Global average pooling: (N, H, W, C) -> (N, C). Makes a model resolution-free."""
    return Layer("gap")


@_layer_args
def add2(shortcut: BluePrint, main: BluePrint) -> Add2:
    """Residual connection: shortcut(x) + main(x). Use identity() for a plain skip."""
    for name, v in (("shortcut", shortcut), ("main", main)):
        if not isinstance(v, BluePrint):
            raise bad_argument(BluePrintError, "add2", name, v, "a layer or seq",
                               "e.g. add2(identity(), seq(conv(64, 3, p=1), bn()))")
    return Add2(shortcut, main)


@_conv_args
def cbr(out: int, k: int, s: int = 1, p: int = 0) -> Named:
    """The pre-fused conv (no bias) + bn + relu block."""
    body = seq(conv(out, k, s, p, bias=False), bn(), relu())
    return Named(f"cbr({out}, k={k}, s={s}, p={p})", body)


RESNET_3_3 = "RESNET_3_3"
RESNET_3_3_DS = "RESNET_3_3_DS"


@_conv_args
def block(out: int, kind: str = RESNET_3_3) -> Named:
    """ResNet basic block: two 3x3 convs with a residual. RESNET_3_3_DS halves the
    resolution (stride 2) and projects the shortcut with a 1x1 conv + bn."""
    out = _positive_int("block", "out", out, "block(64, RESNET_3_3)")
    if kind == RESNET_3_3:
        main = seq(cbr(out, 3, 1, 1), conv(out, 3, 1, 1, bias=False), bn())
        body = seq(add2(identity(), main), relu())
    elif kind == RESNET_3_3_DS:
        main = seq(cbr(out, 3, 2, 1), conv(out, 3, 1, 1, bias=False), bn())
        body = seq(add2(seq(conv(out, 1, 2, 0, bias=False), bn()), main), relu())
    else:
        raise bad_argument(BluePrintError, "block", "kind", kind, "RESNET_3_3 or RESNET_3_3_DS",
                           "pass kind=RESNET_3_3 (same size) or RESNET_3_3_DS (downsample)")
    return Named(f"block({out}, {kind})", body)


LAYER_BUILDERS = {f.__name__: f for f in (fc, relu, tanh, sigmoid, silu, gelu, leaky_relu, dropout, flatten, conv,
                                          bn, maxpool, avgpool, gap, identity)}
"""Layer kind -> the builder that checks its parameters (BluePrint.from_dict rebuilds through them)."""

"""The BluePrint's node classes, its containers (seq, repeat, add2) and the checks every layer
builder shares; the layer builders themselves live with their op (renaissance_nb/ops/) and register
here, so ``BluePrint.from_dict`` and ``Layer.signature`` reach them without importing ops/.

``seq(fc(1024), relu(), fc(10))`` says what the model is and nothing about how it
runs: the compiler turns it into tensors, regions and graph nodes. BluePrints are
frozen values: they compare by content, hash, and print as a readable tree.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

from .checks import arguments_checked, as_float, as_int
from .errors import BluePrintError, bad_argument

LAYER_BUILDERS: dict[str, Callable[..., "Layer"]] = {}
"""Layer kind -> the builder that checks its parameters (BluePrint.from_dict rebuilds through them);
filled by ``register_layer`` as renaissance_nb/ops/ loads."""
SIGNATURES: dict[str, Callable[[dict[str, Any]], "str | None"]] = {}
"""Layer kind -> how its call reads in a tree (None: ``kind(name=value, ...)``)."""


READERS: dict[str, Callable[[Any, bool], tuple[dict[str, Any], dict[str, Any]]]] = {}
"""Foreign model formats -> the function describing a model of that format (``to_dict``'s form) and
its weights: export/from_torch.py registers "torch" (it reads the ops, which import this module)."""


def register_layer(kind: str, builder: Callable[..., "Layer"], signature: Callable[[dict[str, Any]], "str | None"]) -> None:
    """Make ``kind`` a layer BluePrints can hold: rebuilt by ``builder``, printed by ``signature``."""
    assert kind not in LAYER_BUILDERS, f"layer kind {kind!r} registered twice"
    LAYER_BUILDERS[kind] = builder
    SIGNATURES[kind] = signature


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
            return {"named": self.label, "body": self.body.to_dict(),
                    **({"channels": self.channels} if self.channels is not None else {})}
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
            return Named(d["named"], BluePrint.from_dict(d["body"]), d.get("channels"))
        raise BluePrintError(f"from_dict: {d!r} is not a BluePrint description. Fix: pass BluePrint.to_dict() output.")

    @staticmethod
    def from_torch(module: Any, weights: bool = False) -> Any:
        """The BluePrint of a ``torch.nn.Sequential`` of the modules some op reads (Linear, Conv2d,
        BatchNorm1d/2d, the activations, MaxPool2d/AvgPool2d, AdaptiveAvgPool2d(1), Flatten, Dropout...;
        nested Sequentials too), to plan and inspect a model written in PyTorch. With
        ``weights=True``: ``(blueprint, state_dict)``, the module's weights under this library's names
        for ``task.load_state_dict(state_dict)`` once the task is compiled (same logits in eval mode).
        Any other layer is a BluePrintError naming its position and class."""
        description, state = READERS["torch"](module, weights)
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
        own = SIGNATURES.get(self.kind)
        text = own(self.p) if own is not None else None
        if text is not None:
            return text
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
    """A pre-fused building block (cbr, ResNet block): a label over its expansion. ``channels``, where
    given, is the input width the body was built for (MBCONV's cin): plan() checks it."""

    label: str
    body: BluePrint
    channels: int | None = None

    def leaves(self) -> list[Layer]:
        return self.body.leaves()

    def _lines(self) -> list[str]:
        sub = self.body._lines()
        return [f"{self.label}"] + ["   " + s for s in sub[1:]] if sub[0] == "seq" else [self.label] + ["   " + s for s in sub]


# ---- checks shared by the layer builders (renaissance_nb/ops/) --------------------------
SIZE_MAX = 2**31 - 1
"""The largest layer size, kernel, stride or padding a builder takes: shapes are indexed with
32-bit ints on the GPU, and no arena holds a layer that wide anyway."""


def positive_int(where: str, name: str, v: Any, example: str) -> int:
    n = as_int(v)
    if n is None or not 0 < n <= SIZE_MAX:
        raise bad_argument(BluePrintError, where, name, v, f"a positive int up to {SIZE_MAX}",
                           f"pass a whole number >= 1, e.g. {example}")
    return n


def probability(where: str, name: str, v: Any, *, allow_one: bool = False) -> float:
    f = as_float(v)
    if f is None or f < 0 or f > 1 or (f == 1 and not allow_one):
        raise bad_argument(BluePrintError, where, name, v, "a float in [0, 1)",
                           "use a drop probability such as 0.1 or 0.5")
    return f


def boolean(where: str, name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise bad_argument(BluePrintError, where, name, v, "True or False", f"pass {name}=True or {name}=False")
    return v


def nonneg_int(where: str, name: str, v: Any) -> int:
    n = as_int(v)
    if n is None or not 0 <= n <= SIZE_MAX:
        raise bad_argument(BluePrintError, where, name, v, f"an int from 0 to {SIZE_MAX}",
                           f"pass a whole number, e.g. {name}=1")
    return n


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
layer_args = arguments_checked(BluePrintError, aliases=NOT_HERE)
conv_args = arguments_checked(BluePrintError, aliases={**NOT_HERE, **CONV_NAMES})
fc_args = arguments_checked(BluePrintError, aliases={**NOT_HERE, "out_features": "out"})


# ---- containers -----------------------------------------------------------------------
@layer_args
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


@layer_args
def repeat(body: BluePrint, n: int) -> Repeat:
    """``body`` applied n times in sequence, each copy with its own weights."""
    if not isinstance(body, BluePrint):
        raise bad_argument(BluePrintError, "repeat", "body", body, "a layer or seq",
                           "pass a BluePrint, e.g. repeat(seq(fc(64), relu()), 3)")
    return Repeat(body, positive_int("repeat", "n", n, "repeat(seq(fc(64), relu()), 3)"))


@layer_args
def add2(shortcut: BluePrint, main: BluePrint) -> Add2:
    """Residual connection: shortcut(x) + main(x). Use identity() for a plain skip."""
    for name, v in (("shortcut", shortcut), ("main", main)):
        if not isinstance(v, BluePrint):
            raise bad_argument(BluePrintError, "add2", name, v, "a layer or seq",
                               "e.g. add2(identity(), seq(conv(64, 3, p=1), bn()))")
    return Add2(shortcut, main)

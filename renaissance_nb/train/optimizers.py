"""Optimizers with PyTorch's names, defaults and update rules (LARS after the paper and torchlars).

Each one is a frozen setting: its hyper-parameters, their checks, ``state`` (the region families it
needs besides W and G) and ``graph_params`` (what its update node carries, ``kind`` first). Its rules,
the update on each backend and the inverse the tensor inspector uses, are its definition in
renaissance_nb/optim/, found by ``kind``: one fused pass over the W/G/M/V ranges of the arena, so the
cost does not grow with the number of parameter tensors.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..checks import as_flag
from ..errors import ConfigError, bad_argument
from .settings import LR_MAX, Settings, check_number


DECAY_GROUPS = ("all", "matrices")
"""Adam's ``decay=``: weight decay on every parameter (PyTorch's one group), or on the matrices of fc,
conv and attention only (minGPT's groups: none on norms, biases and embeddings)."""
DEFAULT_HIDDEN: dict[str, Any] = {"maximize": False, "decay": "all"}
"""Settings a repr leaves out at their default: a checkpoint compares the text, and those saved before
the setting existed say nothing of it."""


class Optimizer(Settings):
    """Base: lr (used when no scheduler is set), weight decay, state families."""

    kind = "base"
    lr_: float  # each optimizer's dataclass field (a bare annotation here is no field)

    @property
    def state(self) -> tuple[str, ...]:
        raise NotImplementedError

    def graph_params(self) -> dict[str, Any]:
        raise NotImplementedError

    def lr(self, value: float):  # type: ignore[no-untyped-def]
        return self._with("lr", value)

    def weight_decay(self, value: float):  # type: ignore[no-untyped-def]
        return self._with("weight_decay", value)

    def __repr__(self) -> str:
        """The settings, ``maximize`` only when set: a checkpoint compares this text, and those saved
        before ``maximize`` existed say nothing of it."""
        args = ", ".join(f"{k}={v!r}" for k, v in self.settings().items() if DEFAULT_HIDDEN.get(k, object()) != v)
        return f"{type(self).__name__}({args})"


def _flag(where: str, name: str, value: Any) -> bool:
    return as_flag(value, where, name, ConfigError, f"pass a bool, e.g. .{name}(True)")


def _betas(where: str, betas: Any) -> tuple[float, float]:
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise bad_argument(ConfigError, where, "betas", betas, "a pair (beta1, beta2)", "e.g. betas=(0.9, 0.999)")
    return tuple(check_number(where, f"beta{i + 1}", b, low=0.0, high=1.0, high_open=True,
                              fix="each beta must be in [0, 1)") for i, b in enumerate(betas))  # type: ignore[return-value]


@dataclass(frozen=True, init=False, repr=False)
class Adam(Optimizer):
    """torch.optim.Adam: L2 weight decay added to the gradient; ``maximize`` ascends, as in PyTorch.

    Moments below float32's smallest normal (1.2e-38) are stored as 0, because subnormals are slow on
    CPUs; with an ``eps`` at or above about 1e-15 this changes no weight (kernels/fused.py TINY32)."""

    lr_: float = 1e-3
    betas_: tuple[float, float] = (0.9, 0.999)
    eps_: float = 1e-8
    weight_decay_: float = 0.0
    maximize_: bool = False
    decay_: str = "all"
    kind = "adam"
    added_later = {"decay": "all"}  # a checkpoint's record names decay= only when it is not the default

    def __post_init__(self) -> None:
        w = type(self).__name__
        self._set("lr", check_number(w, "lr", self.lr_, high=LR_MAX, fix="use a positive learning rate such as 1e-3"))
        self._set("betas", _betas(w, self.betas_))
        self._set("eps", check_number(w, "eps", self.eps_, low=0.0, low_open=True,
                                      fix="use a small positive eps such as 1e-8"))
        self._set("weight_decay", check_number(w, "weight_decay", self.weight_decay_,
                                               fix="use 0 or a small positive value such as 1e-4"))
        self._set("maximize", _flag(w, "maximize", self.maximize_))
        if self.decay_ not in DECAY_GROUPS:
            raise bad_argument(ConfigError, w, "decay", self.decay_, "'all' or 'matrices'",
                               "decay='matrices' leaves norms, biases and embeddings undecayed (minGPT's parameter "
                               "groups); decay='all' decays every parameter (PyTorch's default)")

    def decay(self, groups: str):  # type: ignore[no-untyped-def]
        """Which parameters the weight decay reaches: "all" (one parameter group, PyTorch's default) or
        "matrices" (minGPT's and nanoGPT's groups: fc, conv and attention weights; not norms, biases
        or embeddings)."""
        return self._with("decay", groups)

    def betas(self, beta1: float, beta2: float | None = None):  # type: ignore[no-untyped-def]
        pair = beta1 if beta2 is None else (beta1, beta2)
        return self._with("betas", _betas(type(self).__name__, pair))

    def eps(self, value: float):  # type: ignore[no-untyped-def]
        return self._with("eps", value)

    def maximize(self, value: bool = True):  # type: ignore[no-untyped-def]
        """Ascend the loss instead of descending it (torch's ``maximize=True``: the gradient's sign flips)."""
        return self._with("maximize", value)

    @property
    def state(self) -> tuple[str, ...]:
        return ("M", "V")

    def graph_params(self) -> dict[str, Any]:
        return {"kind": self.kind, "beta1": self.betas_[0], "beta2": self.betas_[1], "eps": self.eps_,
                "weight_decay": self.weight_decay_, "maximize": self.maximize_,
                **({"decay": self.decay_} if self.decay_ != "all" else {})}


@dataclass(frozen=True, init=False, repr=False)
class AdamW(Adam):
    """torch.optim.AdamW: decoupled weight decay (default 0.01, as in PyTorch)."""

    weight_decay_: float = 1e-2
    kind = "adamw"


@dataclass(frozen=True, init=False, repr=False)
class SGD(Optimizer):
    """torch.optim.SGD with momentum, dampening, Nesterov, L2 weight decay and ``maximize``."""

    lr_: float = 1e-3
    momentum_: float = 0.0
    dampening_: float = 0.0
    weight_decay_: float = 0.0
    nesterov_: bool = False
    maximize_: bool = False
    kind = "sgd"

    def __post_init__(self) -> None:
        self._set("lr", check_number("SGD", "lr", self.lr_, high=LR_MAX, fix="use a positive learning rate such as 0.1"))
        self._set("momentum", check_number("SGD", "momentum", self.momentum_, fix="use a momentum >= 0, e.g. 0.9 (0 for none)"))
        self._set("dampening", check_number("SGD", "dampening", self.dampening_, high=1.0,
                                            fix="use a dampening in [0, 1]"))
        self._set("weight_decay", check_number("SGD", "weight_decay", self.weight_decay_,
                                               fix="use 0 or a small positive value"))
        self._set("nesterov", _flag("SGD", "nesterov", self.nesterov_))
        self._set("maximize", _flag("SGD", "maximize", self.maximize_))
        if self.nesterov_ and (self.momentum_ <= 0 or self.dampening_ != 0):
            raise ConfigError("SGD: nesterov=True needs momentum > 0 and dampening = 0 (as in PyTorch). "
                              f"Got momentum={self.momentum_}, dampening={self.dampening_}. Fix: set .momentum(0.9).")

    def momentum(self, value: float) -> "SGD":
        return self._with("momentum", value)

    def dampening(self, value: float) -> "SGD":
        return self._with("dampening", value)

    def nesterov(self, value: bool = True) -> "SGD":
        return self._with("nesterov", value)

    def maximize(self, value: bool = True) -> "SGD":
        """Ascend the loss instead of descending it (torch's ``maximize=True``)."""
        return self._with("maximize", value)

    @property
    def state(self) -> tuple[str, ...]:
        return ("M",) if self.momentum_ != 0 else ()

    def graph_params(self) -> dict[str, Any]:
        return {"kind": self.kind, "momentum": self.momentum_, "dampening": self.dampening_,
                "weight_decay": self.weight_decay_, "nesterov": self.nesterov_, "maximize": self.maximize_}


@dataclass(frozen=True, init=False, repr=False)
class LARS(Optimizer):
    """Layer-wise Adaptive Rate Scaling (You, Gitman and Ginsburg 2017, "Large Batch Training of Convolutional
    Networks"), in torchlars' form: SGD with momentum whose step for each weight tensor is scaled by a trust ratio.

    For each weight tensor w (fc weights and conv kernels), with g its gradient after clipping::

        trust = trust_coefficient * ||w|| / (||g|| + weight_decay * ||w|| + eps)   (1 when ||w|| or ||g|| is 0)
        m = momentum * m + trust * (g + weight_decay * w)
        w = w - lr * m

    Biases and batch-norm parameters are excluded from both the trust ratio and the weight decay, as is common
    practice with LARS (torchlars' and the reference implementations' ``exclude``): ``m = momentum * m + g``,
    ``w = w - lr * m``. The paper's Algorithm 1 puts lr inside the momentum (m = momentum * m + lr * trust * ...);
    with a constant lr the two are the same, under a schedule this one follows torch.optim.SGD's convention.
    The norms, float64 sums rounded to float32, are kept per weight tensor in the N regions as [||w||, ||g||]."""

    lr_: float = 0.1
    momentum_: float = 0.9
    weight_decay_: float = 0.0
    trust_coefficient_: float = 1e-3
    eps_: float = 1e-8
    kind = "lars"

    def __post_init__(self) -> None:
        self._set("lr", check_number("LARS", "lr", self.lr_, high=LR_MAX, fix="use a positive learning rate such as 0.1"))
        self._set("momentum", check_number("LARS", "momentum", self.momentum_, high=1.0, high_open=True,
                                           fix="use a momentum in [0, 1), e.g. 0.9"))
        self._set("weight_decay", check_number("LARS", "weight_decay", self.weight_decay_,
                                               fix="use 0 or a small positive value such as 5e-4"))
        self._set("trust_coefficient", check_number("LARS", "trust_coefficient", self.trust_coefficient_,
                                                    low_open=True, fix="use a small positive value such as 1e-3"))
        self._set("eps", check_number("LARS", "eps", self.eps_, fix="use a small value >= 0 such as 1e-8"))

    def momentum(self, value: float) -> "LARS":
        return self._with("momentum", value)

    def trust_coefficient(self, value: float) -> "LARS":
        """eta, the trust ratio's scale (the paper's 0.001)."""
        return self._with("trust_coefficient", value)

    def eps(self, value: float) -> "LARS":
        return self._with("eps", value)

    @property
    def state(self) -> tuple[str, ...]:
        return ("M", "N")

    def graph_params(self) -> dict[str, Any]:
        return {"kind": self.kind, "momentum": self.momentum_, "weight_decay": self.weight_decay_,
                "trust_coefficient": self.trust_coefficient_, "eps": self.eps_}

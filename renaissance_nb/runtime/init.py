"""Weight initialisation: torch.nn.init's schemes, every random number from Philox's INIT stream.

The weights are a pure function of (seed, scheme, model): one block offset runs over the parameters
in plan order (``compiled.params``) and each draw advances it by the blocks it used
(``Philox.blocks_needed``), so no two tensors share counters and a seed gives the same numbers on
any run. The default, ``kaiming_uniform`` without keywords, is what nn.Linear and nn.Conv2d do in
``reset_parameters`` (``kaiming_uniform_(w, a=math.sqrt(5))``: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
for the weight, and the same bound for the bias), byte for byte the init the runner had before
``init()`` existed.

Biases: ``kaiming_uniform`` keeps reset_parameters' U(+-1/sqrt(fan_in)) whatever ``a=`` or
``nonlinearity=`` say (torch's bias rule reads neither). Every other scheme zeroes them: that is what
re-initialising a torch model means in practice (``xavier_uniform_(m.weight); zeros_(m.bias)``, as
torchvision's ResNet does with kaiming_normal_), Keras's and Flax's layers start with zero biases, and
torch's xavier, kaiming and orthogonal are not defined on a 1-D tensor. Batch norm: weight 1, bias 0,
running mean 0 and variance 1, whatever the scheme (its reset_parameters).
"""
from __future__ import annotations

import math

import numpy as np

from ..compiler.layers import ParamInfo
from ..config_checks import init_defaults
from ..memory.dtensor import arena_layout
from ..train.rng import Philox, StreamId


def fans(shape: tuple[int, ...]) -> tuple[int, int]:
    """(fan_in, fan_out) as torch's ``_calculate_fan_in_and_fan_out`` counts them on its layout: an fc
    weight (out, in) is torch's; a conv weight lives channels-last, (out, kh, kw, in), where torch's is
    (out, in, kh, kw), so the receptive field lies between out and in here."""
    receptive = math.prod(shape[1:-1])
    return shape[-1] * receptive, shape[0] * receptive


def calculate_gain(nonlinearity: str, a: float) -> float:
    """``torch.nn.init.calculate_gain(nonlinearity, a)``: the gain kaiming's std is scaled by."""
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        return math.sqrt(2.0 / (1 + a ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    return 1.0  # linear, conv*, conv_transpose*, sigmoid


class WeightInit:
    """Fills the parameters of one task, in plan order, by its init() scheme; ``offset``: the next
    block of the INIT stream."""

    def __init__(self, seed: int, scheme: str, args: tuple[tuple[str, float | str], ...]) -> None:
        self.rng, self.scheme, self.offset = Philox(seed), scheme, 0
        self.plain = scheme == "kaiming_uniform" and not args  # reset_parameters' own bound, as before init()
        self.args = {**init_defaults(scheme), **dict(args)}

    def fill(self, p: ParamInfo, view: np.ndarray) -> None:
        """Initialise one parameter or buffer (``view``: its arena view, in the arena's layout)."""
        if p.init == "normal" and self.plain:  # an embedding's own N(0, std^2) (nn.Embedding, GPT-2's 0.02)
            self._normal(view, p.std)
        elif p.init == "normal":  # another scheme re-initialises it as a weight
            self._weight(view)
        elif p.init != "uniform":  # batch norm's weight and bias, its running statistics
            view.fill(1.0 if p.init == "ones" else 0.0)
        elif p.role != "weight":  # an fc or conv bias
            if self.scheme == "kaiming_uniform":
                self._uniform(view, 1.0 / math.sqrt(p.fan_in))
            else:
                view.fill(0.0)
        elif self.plain:
            self._uniform(view, 1.0 / math.sqrt(p.fan_in))
        else:
            self._weight(view)

    def _weight(self, view: np.ndarray) -> None:
        """torch.nn.init's formulas, in its order of operations (float64 throughout)."""
        s, k = self.scheme, self.args
        fan_in, fan_out = fans(view.shape)
        if s == "zeros":
            view.fill(0.0)
        elif s == "orthogonal":
            self._orthogonal(view, float(k["gain"]))
        elif s.startswith("kaiming"):
            std = calculate_gain(str(k["nonlinearity"]), float(k["a"])) / math.sqrt(
                fan_in if k["mode"] == "fan_in" else fan_out)
            self._uniform(view, math.sqrt(3.0) * std) if s.endswith("uniform") else self._normal(view, std)
        else:
            std = float(k["gain"]) * math.sqrt(2.0 / float(fan_in + fan_out))
            self._uniform(view, math.sqrt(3.0) * std) if s.endswith("uniform") else self._normal(view, std)

    def _uniform(self, view: np.ndarray, bound: float) -> None:
        """U(-bound, bound): ``(2u - 1) * bound`` in float64 from Philox's 24-bit uniforms, in arena order."""
        u = self.rng.uniform(view.size, int(StreamId.INIT), self.offset)
        view[...] = ((2.0 * u.astype(np.float64) - 1.0) * bound).astype(np.float32).reshape(view.shape)
        self.offset += Philox.blocks_needed(view.size)

    def _gaussian(self, n: int) -> np.ndarray:
        """``n`` standard normals (Philox's Box-Muller), as float64."""
        z = self.rng.normal(n, int(StreamId.INIT), self.offset).astype(np.float64)
        self.offset += Philox.blocks_needed(-(-n // 2), words_per_item=2)  # normal() takes its words in pairs
        return z

    def _normal(self, view: np.ndarray, std: float) -> None:
        view[...] = (self._gaussian(view.size) * std).astype(np.float32).reshape(view.shape)

    def _orthogonal(self, view: np.ndarray, gain: float) -> None:
        """torch.nn.init.orthogonal_: the weight as torch flattens it, (out, in * kh * kw), is the Q of a
        Gaussian matrix's QR (of its transpose when it is wide), each column's sign fixed by diag(R) so Q
        is unique; in float64 (torch: the weight's dtype), then times ``gain``. A zero on R's diagonal,
        which torch's ``sign()`` would turn into a zero column, keeps the sign here."""
        rows = view.shape[0]
        cols = view.size // rows
        flat = self._gaussian(view.size).reshape(rows, cols)
        tall = flat if rows >= cols else flat.T
        q, r = np.linalg.qr(tall)
        q *= np.where(np.diag(r) < 0.0, -1.0, 1.0)
        w = (q if rows >= cols else q.T) * gain
        if view.ndim == 4:  # torch's (out, in, kh, kw) into the arena's (out, kh, kw, in)
            out, kh, kw, c = view.shape
            w = arena_layout(w.reshape(out, c, kh, kw))
        view[...] = w.astype(np.float32).reshape(view.shape)

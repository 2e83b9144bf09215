"""What a node's operands must be before its kernel is bound: counts, shapes and parameters.

Why: the compiler builds its graphs with matching shapes, but a graph built by hand
(``TaskBase.add_graph``) can pair any tensors. The numba loops behind the element-wise
ops index flat arrays without bounds checks and the products write where they are told,
so a short bias or a small output would read or write past its tensor. Each rule here
sees only shapes and parameters, so ``add_graph`` can refuse a node before anything is
registered. Ops without a rule (the compiler's own: backward passes, losses, the
optimizer...) are checked by their kernels when bound.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from .fused import ACT_CODES

Shape = tuple[int, ...]
Rule = Callable[[Sequence[Shape], Sequence[Shape], dict[str, Any]], "str | None"]
RULES: dict[str, tuple[tuple[int, int], tuple[int, int], Rule]] = {}
"""op -> ((fewest, most) inputs, (fewest, most) outputs, rule giving the problem or None)."""


def rule(op: str, inputs: tuple[int, int], outputs: tuple[int, int]) -> Callable[[Rule], Rule]:
    def register(f: Rule) -> Rule:
        RULES[op] = (inputs, outputs, f)
        return f
    return register


def _flat2d(s: Shape) -> Shape:
    return (s[0], math.prod(s[1:])) if len(s) >= 2 else s


def _broadcast(*shapes: Shape) -> Shape | None:
    """NumPy's broadcast shape, or None when the shapes do not broadcast."""
    out: list[int] = []
    for dims in zip(*(((1,) * (max(map(len, shapes)) - len(s)) + s)[::-1] for s in shapes)):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            return None
        out.append(sizes.pop() if sizes else 1)
    return tuple(out[::-1])


def _act(p: dict[str, Any], default: str | None = None) -> str | None:
    act = p.get("act", default)
    if act not in ACT_CODES:
        return f"parameter act={act!r} is not one of {sorted(ACT_CODES)} (node(..., act='relu'))"
    return None


@rule("fc_fwd", (2, 3), (1, 1))
def _fc_fwd(ins: Sequence[Shape], outs: Sequence[Shape], p: dict[str, Any]) -> str | None:
    x, w, y = _flat2d(ins[0]), ins[1], outs[0]
    if len(x) != 2 or len(w) != 2 or len(y) != 2 or w[1] != x[1] or y != (x[0], w[0]):
        return f"y = x W^T needs x (m, k), W (n, k), y (m, n); got x {ins[0]}, W {w}, y {y}"
    if len(ins) == 3 and math.prod(ins[2]) != w[0]:
        return f"the bias has {math.prod(ins[2])} values for {w[0]} outputs (shape {ins[2]})"
    return _act(p, "none")


@rule("matmul", (2, 2), (1, 1))
def _matmul(ins: Sequence[Shape], outs: Sequence[Shape], p: dict[str, Any]) -> str | None:
    a, b, c = ins[0], ins[1], outs[0]
    if len(a) != 2 or len(b) != 2 or len(c) != 2:
        return f"matmul takes 2-D tensors; got {a}, {b} -> {c}"
    a = a[::-1] if p.get("trans_a") else a
    b = b[::-1] if p.get("trans_b") else b
    if a[1] != b[0] or c != (a[0], b[1]):
        return f"op(a) {a} @ op(b) {b} does not give c {c}"
    return None


def _broadcast_rule(op: str) -> Rule:
    def check(ins: Sequence[Shape], outs: Sequence[Shape], p: dict[str, Any]) -> str | None:
        if _broadcast(*ins, outs[0]) != outs[0]:
            return f"{op} of {' and '.join(map(str, ins))} does not broadcast to the output {outs[0]}"
        return None
    return check


rule("add", (2, 2), (1, 1))(_broadcast_rule("add"))
rule("mul", (2, 2), (1, 1))(_broadcast_rule("mul"))
rule("copy", (1, 1), (1, 1))(_broadcast_rule("copy"))


def _same_shape(act: bool) -> Rule:
    def check(ins: Sequence[Shape], outs: Sequence[Shape], p: dict[str, Any]) -> str | None:
        if any(s != outs[0] for s in ins):
            return f"an element-wise op needs equal shapes; got {' and '.join(map(str, ins))} -> {outs[0]}"
        return _act(p) if act else None
    return check


rule("relu", (1, 1), (1, 1))(_same_shape(act=False))
rule("act_fwd", (1, 1), (1, 1))(_same_shape(act=True))
rule("act_bwd", (2, 2), (1, 1))(_same_shape(act=True))


@rule("reshape_copy", (1, 1), (1, 1))
def _reshape_copy(ins: Sequence[Shape], outs: Sequence[Shape], p: dict[str, Any]) -> str | None:
    if math.prod(ins[0]) != math.prod(outs[0]):
        return f"a reshape keeps the number of values; got {ins[0]} -> {outs[0]}"
    return None


@rule("fill", (0, 0), (1, 64))
def _fill(ins: Sequence[Shape], outs: Sequence[Shape], p: dict[str, Any]) -> str | None:
    v = p.get("value", 0.0)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return f"parameter value={v!r} is not one number (node('fill', [], outputs, value=0.0))"
    return None


def operand_problem(op: str, ins: Sequence[Shape], outs: Sequence[Shape], p: dict[str, Any]) -> str | None:
    """Why a node of ``op`` with operands of these shapes cannot run, or None (also for ops without a rule)."""
    if op not in RULES:
        return None
    (lo_in, hi_in), (lo_out, hi_out), check = RULES[op]
    if not (lo_in <= len(ins) <= hi_in and lo_out <= len(outs) <= hi_out):
        want_in = lo_in if lo_in == hi_in else f"{lo_in}-{hi_in}"
        return f"{op} takes {want_in} inputs and {lo_out} output; got {len(ins)} and {len(outs)}"
    return check(ins, outs, p)

"""Tracing: a Python function of 2-D float32 arrays, run once on placeholders, becomes a graph.

    def f(x, w, b):
        return relu(x @ w + b)

    traced = trace(f, x=(4, 3), w=(3, 2), b=(1, 2))
    traced.forward, traced.backward      # GraphNodes: the function, and its reverse mode
    traced.rules                         # each op's backward rule as it was applied

Why a tracer of its own: a DeepLearningTask builds its graphs from a BluePrint, so a student never
sees how a *function* becomes a static graph. Here the function runs once with ``Traced`` values that
record every operation instead of computing it (as ``jax.jit`` and ``torch.fx`` do), the backward graph
is derived node by node in reverse with one rule per op, and the result is planned and bound by a
``TaskBase``, with liveness reuse. What a trace cannot do is the point of static graphs: its shapes are
fixed (``Jit`` traces a new variant per input shape, a guard), and a branch on a computed value is
refused with a ``TraceError`` (the graph would silently keep one side).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .compiler.graph import GraphNode, node
from .errors import TraceError, bad_argument
from .memory.liveness import lifetimes_from_programs
from .memory.region import Region
from .taskbase import TaskBase

Shape = tuple[int, ...]
RULES = {
    "matmul": "c = a @ b  →  da += dc @ bᵀ,  db += aᵀ @ dc",
    "add": "c = a + b  →  da += dc,  db += dc (summed over the rows it was broadcast along)",
    "mul": "c = a * b  →  da += dc * b,  db += dc * a",
    "relu": "y = relu(x)  →  dx += dy * (x > 0)",
    "tanh": "y = tanh(x)  →  dx += dy * (1 - tanh(x)²)",
}
"""Each traced op's reverse-mode rule, as ``Traced.rules`` prints it."""


class Traced:
    """A placeholder for an array while a function is traced: it has a shape, no values."""

    def __init__(self, tape: "_Tape", tid: int) -> None:
        self.tape, self.id = tape, tid

    @property
    def shape(self) -> Shape:
        return self.tape.shapes[self.id]

    @property
    def name(self) -> str:
        return self.tape.names[self.id]

    def __matmul__(self, other: "Traced") -> "Traced":
        a, b = self.shape, _operand(other, "@").shape
        if a[1] != b[0]:
            raise TraceError(f"trace: {self.name} @ {other.name}: shapes {a} and {b} do not multiply. "
                             "Fix: the inner dimensions must agree.")
        return self.tape.op("matmul", (self, other), (a[0], b[1]))

    def __add__(self, other: "Traced") -> "Traced":
        return self.tape.op("add", (self, _operand(other, "+")), _broadcast(self, other, "+"))

    def __mul__(self, other: "Traced") -> "Traced":
        return self.tape.op("mul", (self, _operand(other, "*")), _broadcast(self, other, "*"))

    def __bool__(self) -> bool:
        raise TraceError(f"trace: `if` on {self.name}, a value the graph computes: a traced graph is fixed before "
                         "any value exists, so it cannot take a branch on one. Fix: decide outside the function "
                         "(between steps, on the host), or compute both sides and combine them arithmetically.")

    def __float__(self) -> float:
        raise TraceError(f"trace: float({self.name}) needs a value, and a trace has none. Fix: read results "
                         "after the graph ran (Compiled.run returns them).")

    __int__ = __index__ = __float__  # type: ignore[assignment]

    def _compare(self, other: Any) -> bool:
        """==, !=, <, ... on a traced value: a branch on a computed value (`if h == x:` never reached __bool__:
        Python compared identities and the graph silently kept one side)."""
        raise TraceError(f"trace: comparing {self.name}, a value the graph computes, decides nothing while tracing "
                         "(no value exists yet). Fix: decide outside the function, or compute both sides and "
                         "combine them arithmetically (relu(x) keeps where x > 0).")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _compare  # type: ignore[assignment]
    __hash__ = object.__hash__  # placeholders are still told apart by identity (the tape's dictionaries)

    def _unsupported(self, *args: Any, **kwargs: Any) -> "Traced":
        raise TraceError(f"trace: {self.name} takes part in an operation a trace does not record; the traced ops "
                         "are a @ b, a + b, a * b (Traced on both sides), relu and tanh. Fix: write the function "
                         "with those (a - b as a + b * minus_ones, a constant as an input of its own).")

    __sub__ = __rsub__ = __radd__ = __rmul__ = __rmatmul__ = __neg__ = __pos__ = __abs__ = _unsupported
    __truediv__ = __rtruediv__ = __pow__ = __rpow__ = __getitem__ = __iter__ = __len__ = _unsupported  # type: ignore

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> "Traced":
        return self._unsupported()

    def __getattr__(self, attr: str) -> Any:  # .T, .sum(), .reshape(...): what NumPy arrays have and these do not
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise TraceError(f"trace: {self.name}.{attr}: a traced placeholder has a shape and a name, no {attr!r}. "
                         "Fix: write the function with @, +, *, relu and tanh on traced values.")

    def __repr__(self) -> str:
        return f"Traced({self.name}, shape={self.shape})"


def relu(x: Traced) -> Traced:
    """max(x, 0), element-wise."""
    return _operand(x, "relu").tape.op("relu", (x,), x.shape)


def tanh(x: Traced) -> Traced:
    """tanh(x), element-wise."""
    return _operand(x, "tanh").tape.op("act_fwd", (x,), x.shape, act="tanh")


def _operand(x: Any, op: str) -> Traced:
    if not isinstance(x, Traced):
        raise TraceError(f"trace: {op} got {type(x).__name__} {x!r}; only traced arrays take part in the graph. "
                         "Fix: pass constants as inputs of the traced function.")
    return x


def _broadcast(a: Traced, b: Traced, op: str) -> Shape:
    """The shape of an element-wise op: equal shapes, or a (1, n) row / (m, 1) column broadcast."""
    sa, sb = a.shape, _operand(b, op).shape
    out = tuple(max(x, y) for x, y in zip(sa, sb))
    if any(x not in (1, o) for x, o in zip(sa, out)) or any(y not in (1, o) for y, o in zip(sb, out)):
        raise TraceError(f"trace: {a.name} {op} {b.name}: shapes {sa} and {sb} do not broadcast. "
                         "Fix: use equal shapes, or a (1, n) row.")
    return out


@dataclass
class _Tape:
    """What a trace records: tensor shapes and names, and the forward nodes in order."""

    shapes: list[Shape] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)  # "input", "value", "grad", "ones"
    nodes: list[GraphNode] = field(default_factory=list)

    def new(self, shape: Shape, name: str, kind: str) -> int:
        self.shapes.append(tuple(shape))
        self.names.append(name)
        self.kinds.append(kind)
        return len(self.shapes) - 1

    def op(self, op: str, ins: tuple[Traced, ...], shape: Shape, **params: Any) -> Traced:
        out = self.new(shape, f"v{len(self.nodes) + 1}", "value")
        self.nodes.append(node(op, [x.id for x in ins], [out], **params))
        return Traced(self, out)


class _Reverse:
    """Reverse mode over a tape: each node's rule, last node first, into gradient slots."""

    def __init__(self, tape: _Tape) -> None:
        self.tape, self.nodes, self.rules = tape, [], []  # type: ignore[var-annotated]
        self.grad: dict[int, int] = {}
        self.ones: dict[Shape, int] = {}

    def run(self, out: int) -> None:
        t = self.tape
        self.grad[out] = t.new(t.shapes[out], f"d{t.names[out]}", "grad")
        self.nodes.append(node("fill", [], [self.grad[out]], value=1.0))  # L = sum(out): dL/dout = 1
        self.rules.append(f"seed: d{t.names[out]} = 1   (the gradient of L = sum({t.names[out]}))")
        for n in reversed(list(t.nodes)):
            if n.outputs[0] in self.grad:
                self.rule(n)

    def rule(self, n: GraphNode) -> None:
        t, dc = self.tape, self.grad[n.outputs[0]]
        kind = "tanh" if n.op == "act_fwd" else n.op
        names = [t.names[i] for i in (*n.inputs, *n.outputs)]
        self.rules.append(f"{kind:<7} {RULES[kind]}   [{', '.join(names)}]")
        if n.op == "matmul":
            a, b = n.inputs
            self.accumulate(a, t.shapes[a], "matmul", [dc, b], trans_b=True)
            self.accumulate(b, t.shapes[b], "matmul", [a, dc], trans_a=True)
        elif n.op == "add":
            for x in n.inputs:
                self.accumulate(x, t.shapes[dc], "copy", [dc])
        elif n.op == "mul":
            a, b = n.inputs
            self.accumulate(a, t.shapes[dc], "mul", [dc, b])
            self.accumulate(b, t.shapes[dc], "mul", [dc, a])
        else:  # relu, tanh: dx = dy * f'(x), the kernel act_bwd
            self.accumulate(n.inputs[0], t.shapes[dc], "act_bwd", [dc, n.inputs[0]], act=n.p.get("act", "relu"))

    def accumulate(self, x: int, shape: Shape, op: str, ins: list[int], **params: Any) -> None:
        """dx += op(ins), where op's result has ``shape``: the first contribution writes dx's slot, a later
        one a slot of its own that is then added to dx. A result wider than x (x was broadcast) is summed
        over the broadcast rows or columns first."""
        t = self.tape
        first = x not in self.grad
        if first:
            self.grad[x] = t.new(t.shapes[x], f"d{t.names[x]}", "grad")
        dx = self.grad[x]
        part = dx if first and shape == t.shapes[x] else t.new(shape, f"d{t.names[x]}.{len(t.shapes)}", "grad")
        self.nodes.append(node(op, ins, [part], **params))
        if shape != t.shapes[x]:
            part = self.reduce(part, t.shapes[x], dx if first else None)
        if part != dx:
            self.nodes.append(node("add", [dx, part], [dx]))

    def reduce(self, part: int, target: Shape, into: int | None) -> int:
        """``part`` summed down to ``target``: over rows by ones(1, m) @ part, over columns by part @ ones(n, 1)."""
        t = self.tape
        (m, n), (rm, rn) = t.shapes[part], target
        if rm == 1 and m > 1:
            out = into if into is not None and rn == n else t.new((1, n), f"{t.names[part]}.rows", "grad")
            self.nodes.append(node("matmul", [self.ones_of((1, m)), part], [out]))
            part = out
        if rn == 1 and n > 1:
            out = into if into is not None else t.new((rm, 1), f"{t.names[part]}.cols", "grad")
            self.nodes.append(node("matmul", [part, self.ones_of((n, 1))], [out]))
            part = out
        return part

    def ones_of(self, shape: Shape) -> int:
        """A constant vector of ones (filled once at the start of backward) for the sums above."""
        if shape not in self.ones:
            self.ones[shape] = self.tape.new(shape, f"ones{shape}", "ones")
        return self.ones[shape]


REGIONS = {"input": Region.W_FC_WEIGHT, "value": Region.F_FEATURE_FP32, "grad": Region.F_GRAD_SLOT_FP32,
           "ones": Region.S_SCALAR_FP32}
"""Where a traced program's tensors live: inputs like weights, values like feature maps, gradients in
the gradient slots (both reusable by liveness), the constant ones vectors with the scalars."""


@dataclass
class Compiled:
    """One traced variant: its graphs, the task that planned and bound them, and what it cost."""

    inputs: dict[str, Shape]
    forward: list[GraphNode]
    backward: list[GraphNode]
    rules: list[str]
    names: list[str]
    output: int
    grads: dict[str, int]
    task: TaskBase
    seconds: float

    def as_text(self) -> str:
        """The forward and backward graphs, one node per line, tensors by name."""
        def line(n: GraphNode) -> str:
            ps = ", ".join(f"{k}={v}" for k, v in n.params)
            return (f"  {n.op}({', '.join(self.names[i] for i in n.inputs)}) -> "
                    f"{', '.join(self.names[i] for i in n.outputs)}" + (f"   [{ps}]" if ps else ""))
        return "\n".join(["forward:", *map(line, self.forward), "backward:", *map(line, self.backward)])

    def run(self, **arrays: Any) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Write the inputs, replay forward then backward: the output and each input's gradient
        (of the sum of the output)."""
        for name, value in arrays.items():
            self.task.write(name, np.asarray(value, dtype=np.float32))
        self.task.run("forward")
        self.task.run("backward")
        return self.task.read(self.output), {k: self.task.read(v) for k, v in self.grads.items()}


def _shapes(where: str, shapes: dict[str, Any]) -> dict[str, Shape]:
    out = {}
    for name, shape in shapes.items():
        dims = tuple(shape) if isinstance(shape, (tuple, list)) else ()
        if len(dims) != 2 or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d > 0 for d in dims):
            raise bad_argument(TraceError, where, name, shape, "a 2-D shape of positive ints like (4, 3)",
                               f"give {name}'s (rows, columns)")
        out[name] = (int(dims[0]), int(dims[1]))
    return out


def trace(fn: Callable[..., Traced], **shapes: Any) -> Compiled:
    """Trace ``fn`` with one placeholder per keyword (its 2-D shape), derive the backward graph, plan
    the tensors with liveness reuse and bind both graphs: a compiled variant for these shapes."""
    started = time.perf_counter()
    shapes_t = _shapes("trace", shapes)
    tape = _Tape()
    args = {name: Traced(tape, tape.new(s, name, "input")) for name, s in shapes_t.items()}
    out = fn(**args)
    if not isinstance(out, Traced) or out.tape is not tape:
        raise TraceError(f"trace: {getattr(fn, '__name__', fn)} returned {type(out).__name__}, not a traced array "
                         "computed from its inputs. Fix: return the result of the traced operations.")
    if not tape.nodes:
        raise TraceError(f"trace: {getattr(fn, '__name__', fn)} returned its input {out.name} unchanged: there is "
                         "no operation to trace. Fix: compute something from the inputs.")
    forward = list(tape.nodes)
    rev = _Reverse(tape)
    rev.run(out.id)
    task = TaskBase(f"trace {getattr(fn, '__name__', 'fn')} {tuple(shapes_t.values())}")
    for shape, name, kind in zip(tape.shapes, tape.names, tape.kinds):
        task.alloc(shape, "float32", REGIONS[kind], name=name)
    ones = [node("fill", [], list(rev.ones.values()), value=1.0)] if rev.ones else []
    backward = ones + rev.nodes
    grads = {name: rev.grad[a.id] for name, a in args.items() if a.id in rev.grad}
    # the output and the inputs' gradients are read after the step: live to its end, never overwritten
    step = [(n.inputs, n.outputs) for n in forward + backward] + [((out.id, *grads.values()), ())]
    task.finalize_memory(lifetimes_from_programs([step]))
    task.add_graph("forward", forward)
    task.add_graph("backward", backward)
    task.compile()
    return Compiled(shapes_t, forward, backward, rev.rules, list(tape.names), out.id, grads, task,
                    time.perf_counter() - started)


class Jit:
    """``fn`` compiled once per distinct input shapes (its guard), like ``jax.jit``: ``variants`` maps
    each shape key to its compiled variant. With ``buckets``, the first dimension of every input named in
    ``pad`` is padded with zero rows up to the next bucket, so few variants serve many batch sizes."""

    def __init__(self, fn: Callable[..., Traced], buckets: tuple[int, ...] = (), pad: tuple[str, ...] = ()) -> None:
        if buckets and (list(buckets) != sorted(set(buckets)) or not all(isinstance(b, int) and b > 0 for b in buckets)):
            raise bad_argument(TraceError, "Jit", "buckets", buckets, "increasing positive ints like (16, 32, 64)",
                               "list each padded batch size once, smallest first")
        self.fn, self.buckets, self.pad = fn, tuple(buckets), tuple(pad)
        self.variants: dict[tuple[tuple[str, Shape], ...], Compiled] = {}

    def padded_rows(self, rows: int) -> int:
        """The rows a batch of ``rows`` runs with: the smallest bucket that holds it."""
        if not self.buckets:
            return rows
        fit = [b for b in self.buckets if b >= rows]
        if not fit:
            raise bad_argument(TraceError, "Jit", "rows", rows, f"at most the largest bucket, {self.buckets[-1]}",
                               "add a larger bucket")
        return fit[0]

    def __call__(self, **arrays: Any) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        values = {k: np.asarray(v, dtype=np.float32) for k, v in arrays.items()}
        rows = {k: v.shape[0] for k, v in values.items() if k in self.pad}
        for k, r in rows.items():
            extra = self.padded_rows(r) - r
            values[k] = np.concatenate([values[k], np.zeros((extra, *values[k].shape[1:]), np.float32)]) if extra else values[k]
        key = tuple((k, tuple(v.shape)) for k, v in sorted(values.items()))
        if key not in self.variants:  # the guard failed: a new variant
            self.variants[key] = trace(self.fn, **{k: s for k, s in key})
        out, grads = self.variants[key].run(**values)
        grads = {k: (g[:rows[k]] if k in rows else g) for k, g in grads.items()}  # a padded input's zero rows cut
        return (out[: min(rows.values())] if rows else out), grads

    @property
    def arena_bytes(self) -> int:
        """The bytes every variant's arena holds, all of them kept (each is compiled for reuse)."""
        return sum(v.task.memory.total_bytes for v in self.variants.values())

    @property
    def compile_seconds(self) -> float:
        return sum(v.seconds for v in self.variants.values())

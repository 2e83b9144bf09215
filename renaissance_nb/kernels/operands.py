"""What a node's operands mean, for every backend: the rules a node must pass before it is bound,
and the unpacking, geometry and range helpers both kernel tables (kernels/ and gpu/) bind with.

Rules: what a node's operands must be before its kernel is bound (counts, shapes, parameters).

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
import numbers
from typing import Any, Callable, NamedTuple, Sequence

from ..errors import PlanError

PAR_CHUNKS = 8
"""Row blocks of the CPU's threaded sums: the kernels cut a pass into this many chunks, and the plan
sizes their partial-sum scratch (bias gradients, batch norm, the NaN probe) by it."""


def conv_tiles(k: int, s: int, p: int, cin: int) -> bool:
    """Whether a conv's geometry lets it run by tiles on the CPU (kernels/conv_tiled.py), which needs dW
    partials: an im2col convolution (not a 1x1, stride-1, unpadded product) of more than one channel."""
    return cin >= 2 and not (k == 1 and s == 1 and p == 0)


CONV_TILE_BYTES = 512 << 10
"""Target size of one tile's columns. In the conv net's step (2 MiB of L2 per core) 128, 256,
512 and 1024 KiB gave 13.1-15.6, 14.1-14.6, 12.9-13.3 and 12.3-12.6 ms for the deep layers'
forward, and about 25 ms for their backward at each size; 512 KiB leaves room in L2 for the
backward's second tile (dcols) and the sgemm's packed operands."""
CONV_THREADS = 8
"""The most threads a tiled convolution runs on: its columns scratch holds one tile for each, and its
weight gradient has CONV_THREADS - 1 partials. A constant, so the plan is the same on every machine."""


def conv_tile_images(rows_per_image: int, width: int, itemsize: int = 4) -> int:
    """Images per tile: as many as keep a tile's columns within CONV_TILE_BYTES, at least one."""
    return max(1, CONV_TILE_BYTES // max(1, rows_per_image * width * itemsize))


def conv_scratch_shape(n: int, ho: int, wo: int, k: int, s: int, p: int, cin: int) -> tuple[int, ...]:
    """The shape of a convolution's im2col scratch (``cols``, and ``dcols`` alike) for n images.

    Tiled (conv_tiles): (tiles, rows of a tile, k*k*Cin), one tile of conv_tile_images per thread,
    CONV_THREADS tiles at most, as many images as the batch at most: every backend walks the batch
    through it a tile at a time, and the backward through a scratch of the same shape (bwd_cols; it
    makes the columns again: remakes_columns). A 1x1, stride-1, unpadded conv reads x itself: (1, Cin),
    never read. A one-channel conv keeps its whole (n*Ho*Wo, k*k) tap-major matrix (kernels/conv.py),
    which its backward reads."""
    kk, per = k * k * cin, ho * wo
    if k == 1 and s == 1 and p == 0:
        return (1, cin)
    if not conv_tiles(k, s, p, cin):
        return (n * per, kk)
    tiles = min(CONV_THREADS, -(-n // conv_tile_images(per, kk)))
    tile = min(conv_tile_images(per, kk), -(-n // tiles))  # as even as the batch allows
    return (tiles, tile * per, kk)

ACT_CODES = {"none": 0, "relu": 1, "tanh": 2, "sigmoid": 3, "leaky_relu": 4, "silu": 5, "gelu": 6}
"""Activation name (as the graph stores it) -> the code the CPU and CUDA kernels switch on."""

Shape = tuple[int, ...]
Rule = Callable[[Sequence[Shape], Sequence[Shape], dict[str, Any]], "str | None"]
RULES: dict[str, tuple[tuple[int, int], tuple[int, int], Rule]] = {}
"""op -> ((fewest, most) inputs, (fewest, most) outputs, rule giving the problem or None)."""


def rule(op: str, inputs: tuple[int, int], outputs: tuple[int, int]) -> Callable[[Rule], Rule]:
    def register(f: Rule) -> Rule:
        RULES[op] = (inputs, outputs, f)
        return f
    return register


def _flat2d_shape(s: Shape) -> Shape:
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


FC_ACTS = ("none", "relu", "tanh", "sigmoid", "leaky_relu")
"""The activations the dense layers' fused bias passes compute (native.c bias_act_rows, fused.bias_act_: codes 0-4;
ops/fc.py fuses these): an fc node given silu or gelu would skip it silently."""


def _act(p: dict[str, Any], default: str | None = None, allowed: Sequence[str] = tuple(ACT_CODES)) -> str | None:
    act = p.get("act", default)
    if act not in allowed:
        return f"parameter act={act!r} is not one of {sorted(allowed)} (node(..., act='relu'))"
    return None


@rule("fc_fwd", (2, 3), (1, 1))
def _fc_fwd(ins: Sequence[Shape], outs: Sequence[Shape], p: dict[str, Any]) -> str | None:
    x, w, y = ins[0], ins[1], outs[0]
    per_row = len(x) == 3 and len(y) == 3 and len(w) == 2 and x[-1] == w[1] and y == (*x[:-1], w[0])  # (B, T, d)
    x = _flat2d_shape(x)
    if not per_row and (len(x) != 2 or len(w) != 2 or len(y) != 2 or w[1] != x[1] or y != (x[0], w[0])):
        return f"y = x W^T needs x (m, k), W (n, k), y (m, n); got x {ins[0]}, W {w}, y {y}"
    if len(ins) == 3 and math.prod(ins[2]) != w[0]:
        return f"the bias has {math.prod(ins[2])} values for {w[0]} outputs (shape {ins[2]})"
    return _act(p, "none", FC_ACTS)


@rule("fc_bwd", (5, 5), (1, 64))
def _fc_bwd(ins: Sequence[Shape], outs: Sequence[Shape], p: dict[str, Any]) -> str | None:
    """(dy, x, W, y, ones) -> (dW, [db], [dx], scratch...), rows flattened as fc_bwd_operands flattens them."""
    dy, x, w, y = ins[:4]
    if len(w) != 2 or math.prod(dy) % max(w[0], 1):
        return f"dW = dy^T x needs W (n, k) and dy of rows of n; got W {w}, dy {dy}"
    m, (n, k) = math.prod(dy) // max(w[0], 1), w
    main = list(outs[:len(outs) - len(p.get("scratch", ()))])
    wants = [("dW", main.pop(0) if main else None, w)]
    if p.get("bias"):
        wants.append(("db", main.pop(0) if main else None, (n,)))
    if p.get("need_dx"):
        wants.append(("dx", main.pop(0) if main else None, (m, k)))
    for name, got, size in (("x", x, (m, k)), ("y", y, (m, n)), *wants):
        if got is None or math.prod(got) != math.prod(size) or (name == "dW" and tuple(got) != tuple(size)):
            return f"{name} must hold {size} values as dy {dy} and W {w} give them; got {got}"
    return _act(p, "none", FC_ACTS)


@rule("softmax_xent", (2, 3), (1, 64))
def _softmax_xent(ins: Sequence[Shape], outs: Sequence[Shape], p: dict[str, Any]) -> str | None:
    """(logits, labels, [class weights]) -> (result, [dlogits]): a label per row of logits (a sequence's (B, T)
    per position), dlogits shaped as the logits."""
    logits, labels = ins[0], ins[1]
    rows = logits[:-1] if len(labels) == 2 else logits[:1]
    if len(logits) < 2 or tuple(labels) != tuple(rows):
        return f"the labels must give one class per row of the logits {logits}; got labels {labels}"
    classes = logits[-1] if len(labels) == 2 else math.prod(logits[1:])
    if len(ins) == 3 and math.prod(ins[2]) != classes:
        return f"the class weights have {math.prod(ins[2])} values for {classes} classes"
    if p.get("grad") and (len(outs) < 2 or math.prod(outs[1]) != math.prod(logits)):
        return f"the logits' gradient must be shaped as the logits {logits}; got {outs[1] if len(outs) > 1 else None}"
    return None


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
    if isinstance(v, bool) or type(v).__name__ == "bool_" or not isinstance(v, numbers.Real):  # NumPy's scalars too
        return f"parameter value={v!r} is not one number (node('fill', [], outputs, value=0.0))"
    return None


def dtype_problem(op: str, ins: Sequence[Any], outs: Sequence[Any], p: dict[str, Any]) -> str | None:
    """What a node's dtypes (NumPy dtypes) make impossible to run, or None: the few cases every kernel refuses
    alike (each was a raw NumPy or numba error when the graph first ran): labels that are not integers, a float
    written into an integer tensor, a fill value its tensor cannot hold."""
    if op == "softmax_xent" and len(ins) > 1 and ins[1].kind not in "iu":
        return f"the labels must be integers; got {ins[1]}"
    if op in ("copy", "add", "mul") and outs and outs[0].kind in "iu" and any(d.kind not in "iub" for d in ins):
        return f"{op} of {', '.join(map(str, ins))} into an {outs[0]} tensor would cut the values"
    v = p.get("value", 0.0)
    for d in outs if op == "fill" and isinstance(v, numbers.Real) else ():
        if d.kind not in "iu":
            continue
        bits = 8 * d.itemsize
        lo, hi = (0, 2 ** bits - 1) if d.kind == "u" else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        if not (math.isfinite(v) and float(v) == int(v) and lo <= int(v) <= hi):
            return f"parameter value={v!r} is not a whole number in [{lo}, {hi}], which the {d} tensor holds"
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


# ---- operand unpacking shared by the CPU and GPU kernel tables ------------------------------------
def split_scratch(outs: Sequence[Any], p: dict) -> tuple[list[Any], dict[str, Any]]:
    """A node's outputs without its trailing scratch tensors, and the scratch by role. The
    compiler lists the arena tensors a kernel works in (partial sums, per-channel coefficients)
    as the node's last outputs and names their roles in ``p["scratch"]``, so they are planned,
    placed and shown like any tensor; a backend that needs no scratch ignores them."""
    roles = tuple(p.get("scratch", ()))
    if not roles:
        return list(outs), {}
    if len(outs) < len(roles):
        raise PlanError(f"node: scratch roles {roles} name more tensors than the node's {len(outs)} outputs.")
    return list(outs[:len(outs) - len(roles)]), dict(zip(roles, outs[len(outs) - len(roles):]))


def flat2d(a: Any) -> Any:
    """(N, ...) -> (N, rest), a view (NumPy or CuPy)."""
    return a.reshape(a.shape[0], -1)


def rows(a: Any) -> Any:
    """(N, H, W, C) or (N, C) -> (rows, C), a view."""
    return a.reshape(-1, a.shape[-1])


def out_size(h: int, k: int, s: int, p: int) -> int:
    """Output size of a window k, stride s, zero padding p over h: (h + 2p - k)//s + 1."""
    return (h + 2 * p - k) // s + 1


def check_shape(op: str, name: str, got: Sequence[int], want: Sequence[int]) -> None:
    if tuple(got) != tuple(want):
        raise PlanError(f"{op}: {name} has shape {tuple(got)}, expected {tuple(want)}.")


def relu_code(op: str, p: dict) -> int:
    """The fused activation of conv, batch norm, bn_inf and add: 'none' (0) or 'relu' (1)."""
    act = p.get("act", "none")
    code = ACT_CODES.get(act, -1) if isinstance(act, str) else -1
    if code not in (ACT_CODES["none"], ACT_CODES["relu"]):
        raise PlanError(f"{op}: act must be 'none' or 'relu', got {act!r}.")
    return code


def conv_geometry(op: str, x: Any, w: Any, k: int, s: int, p: int) -> tuple[int, int, int, int, int, int, int]:
    """(n, h, w, cin, cout, ho, wo) of a convolution of NHWC x by (Cout, k, k, Cin) w, checked."""
    if x.ndim != 4 or w.ndim != 4:
        raise PlanError(f"{op}: x must be (N, H, W, Cin) and w (Cout, k, k, Cin); got {x.shape} and {w.shape}.")
    n, h, wd, cin = x.shape
    cout = w.shape[0]
    check_shape(op, "w", w.shape, (cout, k, k, cin))
    ho, wo = out_size(h, k, s, p), out_size(wd, k, s, p)
    if ho < 1 or wo < 1:
        raise PlanError(f"{op}: a {k}x{k} kernel (stride {s}, padding {p}) does not fit a {h}x{wd} input.")
    return n, h, wd, cin, cout, ho, wo


def pool_geometry(op: str, x: Any, y: Any, p: dict) -> tuple[int, int, int]:
    """(k, s, pad) of a pooling node from image x to pooled y, checked as PyTorch allows them."""
    k, s, pad = int(p["k"]), int(p.get("s", p["k"])), int(p.get("p", 0))
    if pad * 2 > k:
        raise PlanError(f"{op}: padding {pad} must be at most half the kernel size {k} (as in PyTorch).")
    n, h, w, c = x.shape
    check_shape(op, "output", y.shape, (n, out_size(h, k, s, pad), out_size(w, k, s, pad), c))
    return k, s, pad


def pool_operands(op: str, ins: Sequence[Any], p: dict) -> tuple[Any, Any]:
    """(x, aff or None) of a maxpool_fwd node (shared by the CPU and GPU tables): with bn_relu (the batch norm
    whose output it pools, ops/pool.py relu_pool_pairs) x is that batch norm's input and aff its (2, C) affine,
    the second input, and the window's values are relu(x * aff[0] + aff[1]), the output it did not write."""
    bn_relu = bool(p.get("bn_relu"))
    if len(ins) != (2 if bn_relu else 1):
        raise PlanError(f"{op}: takes its input x, and with bn_relu a batch norm's (2, C) affine as a second; got "
                        f"{len(ins)} inputs with bn_relu={p.get('bn_relu')!r}.")
    if not bn_relu:
        return ins[0], None
    x, aff = ins
    check_shape(op, "affine", aff.shape, (2, x.shape[-1]))
    return x, aff


def pool_grad_operands(op: str, ins: Sequence[Any], p: dict) -> tuple[Any, Any, Any]:
    """(dy, argmax, py) of a maxpool_bwd node (shared by the CPU and GPU tables): py is the forward's
    output, its third input, with relu=True (ops/pool.py relu_through_pool), else dy itself, unread."""
    relu = bool(p.get("relu", False))
    if len(ins) != (3 if relu else 2):
        raise PlanError(f"{op}: takes (dy, argmax) inputs, and the forward's output y as a third with relu=True; "
                        f"got {len(ins)} inputs with relu={relu}.")
    dy, am = ins[0], ins[1]
    py = ins[2] if relu else dy
    check_shape(op, "y", py.shape, dy.shape)
    return dy, am, py


class ConvBwd(NamedTuple):
    """The operands of a conv_bwd node, checked and reshaped (shared by the CPU and GPU tables)."""

    geometry: tuple[int, int, int, int, int, int, int]  # n, h, w, cin, cout, ho, wo
    k: int
    s: int
    pad: int
    act: int
    dy2: Any     # (M, Cout) view of dy
    y2: Any      # (M, Cout) view of the forward output (dy2 when there is no ReLU)
    cols: Any    # (rows, k*k*Cin): the im2col scratch of `tile` images, or x as (M, Cin) for a 1x1/stride-1 conv
    wmat: Any    # (Cout, k*k*Cin)
    dw2: Any     # (Cout, k*k*Cin)
    db: Any      # (Cout,) or None
    dx: Any      # like x, or None (first layer)
    dx2: Any     # dx as (M, Cin) for a 1x1/stride-1 conv (written by the GEMM), else None
    dcols: Any   # like cols when dx goes through col2im, else None
    tile: int    # images whose columns cols holds at once: n when it is the whole matrix


def conv_bwd_operands(outs: Sequence[Any], ins: Sequence[Any], p: dict) -> ConvBwd:
    k, s, pad = int(p["k"]), int(p.get("s", 1)), int(p.get("p", 0))
    dy, x, w = ins[0], ins[1], ins[2]
    outs = split_scratch(outs, p)[0]
    cols = ins[3] if len(ins) > 3 else None
    y = ins[4] if len(ins) > 4 else None
    act = relu_code("conv_bwd", p)
    if act and y is None:
        raise PlanError("conv_bwd: act='relu' needs the forward output y as the fifth input.")
    has_b, need_dx = bool(p.get("bias", False)), bool(p.get("need_dx", True))
    geometry = conv_geometry("conv_bwd", x, w, k, s, pad)
    n, h, wd, cin, cout, ho, wo = geometry
    check_shape("conv_bwd", "dy", dy.shape, (n, ho, wo, cout))
    m = n * ho * wo
    outs = list(outs)
    dw = outs.pop(0)
    check_shape("conv_bwd", "dw", dw.shape, w.shape)
    db = outs.pop(0) if has_b else None
    dx = outs.pop(0) if need_dx else None
    dcols = outs.pop(0) if (need_dx and outs) else None
    direct = k == 1 and s == 1 and pad == 0
    tile = n
    if direct:
        cols = x.reshape(m, cin)
    else:
        if cols is None:
            raise PlanError("conv_bwd: the im2col buffer 'cols' of the forward pass is the fourth input.")
        cols, tile = conv_columns("conv_bwd", "cols", cols, n, ho * wo, k * k * cin)
    dy2 = dy.reshape(m, cout)
    dx2 = None
    if dx is not None:
        check_shape("conv_bwd", "dx", dx.shape, x.shape)
        if direct:
            dx2, dcols = dx.reshape(m, cin), None
        else:
            if dcols is None:
                raise PlanError("conv_bwd: need_dx needs a dcols scratch view shaped like cols.")
            dcols = conv_columns("conv_bwd", "dcols", dcols, n, ho * wo, k * k * cin)[0]
            check_shape("conv_bwd", "dcols", dcols.shape, cols.shape)
    return ConvBwd(geometry, k, s, pad, act, dy2, y.reshape(m, cout) if act else dy2, cols, w.reshape(cout, -1),
                   dw.reshape(cout, -1), db, dx, dx2, dcols, tile)


def remakes_columns(o: ConvBwd, cin: int) -> bool:
    """Whether a conv backward makes its columns again from x rather than read the forward's: always for a
    convolution that tiles (its plan gives the backward a scratch of its own, bwd_cols, so the forward's
    lives only through the forward), and wherever cols holds fewer images than the batch."""
    n = o.geometry[0]
    return not (o.k == 1 and o.s == 1 and o.pad == 0) and (conv_tiles(o.k, o.s, o.pad, cin) or o.tile < n)


def conv_columns(op: str, name: str, cols: Any, n: int, per: int, kk: int) -> tuple[Any, int]:
    """A convolution's im2col scratch as (rows, k*k*Cin) and the images whose columns it holds at once
    (1 to n; per is one image's output pixels), checked. The plan gives (tiles, rows, k*k*Cin)
    (conv_scratch_shape); a hand-built graph may give the whole (n*per, k*k*Cin) matrix."""
    shape = tuple(cols.shape)
    if cols.ndim == 3 and shape[-1] == kk and cols.flags.c_contiguous:
        cols = cols.reshape(-1, kk)
    rows = cols.shape[0] if cols.ndim == 2 else 0
    if cols.ndim != 2 or cols.shape[1] != kk or rows % per or rows < per:
        raise PlanError(f"{op}: {name} has shape {shape}, expected ({n * per}, {kk}): the im2col matrix, or the "
                        f"rows of a whole number of images ({per} rows each), as 2-D or as contiguous (tiles, rows, "
                        f"{kk}). Fix: plan it with kernels.operands.conv_scratch_shape.")
    return cols, min(n, rows // per)


def bn_fwd_operands(outs: Sequence[Any], ins: Sequence[Any], p: dict) -> tuple[Any, ...]:
    """(x2, gamma, beta, y2, mean, invstd, rmean, rvar, momentum, eps, act) of a bn_fwd node, checked,
    x and y as (rows, C), y None where the node has none (y_by: a max pool applies the affine; shared by the
    CPU and GPU tables)."""
    x, gamma, beta = ins
    if p.get("y_by"):  # the max pool after it makes y's values from x and the affine (pool_operands): no y
        main = split_scratch(outs, p)[0]
        if len(main) != 4 or relu_code("bn_fwd", p) != 1 or "affine" not in tuple(p.get("scratch", ())):
            raise PlanError(f"bn_fwd: y_by={p['y_by']!r} (a max pool makes its relu output) takes act='relu', the "
                            f"outputs (mean, invstd, running_mean, running_var) and the 'affine' scratch the pool "
                            f"reads; got {len(main)} outputs, act={p.get('act', 'none')!r}, scratch "
                            f"{tuple(p.get('scratch', ()))}.")
        y = None
        mean, invstd, rmean, rvar = main
    else:
        y, mean, invstd, rmean, rvar = split_scratch(outs, p)[0]
        check_shape("bn_fwd", "y", y.shape, x.shape)
    c = x.shape[-1]
    for name, a in (("gamma", gamma), ("beta", beta), ("mean", mean), ("invstd", invstd),
                    ("running_mean", rmean), ("running_var", rvar)):
        check_shape("bn_fwd", name, a.shape, (c,))
    x2, y2 = rows(x), (None if y is None else rows(y))
    if x2.shape[0] < 2:
        raise PlanError(f"bn_fwd: training batch norm needs more than one value per channel, got input {x.shape}.")
    momentum, eps = float(p.get("momentum", 0.1)), float(p.get("eps", 1e-5))
    return x2, gamma, beta, y2, mean, invstd, rmean, rvar, momentum, eps, relu_code("bn_fwd", p)


class PooledGrad(NamedTuple):
    """Where a bn_bwd node with ``dy_pool`` = k takes dy from (ops/pool.py grad_from_pool): a max pool's
    gradient, argmax and output (N, H // k, W // k, C), k x k windows at stride k without padding. dy at
    (n, h, w, c) is the pool's gradient where the window's argmax is h * W + w and its max is above 0,
    else 0.0 (maxpool_bwd with relu=True)."""

    dy: Any
    argmax: Any
    y: Any
    k: int
    h: int  # the batch norm's map, H x W
    w: int

    def pool_backward(self) -> tuple[list[Any], dict[str, Any]]:
        """(inputs, params) of the maxpool_bwd node that would write this dy: the numba and GPU bn_bwd run it into dx."""
        return [self.dy, self.argmax, self.y], {"k": self.k, "s": self.k, "p": 0, "relu": True}


def bn_bwd_operands(outs: Sequence[Any], ins: Sequence[Any], p: dict) -> tuple[Any, ...]:
    """(dy2, x2, y2, gamma, mean, invstd, dx2, dgamma, dbeta, act, pooled) of a bn_bwd node, checked, feature
    maps as (rows, C); y2 is x2 without a fused ReLU, whose y the node may then leave out of its inputs;
    with ``dy_pool`` dy2 is None and ``pooled`` (PooledGrad) says where dy comes from, else pooled is None
    (shared by the CPU and GPU tables)."""
    act = relu_code("bn_bwd", p)
    if p.get("dy_pool"):
        return _pooled_bn_bwd_operands(outs, ins, p, act)
    if len(ins) not in ((6,) if act else (5, 6)):
        raise PlanError(f"bn_bwd: takes (dy, x, y, gamma, mean, invstd), or without a fused ReLU (act='none') "
                        f"(dy, x, gamma, mean, invstd); got {len(ins)} inputs with act={p.get('act', 'none')!r}.")
    if len(ins) == 5:  # no fused ReLU to differentiate: y is not read (ops/pool.py relu_pool_pairs)
        dy, x, gamma, mean, invstd = ins
        y = x
    else:
        dy, x, y, gamma, mean, invstd = ins
    dx, dgamma, dbeta = split_scratch(outs, p)[0]
    check_shape("bn_bwd", "dx", dx.shape, x.shape)
    check_shape("bn_bwd", "dy", dy.shape, x.shape)
    x2 = rows(x)
    return rows(dy), x2, (rows(y) if act else x2), gamma, mean, invstd, rows(dx), dgamma, dbeta, act, None


def _pooled_bn_bwd_operands(outs: Sequence[Any], ins: Sequence[Any], p: dict, act: int) -> tuple[Any, ...]:
    """bn_bwd_operands of a node with ``dy_pool`` = k: inputs (pool dy, pool argmax, pool y, x, gamma, mean,
    invstd), act='none' (the pool's max applies the ReLU's gradient)."""
    k = p["dy_pool"]
    if act or len(ins) != 7 or not isinstance(k, int) or k < 1:
        raise PlanError(f"bn_bwd: with dy_pool=k (a k x k max pool's windows, stride k) takes (pool dy, pool argmax, "
                        f"pool y, x, gamma, mean, invstd) and act='none'; got {len(ins)} inputs, dy_pool={k!r}, "
                        f"act={p.get('act', 'none')!r}.")
    pdy, am, py, x, gamma, mean, invstd = ins
    dx, dgamma, dbeta = split_scratch(outs, p)[0]
    check_shape("bn_bwd", "dx", dx.shape, x.shape)
    if x.ndim != 4:
        raise PlanError(f"bn_bwd: dy_pool needs an (N, H, W, C) input; got shape {tuple(x.shape)}.")
    n, h, w, c = x.shape
    for name, a in (("pool dy", pdy), ("pool argmax", am), ("pool y", py)):
        check_shape("bn_bwd", name, a.shape, (n, h // k, w // k, c))
    x2 = rows(x)
    return None, x2, x2, gamma, mean, invstd, rows(dx), dgamma, dbeta, act, PooledGrad(pdy, am, py, k, h, w)


def fc_bwd_operands(outs: Sequence[Any], ins: Sequence[Any], p: dict) -> tuple[Any, ...]:
    """(dy, x, w, y, ones, dW, db or None, dx or None) of an fc_bwd node, x and dx flattened to 2-D
    (shared by the CPU and GPU kernel tables)."""
    dy, x, w, y, ones = ins
    outs = split_scratch(outs, p)[0]
    dw = outs.pop(0)
    db = outs.pop(0) if p["bias"] else None
    out, fan_in = w.shape[0], w.shape[1]  # a sequence's (B, T, d) acts row by row: (B*T, d)
    dx = outs.pop(0).reshape(-1, fan_in) if p["need_dx"] else None
    return dy.reshape(-1, out), x.reshape(-1, fan_in), w, y.reshape(-1, out), ones, dw, db, dx


def optimizer_ranges(range_view: Callable[[str, str, str], Any]) -> tuple[Any, Any, Any, Any]:
    """The W, G, M, V ranges as flat float32 arrays (NumPy or CuPy), checked to line up."""
    w, g, m, v = (range_view(f"{f}_BN_BIAS", f"{f}_DEEP_CONV", "float32") for f in "WGMV")
    for name, arr in (("G", g), ("M", m), ("V", v)):
        if arr.size and arr.size != w.size:
            raise PlanError(f"optimizer: the {name} range holds {arr.size} values but W holds {w.size}; "
                            "W, G, M and V must list the same tensors with the same slot sizes.")
    return w, g, m, v


def ema_ranges(range_view: Callable[[str, str, str], Any]) -> tuple[Any, Any, Any, Any]:
    """(E, W, B_NEXT, B_PREV): the EMA's parameters and BN statistics, and their sources."""
    e = range_view("E_BN_BIAS", "E_DEEP_CONV", "float32")
    w = range_view("W_BN_BIAS", "W_DEEP_CONV", "float32")
    be = range_view("B_NEXT_MEAN", "B_NEXT_VAR", "float32")
    bw = range_view("B_PREV_MEAN", "B_PREV_VAR", "float32")
    for name, a, b in (("E", e, w), ("B_NEXT", be, bw)):
        if a.size != b.size:
            raise PlanError(f"ema_update: the {name} range holds {a.size} values but its source holds {b.size}; "
                            "they must list the same tensors with the same slot sizes.")
    return e, w, be, bw


# ---- the workspace of a product on 16-bit operands (kernels/fc_lowp.py; planned by compiler/autocast.py) ----
def workspace_elems(m: int, n: int, k: int) -> int:
    """float32 elements that are enough for c(m, n) = a(m, k) b(k, n) on any of lowp.gemm's paths: vdpbf16ps
    tiles pack both operands in k pairs; the sgemm path widens both (and the sums, for a 16-bit result),
    the NumPy fallback too (lowp.scratch_elems). The most of them, so that a plan is the same on every machine."""
    packed = (-(-m // 6) * 6 + -(-n // 64) * 64) * -(-k // 2)
    return max(packed, m * k + k * n + m * n)


def forward_workspace(x_shape: tuple[int, ...], w_shape: tuple[int, ...]) -> int:
    rows, (out, fan_in) = math.prod(x_shape[:-1]), w_shape
    return workspace_elems(rows, out, fan_in)


def backward_workspace(x_shape: tuple[int, ...], w_shape: tuple[int, ...]) -> int:
    rows, (out, fan_in) = math.prod(x_shape[:-1]), w_shape
    return max(workspace_elems(out, fan_in, rows), workspace_elems(rows, fan_in, out))

"""Causal self-attention's C kernels (kernels/attention_native.c) give the bytes of the NumPy and numba path
they replace (ops/attention_kernels.py).

Each test binds one kernel both ways on copies of the same data (outputs prefilled with garbage, so a value
left unwritten shows), runs each and compares every array, outputs, inputs and scratch, byte for byte. The
reference runs as a training step runs it (inside blas.own_cores(): OpenBLAS at one thread per call), bound
serially or, in a plan on numba's threads, with the ``par`` twins; the C kernel on 1, 2 and 3 of the pool's
threads. The shapes cover T not divisible by the flash block (a last block of one query and one key: NumPy's
dot, gemv and plain-loop cases), one head and four, hd = 1, T = 1 and tiny sizes. Then the op's binding:
C once the plan binds C for the attention ops (NUMBA_FREE_OPS, patched here), and one native op per kernel.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable

import numpy as np
import pytest

from renaissance_nb.kernels import attention_native as an
from renaissance_nb.kernels import blas, native
from renaissance_nb.kernels.cpu import BindEnv
from renaissance_nb.kernels.native_build import HERE
from renaissance_nb.runtime.bind import KERNELS
from renaissance_nb.kernels.program import calls_of
from renaissance_nb.ops import attention_kernels as ak
from test_native import same

needs_lib = pytest.mark.skipif(native.lib() is None or an.numpy_blas() is None,
                               reason=f"no C kernels ({native.status().why_not}) or no OpenBLAS by address")
NUMBA = {"an op only numba has"}
"""A plan with this op binds numba's kernels (chosen_for: it is not in NUMBA_FREE_OPS)."""
ATTENTION_OPS = {"attn_scores", "attn_mix", "attn_mix_bwd", "attn_scores_bwd", "flash_attn_fwd", "flash_attn_bwd"}
SHAPES = [(2, 4, 37, 8), (1, 1, 5, 3), (3, 1, 1, 4), (2, 2, 6, 1), (1, 4, 2, 2), (2, 4, 130, 16), (1, 2, 33, 4),
          (1, 1, 33, 1)]
"""(B, H, T, hd): T = 37 against blocks of 4 and 16; T = 1; hd = 1; tiny; B*H*T*T past PASS_PAR_MIN (the
numba reference binds its threaded twins); T = 33, one past CAUSAL_BLOCK: a last product block of one query
or key (NumPy's gemv, dot and plain-loop cases), with hd = 4 and 1."""
Make = Callable[[], tuple[list[np.ndarray], list[np.ndarray]]]


def values(rng: np.random.Generator, shape: tuple[int, ...], scale: float = 1.0) -> np.ndarray:
    """float32 values of several magnitudes with zeros of both signs and a subnormal."""
    x = (rng.standard_normal(shape) * np.exp(rng.uniform(-3, 1, shape)) * scale).astype(np.float32)
    flat = x.reshape(-1)
    for s in (0.0, -0.0, 1e-40)[:flat.size]:
        flat[rng.integers(0, flat.size)] = s
    return x


def garbage(shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
    return np.full(shape, 7.0, dtype)


def reference(bind: Callable[..., Any], outs: list, ins: list, p: dict[str, Any], threaded: bool) -> None:
    """attention_kernels' kernel, bound in a plan on numba's threads (``threaded``) or serially, run inside
    own_cores as a replay runs it."""
    with native.chosen_for(NUMBA) if threaded else nullcontext():
        kernel = bind(outs, ins, p, None)
    with blas.own_cores():
        kernel()


def compare(bind: Callable[..., Any], c_bind: Callable[..., Any], make: Make, p: dict[str, Any], threads: int,
            threaded: bool) -> None:
    """Both kernels on copies of make()'s arrays; every array the same bytes after."""
    outs, ins = make()
    reference(bind, outs, ins, p, threaded)
    c_outs, c_ins = make()
    kernel = c_bind(c_outs, c_ins, threads)
    assert kernel is not None
    kernel()
    for a, b in zip(outs + ins, c_outs + c_ins):
        same(a, b)


def _qkv(shape: tuple[int, ...], seed: int) -> np.ndarray:
    b, h, t, hd = shape
    return values(np.random.default_rng(seed), (b, t, 3 * h * hd))


def _heads(shape: tuple[int, ...], seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """q, k, v and P as the forward makes them (numba's kernel) from a seeded qkv."""
    b, h, t, hd = shape
    q, k, v, probs = garbage(shape), garbage(shape), garbage(shape), garbage((b, h, t, t))
    ak.bind_scores([q, k, v, probs], [_qkv(shape, seed)], {}, None)()
    return q, k, v, probs


def _scores_case(shape: tuple[int, int, int, int], seed: int) -> Callable[[], tuple[list, list]]:
    """attn_scores' arrays, made anew per call: garbage outputs (q, k, v, probs) and a qkv input."""
    b, h, t, _ = shape

    def scores() -> tuple[list, list]:
        return [garbage(shape), garbage(shape), garbage(shape), garbage((b, h, t, t))], [_qkv(shape, seed)]
    return scores


@needs_lib
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_materialized_forward(shape: tuple[int, int, int, int], threads: int) -> None:
    b, h, t, hd = shape
    threaded = threads > 1

    compare(ak.bind_scores, lambda o, i, n: an.bind_scores(*i, *o, n), _scores_case(shape, t), {}, threads, threaded)

    def mix() -> tuple[list, list]:
        _, _, v, probs = _heads(shape, t + 1)
        return [garbage((b, t, h * hd)), garbage(shape)], [probs, v]
    compare(ak.bind_mix, lambda o, i, n: an.bind_mix(*i, *o, n), mix, {}, threads, threaded)


@needs_lib
def test_rows_longer_than_the_c_softmax_piece() -> None:
    """T = 520 > EXP_PIECE (512): the C softmax computes a long row's exps again for its last pass (the numba
    twin keeps them), the same bytes."""
    shape = (1, 1, 520, 2)
    compare(ak.bind_scores, lambda o, i, n: an.bind_scores(*i, *o, n), _scores_case(shape, 4), {}, 1, False)


@needs_lib
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_materialized_backward(shape: tuple[int, int, int, int], threads: int) -> None:
    b, h, t, hd = shape
    threaded = threads > 1
    rng = np.random.default_rng(t * 7 + hd)
    dy, dprobs0, dv = values(rng, (b, t, h * hd)), values(rng, (b, h, t, t)), values(rng, shape)

    def mix_bwd() -> tuple[list, list]:
        _, _, v, probs = _heads(shape, t + 2)
        return [garbage((b, h, t, t)), garbage(shape), garbage(shape)], [dy.copy(), probs, v]
    compare(ak.bind_mix_bwd, lambda o, i, n: an.bind_mix_bwd(*i, *o, n), mix_bwd, {}, threads, threaded)

    def scores_bwd() -> tuple[list, list]:
        q, k, _, probs = _heads(shape, t + 3)
        dprobs = dprobs0.copy()
        return [garbage((b, t, 3 * h * hd)), garbage(shape), garbage(shape), dprobs], [dprobs, probs, q, k, dv.copy()]

    def c_scores_bwd(o: list, i: list, n: int) -> Any:
        return an.bind_scores_bwd(*i, *o[:3], n)
    compare(ak.bind_scores_bwd, c_scores_bwd, scores_bwd, {}, threads, threaded)


def _flash_scratch(shape: tuple[int, ...], block: int) -> dict[str, np.ndarray]:
    """The flash form's planned scratch (ops/attention.py's tensors), prefilled with garbage."""
    b, h, t, hd = shape
    bh, blk = b * h, min(block, t)
    out = {r: garbage((bh, blk, blk)) for r in ("sblk", "dpblk")}
    out.update({r: garbage((bh, blk, hd)) for r in ("pq", "pk")})
    out.update({"mrow": garbage((bh, blk), np.float64), "lrow": garbage((bh, blk), np.float64),
                "acc": garbage((bh, blk, hd), np.float64)})
    return out


def _flash_fwd_arrays(shape: tuple[int, ...], block: int, seed: int) -> tuple[list, list]:
    b, h, t, hd = shape
    s = _flash_scratch(shape, block)
    outs = [garbage(shape), garbage(shape), garbage(shape), garbage((b, t, h * hd)), garbage((b, h, t)), s["sblk"],
            s["mrow"], s["lrow"], s["acc"], s["pq"], garbage(shape)]
    return outs, [_qkv(shape, seed)]


@needs_lib
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("block", [4, 16, 64])
@pytest.mark.parametrize("threads", [1, 3])
def test_flash(shape: tuple[int, int, int, int], block: int, threads: int) -> None:
    b, h, t, hd = shape
    p, threaded = {"block": block}, threads > 1
    compare(ak.bind_flash_fwd, lambda o, i, n: an.bind_flash_fwd(*i, *o, block, n),
            lambda: _flash_fwd_arrays(shape, block, t), p, threads, threaded)
    fwd_outs, fwd_ins = _flash_fwd_arrays(shape, block, t)
    ak.bind_flash_fwd(fwd_outs, fwd_ins, p, None)()
    q, k, v, y, lse = fwd_outs[:5]
    dy = values(np.random.default_rng(hd), (b, t, h * hd))

    def bwd() -> tuple[list, list]:
        s = _flash_scratch(shape, block)
        outs = [garbage((b, t, 3 * h * hd)), garbage(shape), garbage(shape), garbage(shape), s["sblk"], s["dpblk"],
                s["pq"], s["pk"], garbage(shape), garbage(shape), garbage((b, h, t))]
        return outs, [dy.copy(), y.copy(), q.copy(), k.copy(), v.copy(), lse.copy()]
    compare(ak.bind_flash_bwd, lambda o, i, n: an.bind_flash_bwd(*i, *o, block, n), bwd, p, threads, threaded)


@needs_lib
def test_the_binders_decline_what_the_c_loops_do_not_take() -> None:
    """Another dtype, a non-contiguous view, mismatched shapes, or a plan on numba's threads: None."""
    shape = (1, 2, 4, 2)
    q, k, v, probs = _heads(shape, 0)
    qkv = _qkv(shape, 0)
    assert an.bind_scores(qkv, q, k, v, probs) is not None
    assert an.bind_scores(qkv.astype(np.float64), q, k, v, probs) is None
    assert an.bind_scores(qkv, q, k, v, probs[..., :2]) is None
    assert an.bind_scores(qkv, q.swapaxes(2, 3).copy(), k, v, probs) is None
    assert an.bind_mix(probs, v, np.zeros((1, 4, 5), np.float32), q) is None
    with native.chosen_for(NUMBA):
        assert an.bind_scores(qkv, q, k, v, probs) is None


def _bound_by_the_op(op: str, outs: list, ins: list, p: dict[str, Any], ops: set[str]) -> Any:
    with native.chosen_for(ops):
        return KERNELS[op](outs, ins, p, BindEnv())


@needs_lib
@pytest.mark.parametrize("form", ["materialized", "flash"])
def test_the_op_binds_c_once_the_plan_binds_c_for_attention(form: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside NUMBA_FREE_OPS the op binds the NumPy and numba kernel (a Python kernel, which splits the
    native program); with the attention ops in it (as they are), the C one, one native op, the same bytes."""
    shape = (2, 2, 9, 4)
    p = {"block": 4}
    op, make = "attn_scores", lambda: ([*(garbage(shape) for _ in "qkv"), garbage((2, 2, 9, 9))], [_qkv(shape, 1)])
    if form == "flash":
        op, make = "flash_attn_fwd", lambda: _flash_fwd_arrays(shape, 4, 1)
    outs, ins = make()
    monkeypatch.setattr(native, "NUMBA_FREE_OPS", native.NUMBA_FREE_OPS - ATTENTION_OPS)
    numba_kernel = _bound_by_the_op(op, outs, ins, p, {op})
    assert calls_of(numba_kernel) is None
    monkeypatch.setattr(native, "NUMBA_FREE_OPS", native.NUMBA_FREE_OPS | ATTENTION_OPS)
    c_outs, c_ins = make()
    c_kernel = _bound_by_the_op(op, c_outs, c_ins, p, {op})
    assert calls_of(c_kernel) == ({"attn_scores": "rnb_attn_scores", "flash_attn_fwd": "rnb_flash_fwd"}[op],)
    with blas.own_cores():
        numba_kernel()
    c_kernel()
    for a, b in zip(outs + ins, c_outs + c_ins):
        same(a, b)



def test_both_twins_cut_the_products_into_the_same_blocks() -> None:
    """attention_native.c's CAUSAL_BLOCK is attention_kernels.CAUSAL_BLOCK (the shapes above with T past it
    compare the bytes; this says which constant to change with the other)."""
    text = (HERE / "attention_native.c").read_text()
    assert f"#define CAUSAL_BLOCK {ak.CAUSAL_BLOCK}\n" in text

"""The GPT's C kernels (kernels/gpt_native.c: layer norm, token and position embeddings) give their numba
twins' bytes (ops/layernorm.py, ops/embedding.py).

Each kernel runs on the same inputs as its numba twins, serial and threaded, and on 1, 2 and 3 pool threads
(the thread count must never change a byte), on shapes with rows not divisible by PAR_CHUNKS, odd and tiny
widths, and values of all magnitudes (NaN and infinities among them); every output is compared byte for
byte, the layer norm's per-block float64 partials and the embedding's float64 sums included. Then the ops'
bind functions: C where the ops are in native.NUMBA_FREE_OPS (as the library lists them), numba
otherwise, and a small GPT that trains to the same bytes with its layer norms and embeddings in C as on
numba's kernels alone.
"""
from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import pytest

from renaissance_nb.kernels import gpt_native, native, program
from renaissance_nb.kernels.base import BindEnv
from renaissance_nb.kernels.operands import PAR_CHUNKS
from renaissance_nb.ops import registry
from test_native import awkward, same

ln = importlib.import_module("renaissance_nb.ops.layernorm")
emb = importlib.import_module("renaissance_nb.ops.embedding")
needs_lib = pytest.mark.skipif(native.lib() is None, reason=f"no C kernels: {native.status().why_not}")
THREADS = (1, 2, 3)
OPS = frozenset({"layernorm_fwd", "layernorm_bwd", "embedding_fwd", "embedding_bwd", "pos_embedding_fwd",
                 "pos_embedding_bwd"})
NUMBA = {"an op only numba has"}
"""A plan with this op binds numba's kernels (chosen_for: it is not in NUMBA_FREE_OPS)."""
LN_SHAPES = [(1, 1), (3, 5), (13, 7), (8, 64), (203, 33), (67, 128)]
"""(rows, d): tiny, fewer rows than PAR_CHUNKS, rows not divisible by it, d odd, a GPT's widths."""


def seeded(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _ln_inputs(rows: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = seeded(seed)
    x = awkward(rng, (rows, d), nan=rows > 8) + rng.uniform(-2, 2, (rows, 1)).astype(np.float32)
    return x, rng.uniform(0.5, 1.5, d).astype(np.float32), awkward(rng, (d,))


@needs_lib
@pytest.mark.parametrize("rows,d", LN_SHAPES)
def test_layer_norm_forward(rows: int, d: int) -> None:
    """ln_fwd_rows_ over every row and ln_fwd_ (by PAR_CHUNKS blocks) against rnb_ln_fwd."""
    x, w, b = _ln_inputs(rows, d, rows * 100 + d)

    def outputs() -> list[np.ndarray]:
        return [np.full((rows, d), 7.0, np.float32), np.full(rows, 7.0, np.float32), np.full(rows, 7.0, np.float32)]
    ref, par = outputs(), outputs()
    ln.ln_fwd_rows_(x, w, b, *ref, 1e-5, 0, rows)
    ln.ln_fwd_(x, w, b, *par, 1e-5)
    for a, c in zip(ref, par):
        same(a, c)
    for threads in THREADS:
        got = outputs()
        gpt_native.bind_ln_fwd(x, w, b, *got, 1e-5, threads)()
        for a, c in zip(ref, got):
            same(a, c)


@needs_lib
@pytest.mark.parametrize("rows,d", LN_SHAPES)
@pytest.mark.parametrize("need_dx", [True, False])
def test_layer_norm_backward(rows: int, d: int, need_dx: bool) -> None:
    """ln_bwd_serial_ and ln_bwd_, then ln_param_grads_, against rnb_ln_bwd: dx, the float64 partials
    (2, PAR_CHUNKS, d), dweight and dbias."""
    x, w, b = _ln_inputs(rows, d, rows + d)
    y, mean, rstd = np.zeros_like(x), np.zeros(rows, np.float32), np.zeros(rows, np.float32)
    ln.ln_fwd_rows_(x, w, b, y, mean, rstd, 1e-5, 0, rows)
    dy = awkward(seeded(d), (rows, d))

    def outputs() -> list[np.ndarray]:
        dx = np.full((rows if need_dx else 0, d), 7.0, np.float32)
        return [dx, np.full((2, PAR_CHUNKS, d), 7.0), np.full(d, 7.0, np.float32), np.full(d, 7.0, np.float32)]
    results = []
    for rows_kernel in (ln.ln_bwd_serial_, ln.ln_bwd_):
        dx, part, dw, db = outputs()
        rows_kernel(dy, x, w, mean, rstd, dx, part)
        ln.ln_param_grads_(part, dw, db)
        results.append([dx, part, dw, db])
    for threads in THREADS:
        dx, part, dw, db = outputs()
        gpt_native.bind_ln_bwd(dy, x, w, mean, rstd, dx, part, dw, db, threads)()
        results.append([dx, part, dw, db])
    for got in results[1:]:
        for a, c in zip(results[0], got):
            same(a, c)


EMBED_SHAPES = [(1, 1, 1, 1), (3, 5, 7, 9), (17, 11, 65, 64), (9, 32, 5, 3), (2, 3, 300, 513)]
"""(samples, positions, vocab, d): tiny, odd, a char GPT's, fewer columns than PAR_CHUNKS, a tile and a bit
of the position sums' 256 columns."""


@needs_lib
@pytest.mark.parametrize("n,t,vocab,d", EMBED_SHAPES)
def test_token_embedding(n: int, t: int, vocab: int, d: int) -> None:
    """gather_rows_ and gather_par_ against rnb_embed_fwd; scatter_add_ against rnb_embed_bwd (dw and the
    float64 sums); ids repeat, so rows gather several positions' gradients."""
    rng = seeded(n * t + d)
    ids = rng.integers(0, vocab, (n, t)).astype(np.int32)
    w, dy = awkward(rng, (vocab, d), nan=True), awkward(rng, (n, t, d), nan=True)
    ref, par = np.full((n, t, d), 7.0, np.float32), np.full((n, t, d), 3.0, np.float32)
    emb.gather_rows_(ids, w, ref, 0, n)
    emb.gather_par_(ids, w, par)
    same(ref, par)
    dw_ref, acc_ref = np.full((vocab, d), 7.0, np.float32), np.full((vocab, d), 7.0)
    emb.scatter_add_(ids, dy, dw_ref, acc_ref)
    for threads in THREADS:
        y = np.full((n, t, d), 5.0, np.float32)
        gpt_native.bind_embed_fwd(ids, w, y, threads)()
        same(ref, y)
        dw, acc = np.full((vocab, d), 5.0, np.float32), np.full((vocab, d), 5.0)
        gpt_native.bind_embed_bwd(ids, dy, dw, acc, threads)()
        same(dw_ref, dw)
        same(acc_ref, acc)


@needs_lib
@pytest.mark.parametrize("n,t,context,d", [(1, 1, 1, 1), (3, 5, 7, 9), (17, 11, 11, 64), (9, 32, 40, 3),
                                           (2, 3, 5, 513)])
def test_position_embedding(n: int, t: int, context: int, d: int) -> None:
    """add_rows_ against rnb_pos_fwd; batch_sum_ and the zero rows past T against rnb_pos_bwd, with dx, with
    none, and with dx the gradient's own buffer (a gradient handed through)."""
    rng = seeded(n + t + d)
    x, table, dy = awkward(rng, (n, t, d), nan=True), awkward(rng, (context, d)), awkward(rng, (n, t, d), nan=True)
    ref = np.full((n, t, d), 7.0, np.float32)
    emb.add_rows_(x, table, ref)
    dt_ref, dx_ref = np.full((context, d), 7.0, np.float32), np.full((n, t, d), 7.0, np.float32)
    emb.batch_sum_(dy, dt_ref[:t], dx_ref)
    dt_ref[t:] = 0.0
    for threads in THREADS:
        y = np.full((n, t, d), 5.0, np.float32)
        gpt_native.bind_pos_fwd(x, table, y, threads)()
        same(ref, y)
        through = dy.copy()
        for g, dx in ((dy, np.full((n, t, d), 5.0, np.float32)), (dy, np.empty((0, 0, 0), np.float32)),
                      (through, through)):
            dt = np.full((context, d), 5.0, np.float32)
            gpt_native.bind_pos_bwd(g, dt, dx, threads)()
            same(dt_ref, dt)
            if dx.size:
                same(dx_ref, dx)


@needs_lib
def test_the_binders_decline_what_the_c_loops_do_not_take() -> None:
    """int64 ids, float64 values, a non-contiguous view, a partials array of the wrong shape: None (the op
    binds numba's loop)."""
    rng = seeded(1)
    ids, w, y = rng.integers(0, 5, (2, 3)).astype(np.int32), awkward(rng, (5, 4)), np.zeros((2, 3, 4), np.float32)
    assert gpt_native.bind_embed_fwd(ids, w, y, 1) is not None
    assert gpt_native.bind_embed_fwd(ids.astype(np.int64), w, y, 1) is None
    assert gpt_native.bind_embed_fwd(ids, w.astype(np.float64), y, 1) is None
    x = awkward(rng, (6, 8))
    stats = [np.zeros(3, np.float32), np.zeros(3, np.float32)]
    assert gpt_native.bind_ln_fwd(x[::2], x[0], x[1], np.zeros((3, 8), np.float32), *stats, 1e-5, 1) is None
    dw = [np.zeros(8, np.float32), np.zeros(8, np.float32)]
    part = np.zeros((2, PAR_CHUNKS - 1, 8))
    assert gpt_native.bind_ln_bwd(x, x, x[0], np.zeros(6, np.float32), np.zeros(6, np.float32), x, part, *dw, 1) is None
    with native.chosen_for(NUMBA):
        assert gpt_native.bind_embed_fwd(ids, w, y, 1) is None  # a plan bound to numba


def _op_arrays(op: str) -> tuple[list, list, dict[str, Any]]:
    """Fresh (outs, ins, params) of one of OPS, the same values on every call (n 5, T 9, d 33, vocab 12)."""
    rng = seeded(len(op))
    n, t, d, vocab, context = 5, 9, 33, 12, 11
    x, dy, w = awkward(rng, (n, t, d)), awkward(rng, (n, t, d)), awkward(rng, (d,))
    stats = [np.abs(awkward(rng, (n, t))), np.abs(awkward(rng, (n, t))) + np.float32(0.5)]
    ids = rng.integers(0, vocab, (n, t)).astype(np.int32)
    f32 = np.float32
    made: dict[str, tuple[list, list, dict[str, Any]]] = {
        "layernorm_fwd": ([np.zeros_like(x), np.zeros((n, t), f32), np.zeros((n, t), f32)], [x, w, awkward(rng, (d,))],
                          {"eps": 1e-5}),
        "layernorm_bwd": ([np.zeros(d, f32), np.zeros(d, f32), np.zeros_like(x), np.zeros((2, PAR_CHUNKS, d))],
                          [dy, x, w, *stats], {"need_dx": True}),
        "embedding_fwd": ([np.zeros((n, t, d), f32)], [ids, awkward(rng, (vocab, d))], {}),
        "embedding_bwd": ([np.zeros((vocab, d), f32), np.zeros((vocab, d))], [dy, ids], {}),
        "pos_embedding_fwd": ([np.zeros_like(x)], [x, awkward(rng, (context, d))], {}),
        "pos_embedding_bwd": ([np.zeros((context, d), f32), np.zeros_like(x)], [dy], {}),
    }
    return made[op]


@needs_lib
@pytest.mark.parametrize("op", sorted(OPS))
def test_the_ops_bind_c_once_listed_as_numba_free(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the op in NUMBA_FREE_OPS its bind function binds the C kernel (a native program's call, nothing
    declined); in a numba plan, numba's; both give the same bytes."""
    monkeypatch.setattr(native, "NUMBA_FREE_OPS", native.NUMBA_FREE_OPS | OPS)
    factory = registry.cpu_kernels()[op]
    got = []
    for ops in (NUMBA, {op}):
        outs, ins, params = _op_arrays(op)
        with native.chosen_for(ops) as use_c:
            declined = len(native.DECLINED)
            kernel = factory(outs, ins, params, BindEnv())
            assert use_c == (ops != NUMBA) and len(native.DECLINED) == declined
        assert (program.ops_of(kernel) is not None) == use_c
        kernel()
        got.append(outs + ins)
    for a, b in zip(*got):
        same(a, b)


def _gpt_task(batch: int) -> Any:
    from renaissance_nb import AdamW, DeepLearningTask, gpt
    from tests.gpt_helpers import token_splits
    return (DeepLearningTask().model(gpt(65, 64, 2, 4, 32)).data(token_splits(batch * 3, 32, 65), batch_size=batch,
                                                                 shuffle=False)
            .optimizer(AdamW(lr=3e-3, weight_decay=0.1)).total_epochs(1).seed(0))


@needs_lib
@pytest.mark.parametrize("batch", [8, 64])
def test_a_gpt_trains_to_the_same_bytes_with_its_layer_norms_and_embeddings_in_c(
        batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """gpt(65, 64, 2, 4, 32): on numba's kernels (NUMBA_FREE_OPS emptied), and as the library binds it, every op
    of the plan numba-free, so the plan binds C: the layer norms and embeddings are then C calls of the
    step's native programs, and the weights after three steps are the same bytes. Batch 64: the passes on
    the pool's threads (the numba plan's on numba's)."""
    monkeypatch.setattr(native, "NUMBA_FREE_OPS", frozenset())
    ref = _gpt_task(batch)
    ref.run(progress=False)
    monkeypatch.undo()
    assert ref.executor.ops <= native.NUMBA_FREE_OPS
    task = _gpt_task(batch)
    task.run(progress=False)
    mine = [program.ops_of(k) is not None for g in task.executor.bound for n, k in zip(g.nodes, g.kernels)
            if n.op in OPS]
    assert mine and all(mine)
    a, b = ref.state_dict(), task.state_dict()
    assert a.keys() == b.keys() and all(a[k].tobytes() == b[k].tobytes() for k in a)


@needs_lib
@pytest.mark.parametrize("position", [0, 5, 15])
def test_the_decode_steps_kernels_give_the_numba_twins_bytes(position: int) -> None:
    """generate()'s one-token kernels: the position embedding's row add and the attention over the KV cache
    (its caches, float64 scores and output all compared)."""
    from renaissance_nb.kernels import gpt_native
    from renaissance_nb.ops.attention_kernels import attn_decode_
    rng = seeded(position)
    h, ctx, hd = 3, 16, 5
    pos = np.array([position], np.int64)
    qkv = rng.standard_normal((1, 1, 3 * h * hd)).astype(np.float32)
    arrays = [rng.standard_normal((1, h, ctx, hd)).astype(np.float32) for _ in "kv"]
    arrays += [rng.standard_normal((1, h, ctx)), np.zeros((1, 1, h * hd), np.float32)]
    c = [a.copy() for a in arrays]
    kernel = gpt_native.bind_attn_decode(qkv, pos, *c, 1 / np.sqrt(hd))
    assert kernel is not None
    kernel()
    attn_decode_(qkv, pos, *arrays, 1 / np.sqrt(hd))
    for a, b in zip(arrays, c):
        assert a.tobytes() == b.tobytes()
    x, table = rng.standard_normal((1, 1, 7)).astype(np.float32), rng.standard_normal((ctx, 7)).astype(np.float32)
    y, yc = np.empty_like(x), np.empty_like(x)
    emb.add_row_at_(x, table, pos, y)
    gpt_native.bind_add_row_at(x, table, pos, yc)()
    assert y.tobytes() == yc.tobytes()

"""Gradients of every layer kernel and of the loss against central finite differences.

The kernel factories of ``kernels/cpu.py`` are called directly with float64 arrays
(factory(outs, ins, params, BindEnv()) -> closure), so the finite differences are
accurate to ~1e-9 and a wrong derivative (a missing factor, a transposed product,
a wrong sign) shows up as an O(1) error. An end-to-end check then compares one
training step's gradients in the arena (float32) with a float64 NumPy reference.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import numgrad, one_step_gradients

from renaissance_nb import (
    CrossEntropyLoss,
    DeepLearningTask,
    dropout,
    fc,
    flatten,
    gelu,
    leaky_relu,
    relu,
    seq,
    silu,
    tanh,
)
from renaissance_nb.kernels.cpu import KERNELS, BindEnv

F64 = np.float64
ERF = np.vectorize(math.erf)


# ---- helpers -----------------------------------------------------------------------------------
def run_kernel(op: str, outs, ins, **params) -> None:
    KERNELS[op](list(outs), list(ins), params, BindEnv())()


def assert_grad(analytic: np.ndarray, numeric: np.ndarray, rtol: float = 1e-6, atol: float = 1e-8) -> None:
    assert analytic.shape == numeric.shape
    scale = max(1.0, float(np.abs(numeric).max()))
    np.testing.assert_allclose(analytic, numeric, rtol=rtol, atol=atol * scale)


def away_from_kinks(rng: np.random.Generator, shape, margin: float = 0.05) -> np.ndarray:
    """Normal samples with |x| >= margin (relu/leaky_relu are not differentiable at 0)."""
    x = rng.standard_normal(shape)
    return np.where(np.abs(x) < margin, np.sign(x + 1e-12) * (margin + np.abs(x)), x)


def act_ref(name: str, z: np.ndarray, slope: float = 0.0) -> np.ndarray:
    """Float64 reference forward of every activation (GELU: exact erf form)."""
    if name == "none":
        return z
    if name == "relu":
        return np.maximum(z, 0.0)
    if name == "tanh":
        return np.tanh(z)
    if name == "sigmoid":
        return 1.0 / (1.0 + np.exp(-z))
    if name == "leaky_relu":
        return np.where(z > 0, z, slope * z)
    if name == "silu":
        return z / (1.0 + np.exp(-z))
    if name == "gelu":
        return 0.5 * z * (1.0 + ERF(z / math.sqrt(2.0)))
    raise AssertionError(name)


def act_grad_ref(name: str, z: np.ndarray, slope: float = 0.0) -> np.ndarray:
    """Float64 reference derivative of every activation, written out by hand."""
    if name == "none":
        return np.ones_like(z)
    if name == "relu":
        return (z > 0).astype(F64)
    if name == "tanh":
        return 1.0 - np.tanh(z) ** 2
    if name == "sigmoid":
        s = 1.0 / (1.0 + np.exp(-z))
        return s * (1.0 - s)
    if name == "leaky_relu":
        return np.where(z > 0, 1.0, slope)
    if name == "silu":
        s = 1.0 / (1.0 + np.exp(-z))
        return s * (1.0 + z * (1.0 - s))
    if name == "gelu":
        return 0.5 * (1.0 + ERF(z / math.sqrt(2.0))) + z * np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    raise AssertionError(name)


def xent_ref(logits: np.ndarray, labels: np.ndarray, smoothing: float) -> float:
    """Mean softmax cross-entropy with PyTorch's label smoothing, float64."""
    n, c = logits.shape
    m = logits.max(axis=1, keepdims=True)
    logp = logits - m - np.log(np.exp(logits - m).sum(axis=1, keepdims=True))
    target = np.full((n, c), smoothing / c)
    target[np.arange(n), labels] += 1.0 - smoothing
    return float(-(target * logp).sum() / n)


# ---- fc ------------------------------------------------------------------------------------------
FC_ACTS = [("none", 0.0), ("relu", 0.0), ("tanh", 0.0), ("sigmoid", 0.0), ("leaky_relu", 0.1)]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("act,slope", FC_ACTS)
def test_fc_gradients_match_finite_differences(act: str, slope: float, bias: bool) -> None:
    rng = np.random.default_rng(1)
    n, fin, fout = 5, 4, 3
    x = rng.standard_normal((n, fin))
    w = rng.standard_normal((fout, fin)) * 0.7
    b = rng.standard_normal(fout) * 0.3
    upstream = rng.standard_normal((n, fout))
    ones = np.ones(n)

    def ref_loss() -> float:  # float64 NumPy forward: L = sum(G * act(x W^T + b))
        z = x @ w.T + (b if bias else 0.0)
        return float((upstream * act_ref(act, z, slope)).sum())

    # the kernel's forward
    y = np.zeros((n, fout))
    ins = [x, w, b] if bias else [x, w]
    run_kernel("fc_fwd", [y], ins, act=act, slope=slope)
    z = x @ w.T + (b if bias else 0.0)
    np.testing.assert_allclose(y, act_ref(act, z, slope), rtol=1e-12, atol=1e-14)  # float64-exact
    assert np.abs(z).min() > 1e-3  # no pre-activation near relu's kink: finite differences are valid

    # the kernel's backward (it overwrites dy with dz in place: give it a copy)
    dy = upstream.copy()
    dw, db, dx = np.zeros_like(w), np.zeros_like(b), np.zeros_like(x)
    outs = [dw] + ([db] if bias else []) + [dx]
    run_kernel("fc_bwd", outs, [dy, x, w, y, ones], act=act, slope=slope, bias=bias, need_dx=True)

    tol = dict(rtol=1e-6, atol=1e-8)
    assert_grad(dw, numgrad(ref_loss, w), **tol)
    assert_grad(dx, numgrad(ref_loss, x), **tol)
    if bias:
        assert_grad(db, numgrad(ref_loss, b), **tol)
    # and against the closed form, to be sure the finite differences themselves are right
    dz = upstream * act_grad_ref(act, z, slope)
    np.testing.assert_allclose(dw, dz.T @ x, rtol=tol["rtol"], atol=tol["atol"])
    np.testing.assert_allclose(dx, dz @ w, rtol=tol["rtol"], atol=tol["atol"])


def test_fc_backward_without_input_gradient_writes_only_weight_grads() -> None:
    """The first layer computes no dx (need_dx=False): dW and db must still be right."""
    rng = np.random.default_rng(2)
    x, w, b = rng.standard_normal((6, 4)), rng.standard_normal((3, 4)), rng.standard_normal(3)
    up = rng.standard_normal((6, 3))
    y = np.zeros((6, 3))
    run_kernel("fc_fwd", [y], [x, w, b], act="none", slope=0.0)
    np.testing.assert_allclose(y, x @ w.T + b, rtol=1e-12)
    dw, db = np.full_like(w, np.nan), np.full_like(b, np.nan)
    run_kernel("fc_bwd", [dw, db], [up.copy(), x, w, y, np.ones(6)], act="none", slope=0.0, bias=True,
               need_dx=False)
    np.testing.assert_allclose(dw, up.T @ x, rtol=1e-12)
    np.testing.assert_allclose(db, up.sum(axis=0), rtol=1e-12)


@pytest.mark.parametrize("act,slope", [("tanh", 0.0), ("sigmoid", 0.0), ("leaky_relu", 0.1)])
def test_fc_fused_activation_is_exact_in_float64(act: str, slope: float) -> None:
    rng = np.random.default_rng(3)
    x, w, b = rng.standard_normal((8, 5)), rng.standard_normal((4, 5)), rng.standard_normal(4)
    y = np.zeros((8, 4))
    run_kernel("fc_fwd", [y], [x, w, b], act=act, slope=slope)
    np.testing.assert_allclose(y, act_ref(act, x @ w.T + b, slope), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("act,slope", [
    ("relu", 0.0), ("tanh", 0.0), ("sigmoid", 0.0),
    ("leaky_relu", 0.1),
])
def test_fc_fused_activation_backward_is_exact_in_float64(act: str, slope: float) -> None:
    rng = np.random.default_rng(4)
    x, w, b = rng.standard_normal((8, 5)), rng.standard_normal((4, 5)), rng.standard_normal(4)
    up = rng.standard_normal((8, 4)) * 1e-3  # small, so that float32 rounding is visible against atol
    y = np.zeros((8, 4))
    run_kernel("fc_fwd", [y], [x, w, b], act=act, slope=slope)
    dz = up.copy()
    dw, db, dx = np.zeros_like(w), np.zeros_like(b), np.zeros_like(x)
    run_kernel("fc_bwd", [dw, db, dx], [dz, x, w, y, np.ones(8)], act=act, slope=slope, bias=True, need_dx=True)
    want = up * act_grad_ref(act, x @ w.T + b, slope)
    np.testing.assert_allclose(dz, want, rtol=1e-13, atol=1e-18)
    np.testing.assert_allclose(dx, want @ w, rtol=1e-12, atol=1e-18)


# ---- standalone activations ----------------------------------------------------------------------------
@pytest.mark.parametrize("act,slope", [("relu", 0.0), ("tanh", 0.0), ("sigmoid", 0.0), ("leaky_relu", 0.2),
                                       ("silu", 0.0), ("gelu", 0.0)])
def test_activation_gradients_match_finite_differences(act: str, slope: float) -> None:
    rng = np.random.default_rng(4)
    x = away_from_kinks(rng, (4, 7)) * 2.0
    upstream = rng.standard_normal((4, 7))
    y = np.zeros_like(x)
    fwd = KERNELS["act_fwd"]([y], [x], {"act": act, "slope": slope}, BindEnv())

    def loss() -> float:
        fwd()
        return float((upstream * y).sum())

    fwd()
    np.testing.assert_allclose(y, act_ref(act, x, slope), rtol=1e-12, atol=1e-14)  # float64-exact
    dx = np.zeros_like(x)
    run_kernel("act_bwd", [dx], [upstream, x], act=act, slope=slope)
    assert_grad(dx, numgrad(loss, x), rtol=1e-7)
    np.testing.assert_allclose(dx, upstream * act_grad_ref(act, x, slope), rtol=1e-12, atol=1e-14)


def test_fused_and_standalone_activation_backward_agree_in_float32() -> None:
    """fc's fused backward (from the output y) equals act_bwd (from the input z) to float32 rounding."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((16, 8)).astype(np.float32)
    w = rng.standard_normal((6, 8)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    up = rng.standard_normal((16, 6)).astype(np.float32)
    ones = np.ones(16, np.float32)
    for act, slope in FC_ACTS[1:]:
        y = np.zeros((16, 6), np.float32)
        run_kernel("fc_fwd", [y], [x, w, b], act=act, slope=slope)
        z = np.zeros((16, 6), np.float32)
        run_kernel("fc_fwd", [z], [x, w, b], act="none", slope=0.0)
        y2 = np.zeros_like(z)
        run_kernel("act_fwd", [y2], [z], act=act, slope=slope)
        np.testing.assert_allclose(y, y2, rtol=1e-6, atol=1e-7, err_msg=act)
        dz_fused = up.copy()
        dw1, db1, dx1 = np.zeros_like(w), np.zeros_like(b), np.zeros_like(x)
        run_kernel("fc_bwd", [dw1, db1, dx1], [dz_fused, x, w, y, ones], act=act, slope=slope, bias=True,
                   need_dx=True)
        dz = np.zeros_like(z)
        run_kernel("act_bwd", [dz], [up, z], act=act, slope=slope)
        np.testing.assert_allclose(dz_fused, dz, rtol=2e-6, atol=1e-6, err_msg=act)


# ---- loss -------------------------------------------------------------------------------------------
def test_top_k_counts_rank_nan_logits_as_argmax_does() -> None:
    """A diverged row is not a hit: NaN comes before every number (np.argmax returns the first NaN's
    index, as torch.argmax does), equal values by lower index. It used to count as top-1 and top-5."""
    from renaissance_nb.kernels import fused

    nan = np.nan
    logits = np.array([[nan] * 6,                       # all NaN, label 0: argmax is 0, a hit
                       [nan] * 6,                       # all NaN, label 3: a miss for top-1, 4th for top-5
                       [0.1, 5.0, nan, 0.3, 0.2, 0.0],  # the true class is the only NaN: argmax, a hit
                       [0.1, 5.0, 1.0, nan, 0.2, 0.0],  # another class is NaN: it comes first
                       [9.0, 1.0, 2.0, 3.0, 4.0, 5.0],  # finite: rank 5, a miss for both
                       [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]], np.float32)  # ties by index
    labels = np.array([0, 3, 2, 1, 1, 4], np.int32)
    result = np.zeros(3, np.float32)
    fused.softmax_xent(logits, labels, 0.0, np.zeros(0, np.float32), result, np.zeros((0, 0), np.float32), False)

    def rank(row: np.ndarray, y: int) -> int:  # sorted by (not NaN, -value, index): NaN first
        order = sorted(range(len(row)), key=lambda j: (not np.isnan(row[j]), -np.nan_to_num(row[j], nan=0.0), j))
        return order.index(y)
    ranks = [rank(r, int(y)) for r, y in zip(logits, labels)]
    assert ranks == [0, 3, 0, 1, 5, 4]
    assert result[1] == sum(r == 0 for r in ranks) == (logits.argmax(axis=1) == labels).sum() == 2
    assert result[2] == sum(r < 5 for r in ranks) == 5


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_softmax_xent_loss_and_gradient(smoothing: float) -> None:
    rng = np.random.default_rng(6)
    n, c = 7, 6
    logits = rng.standard_normal((n, c)) * 2.0
    labels = rng.integers(0, c, n).astype(np.int32)
    result = np.zeros(3)
    dlogits = np.zeros((n, c))
    k = KERNELS["softmax_xent"]([result, dlogits], [logits, labels], {"smoothing": smoothing, "grad": True},
                                BindEnv())

    def loss() -> float:
        k()
        return float(result[0])

    k()
    assert result[0] == pytest.approx(xent_ref(logits, labels, smoothing), rel=1e-12)
    # top-1 / top-5 are counts of correct rows
    rank = (logits > logits[np.arange(n), labels][:, None]).sum(axis=1)
    assert result[1] == (rank == 0).sum()
    assert result[2] == (rank < 5).sum()
    analytic = dlogits.copy()
    # the gradient of the MEAN loss
    assert_grad(analytic, numgrad(loss, logits), rtol=1e-7)
    assert_grad(analytic, numgrad(lambda: xent_ref(logits, labels, smoothing), logits), rtol=1e-7)
    np.testing.assert_allclose(analytic.sum(axis=1), 0.0, atol=1e-15)  # softmax - target sums to 0


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_class_weighted_softmax_xent_is_torchs(smoothing: float) -> None:
    """CrossEntropyLoss(weight=...): the loss and its gradient are torch's (float64 throughout), and
    the gradient is the loss's by finite differences."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    n, c = 9, 6
    logits = rng.standard_normal((n, c)) * 2.0
    labels = rng.integers(0, c, n).astype(np.int32)
    labels[:2] = 4  # a class of weight 0 among the targets
    weight = np.array([1.0, 2.0, 0.5, 3.0, 0.0, 1.25])
    result, dlogits = np.zeros(3), np.zeros((n, c))
    k = KERNELS["softmax_xent"]([result, dlogits], [logits, labels, weight], {"smoothing": smoothing, "grad": True},
                                BindEnv())

    def loss() -> float:
        k()
        return float(result[0])

    k()
    z = torch.tensor(logits, requires_grad=True)
    ref = torch.nn.functional.cross_entropy(z, torch.tensor(labels, dtype=torch.int64), weight=torch.tensor(weight),
                                            label_smoothing=smoothing)
    ref.backward()
    assert result[0] == pytest.approx(float(ref.detach()), rel=1e-12)
    analytic = dlogits.copy()
    np.testing.assert_allclose(analytic, z.grad.numpy(), rtol=1e-10, atol=1e-15)
    assert_grad(analytic, numgrad(loss, logits), rtol=1e-7)
    assert result[1] == (logits.argmax(1) == labels).sum()  # counts stay unweighted


def test_softmax_xent_large_logits_are_stable() -> None:
    logits = np.array([[1000.0, 0.0, -1000.0], [0.0, 1000.0, 999.0]])
    labels = np.array([0, 2], np.int32)
    result, d = np.zeros(3), np.zeros((2, 3))
    run_kernel("softmax_xent", [result, d], [logits, labels], smoothing=0.0, grad=True)
    assert np.isfinite(result).all() and np.isfinite(d).all()
    expected = (0.0 + (np.log1p(np.exp(-1.0)) + 1.0)) / 2
    assert result[0] == pytest.approx(expected, rel=1e-12)
    assert result[1] == 1.0 and result[2] == 2.0


# ---- dropout, flatten ---------------------------------------------------------------------------------
def test_dropout_backward_is_the_mask_multiply() -> None:
    rng = np.random.default_rng(7)
    n, d, p = 8, 16, 0.25
    x32 = rng.standard_normal((n, d)).astype(np.float32)
    y32, mask = np.zeros_like(x32), np.zeros_like(x32)
    offset = np.zeros(1, np.int64)
    env = BindEnv(seed=11)
    KERNELS["dropout_fwd"]([y32, mask], [x32, offset], {"p": p}, env)()
    keep = 1.0 - p
    assert set(np.unique(mask)) <= {0.0, np.float32(1.0 / keep)}
    assert 0 < (mask == 0).sum() < mask.size
    np.testing.assert_array_equal(y32, x32 * mask)
    assert offset[0] == (mask.size + 3) // 4  # the offset advances: the next call draws a new mask
    mask2 = np.zeros_like(mask)
    KERNELS["dropout_fwd"]([np.zeros_like(x32), mask2], [x32, offset], {"p": p}, env)()
    assert not np.array_equal(mask, mask2)

    # the gradient through y = x * mask in float64, with the backward node the graph uses ("mul")
    m64 = mask.astype(F64)
    x = rng.standard_normal((n, d))
    up = rng.standard_normal((n, d))
    y = np.zeros_like(x)
    fwd = KERNELS["mul"]([y], [x, m64], {}, BindEnv())

    def loss() -> float:
        fwd()
        return float((up * y).sum())

    dx = np.zeros_like(x)
    run_kernel("mul", [dx], [up, m64])
    assert_grad(dx, numgrad(loss, x))
    np.testing.assert_array_equal(dx, up * m64)


def test_flatten_forward_and_backward() -> None:
    rng = np.random.default_rng(8)
    x = rng.standard_normal((3, 2, 4))
    y = np.zeros((3, 8))
    fwd = KERNELS["reshape_copy"]([y], [x], {}, BindEnv())
    up = rng.standard_normal((3, 8))

    def loss() -> float:
        fwd()
        return float((up * y).sum())

    fwd()
    np.testing.assert_array_equal(y, x.reshape(3, 8))
    dx = np.zeros_like(x)
    run_kernel("reshape_copy", [dx], [up])
    assert_grad(dx, numgrad(loss, x))


# ---- end to end: one step's gradients in the arena ---------------------------------------------
def _reference_backprop(layers, x, labels, smoothing):
    """Float64 forward and backward of a layer list; returns (loss, {name: grad})."""
    acts = [x]
    for kind, arg in layers:
        h = acts[-1]
        if kind == "fc":
            w, b = arg
            acts.append(h.reshape(h.shape[0], -1) @ w.T + b)
        elif kind == "act":
            name, slope = arg
            acts.append(act_ref(name, h, slope))
        elif kind == "mask":
            acts.append(h * arg)
        elif kind == "flatten":
            acts.append(h.reshape(h.shape[0], -1))
    logits = acts[-1]
    n, c = logits.shape
    loss = xent_ref(logits, labels, smoothing)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    t = np.full((n, c), smoothing / c)
    t[np.arange(n), labels] += 1.0 - smoothing
    g = (p - t) / n
    grads = {}
    for i in range(len(layers) - 1, -1, -1):
        kind, arg = layers[i]
        h = acts[i]
        if kind == "fc":
            w, b = arg
            h2 = h.reshape(h.shape[0], -1)
            grads[i] = (g.T @ h2, g.sum(axis=0))
            g = g @ w
        elif kind == "act":
            g = g * act_grad_ref(arg[0], h, arg[1])
        elif kind == "mask":
            g = g * arg
        elif kind == "flatten":
            g = g.reshape(h.shape)
    return loss, grads


def _compare_step(task, layers_of, x, labels, smoothing) -> None:
    one_step_gradients(task)
    ex = task.executor
    layers = layers_of(ex)
    loss, ref = _reference_backprop(layers, x.astype(F64), labels, smoothing)
    assert float(ex.view("train_base", "result")[0]) == pytest.approx(loss, rel=1e-5)
    fc_names = [n for n in task.state_dict() if n.endswith(".weight")]
    fc_idx = [i for i, (k, _) in enumerate(layers) if k == "fc"]
    assert len(fc_names) == len(fc_idx)
    for name, i in zip(fc_names, fc_idx):
        layer = name.split(".")[0]
        gw = ex.view("train_base", f"{layer}.weight@grad").astype(F64)
        gb = ex.view("train_base", f"{layer}.bias@grad").astype(F64)
        rw, rb = ref[i]
        for got, want in ((gw, rw), (gb, rb)):
            scale = np.abs(want).max()
            assert scale > 1e-4  # a gradient that is really there
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5 * scale, err_msg=name)
    return loss, ref


def test_end_to_end_step_gradients_match_float64_reference_and_finite_differences() -> None:
    rng = np.random.default_rng(9)
    n, d = 32, 10
    x = rng.standard_normal((n, d)).astype(np.float32)
    y = rng.integers(0, 3, n)
    task = (DeepLearningTask().model(seq(fc(16), tanh(), fc(8), gelu(), fc(3)))
            .data(train=(x, y), batch_size=n, shuffle=False).total_epochs(1).seed(3))
    task.compile()
    sd = {k: v.astype(F64) for k, v in task.state_dict().items()}

    def layers_of(_ex):
        return [("fc", (sd["fc1.weight"], sd["fc1.bias"])), ("act", ("tanh", 0.0)),
                ("fc", (sd["fc2.weight"], sd["fc2.bias"])), ("act", ("gelu", 0.0)),
                ("fc", (sd["fc3.weight"], sd["fc3.bias"]))]

    labels = y.astype(np.int64)
    _compare_step(task, layers_of, x, labels, 0.0)

    # the reference itself against finite differences of the float64 loss
    x64 = x.astype(F64)
    for key in ("fc1.weight", "fc2.bias", "fc3.weight"):
        def loss() -> float:
            return _reference_backprop(layers_of(None), x64, labels, 0.0)[0]
        idx = {"fc1.weight": 0, "fc2.bias": 2, "fc3.weight": 4}[key]
        want = _reference_backprop(layers_of(None), x64, labels, 0.0)[1][idx][0 if key.endswith("weight") else 1]
        assert_grad(want, numgrad(loss, sd[key]), rtol=1e-6)
        got = task.executor.view("train_base", f"{key}@grad").astype(F64)
        np.testing.assert_allclose(got, numgrad(loss, sd[key]), rtol=2e-2, atol=1e-4 * np.abs(want).max())


def test_end_to_end_gradients_with_dropout_flatten_leaky_silu_and_smoothing() -> None:
    """Image-shaped input, flatten first (no first-layer backward), fused leaky_relu, dropout, silu,
    label smoothing 0.1, and fusion off for the second model: both must match the float64 reference."""
    rng = np.random.default_rng(10)
    n = 24
    x = rng.standard_normal((n, 2, 3, 2)).astype(np.float32)
    y = rng.integers(0, 4, n)
    model = seq(flatten(), fc(16), leaky_relu(0.1), dropout(0.3), fc(8), silu(), fc(4), relu(), fc(4))
    for fuse in (True, False):
        task = (DeepLearningTask().model(model).loss(CrossEntropyLoss().label_smoothing(0.1))
                .data(train=(x, y), batch_size=n, shuffle=False).total_epochs(1).seed(5).options(fuse=fuse))
        task.compile()
        sd = {k: v.astype(F64) for k, v in task.state_dict().items()}

        def layers_of(ex):
            mask = ex.view("train_base", "dropout1.mask").astype(F64)
            assert (mask == 0).any() and (mask != 0).any()
            return [("flatten", None), ("fc", (sd["fc1.weight"], sd["fc1.bias"])), ("act", ("leaky_relu", 0.1)),
                    ("mask", mask), ("fc", (sd["fc2.weight"], sd["fc2.bias"])), ("act", ("silu", 0.0)),
                    ("fc", (sd["fc3.weight"], sd["fc3.bias"])), ("act", ("relu", 0.0)),
                    ("fc", (sd["fc4.weight"], sd["fc4.bias"]))]

        _compare_step(task, layers_of, x, y.astype(np.int64), 0.1)

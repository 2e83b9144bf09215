"""Parity with PyTorch: the same MLP, the same initial weights, the same batches, the same
loss (label smoothing 0.1), optimizer and warmup+cosine schedule give the same per-step losses
and the same first-step gradients.

The engine is run with shuffle=False on 50*128 samples and no validation set, so one epoch is
exactly 50 steps and PyTorch sees the batches x[128*i : 128*(i+1)] in order. The schedule is
CosineAnnealingLR().warmup(0.2) over 1 epoch = 10 warmup steps (LinearLR(start_factor=0.1,
total_iters=10)) then CosineAnnealingLR(T_max=40) inside SequentialLR(milestones=[10]), stepped
per batch, exactly as renaissance_nb/train/schedulers.py defines it.

Measured on the development machine (2 CPU cores, torch 2.13, 784-1024-512-256-10, 50 steps):
    max relative difference of the per-step losses:
        SGD momentum 0.9           ~1e-7     SGD Nesterov           ~1e-7
        Adam                        ~6e-7     AdamW (wd 0.01)        ~6e-7
    first-step gradients, max |engine - torch| / max |torch grad| over all 8 tensors: <= ~5e-7
    learning-rate tables (engine float32 vs torch float64): <= 6e-8 relative
(see MEASURED below, which the test fills in and prints with -s).
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from renaissance_nb import (SGD, Adam, AdamW, CosineAnnealingLR, CrossEntropyLoss, DeepLearningTask, GraphId, fc, relu,
                            seq)

torch = pytest.importorskip("torch")

STEPS, BATCH, WARMUP_EPOCHS = 50, 128, 0.2
WARMUP_STEPS = round(WARMUP_EPOCHS * STEPS)
SIZES = (784, 1024, 512, 256, 10)
MEASURED: dict[str, dict[str, float]] = {}


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    n = STEPS * BATCH
    x = rng.standard_normal((n, SIZES[0]), dtype=np.float32)
    teacher = rng.standard_normal((SIZES[0], 10)).astype(np.float32) / 28.0
    y = np.argmax(x @ teacher + 0.5 * rng.standard_normal((n, 10)).astype(np.float32), axis=1)
    return x, y


CONFIGS = {
    "sgd": (lambda: SGD().momentum(0.9), 0.02,
            lambda p, lr: torch.optim.SGD(p, lr=lr, momentum=0.9)),
    "sgd_nesterov": (lambda: SGD().momentum(0.9).nesterov(True), 0.02,
                     lambda p, lr: torch.optim.SGD(p, lr=lr, momentum=0.9, nesterov=True)),
    "adam": (lambda: Adam(), 1e-3,
             lambda p, lr: torch.optim.Adam(p, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)),
    "adamw": (lambda: AdamW().weight_decay(1e-2), 1e-3,
              lambda p, lr: torch.optim.AdamW(p, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)),
}


def engine_run(x, y, make_opt, lr):
    task = (DeepLearningTask("parity")
            .model(seq(fc(SIZES[1]), relu(), fc(SIZES[2]), relu(), fc(SIZES[3]), relu(), fc(SIZES[4])))
            .data(train=(x, y), batch_size=BATCH, shuffle=False)
            .loss(CrossEntropyLoss().label_smoothing(0.1))
            .optimizer(make_opt())
            .scheduler(CosineAnnealingLR().base_lr(lr).warmup(WARMUP_EPOCHS))
            .total_epochs(1)
            .seed(1))
    task.compile()
    assert task.steps_per_epoch == STEPS
    init = task.state_dict()
    # first step's gradients: batch 0's forward and backward, no optimizer
    ex = task.executor
    ex.view("train_base", "cursor")[0] = 0
    for gid in (GraphId.CLEAR_METRICS, GraphId.TRANSFER_A, GraphId.FIRST_LAYER_FWD_A, GraphId.DEEP_FWD_BWD,
                GraphId.FIRST_LAYER_BWD_A):
        for k in ex.kernels("train_base", gid):
            k()
    grads = {k: ex.view("train_base", f"{k}@grad").copy() for k in init}
    first_loss = float(ex.view("train_base", "result")[0])
    assert int(ex.view("train_base", "step")[0]) == 0  # nothing was updated
    res = task.run(progress=False)  # the epoch starts over from batch 0
    assert len(res.step_losses) == STEPS
    assert res.step_losses[0] == first_loss
    return task, init, grads, res.step_losses.astype(np.float64)


def torch_run(x, y, init, make_opt, lr):
    torch.set_num_threads(2)
    torch.manual_seed(0)
    layers = []
    for i in range(4):
        lin = torch.nn.Linear(SIZES[i], SIZES[i + 1])
        with torch.no_grad():  # nn.Linear's weight is (out, in), like fc's
            lin.weight.copy_(torch.from_numpy(init[f"fc{i + 1}.weight"]))
            lin.bias.copy_(torch.from_numpy(init[f"fc{i + 1}.bias"]))
        layers += [lin, torch.nn.ReLU()] if i < 3 else [lin]
    model = torch.nn.Sequential(*layers)
    opt = make_opt(model.parameters(), lr)
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, end_factor=1.0, total_iters=WARMUP_STEPS)
    cos = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS - WARMUP_STEPS, eta_min=0.0)
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [warm, cos], milestones=[WARMUP_STEPS])
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))
    losses, lrs, grads = [], [], {}
    for i in range(STEPS):
        xb, yb = xt[i * BATCH:(i + 1) * BATCH], yt[i * BATCH:(i + 1) * BATCH]
        lrs.append(opt.param_groups[0]["lr"])
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xb), yb)
        loss.backward()
        if i == 0:
            for j in range(4):
                lin = layers[2 * j]
                grads[f"fc{j + 1}.weight"] = lin.weight.grad.detach().numpy().copy()
                grads[f"fc{j + 1}.bias"] = lin.bias.grad.detach().numpy().copy()
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    return np.array(losses), np.array(lrs), grads


@pytest.mark.parametrize("name", list(CONFIGS))
def test_matches_pytorch(name: str, data) -> None:
    x, y = data
    make_opt, lr, make_torch_opt = CONFIGS[name]
    task, init, grads, losses = engine_run(x, y, make_opt, lr)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t_losses, t_lrs, t_grads = torch_run(x, y, init, make_torch_opt, lr)

    # the same learning rate at every step
    np.testing.assert_allclose(task.lr_table(), t_lrs, rtol=1e-6)
    assert t_lrs[0] == pytest.approx(0.1 * lr) and max(t_lrs) == pytest.approx(lr, rel=1e-6)

    # first-step gradients, relative to the largest gradient of each tensor
    grad_err = 0.0
    for k, g in t_grads.items():
        scale = float(np.abs(g).max())
        assert scale > 0
        err = float(np.abs(grads[k] - g).max()) / scale
        grad_err = max(grad_err, err)
        assert err < 1e-5, (k, err)

    # per-step losses over 50 steps
    rel = np.abs(losses - t_losses) / np.abs(t_losses)
    MEASURED[name] = {"loss_rel_max": float(rel.max()), "grad_rel_max": grad_err}
    print(f"\n{name}: max rel loss diff {rel.max():.2e}, max rel grad diff {grad_err:.2e}")
    assert rel.max() < 1e-4, (name, rel.max(), int(rel.argmax()))
    # and training did something: the loss moved
    assert abs(t_losses[-1] - t_losses[0]) > 0.05

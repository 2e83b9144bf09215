"""The small GPT against PyTorch: 30 AdamW steps of a 2-layer GPT with a float64 minGPT reference
(nn.Embedding, nn.LayerNorm, F.scaled_dot_product_attention(is_causal=True), GELU), in both attention
forms; every final weight to the bound of the MLP parity tests (test_torch_parity: 1e-3 relative
Frobenius; these reach it with an order of magnitude to spare), the per-step losses too."""
from __future__ import annotations

import numpy as np
import pytest

from renaissance_nb.export.from_gpt import gpt_weight_names as engine_names
from tests.gpt_helpers import load_into_torch, token_splits, torch_gpt, torch_train

torch = pytest.importorskip("torch")

VOCAB, D, LAYERS, HEADS, T, BATCH, STEPS, LR = 13, 32, 2, 4, 16, 8, 30, 3e-3
K_BIAS = np.arange(D, 2 * D)
"""The key third of c_attn's bias (q | k | v)."""


def _engine(form: str, approximate: str = "none", block: int = 64):  # type: ignore[no-untyped-def]
    from renaissance_nb import AdamW, DeepLearningTask, gpt
    splits = token_splits(BATCH * STEPS, T, VOCAB)
    model = gpt(VOCAB, D, LAYERS, HEADS, T, attention_form=form, approximate=approximate)
    if block != 64:  # the flash form's block size: smaller than T exercises the online softmax's rescaling
        from renaissance_nb.inspector.sequence import with_layer_params
        model = with_layer_params(model, "attention", {"block": block})
    task = (DeepLearningTask().model(model).data(splits, batch_size=BATCH, shuffle=False)
            .optimizer(AdamW(lr=LR, weight_decay=0.1)).total_epochs(1).seed(3))
    task.compile()
    return task, splits


@pytest.mark.parametrize("form,approximate,block", [("materialized", "none", 64), ("flash", "none", 64),
                                                    ("flash", "tanh", 8)])
def test_thirty_steps_match_pytorch_float64(form: str, approximate: str, block: int) -> None:
    task, splits = _engine(form, approximate, block)
    ref = torch_gpt(VOCAB, D, LAYERS, HEADS, T, approximate)
    load_into_torch(ref, task.state_dict(), LAYERS)
    task.run(progress=False)
    losses = torch_train(ref, splits, batch=BATCH, steps=STEPS, lr=LR, weight_decay=0.1)
    ours, theirs = task.state_dict(), ref.state_dict()
    worst = 0.0
    for mine, name in engine_names(LAYERS):
        want = theirs[name].detach().numpy()
        got = ours[mine].reshape(want.shape)
        if mine.endswith("qkv.bias"):  # the keys' bias: checked on its own below
            got, want = np.delete(got, K_BIAS), np.delete(want, K_BIAS)
        rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        assert rel < 1e-4, (mine, rel)
        worst = max(worst, rel)
    for i in range(LAYERS):
        # A key bias adds the same q.b_k to every score of a query's row, which the softmax cancels: its
        # gradient is zero in exact arithmetic, rounding noise in practice, and Adam normalises noise to
        # steps of about lr. Both sides' key biases only drift by such steps from where they started.
        moved = ours[f"attention{i + 1}.qkv.bias"][K_BIAS] - theirs[f"transformer.h.{i}.attn.c_attn.bias"].detach().numpy()[K_BIAS]
        assert np.abs(moved).max() <= 2 * LR * STEPS
    np.testing.assert_allclose(task.result.step_losses[:STEPS], losses, rtol=1e-5)
    assert losses[-1] < losses[0] - 0.5, losses  # it learnt: the stream is predictable
    assert worst > 0  # float32 against float64: never bit-equal, so the comparison really ran


def test_the_two_attention_forms_agree() -> None:
    """Materialised and flash attention are one function: after 30 steps the weights agree to float32
    rounding (the online softmax rounds in another order)."""
    a, _ = _engine("materialized")
    b, _ = _engine("flash", block=8)
    a.run(progress=False)
    b.run(progress=False)
    sa, sb = a.state_dict(), b.state_dict()
    for name in sa:
        x, z = sa[name], sb[name]
        if name.endswith("qkv.bias"):  # the keys' bias moves by noise (see above)
            x, z = np.delete(x, K_BIAS), np.delete(z, K_BIAS)
        rel = float(np.linalg.norm(x - z) / max(np.linalg.norm(x), 1e-12))
        assert rel < 1e-4, (name, rel)


def test_adamw_decay_matrices_matches_mingpt_parameter_groups() -> None:
    """AdamW(decay="matrices") against torch.optim.AdamW with minGPT's two groups: weight decay on the
    fc and attention matrices only (not on norms, biases or embeddings)."""
    from renaissance_nb import AdamW, DeepLearningTask, gpt
    splits = token_splits(BATCH * 10, T, VOCAB)
    task = (DeepLearningTask().model(gpt(VOCAB, D, 1, HEADS, T)).data(splits, batch_size=BATCH, shuffle=False)
            .optimizer(AdamW(lr=LR, weight_decay=0.5).decay("matrices")).total_epochs(1).seed(3))
    task.compile()
    ref = torch_gpt(VOCAB, D, 1, HEADS, T)
    load_into_torch(ref, task.state_dict(), 1)
    task.run(progress=False)
    decayed = [p for n, p in ref.named_parameters() if n.endswith("weight") and "ln_" not in n and "wte" not in n
               and "wpe" not in n]
    others = [p for n, p in ref.named_parameters() if all(p is not q for q in decayed)]
    opt = torch.optim.AdamW([{"params": decayed, "weight_decay": 0.5}, {"params": others, "weight_decay": 0.0}],
                            lr=LR)
    for i in range(10):
        xb = torch.from_numpy(splits.train.x[i * BATCH:(i + 1) * BATCH].astype(np.int64))
        yb = torch.from_numpy(splits.train.y[i * BATCH:(i + 1) * BATCH].astype(np.int64))
        opt.zero_grad()
        logits = ref(xb)
        torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), yb.reshape(-1)).backward()
        opt.step()
    ours, theirs = task.state_dict(), ref.state_dict()
    for mine, name in engine_names(1):
        want, got = theirs[name].detach().numpy(), ours[mine].reshape(theirs[name].shape)
        if mine.endswith("qkv.bias"):
            got, want = np.delete(got, K_BIAS), np.delete(want, K_BIAS)
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-4, mine
    # (at weight_decay=0.5 a decayed embedding would shrink by lr * 0.5 per step: 0.15% in ten, 15x the bound)
    assert "decay='matrices'" in repr(task.config.optimizer)  # saved with the checkpoint's settings

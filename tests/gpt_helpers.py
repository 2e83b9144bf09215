"""A nanoGPT-style PyTorch GPT in float64 and the data the GPT tests share: the reference side of the
parity runs (tests/test_gpt_parity.py), built from the same parts as ``renaissance_nb.gpt``."""
from __future__ import annotations

import numpy as np

from renaissance_nb.export.from_gpt import gpt_weight_names


def token_splits(n: int, t: int, vocab: int, seed: int = 0, noise: float = 0.1, val: int = 0):  # type: ignore[no-untyped-def]
    """Windows of a learnable token stream (next = 3 cur + 1 mod vocab, a random token with
    probability ``noise``): ``n`` training windows of ``t`` tokens (and ``val`` validation ones)."""
    from renaissance_nb.data.arrays import DataSplits, Dataset
    rng = np.random.default_rng(seed)
    total = (n + val) * (t + 1)
    stream = np.zeros(total, np.int64)
    stream[0] = 1
    for i in range(1, total):
        stream[i] = (stream[i - 1] * 3 + 1) % vocab if rng.random() >= noise else rng.integers(vocab)
    w = stream.reshape(n + val, t + 1)
    x, y = np.ascontiguousarray(w[:, :-1], np.int32), np.ascontiguousarray(w[:, 1:], np.int32)
    train = Dataset(x[:n], y[:n], vocab, "toy tokens")
    held = Dataset(x[n:], y[n:], vocab, "toy tokens") if val else None
    return DataSplits(train, held, "toy tokens")


def torch_gpt(vocab: int, d: int, layers: int, heads: int, context: int, approximate: str = "none"):  # type: ignore[no-untyped-def]
    """nanoGPT's GPT (its module names; pre-norm blocks, c_attn/c_proj, GELU MLP, bias-free head, untied) in
    float64, with F.scaled_dot_product_attention(is_causal=True) for the attention."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)

        def forward(self, x):  # type: ignore[no-untyped-def]
            b, t, _ = x.shape
            q, k, v = (z.view(b, t, heads, d // heads).transpose(1, 2) for z in self.c_attn(x).split(d, dim=2))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).reshape(b, t, d))

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c_fc, self.c_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):  # type: ignore[no-untyped-def]
            return self.c_proj(F.gelu(self.c_fc(x), approximate=approximate))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln_1, self.attn, self.ln_2, self.mlp = nn.LayerNorm(d), Attention(), nn.LayerNorm(d), MLP()

        def forward(self, x):  # type: ignore[no-untyped-def]
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(vocab, d), wpe=nn.Embedding(context, d),
                                                  h=nn.ModuleList(Block() for _ in range(layers)), ln_f=nn.LayerNorm(d)))
            self.lm_head = nn.Linear(d, vocab, bias=False)

        def forward(self, idx):  # type: ignore[no-untyped-def]
            tr = self.transformer
            x = tr.wte(idx) + tr.wpe(torch.arange(idx.shape[1]))
            for blk in tr.h:
                x = blk(x)
            return self.lm_head(tr.ln_f(x))

    return GPT().double()


def load_into_torch(model, state: dict, layers: int) -> None:  # type: ignore[no-untyped-def]
    """The engine's weights into the torch GPT (same layouts: nn.Linear's (out, in), rows of tables)."""
    import torch
    ours = model.state_dict()
    with torch.no_grad():
        for mine, theirs in gpt_weight_names(layers):
            ours[theirs].copy_(torch.from_numpy(np.asarray(state[mine], np.float64)).reshape(ours[theirs].shape))


def torch_train(model, splits, *, batch: int, steps: int, lr: float, weight_decay: float) -> list[float]:  # type: ignore[no-untyped-def]
    """AdamW steps of the mean cross entropy over every position, on the windows in order; the losses."""
    import torch
    from torch.nn import functional as F
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    x, y = splits.train.x, splits.train.y
    losses = []
    for i in range(steps):
        xb = torch.from_numpy(x[i * batch:(i + 1) * batch].astype(np.int64))
        yb = torch.from_numpy(y[i * batch:(i + 1) * batch].astype(np.int64))
        opt.zero_grad()
        logits = model(xb)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), yb.reshape(-1))
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses

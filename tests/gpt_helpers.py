"""A minGPT-style PyTorch GPT in float64 and the data the GPT tests share: the reference side of the
parity runs (tests/test_gpt_parity.py), built from the same parts as ``renaissance_nb.gpt``."""
from __future__ import annotations

import numpy as np


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
    """minGPT's GPT (pre-norm blocks, c_attn/c_proj, GELU MLP, bias-free head) in float64, with
    F.scaled_dot_product_attention(is_causal=True) for the attention."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):  # type: ignore[no-untyped-def]
            b, t, _ = x.shape
            q, k, v = self.c_attn(self.ln1(x)).split(d, dim=2)
            q, k, v = (z.view(b, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, d))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate=approximate))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(context, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

        def forward(self, idx):  # type: ignore[no-untyped-def]
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln_f(x))

    return GPT().double()


def engine_names(layers: int) -> list[tuple[str, str]]:
    """(the engine's parameter name, the torch model's) for ``gpt(...)`` of ``layers`` blocks."""
    pairs = [("embedding1.weight", "wte.weight"), ("pos_embedding1.weight", "wpe.weight")]
    for i in range(layers):
        b = f"blocks.{i}"
        pairs += [(f"layernorm{2 * i + 1}.{r}", f"{b}.ln1.{r}") for r in ("weight", "bias")]
        pairs += [(f"attention{i + 1}.qkv.{r}", f"{b}.c_attn.{r}") for r in ("weight", "bias")]
        pairs += [(f"attention{i + 1}.proj.{r}", f"{b}.c_proj.{r}") for r in ("weight", "bias")]
        pairs += [(f"layernorm{2 * i + 2}.{r}", f"{b}.ln2.{r}") for r in ("weight", "bias")]
        pairs += [(f"fc{2 * i + 1}.{r}", f"{b}.fc1.{r}") for r in ("weight", "bias")]
        pairs += [(f"fc{2 * i + 2}.{r}", f"{b}.fc2.{r}") for r in ("weight", "bias")]
    return pairs + [(f"layernorm{2 * layers + 1}.{r}", f"ln_f.{r}") for r in ("weight", "bias")] + [
        (f"fc{2 * layers + 1}.weight", "head.weight")]


def load_into_torch(model, state: dict, layers: int) -> None:  # type: ignore[no-untyped-def]
    """The engine's weights into the torch GPT (same layouts: nn.Linear's (out, in), rows of tables)."""
    import torch
    ours = model.state_dict()
    with torch.no_grad():
        for mine, theirs in engine_names(layers):
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

"""from_torch of nanoGPT's and minGPT's GPT modules (their names, their forwards, written out here): the
BluePrint and weights read give the module's logits, tied weights warn, an unsupported variant is refused."""
from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from renaissance_nb import BluePrint, DeepLearningTask  # noqa: E402
from renaissance_nb.errors import BluePrintError  # noqa: E402
from tests.gpt_helpers import token_splits  # noqa: E402

VOCAB, D, HEADS, LAYERS, CTX = 13, 32, 4, 2, 16


class NewGELU(nn.Module):  # minGPT's
    def forward(self, x):  # type: ignore[no-untyped-def]
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class CausalSelfAttention(nn.Module):  # nanoGPT's, the non-flash path kept apart as in the original
    def __init__(self, bias: bool = True) -> None:
        super().__init__()
        self.c_attn, self.c_proj = nn.Linear(D, 3 * D, bias=bias), nn.Linear(D, D, bias=bias)
        self.attn_dropout, self.resid_dropout = nn.Dropout(0.0), nn.Dropout(0.0)
        self.n_head, self.n_embd = HEADS, D
        self.register_buffer("bias", torch.tril(torch.ones(CTX, CTX)).view(1, 1, CTX, CTX))

    def forward(self, x):  # type: ignore[no-untyped-def]
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = F.softmax(att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf")), dim=-1)
        y = self.attn_dropout(att) @ v
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c)))


class MLP(nn.Module):  # nanoGPT's
    def __init__(self, bias: bool = True) -> None:
        super().__init__()
        self.c_fc, self.gelu, self.c_proj = nn.Linear(D, 4 * D, bias=bias), nn.GELU(), nn.Linear(4 * D, D, bias=bias)
        self.dropout = nn.Dropout(0.0)

    def forward(self, x):  # type: ignore[no-untyped-def]
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, mingpt: bool, bias: bool = True) -> None:
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(D, bias=bias), CausalSelfAttention(bias), nn.LayerNorm(D, bias=bias)
        if mingpt:  # minGPT: a ModuleDict with NewGELU
            self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(D, 4 * D), c_proj=nn.Linear(4 * D, D), act=NewGELU(),
                                          dropout=nn.Dropout(0.0)))
            m = self.mlp
            self.mlpf = lambda x: m.dropout(m.c_proj(m.act(m.c_fc(x))))  # noqa: E731
        else:
            self.mlp = MLP(bias)
            self.mlpf = self.mlp

    def forward(self, x):  # type: ignore[no-untyped-def]
        x = x + self.attn(self.ln_1(x))
        return x + self.mlpf(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, mingpt: bool = False, tie: bool = False, bias: bool = True) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(VOCAB, D), wpe=nn.Embedding(CTX, D), drop=nn.Dropout(0.0),
                                              h=nn.ModuleList([Block(mingpt, bias) for _ in range(LAYERS)]),
                                              ln_f=nn.LayerNorm(D, bias=bias)))
        self.lm_head = nn.Linear(D, VOCAB, bias=False)
        if tie:
            self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx):  # type: ignore[no-untyped-def]
        b, t = idx.size()
        assert t <= CTX
        tr = self.transformer
        x = tr.drop(tr.wte(idx) + tr.wpe(torch.arange(0, t, dtype=torch.long)))
        for block in tr.h:
            x = block(x)
        return self.lm_head(tr.ln_f(x))


def logits_match(net) -> BluePrint:  # type: ignore[no-untyped-def]
    """The module read by from_torch (weights too), compiled: its logits are the module's within 1e-5."""
    bp, state = BluePrint.from_torch(net, weights=True)
    splits = token_splits(32, CTX, VOCAB)
    task = DeepLearningTask().model(bp).data(splits, batch_size=8).total_epochs(1)
    task.compile()
    task.load_state_dict(state)
    x = splits.train.x[:6]
    with torch.no_grad():
        want = net(torch.from_numpy(x.astype(np.int64))).numpy()
    assert np.abs(task.predict_logits(x) - want).max() <= 1e-5 * np.abs(want).max()
    return bp


@pytest.mark.parametrize("mingpt", [False, True], ids=["nanoGPT", "minGPT"])
def test_a_gpt_module_gives_its_logits(mingpt: bool) -> None:
    torch.manual_seed(0)
    bp = logits_match(GPT(mingpt).eval())
    assert ("gelu_tanh" in str(bp.to_dict())) == mingpt


def test_tied_weights_are_read_as_two_copies_with_a_warning() -> None:
    net = GPT(tie=True)
    with pytest.warns(UserWarning, match="tied"):
        _, state = BluePrint.from_torch(net, weights=True)
    np.testing.assert_array_equal(state["embedding1.weight"], state[f"fc{2 * LAYERS + 1}.weight"])


def test_a_bias_free_gpt_is_refused_with_the_reason() -> None:
    with pytest.raises(BluePrintError, match="has no biases"):
        BluePrint.from_torch(GPT(bias=False))


@pytest.mark.parametrize("mingpt", [False, True], ids=["nanoGPT", "minGPT"])
def test_layer_norm_eps_and_dropout_are_read_or_refused(mingpt: bool) -> None:
    """eps is read from the module's layer norms (it was the default whatever the module had: logits off by
    0.05 at eps=0.1), one dropout probability shared by every site is read, and sites that differ are refused
    (transformer.drop's was taken for all of them)."""
    torch.manual_seed(0)
    net = GPT(mingpt).eval()
    for m in net.modules():
        if isinstance(m, nn.LayerNorm):
            m.eps = 0.1
    logits_match(net)
    for m in net.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.2
    assert "'p': 0.2" in str(BluePrint.from_torch(net).to_dict())
    net.transformer.drop.p = 0.0
    with pytest.raises(BluePrintError, match=r"dropout probability that differs between its modules \(transformer.drop 0"):
        BluePrint.from_torch(net)
    net.transformer.drop.p = 0.2
    net.transformer.ln_f.eps = 1e-5
    with pytest.raises(BluePrintError, match="LayerNorm eps that differs"):
        BluePrint.from_torch(net)

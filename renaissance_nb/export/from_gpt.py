"""nanoGPT's and minGPT's GPT modules as a ``gpt(...)`` BluePrint description, and their weights.

Why by structure and not by tracing: torch.fx cannot trace either forward (nanoGPT asserts on ``idx.size()``
and both branch on Python values of the config), and ``torch.export`` gives an ATen graph whose attention
is a dozen ops to pattern-match back. Both repositories name their parts the same way, which is what is read
here: ``transformer.wte``/``wpe`` (nn.Embedding), ``transformer.h`` (blocks of ``ln_1``, ``attn.c_attn``,
``attn.c_proj``, ``attn.n_head``, ``ln_2``, ``mlp.c_fc``, ``mlp.c_proj`` and a GELU), ``transformer.ln_f``
and ``lm_head``. A module with those names but another forward would be misread: the tests check the logits
of both repositories' modules against the compiled task's.

nanoGPT ties ``lm_head.weight`` to ``wte.weight``: here they are read as two copies (the logits are the same;
training then moves them apart), and a warning says so.
"""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from ..errors import BluePrintError


def looks_like_gpt(module: Any) -> bool:
    tr = getattr(module, "transformer", None)
    return tr is not None and all(hasattr(tr, k) for k in ("wte", "wpe", "h", "ln_f")) and hasattr(module, "lm_head")


def gpt_weight_names(layers: int) -> list[tuple[str, str]]:
    """(the engine's parameter name, nanoGPT's) for ``gpt(...)`` of ``layers`` blocks."""
    pairs = [("embedding1.weight", "transformer.wte.weight"), ("pos_embedding1.weight", "transformer.wpe.weight")]
    for i in range(layers):
        b = f"transformer.h.{i}"
        for mine, theirs in ((f"layernorm{2 * i + 1}", "ln_1"), (f"attention{i + 1}.qkv", "attn.c_attn"),
                             (f"attention{i + 1}.proj", "attn.c_proj"), (f"layernorm{2 * i + 2}", "ln_2"),
                             (f"fc{2 * i + 1}", "mlp.c_fc"), (f"fc{2 * i + 2}", "mlp.c_proj")):
            pairs += [(f"{mine}.{r}", f"{b}.{theirs}.{r}") for r in ("weight", "bias")]
    return pairs + [(f"layernorm{2 * layers + 1}.{r}", f"transformer.ln_f.{r}") for r in ("weight", "bias")] + [
        (f"fc{2 * layers + 1}.weight", "lm_head.weight")]


def _refuse(why: str) -> BluePrintError:
    return BluePrintError(f"from_torch: this GPT module {why}. Fix: gpt(...) builds the model it can read "
                          "(biases on, bias-free head, GELU MLP), or write the model with gpt() and load weights "
                          "by name.")


def _gelu_form(mlp: Any) -> str:
    act = getattr(mlp, "gelu", None) or getattr(mlp, "act", None)
    name = type(act).__name__
    if name == "GELU":
        return act.approximate
    if name == "NewGELU":  # minGPT's: the tanh form
        return "tanh"
    raise _refuse(f"has an MLP activation {name} (only GELU, exact or tanh)")


def describe_gpt(module: Any, weights: bool) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(description, state dict under the engine's names) of a nanoGPT/minGPT GPT."""
    from ..ops.gpt import gpt
    tr = module.transformer
    blocks = list(tr.h)
    if not blocks:
        raise _refuse("has no blocks")
    first = blocks[0]
    vocab, d = tr.wte.num_embeddings, tr.wte.embedding_dim
    if first.attn.c_attn.bias is None or tr.ln_f.bias is None:
        raise _refuse("has no biases (nanoGPT's bias=False): attention() and layernorm() keep theirs")
    if module.lm_head.bias is not None:
        raise _refuse("has a bias on lm_head")
    drop = float(getattr(tr.drop, "p", 0.0)) if hasattr(tr, "drop") else 0.0
    ratio = first.mlp.c_fc.out_features // d
    model = gpt(vocab, d, len(blocks), int(first.attn.n_head), tr.wpe.num_embeddings, mlp_ratio=ratio, dropout=drop,
                approximate=_gelu_form(first.mlp))
    state: dict[str, np.ndarray] = {}
    if weights:
        theirs = module.state_dict()
        if module.lm_head.weight is tr.wte.weight:
            warnings.warn("from_torch: lm_head.weight is tied to transformer.wte.weight; it is read as two copies "
                          "(the same logits; training moves them apart).", stacklevel=3)
        state = {mine: theirs[name].detach().cpu().float().numpy().copy() for mine, name in gpt_weight_names(len(blocks))}
    return model.to_dict(), state

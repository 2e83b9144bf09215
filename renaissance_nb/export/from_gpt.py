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


def _dropouts(tr: Any, blocks: list[Any]) -> dict[str, float]:
    """Every dropout site's probability by its module name (nanoGPT's and minGPT's: the embeddings', and each
    block's attention probabilities, attention output and MLP output)."""
    sites = {"transformer.drop": getattr(tr, "drop", None)}
    for i, b in enumerate(blocks):  # minGPT's mlp is a ModuleDict: its modules are attributes too
        sites.update({f"h.{i}.attn.{n}": getattr(b.attn, n, None) for n in ("attn_dropout", "resid_dropout")})
        sites[f"h.{i}.mlp.dropout"] = getattr(b.mlp, "dropout", None)
    return {k: float(getattr(m, "p", 0.0)) for k, m in sites.items() if m is not None}


def _epsilons(tr: Any, blocks: list[Any]) -> dict[str, float]:
    """Every layer norm's eps by its module name."""
    norms = {"transformer.ln_f": tr.ln_f, **{f"h.{i}.{n}": getattr(b, n) for i, b in enumerate(blocks)
                                           for n in ("ln_1", "ln_2")}}
    return {k: float(getattr(m, "eps", 1e-5)) for k, m in norms.items()}


def _one_setting(what: str, by_site: dict[str, float], default: float) -> float:
    """The one value gpt() takes for a setting every site of the module shares; a module whose sites differ
    is refused by name (it was read as one value silently: transformer.drop's, or the default eps)."""
    values = set(by_site.values())
    if len(values) > 1:
        shown = ", ".join(f"{k} {v:g}" for k, v in list(by_site.items())[:4])
        raise _refuse(f"has a {what} that differs between its modules ({shown}, ...): gpt() takes one")
    return values.pop() if values else default


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
    ratio = first.mlp.c_fc.out_features // d
    model = gpt(vocab, d, len(blocks), int(first.attn.n_head), tr.wpe.num_embeddings, mlp_ratio=ratio,
                dropout=_one_setting("dropout probability", _dropouts(tr, blocks), 0.0),
                approximate=_gelu_form(first.mlp), eps=_one_setting("LayerNorm eps", _epsilons(tr, blocks), 1e-5))
    state: dict[str, np.ndarray] = {}
    if weights:
        theirs = module.state_dict()
        if module.lm_head.weight is tr.wte.weight:
            warnings.warn("from_torch: lm_head.weight is tied to transformer.wte.weight; it is read as two copies "
                          "(the same logits; training moves them apart).", stacklevel=3)
        state = {mine: theirs[name].detach().cpu().float().numpy().copy() for mine, name in gpt_weight_names(len(blocks))}
    return model.to_dict(), state

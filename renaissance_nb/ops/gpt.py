"""The GPT building blocks: ``transformer_block`` (GPT-2's pre-norm block) and ``gpt`` (a whole
decoder-only language model), BluePrints of the ops in embedding.py, layernorm.py, attention.py,
activation.py (exact GELU) or gelu_tanh.py, fc.py and dropout.py, so the compiler, the memory plan and the
inspector see every part.

    transformer_block(d, heads) = x + attn(ln1(x)), then x + mlp(ln2(x)),
        mlp = fc(mlp_ratio d), gelu, fc(d), as minGPT's and nanoGPT's Block
    gpt(vocab, d, layers, heads, context) = embedding + pos_embedding, layers blocks, layernorm,
        fc(vocab, bias=False): logits (T, vocab) for every position
"""
from __future__ import annotations

from ..blueprint_nodes import BluePrint, Named, add2, layer_args, positive_int, probability, seq, repeat
from .attention import attention
from .dropout import dropout
from .embedding import embedding, pos_embedding
from .fc import fc
from .activation import gelu
from .identity import identity
from .layernorm import layernorm

GPT2_STD = 0.02
"""GPT-2's (and minGPT's) initial standard deviation of the embeddings."""


def _maybe_dropout(p: float) -> tuple[BluePrint, ...]:
    return (dropout(p),) if p > 0 else ()


@layer_args
def transformer_block(d: int, heads: int, mlp_ratio: int = 4, dropout: float = 0.0,
                      attention_form: str = "materialized", approximate: str = "none", eps: float = 1e-5) -> Named:
    """GPT-2's pre-norm block on (T, d) features: x + attention(layernorm(x)), then
    x + fc(d)(gelu(fc(mlp_ratio * d)(layernorm(x)))), with residual dropout ``dropout`` after each
    branch (and on the attention probabilities in the materialised form); ``eps``: the layer norms'."""
    d = positive_int("transformer_block", "d", d, "transformer_block(128, 4)")
    h = positive_int("transformer_block", "heads", heads, "transformer_block(128, 4)")
    r = positive_int("transformer_block", "mlp_ratio", mlp_ratio, "transformer_block(128, 4, mlp_ratio=4)")
    p = probability("transformer_block", "dropout", dropout)
    attn_p = p if attention_form == "materialized" else 0.0
    attn = seq(layernorm(eps), attention(h, form=attention_form, dropout=attn_p), *_maybe_dropout(p))
    mlp = seq(layernorm(eps), fc(r * d), gelu(approximate=approximate), fc(d), *_maybe_dropout(p))
    body = seq(add2(identity(), attn), add2(identity(), mlp))
    form = "" if attention_form == "materialized" else f", {attention_form}"
    return Named(f"transformer_block({d}, {h}{form})", body, d)


@layer_args
def gpt(vocab: int, d: int, layers: int, heads: int, context: int, mlp_ratio: int = 4, dropout: float = 0.0,
        attention_form: str = "materialized", approximate: str = "none", eps: float = 1e-5) -> BluePrint:
    """A decoder-only transformer language model (minGPT/nanoGPT's GPT): token and position
    embeddings (N(0, 0.02^2) as GPT-2), ``layers`` transformer blocks, a final layernorm and a
    bias-free head fc(vocab) giving every position's next-token logits (T, vocab); ``eps``: every layer norm's
    (nn.LayerNorm's default)."""
    v = positive_int("gpt", "vocab", vocab, "gpt(65, 128, 4, 4, 128)")
    n = positive_int("gpt", "layers", layers, "gpt(65, 128, 4, 4, 128)")
    c = positive_int("gpt", "context", context, "gpt(65, 128, 4, 4, 128)")
    block = transformer_block(d, heads, mlp_ratio, dropout, attention_form, approximate, eps)
    return seq(embedding(v, d, std=GPT2_STD), pos_embedding(c, std=GPT2_STD), *_maybe_dropout(dropout),
               repeat(block, n), layernorm(eps), fc(v, bias=False))

"""Text generation from a compiled language model: the prompt fed through the decode step (one token
per replay, filling the KV cache), then tokens sampled one by one.

Sampling is reproducible: token i draws the uniform Philox(seed, SAMPLE stream, offset i), and picks
the first token whose cumulative probability passes it, tokens in id order; the probabilities are
softmax(logits / temperature) in float64, restricted to the ``top_k`` largest logits (ties to the
lower id). The same seed gives byte-identical text on any machine whose logits agree bit for bit
(the decode step's sums run in a fixed order). ``temperature=0`` takes the most likely token.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ..errors import ConfigError, bad_argument
from ..train.rng import Philox, StreamId
from .decode import DecodeStep, check_prompt_ids


def next_token(logits: np.ndarray, temperature: float, top_k: int | None, u: float) -> int:
    """The token the uniform ``u`` picks from ``logits`` (see the module docstring)."""
    z = logits.astype(np.float64)
    if temperature == 0:
        return int(np.argmax(z))
    order = np.argsort(-z, kind="stable")
    keep = np.sort(order[:top_k]) if top_k is not None else np.arange(z.size)
    w = np.exp((z[keep] - z[keep].max()) / temperature)
    cdf = np.cumsum(w / w.sum())
    return int(keep[min(int(np.searchsorted(cdf, u, side="right")), keep.size - 1)])


def check_sampling(tokens: Any, temperature: Any, top_k: Any, seed: Any) -> tuple[int, float, int | None, int]:
    from ..checks import as_float, as_int
    n, t, s = as_int(tokens), as_float(temperature), as_int(seed)
    if n is None or n < 0:
        raise bad_argument(ConfigError, "generate", "tokens", tokens, "an int >= 0", "e.g. generate('ROMEO:', 200)")
    if t is None or not math.isfinite(t) or t < 0:
        raise bad_argument(ConfigError, "generate", "temperature", temperature, "a finite float >= 0",
                           "use 1.0 to sample the model's distribution, lower to sharpen it, 0 for the most likely")
    k = None if top_k is None else as_int(top_k)
    if top_k is not None and (k is None or k < 1):
        raise bad_argument(ConfigError, "generate", "top_k", top_k, "None or an int >= 1",
                           "e.g. top_k=10 samples among the ten likeliest tokens")
    if s is None or not 0 <= s < 2 ** 63:
        raise bad_argument(ConfigError, "generate", "seed", seed, "an int in [0, 2**63)", "e.g. seed=0")
    return n, t, k, s


def generate(decoder: Callable[[], DecodeStep], data: Any, prompt: Any, tokens: Any, temperature: Any, top_k: Any,
             seed: Any) -> Any:
    """task.generate: a text prompt through the data's tokenizer (text back), or ids (ids back). Every argument
    is checked before ``decoder()`` plans the decode step (a wrong call plans nothing)."""
    n, t, k, s = check_sampling(tokens, temperature, top_k, seed)
    if not data.train.is_tokens:
        raise ConfigError("generate: writes text with a language model trained on token windows, and this task's "
                          f"data are samples of shape {data.train.sample_shape} with class labels. Fix: train a "
                          "gpt(...) on datasets.default_text() or datasets.tokens(text, context); use predict() here.")
    if not isinstance(prompt, str):
        ids = prompt_ids(prompt)
        check_prompt_ids(ids, data.num_classes)
        return generate_ids(decoder(), ids, n, t, k, s, data.num_classes)
    if data.tokenizer is None:
        raise ConfigError("generate: a text prompt needs the data's tokenizer, and this task's data has none. "
                          "Fix: pass token ids, or build the data with datasets.tokens(text, context).")
    ids = np.asarray(data.tokenizer.encode(prompt), np.int64)
    check_prompt_ids(ids, data.num_classes)
    return data.tokenizer.decode(generate_ids(decoder(), ids, n, t, k, s, data.num_classes))


def prompt_ids(prompt: Any) -> np.ndarray:
    """Token ids given as the prompt: one int, a 1-D sequence or array of ints, or one window of the data (1, T);
    no floats, bools or batches (a float id would be cut silently, a batch of prompts flattened into one)."""
    fix = "pass text, or the ids as a 1-D list of ints, e.g. generate([20, 43, 1], 100)"
    try:
        a = np.asarray(prompt)
    except (TypeError, ValueError):  # ragged nesting
        a = np.asarray(None)
    if a.ndim == 0 or (a.ndim == 2 and a.shape[0] == 1):  # one id, or one window (data.train.x[:1])
        a = a.reshape(-1)
    if a.ndim == 1 and a.size == 0:
        return np.zeros(0, np.int64)  # check_prompt_ids says it is empty
    if a.ndim != 1 or a.dtype.kind not in "iu":
        raise bad_argument(ConfigError, "generate", "prompt", prompt, "text, or token ids as a 1-D sequence of ints",
                           fix)
    return a.astype(np.int64)  # a uint64 past int64 wraps negative: check_prompt_ids refuses it


def generate_ids(step: DecodeStep, prompt: np.ndarray, tokens: int, temperature: float, top_k: int | None,
                 seed: int, vocab: int) -> np.ndarray:
    """The prompt's ids followed by ``tokens`` sampled ones. The model sees at most its context: a longer
    prompt is cut to its last ``context`` tokens (as minGPT's generate crops it), and when the cache is full
    the last half of the text is read again from position 0 (a sliding window, shifted by half a context
    at a time, so re-reading costs one extra step per generated token on average). ``prompt`` is checked
    (check_prompt_ids)."""
    rng, ctx = Philox(seed), step.context
    out = [int(t) for t in prompt]
    logits, pos = _read(step, out[-ctx:]), min(len(out), ctx)
    for i in range(tokens):
        u = float(rng.uniform(1, int(StreamId.SAMPLE), i)[0])
        out.append(next_token(logits, temperature, top_k, u))
        if i + 1 == tokens:
            break
        if pos == ctx:  # the cache is full: keep the last half, from position 0
            window = out[-(ctx // 2 or 1):]
            logits, pos = _read(step, window), len(window)
        else:
            logits, pos = step.run(out[-1], pos), pos + 1
    return np.asarray(out, np.int64)


def _read(step: DecodeStep, window: list[int]) -> np.ndarray:
    """A fresh cache filled with ``window`` from position 0; the logits after its last token."""
    step.reset()
    logits = None
    for pos, tok in enumerate(window):
        logits = step.run(tok, pos)
    assert logits is not None
    return logits

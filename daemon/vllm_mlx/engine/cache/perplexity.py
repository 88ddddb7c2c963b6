"""Perplexity of a text under a model whose KV cache is the engine's (rows.py).

What KV quantization costs in quality is measured here: the text is fed in chunks, as
prefill feeds a prompt, so each chunk attends to the earlier chunks' K and V in the form
the cache keeps them (quantized or not), exactly as a running request does. Used by the
KV-quantization test (a stated bound on the delta) and bench/kv_quantization.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from vllm_mlx.engine.cache.rows import KVQuantization, row_caches
from vllm_mlx.models.cpu.vocab import log_probabilities

# The fixed text the test's bound and the benchmark's table are stated over: plain
# English prose (183 tokens for the bundled model's tokenizer).
REFERENCE_TEXT = (
    "The history of the bicycle begins in the early nineteenth century, when inventors in "
    "Germany and France built wooden machines that riders pushed along with their feet. "
    "Pedals came later, fixed to the front wheel, and the wheel grew larger so that each "
    "turn of the pedals carried the rider further. These high wheelers were fast but "
    "dangerous, and a fall from the tall seat could cause serious injury. The safety "
    "bicycle, with two wheels of equal size and a chain driving the rear wheel, solved the "
    "problem in the eighteen eighties. Pneumatic tyres, invented soon after, made the ride "
    "smoother, and within a decade cycling had become a popular pastime across Europe and "
    "North America. Women in particular found new freedom in the bicycle, which let them "
    "travel without an escort and encouraged more practical clothing. Today bicycles are "
    "used for commuting, sport and recreation, and many cities build dedicated lanes to "
    "keep riders safe from cars."
)


def perplexity(
    model: Any,
    tokens: Sequence[int],
    quantization: KVQuantization | None,
    chunk: int = 64,
) -> float:
    """exp(mean negative log-likelihood) of tokens[1:] given the tokens before each."""
    if len(tokens) < 2:
        raise ValueError("perplexity needs at least two tokens")
    rows = row_caches(make_prompt_cache(model), None, quantization)
    cache = [layer.merge([layer]) if hasattr(layer, "merge") else layer for layer in rows]
    total, count = 0.0, 0
    ids = mx.array(list(tokens))
    for start in range(0, len(tokens) - 1, chunk):
        piece = ids[start : min(start + chunk, len(tokens) - 1)]
        targets = ids[start + 1 : start + 1 + piece.shape[0]]
        logits = model(piece[None], cache=cache)[0].astype(mx.float32)
        logprobs = log_probabilities(logits)
        picked = mx.take_along_axis(logprobs, targets[:, None], axis=-1)
        nll = -mx.sum(picked)
        mx.eval(nll)
        total += float(nll.astype(mx.float32).tolist())  # type: ignore[arg-type]
        count += int(piece.shape[0])
    return math.exp(total / count)

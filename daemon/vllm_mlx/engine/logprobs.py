"""Log-probabilities and shared prefills, on the engine thread only.

Generated tokens: mlx-lm's BatchGenerator hands back each step's full log-probability
vector (after the logits processors: penalties, logit_bias, grammar masks). Only for
requests that asked, the chosen token's value and the top-k are taken from it in one
batched computation per step, after dividing by the request's temperature: the
"processed" distribution the token was sampled from, before top-p/top-k/min-p cut it.

Prompts: scoring a prompt (OpenAI `echo` with `logprobs`) and sharing one prefill among
`n` sequences both run the prompt through the model here, in chunks, into a KV cache
that the sequences then start from, so the prompt is processed once.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from vllm_mlx.engine.cache.prefix import PrefixCache, PrefixHit
from vllm_mlx.engine.types import GenerationRequest, TokenLogprob
from vllm_mlx.models.cpu.vocab import log_probabilities

# JSON has no -inf; a masked token's log-probability is reported as this (as vLLM does).
FLOOR = -9999.0
# Positions scored per forward pass: bounds the (positions x vocabulary) logits held.
SCORE_CHUNK = 256
_BLOCK = 64  # vocabulary block for the top-k search

Row = tuple[mx.array, int, float, int]  # (log-probability vector, token, temperature, top k)


def _value(x: float) -> float:
    return x if x > FLOOR else FLOOR


def _top_k(matrix: mx.array, k: int) -> tuple[mx.array, mx.array]:
    """Ids and values of the k largest per row, without a full-row argpartition.

    The k largest of a row lie in the k blocks with the largest maxima, so one max per
    block of 64 plus two small argpartitions do it (on CPU, tens of times faster).
    """
    rows, size = matrix.shape
    pad = (-size) % _BLOCK
    if pad:
        filler = mx.full((rows, pad), -mx.inf, dtype=matrix.dtype)
        matrix = mx.concatenate([matrix, filler], axis=1)
    blocks = matrix.reshape(rows, -1, _BLOCK)
    maxima = blocks.max(axis=-1)
    kb = min(k, maxima.shape[1])
    best = mx.argpartition(-maxima, kth=kb - 1, axis=-1)[:, :kb]
    candidates = mx.take_along_axis(blocks, best[:, :, None], axis=1).reshape(rows, -1)
    offsets = mx.arange(_BLOCK)[None, None, :]
    candidate_ids = (best[:, :, None] * _BLOCK + offsets).reshape(rows, -1)
    k = min(k, candidates.shape[1])
    chosen = mx.argpartition(-candidates, kth=k - 1, axis=-1)[:, :k]
    ids = mx.take_along_axis(candidate_ids, chosen, axis=-1)
    return ids, mx.take_along_axis(candidates, chosen, axis=-1)


def _tempered_lse(row: np.ndarray[Any, Any], temperature: float) -> float:
    """log-sum-exp of row / temperature over the terms that matter (e**-60 and below
    vanish next to the largest), so exp runs on a few entries, not the vocabulary."""
    scaled = row / temperature
    top = float(scaled.max())
    near = scaled[scaled > top - 60.0]
    return top + float(np.log(np.exp(near - top).sum()))


def _select(
    matrix: mx.array, tokens: list[int], ks: list[int], temperatures: list[float]
) -> list[TokenLogprob]:
    """Chosen values and top-k per row of (rows, vocabulary) log-probabilities, under
    each row's temperature (0 and 1 leave a row as it is)."""
    k = max(ks)
    chosen = mx.take_along_axis(matrix, mx.array(tokens)[:, None], axis=-1)[:, 0]
    outputs = [chosen]
    if k > 0:
        outputs.extend(_top_k(matrix, k))
    mx.eval(*outputs)
    lists: list[Any] = [o.tolist() for o in outputs]
    top_ids, top_vals = lists[1:] if k > 0 else ([[]] * len(tokens), [[]] * len(tokens))
    dense = None
    out = []
    for i, token in enumerate(tokens):
        shift, scale = 0.0, 1.0
        if temperatures[i] > 0 and temperatures[i] != 1.0:
            dense = np.asarray(matrix) if dense is None else dense
            scale = 1.0 / temperatures[i]
            shift = _tempered_lse(dense[i], temperatures[i])
        pairs = sorted(zip(top_ids[i], top_vals[i], strict=True), key=lambda p: -p[1])
        vocab = matrix.shape[-1]
        top = tuple((int(t), _value(v * scale - shift)) for t, v in pairs[: ks[i]] if t < vocab)
        out.append(TokenLogprob(int(token), _value(lists[0][i] * scale - shift), top))
    return out


def step_logprobs(rows: Sequence[Row]) -> list[TokenLogprob]:
    """One step's entries for the requests that asked, in `rows` order."""
    matrix = mx.stack([row[0] for row in rows]).astype(mx.float32)
    return _select(
        matrix, [row[1] for row in rows], [row[3] for row in rows], [row[2] for row in rows]
    )


class RawCapture:
    """A logits processor put first for raw-logprobs requests: it keeps each step's
    logits before the other processors change them, in step order (the generator
    computes step k+1 before it hands out token k, so at most two are held)."""

    def __init__(self) -> None:
        self._steps: deque[mx.array] = deque()

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        self._steps.append(logits)
        # A new array for the processors after it: mlx-lm's repetition and presence
        # penalties assign into the logits they get, which would change the kept ones.
        return mx.array(logits)

    def pop(self) -> mx.array:
        logits = self._steps.popleft()[0].astype(mx.float32)
        return log_probabilities(logits)


def make_row(
    vector: mx.array, token: int, request: GenerationRequest, raw: RawCapture | None
) -> Row:
    """What step_logprobs needs for one sequence: raw rows skip the temperature."""
    if request.logprobs_raw:
        return (raw.pop() if raw is not None else vector, token, 0.0, request.logprobs or 0)
    return (vector, token, request.sampling.temperature, request.logprobs or 0)


def prefill(
    model: Any, cache: list[Any], tokens: Sequence[int], targets: Sequence[int] | None, top: int
) -> list[TokenLogprob]:
    """Run `tokens` into `cache`; with `targets` (the token after each), score them."""
    entries: list[TokenLogprob] = []
    step = SCORE_CHUNK if targets is not None else 512
    for start in range(0, len(tokens), step):
        chunk = mx.array(list(tokens[start : start + step]))[None]
        logits = model(chunk, cache=cache)
        if targets is None:
            mx.eval([c.state for c in cache])
            continue
        logits = logits[0].astype(mx.float32)
        logprobs = log_probabilities(logits)
        wanted = list(targets[start : start + step])
        count = len(wanted)
        entries.extend(_select(logprobs, wanted, [top] * count, [0.0] * count))
    return entries


def shared_prefill(
    model: Any, prefix_cache: PrefixCache, request: GenerationRequest
) -> tuple[PrefixHit, int, tuple[TokenLogprob | None, ...] | None]:
    """Where a shared or scored request starts: (its cache, reused tokens, prompt scores).

    The first member of a group processes prompt[:-1] (from the prefix cache when it
    is not scoring) and keeps the cache on the group; the others start from a copy.
    """
    prompt = list(request.prompt_tokens)
    shared = request.shared
    reused = len(prompt) - 1
    if shared is None or shared.started == 0:
        scoring = request.prompt_logprobs is not None
        hit = PrefixHit(None, 0, prompt) if scoring else prefix_cache.lookup(prompt)
        reused = hit.cached
        cache = hit.cache if hit.cache is not None else make_prompt_cache(model)
        head = prompt[hit.cached : -1]
        targets = prompt[1:] if scoring else None
        entries = prefill(model, cache, head, targets, request.prompt_logprobs or 0)
        scores = (None, *entries) if scoring else None
        if shared is not None:
            shared.cache, shared.prompt_logprobs = cache, scores
    else:
        cache, scores = shared.cache, shared.prompt_logprobs
    if shared is not None:
        shared.started += 1
        if shared.started >= shared.members:
            shared.cache = None  # the last member takes the original
        else:
            cache = copy.deepcopy(cache)
    if len(prompt) == 1:
        return PrefixHit(None, 0, prompt), 0, scores
    return PrefixHit(cache, len(prompt) - 1, prompt[-1:]), reused, scores

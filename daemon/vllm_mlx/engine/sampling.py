"""Per-request samplers and logits processors for a shared batch.

Greedy requests share one sampler object so mlx-lm's BatchGenerator samples them in
a single batched call; every other request gets its own, with its own PRNG key: the
global mlx random state is never used, so one request's failed sampling graph cannot
poison the random state every later request draws from.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

import mlx.core as mx
from mlx_lm.sample_utils import (
    apply_min_p,
    apply_top_k,
    apply_top_p,
    greedy_sampler,
    make_logits_processors,
)

from vllm_mlx.engine.types import SamplingParams
from vllm_mlx.models.cpu.vocab import categorical

Sampler = Callable[[mx.array], mx.array]
LogitsProcessor = Callable[[mx.array, mx.array], mx.array]


def _filters(params: SamplingParams, vocab_size: int) -> list[Callable[[mx.array], mx.array]]:
    filters: list[Callable[[mx.array], mx.array]] = []
    if 0 < params.top_p < 1.0:
        filters.append(lambda x: apply_top_p(x, params.top_p))
    if params.min_p > 0:
        filters.append(lambda x: apply_min_p(x, params.min_p))
    # top_k at or above the vocabulary keeps every token: no filter (argpartition
    # with kth past the end would fail the step).
    if 0 < params.top_k < vocab_size:
        filters.append(lambda x: apply_top_k(x, params.top_k))
    return filters


class SeededSampler:
    """A sampler with its own PRNG stream: the same seed gives the same tokens,
    whatever else shares the batch. Each call takes the next key of the stream; a
    speculative verify step (engine/speculative/draws.py) draws several positions ahead
    with `draw` and the keys that follow `key`, then leaves `key` where drawing the
    emitted tokens one at a time would have."""

    def __init__(self, params: SamplingParams, seed: int, vocab_size: int) -> None:
        self.key = mx.random.key(seed % 2**64)  # signed 64-bit seeds fold into the uint64
        self.filters = _filters(params, vocab_size)
        self.inverse_temp = 1.0 / params.temperature

    def __call__(self, logprobs: mx.array) -> mx.array:
        self.key, step_key = mx.random.split(self.key)
        return self.draw(logprobs, step_key)

    def draw(self, logprobs: mx.array, key: mx.array) -> mx.array:
        """The token drawn from `logprobs` (one row, normalized) with `key`."""
        for apply in self.filters:
            logprobs = apply(logprobs)
        return categorical(logprobs * self.inverse_temp, key)


def make_sampler(params: SamplingParams, vocab_size: int) -> Sampler:
    if params.greedy:
        return greedy_sampler
    seed = secrets.randbits(64) if params.seed is None else params.seed
    return SeededSampler(params, seed, vocab_size)


class Fault:
    """The first failure inside one request's sampling or logits processing."""

    def __init__(self) -> None:
        self.message: str | None = None

    def record(self, what: str, exc: Exception) -> None:
        if self.message is None:
            self.message = f"{what} failed: {type(exc).__name__}: {exc}"


def guard_processor(processor: LogitsProcessor, fault: Fault) -> LogitsProcessor:
    """A processor whose exception fails its own request, never the shared step."""

    def guarded(tokens: mx.array, logits: mx.array) -> mx.array:
        if fault.message is not None:
            return logits
        try:
            return processor(tokens, logits)
        except Exception as exc:
            fault.record("logits processing", exc)
            return logits

    return guarded


class GuardedSampler:
    """A sampler whose exception fails its own request; the batch gets a token anyway."""

    def __init__(self, sampler: Sampler, fault: Fault) -> None:
        self.sampler = sampler
        self.fault = fault

    def __call__(self, logprobs: mx.array) -> mx.array:
        if self.fault.message is None:
            try:
                return self.sampler(logprobs)
            except Exception as exc:
                self.fault.record("sampling", exc)
        return mx.argmax(logprobs, axis=-1)


def guard_sampler(sampler: Sampler, fault: Fault) -> GuardedSampler:
    return GuardedSampler(sampler, fault)


def make_processors(params: SamplingParams, max_tokens: int) -> list[LogitsProcessor]:
    """OpenAI-style penalties look at every generated token, so the context is max_tokens,
    unless the request narrows it (penalty_window)."""
    penalty = params.repetition_penalty
    window = min(max_tokens, params.penalty_window or max_tokens)
    processors: list[LogitsProcessor] = make_logits_processors(
        logit_bias=params.logit_bias or None,
        repetition_penalty=None if penalty in (None, 1.0) else penalty,
        repetition_context_size=window,
        presence_penalty=params.presence_penalty or None,
        presence_context_size=window,
        frequency_penalty=params.frequency_penalty or None,
        frequency_context_size=window,
    )
    return processors

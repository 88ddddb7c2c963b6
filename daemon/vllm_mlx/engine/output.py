"""Token ids -> text deltas: streaming detokenization and stop strings, off the engine thread.

Multi-byte characters stay whole (mlx-lm's streaming detokenizer holds back partial
UTF-8), special tokens are never turned into text, and a stop string is found even
when it spans tokens; text that could still become a stop string is held back.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from vllm_mlx.engine.engine import Engine
from vllm_mlx.engine.types import (
    Finished,
    FinishReason,
    GenerationRequest,
    PromptProcessed,
    SequenceFinished,
    TextDelta,
    TokenLogprob,
    TokensGenerated,
    Usage,
)

OutputEvent = TextDelta | Finished


@dataclass
class RequestTrace:
    """Timings of one request, for the request log line and metrics."""

    request_id: str
    arrived_at: float = field(default_factory=time.monotonic)
    prefill_done_at: float | None = None
    cached_tokens: int = 0  # prompt tokens the prefix cache supplied
    first_token_at: float | None = None
    finished_at: float | None = None
    token_times: list[float] = field(default_factory=list)
    prefill_started_at: float | None = None
    completion_tokens: int = 0

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.arrived_at


class StopMatcher:
    """Finds stop strings across chunk boundaries and holds back possible prefixes."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = [s for s in stops if s]
        self._held = ""

    def feed(self, text: str) -> tuple[str, str | None]:
        """Return (text safe to emit, the stop string hit or None)."""
        if not self._stops:
            return text, None
        buffer = self._held + text
        hit: tuple[int, str] | None = None
        for stop in self._stops:
            index = buffer.find(stop)
            if index != -1 and (hit is None or index < hit[0]):
                hit = (index, stop)
        if hit is not None:
            self._held = ""
            return buffer[: hit[0]], hit[1]
        keep = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(buffer)), keep, -1):
                if buffer.endswith(stop[:size]):
                    keep = size
                    break
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep], None

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held


class Detokenizer:
    def __init__(self, tokenizer: Any) -> None:
        detokenizer = tokenizer.detokenizer
        # mlx-lm drops the reply's first leading space (a console nicety); a completion
        # of "The capital of France is" needs its " Paris", so keep the text as decoded.
        if hasattr(detokenizer, "trim_space"):
            detokenizer.trim_space = False
        if hasattr(detokenizer, "_maybe_trim_space"):
            detokenizer._maybe_trim_space = lambda text: text
        self._detokenizer = detokenizer
        self._special: frozenset[int] = frozenset(getattr(tokenizer, "all_special_ids", ()))

    def add(self, tokens: Sequence[int]) -> str:
        for token in tokens:
            if token not in self._special:
                self._detokenizer.add_token(token)
        segment: str = self._detokenizer.last_segment
        return segment

    def finish(self) -> str:
        self._detokenizer.finalize()
        segment: str = self._detokenizer.last_segment
        return segment


def _one_by_one(
    event: TokensGenerated,
) -> list[tuple[Sequence[int], tuple[TokenLogprob, ...]]]:
    """An event's tokens one at a time, each with its own log-probabilities."""
    tokens, logprobs = event.tokens, event.logprobs
    if len(tokens) <= 1:
        return [(tokens, logprobs)]
    if len(logprobs) == len(tokens):
        return [([t], (lp,)) for t, lp in zip(tokens, logprobs, strict=True)]
    return [([t], logprobs if i == 0 else ()) for i, t in enumerate(tokens)]


async def generate_text(
    engine: Engine,
    request: GenerationRequest,
    trace: RequestTrace | None = None,
) -> AsyncIterator[OutputEvent]:
    """Text deltas then one Finished with usage. Closing the iterator aborts generation."""
    trace = trace or RequestTrace(request.request_id, request.arrived_at)
    detokenizer = Detokenizer(engine.tokenizer)
    stops = StopMatcher(request.stop)
    completion_tokens = 0
    predicted: tuple[int, int] | None = None  # a prediction's (proposed, accepted)
    prompt_tokens = len(request.prompt_tokens)
    # Logprobs of tokens whose text is held back (partial character, possible stop
    # string) ride with the next delta that carries text.
    logprobs: tuple[TokenLogprob, ...] = ()
    async for event in engine.events(request):
        if isinstance(event, PromptProcessed):
            trace.prefill_done_at = event.at
            trace.cached_tokens = event.cached_tokens
            trace.prefill_started_at = event.started_at
            if event.prompt_logprobs is not None:
                yield TextDelta("", prompt_logprobs=event.prompt_logprobs)
        elif isinstance(event, TokensGenerated):
            predicted = event.predicted or predicted
            now = time.monotonic()
            if trace.first_token_at is None:
                trace.first_token_at = now
            # A speculative step brings several tokens at once: each is taken as if it
            # came alone, so deltas, stop strings and usage are as without speculation.
            for tokens, token_logprobs in _one_by_one(event):
                trace.token_times.append(now)
                completion_tokens += len(tokens)
                trace.completion_tokens = completion_tokens
                logprobs += token_logprobs
                text, hit = stops.feed(detokenizer.add(tokens))
                if text or (hit is not None and logprobs):
                    yield TextDelta(text, logprobs)
                    logprobs = ()
                if hit is not None:
                    trace.finished_at = time.monotonic()
                    usage = Usage(prompt_tokens, completion_tokens, trace.cached_tokens)
                    yield Finished(FinishReason.STOP, replace(usage, predicted=predicted), hit)
                    return  # leaving the engine's iterator aborts the sequence
        elif isinstance(event, SequenceFinished):
            tail, hit = stops.feed(detokenizer.finish())
            tail += "" if hit else stops.flush()
            if tail or logprobs:
                yield TextDelta(tail, logprobs)
            trace.finished_at = time.monotonic()
            reason = FinishReason.STOP if hit else event.reason
            cached, stored = trace.cached_tokens, event.cache_stored
            usage = Usage(prompt_tokens, completion_tokens, cached, stored, predicted)
            yield Finished(reason, usage, hit, event.message, event.refused)
            return

"""Warm prompts: a model's configured system prompts prefilled into its prefix cache at
load, before the model reports ready (models[].warm_prompts).

Each text is rendered as a lone system message without a generation prompt: a request
that opens with the same system message renders the same tokens first, so its prefill
starts after them. One greedy token is generated (the cache stores a finished sequence).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import structlog

from vllm_mlx.engine.engine import Engine
from vllm_mlx.engine.types import (
    EngineEvent,
    GenerationRequest,
    PromptProcessed,
    SamplingParams,
    SequenceFinished,
)

log = structlog.get_logger(__name__)

WARM_TIMEOUT_S = 900.0  # a long system prompt on a slow CPU: minutes, not hours


def warm_tokens(engine: Engine, text: str) -> list[int]:
    messages = [{"role": "system", "content": text}]
    rendered = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=False)
    return [int(token) for token in rendered]


class _Waiter:
    """The sink of one warm request: what the loader thread waits for."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.cached = 0
        self.finished: SequenceFinished | None = None

    def __call__(self, event: EngineEvent) -> None:
        if isinstance(event, PromptProcessed):
            self.cached = event.cached_tokens
        elif isinstance(event, SequenceFinished):
            self.finished = event
            self.done.set()


def warm(engine: Engine, model: str, texts: Sequence[str]) -> None:
    """Prefill each text (blocking: the loader thread waits). A prompt longer than the
    model's context is skipped, said in the log; so is one that times out."""
    for index, text in enumerate(texts):
        tokens = warm_tokens(engine, text)
        if len(tokens) >= engine.context_length:
            log.warning("warm prompt skipped: longer than the context", model=model, index=index)
            continue
        waiter = _Waiter()
        request = GenerationRequest(f"warm-{model}-{index}", tokens, 1, SamplingParams())
        engine.scheduler.submit(request, waiter)
        if not waiter.done.wait(WARM_TIMEOUT_S) or waiter.finished is None:
            engine.scheduler.abort(request.request_id)
            log.warning("warm prompt timed out", model=model, index=index)
            continue
        log.info(
            "warm prompt cached",
            model=model,
            index=index,
            prompt_tokens=len(tokens),
            cached_tokens=waiter.cached,
            stored_tokens=waiter.finished.cache_stored,
            outcome=waiter.finished.reason.value,
        )

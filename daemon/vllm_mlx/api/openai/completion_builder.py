"""Neutral events -> a text completion: chunks (streamed) or the whole response.

Every prompt of a request has `n` choices, numbered prompt by prompt; `echo` repeats a
choice's prompt before its text (with the prompt's scores when asked), and legacy
`logprobs` give text offsets into the text so far.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from vllm_mlx.api.error_shapes import openai_error_body
from vllm_mlx.api.errors import APIError
from vllm_mlx.api.openai import convert
from vllm_mlx.api.openai.logprobs import LegacyLogprobs, Tap, merge_blocks
from vllm_mlx.api.pipeline.driver import Event, WireBuilder
from vllm_mlx.api.sse import DONE, data_event
from vllm_mlx.engine.types import Finished, Usage
from vllm_mlx.parsers.types import ContentDelta, ParserEvent


@dataclass(frozen=True)
class CompletionPrompt:
    """One prompt of the request: its tokens and the text `echo` repeats ("" without)."""

    tokens: list[int]
    echo: str


@dataclass
class CompletionChoice:
    """One choice's text as it grows, with its legacy logprobs (offsets into that text)."""

    prompt: CompletionPrompt
    tap: Tap
    legacy: LegacyLogprobs | None
    parts: list[str] = field(default_factory=list)
    blocks: list[dict[str, Any]] = field(default_factory=list)
    finished: Finished | None = None
    echoed: bool = False

    def echo(self) -> tuple[str, dict[str, Any] | None]:
        """The echoed prompt, with its scores when the engine sent them."""
        self.echoed = True
        text, prompt = self.prompt.echo, self.prompt.tokens
        if self.legacy is None:
            return text, None
        block = None
        if self.tap.prompt is not None:
            block = self.legacy.block(self.tap.prompt, prompt)
        self.legacy.offset = len(text)
        return text, block

    def take(self) -> tuple[str, dict[str, Any] | None]:
        """Text and logprobs gathered since the last call."""
        text, self.parts = "".join(self.parts), []
        entries = self.tap.take()
        block = self.legacy.block(entries) if self.legacy is not None else None
        return text, block


class CompletionBuilder(WireBuilder):
    trailer = DONE

    def __init__(
        self,
        request_id: str,
        model: str,
        choices: list[CompletionChoice],
        *,
        streaming: bool,
        include_usage: bool = False,
    ) -> None:
        self.request_id, self.model = request_id, model
        self.choices = choices
        self.streaming = streaming
        self.include_usage = include_usage
        self.created = int(time.time())

    def _chunk(
        self, index: int, text: str, block: dict[str, Any] | None, reason: str | None = None
    ) -> Event:
        return convert.completion_chunk(
            self.request_id, self.model, text, reason, self.created, index, block
        )

    def _echo(self, index: int) -> list[Event]:
        choice = self.choices[index]
        if choice.echoed:
            return []
        if self.streaming:
            if not choice.prompt.echo:
                choice.echoed = True
                return []
            return [self._chunk(index, *choice.echo())]
        text, block = choice.echo()
        choice.parts.append(text)
        if block is not None:
            choice.blocks.append(block)
        return []

    def feed(self, event: ParserEvent, index: int = 0) -> list[Event]:
        assert isinstance(event, ContentDelta)  # completions run without parsers
        out = self._echo(index)
        choice = self.choices[index]
        choice.parts.append(event.text)
        if self.streaming:
            out.append(self._chunk(index, *choice.take()))
        return out

    def finish(self, finished: Finished, index: int = 0) -> list[Event]:
        out = self._echo(index)
        choice = self.choices[index]
        choice.finished = finished
        if self.streaming:
            reason = convert.finish_reason(finished.reason)
            out.append(self._chunk(index, *choice.take(), reason))
        return out

    def usage(self) -> Usage:
        """Each prompt's tokens once (its choices share one prefill), every completion's."""
        seen: set[int] = set()
        prompt_tokens = completion_tokens = cached = written = 0
        for choice in self.choices:
            usage = choice.finished.usage if choice.finished is not None else Usage(0, 0)
            if id(choice.prompt) not in seen:
                seen.add(id(choice.prompt))
                prompt_tokens += usage.prompt_tokens
                cached += usage.cached_tokens
            completion_tokens += usage.completion_tokens
            written += usage.cache_write_tokens
        return Usage(prompt_tokens, completion_tokens, cached, written)

    def end(self) -> list[Event]:
        if not (self.streaming and self.include_usage):
            return []
        chunk = convert.completion_chunk(self.request_id, self.model, "", None, self.created)
        chunk["choices"] = []
        chunk["usage"] = convert.usage_dict(self.usage())
        return [chunk]

    def fail(self, error: APIError) -> list[Event]:
        return [dict(openai_error_body(error))]

    def frame(self, event: Event) -> bytes:
        return data_event(event)

    def result(self) -> dict[str, Any]:
        out = []
        for index, choice in enumerate(self.choices):
            assert choice.finished is not None  # the driver raised for a run without one
            text, block = choice.take()
            logprobs = None if block is None else merge_blocks([*choice.blocks, block])
            reason = convert.finish_reason(choice.finished.reason)
            out.extend(self._chunk(index, text, logprobs, reason)["choices"])
        payload = self._chunk(0, "", None)
        payload["choices"] = out
        payload["usage"] = convert.usage_dict(self.usage())
        return payload

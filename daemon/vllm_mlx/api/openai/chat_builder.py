"""Neutral events -> a chat completion: chunks (streamed) or the whole response.

One ChatBuilder serves every choice of a request (`n`): a role chunk per choice first,
content, reasoning and tool-call deltas as they come, each carrying the token logprobs
that arrived with them, a finish chunk per choice, the usage chunk when asked, [DONE].
Server-side tool rounds (MCP `execute`) continue the same stream: tool-call indexes keep
counting across rounds and executed calls are marked with their server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_mlx.api.error_shapes import openai_error_body
from vllm_mlx.api.errors import APIError
from vllm_mlx.api.openai import convert
from vllm_mlx.api.openai.logprobs import Tap, TokenTexts, chat_logprobs
from vllm_mlx.api.pipeline.driver import Event, WireBuilder
from vllm_mlx.api.sse import DONE, data_event
from vllm_mlx.engine.types import Finished, TokenLogprob, Usage
from vllm_mlx.parsers.types import (
    ContentDelta,
    ParserEvent,
    ReasoningDelta,
    ToolCall,
    ToolCallArgumentsDelta,
    ToolCallStart,
)

Call = tuple[str, str, str]  # id, name, arguments (JSON text)


@dataclass
class ChoiceLogprobs:
    """One choice's token logprobs, kept beside its events by a Tap."""

    tap: Tap
    texts: TokenTexts
    entries: list[TokenLogprob] = field(default_factory=list)  # everything taken so far

    def take(self) -> dict[str, Any]:
        """The logprobs that arrived since the last call."""
        taken = self.tap.take()
        self.entries.extend(taken)
        return chat_logprobs(self.texts, taken)

    def whole(self) -> dict[str, Any]:
        self.take()
        return chat_logprobs(self.texts, self.entries)


class _Message:
    """One choice's message as it grows (in a tool round: this round's)."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, list[str]] = {}  # index -> [id, name, arguments...]
        self.finished: Finished | None = None

    def add(self, event: ParserEvent) -> None:
        if isinstance(event, ContentDelta):
            self.content.append(event.text)
        elif isinstance(event, ReasoningDelta):
            self.reasoning.append(event.text)
        elif isinstance(event, ToolCallStart):
            self.calls[event.index] = [event.id, event.name]
        else:
            self.calls[event.index].append(event.fragment)

    def call_list(self) -> list[Call]:
        return [(c[0], c[1], "".join(c[2:]) or "{}") for c in self.calls.values()]

    def message(self) -> dict[str, Any]:
        calls = [ToolCall(*call) for call in self.call_list()]
        return convert.chat_message("".join(self.content), "".join(self.reasoning), calls)


class ChatBuilder(WireBuilder):
    trailer = DONE

    def __init__(
        self,
        request_id: str,
        model: str,
        logprobs: list[ChoiceLogprobs | None],
        *,
        streaming: bool,
        include_usage: bool = False,
        mcp_servers: dict[str, str] | None = None,
    ) -> None:
        self.request_id, self.model = request_id, model
        self.chunks = convert.ChatChunks(request_id, model)
        self.logprobs = logprobs
        self.messages = [_Message() for _ in logprobs]
        self.streaming = streaming
        self.include_usage = include_usage
        self.mcp_servers = mcp_servers or {}  # executed tool name -> its server
        self.call_base = 0  # tool-call indexes keep counting across tool rounds

    def _chunk(self, index: int, delta: dict[str, Any], reason: str | None = None) -> Event:
        log = self.logprobs[index]
        return self.chunks.chunk(delta, reason, index, None if log is None else log.take())

    def start(self) -> list[Event]:
        role = {"role": "assistant", "content": ""}
        return [self.chunks.chunk(role, index=index) for index in range(len(self.messages))]

    def feed(self, event: ParserEvent, index: int = 0) -> list[Event]:
        self.messages[index].add(event)
        if not self.streaming:
            return []
        return [self._chunk(index, self._delta(event))]

    def _delta(self, event: ParserEvent) -> dict[str, Any]:
        if isinstance(event, ContentDelta):
            return {"content": event.text}
        if isinstance(event, ReasoningDelta):
            return convert.reasoning_delta(event.text)
        index = self.call_base + event.index
        if isinstance(event, ToolCallArgumentsDelta):
            return convert.tool_arguments_delta(index, event.fragment)
        delta = convert.tool_start_delta(index, event.id, event.name)
        if event.name in self.mcp_servers:
            delta["tool_calls"][0]["mcp"] = {"server": self.mcp_servers[event.name]}
        return delta

    def finish(self, finished: Finished, index: int = 0) -> list[Event]:
        self.messages[index].finished = finished
        if not self.streaming:
            return []
        return [self._chunk(index, {}, convert.finish_reason(finished.reason))]

    def end(self) -> list[Event]:
        if not self.include_usage:
            return []
        return [self.chunks.usage(self.usage())]

    def fail(self, error: APIError) -> list[Event]:
        return [dict(openai_error_body(error))]

    def frame(self, event: Event) -> bytes:
        return data_event(event)

    def usage(self) -> Usage:
        """The prompt once (the choices share one prefill), every choice's completion;
        the first to finish writes the prompt's new cache blocks, so writes are summed."""
        usages = [m.finished.usage for m in self.messages if m.finished is not None]
        counts = [u.predicted for u in usages if u.predicted is not None]
        return Usage(
            usages[0].prompt_tokens,
            sum(u.completion_tokens for u in usages),
            usages[0].cached_tokens,
            sum(u.cache_write_tokens for u in usages),
            (sum(c[0] for c in counts), sum(c[1] for c in counts)) if counts else None,
        )

    def round_calls(self) -> tuple[str, list[Call]]:
        """The content and calls of the tool round that just ended (choice 0)."""
        message = self.messages[0]
        return "".join(message.content), message.call_list()

    def next_round(self, records: list[dict[str, Any]]) -> Event:
        """Start the next tool round after `records` ran; the chunk that reports them."""
        self.call_base += len(self.messages[0].calls)
        self.messages[0] = _Message()
        return self.chunks.chunk({"mcp_tool_results": records})

    def result(self) -> dict[str, Any]:
        out = []
        for index, (message, log) in enumerate(zip(self.messages, self.logprobs, strict=True)):
            assert message.finished is not None  # the driver raised for a run without one
            reason = convert.finish_reason(message.finished.reason)
            logprobs = None if log is None else log.whole()
            out.append(convert.chat_choice(index, message.message(), reason, logprobs))
        return convert.chat_response(self.request_id, self.model, out, self.usage())

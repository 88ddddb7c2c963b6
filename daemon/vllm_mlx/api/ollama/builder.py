"""Neutral events -> Ollama's /api/chat and /api/generate objects (NDJSON when streamed).

Every streamed object carries `model`, `created_at` and `done`; text goes in
`message.content` (chat) or `response` (generate), reasoning in `thinking`. A tool call
goes out whole, arguments as an object, once the parser has all of it. The last object
says `done: true` with `done_reason` and Ollama's counters and durations (nanoseconds,
measured here: load = resolving and loading the model, prompt eval = up to the first
output, eval = from there to the end). Not streamed, the same events fold into one
object. A failure after the start is a last object with `error`.
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from vllm_mlx.api.errors import APIError
from vllm_mlx.api.ollama import convert
from vllm_mlx.api.pipeline.driver import Event, WireBuilder
from vllm_mlx.engine.types import Finished
from vllm_mlx.parsers.types import (
    ContentDelta,
    ParserEvent,
    ReasoningDelta,
    ToolCallArgumentsDelta,
    ToolCallStart,
)

Kind = Literal["chat", "generate"]


def ndjson(event: Event) -> bytes:
    return json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def _arguments(text: str) -> dict[str, Any]:
    """A call's arguments as an object; cut short or not an object: {} (as Ollama's)."""
    try:
        value = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


class OllamaBuilder(WireBuilder):
    def __init__(
        self, kind: Kind, model: str, *, streaming: bool, started_ns: int, load_ns: int
    ) -> None:
        self.kind, self.model, self.streaming = kind, model, streaming
        self.started_ns, self.load_ns = started_ns, load_ns
        self.first_ns: int | None = None  # the first output: the prompt is evaluated
        self.content: list[str] = []
        self.thinking: list[str] = []
        self.calls: list[dict[str, Any]] = []
        self._call: list[str] | None = None  # [name, argument fragments...] of the open call
        self.final: Event | None = None

    def _object(self, **fields: Any) -> Event:
        return {"model": self.model, "created_at": convert.timestamp(), **fields}

    def _text(self, content: str = "", thinking: str = "") -> Event:
        if self.kind == "generate":
            event = self._object(response=content, done=False)
            if thinking:
                event["thinking"] = thinking
            return event
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if thinking:
            message["thinking"] = thinking
        return self._object(message=message, done=False)

    def feed(self, event: ParserEvent, index: int = 0) -> list[Event]:
        if self.first_ns is None:
            self.first_ns = time.monotonic_ns()
        if isinstance(event, ToolCallStart):
            out = self._close_call()
            self._call = [event.name]
            return out
        if isinstance(event, ToolCallArgumentsDelta):
            if self._call is not None:
                self._call.append(event.fragment)
            return []
        out = self._close_call()
        if isinstance(event, ContentDelta):
            self.content.append(event.text)
            text = self._text(content=event.text)
        else:
            assert isinstance(event, ReasoningDelta)
            self.thinking.append(event.text)
            text = self._text(thinking=event.text)
        return [*out, text] if self.streaming else []

    def _close_call(self) -> list[Event]:
        if self._call is None:
            return []
        name, *fragments = self._call
        self._call = None
        call = {"function": {"name": name, "arguments": _arguments("".join(fragments))}}
        self.calls.append(call)
        if not self.streaming:
            return []
        message = {"role": "assistant", "content": "", "tool_calls": [call]}
        return [self._object(message=message, done=False)]

    def finish(self, finished: Finished, index: int = 0) -> list[Event]:
        out = self._close_call()
        now = time.monotonic_ns()
        first = self.first_ns or now
        usage = finished.usage
        stats = {
            "done_reason": convert.done_reason(finished.reason),
            "total_duration": now - self.started_ns,
            "load_duration": self.load_ns,
            "prompt_eval_count": usage.prompt_tokens,
            "prompt_eval_duration": max(0, first - self.started_ns - self.load_ns),
            "eval_count": usage.completion_tokens,
            "eval_duration": now - first,
        }
        content = "" if self.streaming else "".join(self.content)
        thinking = "" if self.streaming else "".join(self.thinking)
        if self.kind == "generate":
            self.final = self._object(response=content, done=True, **stats)
            if thinking:
                self.final["thinking"] = thinking
        else:
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if thinking:
                message["thinking"] = thinking
            if self.calls and not self.streaming:
                message["tool_calls"] = self.calls
            self.final = self._object(message=message, done=True, **stats)
        return [*out, self.final] if self.streaming else []

    def fail(self, error: APIError) -> list[Event]:
        return [{"error": error.message}]

    def frame(self, event: Event) -> bytes:
        return ndjson(event)

    def result(self) -> dict[str, Any]:
        assert self.final is not None  # the driver raised for a run without one
        return self.final

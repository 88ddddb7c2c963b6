"""Neutral output events -> Anthropic message events, and the message they add up to.

One MessageBuilder per request turns parser events (content, reasoning, tool calls)
into the stream protocol: message_start, ping, content blocks (start, deltas, stop)
counted from index 0, message_delta with the stop reason and usage, message_stop.
The non-streaming response is those same events folded together, so both modes
always agree on what the model said.
"""

from __future__ import annotations

import json
from typing import Any

from vllm_mlx.api.anthropic import convert
from vllm_mlx.api.error_shapes import anthropic_error_body
from vllm_mlx.api.errors import APIError
from vllm_mlx.api.pipeline.driver import Event, WireBuilder
from vllm_mlx.api.sse import named_event
from vllm_mlx.engine.types import Finished
from vllm_mlx.parsers.types import (
    ContentDelta,
    ParserEvent,
    ReasoningDelta,
    ToolCallArgumentsDelta,
    ToolCallStart,
)

# A `ping` after this many silent seconds (a long prefill, a slow step) keeps clients
# and proxies from dropping the stream as idle; the hosted API pings the same way.
PING_EVERY_S = 10.0

_EMPTY_BLOCKS: dict[str, dict[str, Any]] = {
    "text": {"type": "text", "text": ""},
    # No signature: a local model cannot sign its reasoning the way the hosted API does.
    "thinking": {"type": "thinking", "thinking": "", "signature": ""},
}


class MessageBuilder(WireBuilder):
    keepalive_s = PING_EVERY_S

    def __init__(self, message_id: str, model: str, input_tokens: int) -> None:
        self.message_id = message_id
        self.model = model
        self.input_tokens = input_tokens
        self.content: list[dict[str, Any]] = []  # the blocks so far, as the client sees them
        self._open: str | None = None  # type of the open block
        self._open_tool: int | None = None  # parser index of the open tool_use block
        self._tool_json: list[str] = []
        self.used_tools = False
        self.finished: Finished | None = None
        # MCP tools the daemon runs itself (`execute`) -> their servers: marked on start.
        self.mcp_servers: dict[str, str] = {}

    def _message(self, content: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
        return {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": None,
            "stop_sequence": None,
            # Before the prefill nothing is known of the cache: message_delta has it.
            "usage": {
                "input_tokens": self.input_tokens,
                "output_tokens": 0,
                "cache_read_input_tokens": 0,
                "cache_creation_input_tokens": 0,
            },
            **fields,
        }

    def start(self) -> list[Event]:
        # The ping right away keeps proxies from timing out a long prefill.
        return [{"type": "message_start", "message": self._message([])}, {"type": "ping"}]

    def feed(self, event: ParserEvent, index: int = 0) -> list[Event]:
        if isinstance(event, ContentDelta | ReasoningDelta):
            kind = "text" if isinstance(event, ContentDelta) else "thinking"
            if not event.text:
                return []
            events = self._open_block(kind, dict(_EMPTY_BLOCKS[kind]))
            delta = (
                {"type": "text_delta", "text": event.text}
                if kind == "text"
                else {"type": "thinking_delta", "thinking": event.text}
            )
            return [*events, self._delta(delta)]
        if isinstance(event, ToolCallStart):
            self.used_tools = True
            block = {"type": "tool_use", "id": event.id, "name": event.name, "input": {}}
            events = self._open_block("tool_use", block)
            self._open_tool = event.index
            return events
        return self._arguments(event)

    def _arguments(self, event: ToolCallArgumentsDelta) -> list[Event]:
        # Parsers emit a call's arguments right after its start, before the next call.
        if self._open != "tool_use" or self._open_tool != event.index or not event.fragment:
            return []
        self._tool_json.append(event.fragment)
        return [self._delta({"type": "input_json_delta", "partial_json": event.fragment})]

    def _open_block(self, kind: str, block: dict[str, Any]) -> list[Event]:
        if self._open == kind and kind != "tool_use":
            return []
        events = self._close_block()
        self.content.append(block)
        self._open = kind
        start: Event = {"type": "content_block_start", "index": self._index}
        # The start event carries a copy: the block itself keeps growing with the deltas.
        start["content_block"] = dict(block)
        if kind == "tool_use" and block["name"] in self.mcp_servers:
            start["content_block"]["mcp"] = {"server": self.mcp_servers[block["name"]]}
        return [*events, start]

    @property
    def _index(self) -> int:
        return len(self.content) - 1

    def _delta(self, delta: dict[str, Any]) -> Event:
        block = self.content[-1]
        if delta["type"] == "text_delta":
            block["text"] += delta["text"]
        elif delta["type"] == "thinking_delta":
            block["thinking"] += delta["thinking"]
        return {"type": "content_block_delta", "index": self._index, "delta": delta}

    def close(self) -> list[Event]:
        """Close the open block, if any (a server-side tool round ends here)."""
        return self._close_block()

    def _close_block(self) -> list[Event]:
        if self._open is None:
            return []
        if self._open == "tool_use":
            self.content[-1]["input"] = _json_object("".join(self._tool_json))
            self._tool_json, self._open_tool = [], None
        self._open = None
        return [{"type": "content_block_stop", "index": self._index}]

    def finish(self, finished: Finished, index: int = 0) -> list[Event]:
        """Close the last block; message_delta (stop reason, usage) and message_stop."""
        self.finished = finished
        events = self._close_block()
        if not self.content:
            # Clients read content[0]; an empty answer is one empty text block.
            events = [*self._open_block("text", dict(_EMPTY_BLOCKS["text"])), *self._close_block()]
        delta = {
            "stop_reason": convert.stop_reason(finished, self.used_tools),
            "stop_sequence": finished.stop_sequence,
        }
        usage = convert.usage_dict(finished.usage)
        return [
            *events,
            {"type": "message_delta", "delta": delta, "usage": usage},
            {"type": "message_stop"},
        ]

    def fail(self, error: APIError) -> list[Event]:
        return [dict(anthropic_error_body(error))]

    def ping(self) -> Event:
        return {"type": "ping"}

    def frame(self, event: Event) -> bytes:
        # The SSE event name is always the payload's own type.
        return named_event(event["type"], event)

    def result(self) -> dict[str, Any]:
        assert self.finished is not None  # the driver raised for a run without one
        return self.message(self.finished)

    def message(self, finished: Finished) -> dict[str, Any]:
        """The non-streaming response: finish() folded into the message."""
        delta = next(e for e in self.finish(finished) if e["type"] == "message_delta")
        return self._message(
            self.content,
            **delta["delta"],
            usage=convert.usage_dict(finished.usage),
        )


def _json_object(text: str) -> dict[str, Any]:
    """A tool call's input; arguments cut short (max_tokens) or not an object give {}."""
    try:
        value = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}

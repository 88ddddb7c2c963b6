"""Neutral output events -> Responses stream events, and the response they add up to.

One ResponseBuilder per request turns parser events into output items (reasoning,
message, function_call), each opened with output_item.added and closed with
output_item.done, every event numbered by sequence_number from 0. The non-streaming
response is the same events folded together, so both modes always agree.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vllm_mlx.api.errors import APIError
from vllm_mlx.api.pipeline.driver import Event, WireBuilder
from vllm_mlx.api.pipeline.ids import new_id
from vllm_mlx.api.responses.schema import CreateResponseRequest
from vllm_mlx.api.sse import named_event
from vllm_mlx.engine.types import Finished, FinishReason, SamplingParams
from vllm_mlx.parsers.types import (
    ContentDelta,
    ParserEvent,
    ReasoningDelta,
    ToolCallArgumentsDelta,
    ToolCallStart,
)


def response_base(
    body: CreateResponseRequest, response_id: str, sampling: SamplingParams
) -> dict[str, Any]:
    """The response object before any output: what response.created carries."""
    reasoning = body.reasoning
    text_format = body.text.format if body.text and body.text.format else None
    response: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "completed_at": None,
        "error": None,
        "incomplete_details": None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "model": body.model,
        "output": [],
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "reasoning": {
            "effort": reasoning.effort if reasoning else None,
            "summary": reasoning.summary if reasoning else None,
        },
        "store": body.stores,
        "temperature": sampling.temperature,
        "text": {
            "format": text_format.model_dump(exclude_none=True, by_alias=True)
            if text_format
            else {"type": "text"}
        },
        "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
        "tools": [_tool_echo(tool) for tool in body.tools or []],
        "top_p": sampling.top_p,
        "truncation": body.truncation or "disabled",
        "metadata": body.metadata or {},
        "service_tier": "default",
        "prompt_cache_key": body.prompt_cache_key,
        "safety_identifier": body.safety_identifier,
        "background": False,
    }
    if body.user is not None:  # the spec has no null user
        response["user"] = body.user
    return response


def _tool_echo(tool: dict[str, Any]) -> dict[str, Any]:
    if tool.get("type") != "function":
        return tool  # namespace and hosted tools come back as they were sent
    return {
        "type": "function",
        "name": tool["name"],
        "description": tool.get("description"),
        "parameters": tool.get("parameters"),
        "strict": tool.get("strict"),
    }


def error_code(error: APIError) -> str:
    """The spec's ResponseErrorCode for a failure."""
    if error.status == 429:
        return "rate_limit_exceeded"
    if error.status == 400:
        return "invalid_prompt"
    return "server_error"


@dataclass
class _Open:
    kind: str  # "reasoning", "message" or "function_call"
    index: int  # output_index
    item: dict[str, Any]
    parts: list[str]  # text or arguments so far
    call: int | None = None  # the parser's index of an open function call


class ResponseBuilder(WireBuilder):
    def __init__(
        self,
        response: dict[str, Any],
        namespaces: dict[str, tuple[str, str]],
        count_tokens: Callable[[str], int],
        max_calls: int | None = None,
        keep: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.response = response
        self._keep = keep  # stores the response once it is over (store: true)
        self._namespaces = namespaces
        self._count_tokens = count_tokens
        self._max_calls = max_calls
        self._sequence = 0
        self._open: _Open | None = None
        self._reasoning: list[str] = []

    def _event(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _snapshot(self, kind: str) -> Event:
        return self._event(kind, response=copy.deepcopy(self.response))

    def start(self) -> list[Event]:
        return [self._snapshot("response.created"), self._snapshot("response.in_progress")]

    def feed(self, event: ParserEvent, index: int = 0) -> list[Event]:
        if isinstance(event, ReasoningDelta):
            return self._text("reasoning", event.text) if event.text else []
        if isinstance(event, ContentDelta):
            return self._text("message", event.text) if event.text else []
        if self._max_calls is not None and event.index >= self._max_calls:
            return []  # parallel_tool_calls: false keeps the first call only
        if isinstance(event, ToolCallStart):
            return self._start_call(event)
        return self._arguments(event)

    # --- items ---------------------------------------------------------------------

    def _add(self, kind: str, item: dict[str, Any], call: int | None = None) -> list[Event]:
        events = self._close("completed")
        index = len(self.response["output"])
        self.response["output"].append(item)
        self._open = _Open(kind, index, item, [], call)
        added = self._event("response.output_item.added", output_index=index, item=dict(item))
        events.append(added)
        return events

    def _text(self, kind: str, text: str) -> list[Event]:
        events: list[Event] = []
        if self._open is None or self._open.kind != kind:
            events = self._open_text(kind)
        assert self._open is not None
        self._open.parts.append(text)
        where = {"item_id": self._open.item["id"], "output_index": self._open.index}
        if kind == "reasoning":
            self._reasoning.append(text)
            events.append(
                self._event(
                    "response.reasoning_summary_text.delta", **where, summary_index=0, delta=text
                )
            )
        else:
            events.append(
                self._event(
                    "response.output_text.delta",
                    **where,
                    content_index=0,
                    delta=text,
                    logprobs=[],
                )
            )
        return events

    def _open_text(self, kind: str) -> list[Event]:
        item: dict[str, Any]
        part: dict[str, Any]
        if kind == "reasoning":
            item = {
                "id": new_id("rs_", 32),
                "type": "reasoning",
                "summary": [],
                "status": "in_progress",
            }
            events = self._add(kind, item)
            part = {"type": "summary_text", "text": ""}
            return [*events, self._part_event("response.reasoning_summary_part.added", part)]
        item = {
            "id": new_id("msg_", 32),
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        events = self._add(kind, item)
        part = {
            "type": "output_text",
            "text": "",
            "annotations": [],
            "logprobs": [],
        }
        return [*events, self._part_event("response.content_part.added", part)]

    def _part_event(self, kind: str, part: dict[str, Any]) -> Event:
        assert self._open is not None
        where = {"item_id": self._open.item["id"], "output_index": self._open.index}
        index_key = "summary_index" if self._open.kind == "reasoning" else "content_index"
        return self._event(kind, **where, **{index_key: 0}, part=dict(part))

    def _start_call(self, event: ToolCallStart) -> list[Event]:
        item: dict[str, Any] = {
            "id": new_id("fc_", 32),
            "type": "function_call",
            "status": "in_progress",
            "call_id": event.id,
            "name": event.name,
            "arguments": "",
        }
        if event.name in self._namespaces:
            item["namespace"], item["name"] = self._namespaces[event.name]
        return self._add("function_call", item, event.index)

    def _arguments(self, event: ToolCallArgumentsDelta) -> list[Event]:
        # Parsers emit a call's arguments right after its start, before the next call.
        open_ = self._open
        if open_ is None or open_.call != event.index or not event.fragment:
            return []
        open_.parts.append(event.fragment)
        return [
            self._event(
                "response.function_call_arguments.delta",
                item_id=open_.item["id"],
                output_index=open_.index,
                delta=event.fragment,
            )
        ]

    def _close(self, status: str) -> list[Event]:
        open_, self._open = self._open, None
        if open_ is None:
            return []
        item, text = open_.item, "".join(open_.parts)
        where = {"item_id": item["id"], "output_index": open_.index}
        item["status"] = status
        events: list[Event]
        part: dict[str, Any]
        if open_.kind == "reasoning":
            part = {"type": "summary_text", "text": text}
            item["summary"] = [part]
            events = [
                self._event(
                    "response.reasoning_summary_text.done", **where, summary_index=0, text=text
                ),
                self._event(
                    "response.reasoning_summary_part.done", **where, summary_index=0, part=part
                ),
            ]
        elif open_.kind == "message":
            part = {
                "type": "output_text",
                "text": text,
                "annotations": [],
                "logprobs": [],
            }
            item["content"] = [part]
            events = [
                self._event(
                    "response.output_text.done", **where, content_index=0, text=text, logprobs=[]
                ),
                self._event("response.content_part.done", **where, content_index=0, part=part),
            ]
        else:
            item["arguments"] = text or "{}"
            events = [
                self._event(
                    "response.function_call_arguments.done",
                    **where,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            ]
        done = self._event(
            "response.output_item.done", output_index=open_.index, item=copy.deepcopy(item)
        )
        return [*events, done]

    # --- the end ---------------------------------------------------------------------

    def finish(self, finished: Finished, index: int = 0) -> list[Event]:
        """Close the last item; response.completed (or .incomplete) with usage."""
        incomplete = finished.reason is FinishReason.LENGTH
        events = self._close("incomplete" if incomplete else "completed")
        usage = finished.usage
        self.response["usage"] = {
            "input_tokens": usage.prompt_tokens,
            "input_tokens_details": {
                "cached_tokens": usage.cached_tokens,
                "cache_write_tokens": usage.cache_write_tokens,
            },
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {
                "reasoning_tokens": min(
                    self._count_tokens("".join(self._reasoning)), usage.completion_tokens
                )
            },
            "total_tokens": usage.total_tokens,
        }
        if incomplete:
            self.response["status"] = "incomplete"
            self.response["incomplete_details"] = {"reason": "max_output_tokens"}
            return [*events, self._snapshot("response.incomplete")]
        self.response["status"] = "completed"
        self.response["completed_at"] = int(time.time())
        return [*events, self._snapshot("response.completed")]

    def fail(self, error: APIError) -> list[Event]:
        events = self._close("incomplete")
        self.response["status"] = "failed"
        self.response["error"] = {"code": error_code(error), "message": error.message}
        return [*events, self._snapshot("response.failed")]

    def frame(self, event: Event) -> bytes:
        # The SSE event name is always the payload's own type.
        return named_event(event["type"], event)

    def result(self) -> dict[str, Any]:
        return self.response

    def closed(self) -> None:
        if self._keep is not None:
            self._keep(self.response)

"""Checks for Responses API output: every event and body against the OpenAI spec,
and the stream protocol itself (numbering, item open/close order, SSE names)."""

from __future__ import annotations

import json
from typing import Any

from tests.support.spec import validate_openai

EVENT_SCHEMAS = {
    "response.created": "ResponseCreatedEvent",
    "response.in_progress": "ResponseInProgressEvent",
    "response.completed": "ResponseCompletedEvent",
    "response.incomplete": "ResponseIncompleteEvent",
    "response.failed": "ResponseFailedEvent",
    "response.output_item.added": "ResponseOutputItemAddedEvent",
    "response.output_item.done": "ResponseOutputItemDoneEvent",
    "response.content_part.added": "ResponseContentPartAddedEvent",
    "response.content_part.done": "ResponseContentPartDoneEvent",
    "response.output_text.delta": "ResponseTextDeltaEvent",
    "response.output_text.done": "ResponseTextDoneEvent",
    "response.function_call_arguments.delta": "ResponseFunctionCallArgumentsDeltaEvent",
    "response.function_call_arguments.done": "ResponseFunctionCallArgumentsDoneEvent",
    "response.reasoning_summary_part.added": "ResponseReasoningSummaryPartAddedEvent",
    "response.reasoning_summary_part.done": "ResponseReasoningSummaryPartDoneEvent",
    "response.reasoning_summary_text.delta": "ResponseReasoningSummaryTextDeltaEvent",
    "response.reasoning_summary_text.done": "ResponseReasoningSummaryTextDoneEvent",
}
FINAL = {"response.completed", "response.incomplete", "response.failed"}


def validate_response(body: dict[str, Any]) -> None:
    validate_openai("Response", body)


def validate_event(event: dict[str, Any]) -> None:
    validate_openai(EVENT_SCHEMAS[event["type"]], event)
    validate_openai("ResponseStreamEvent", event)


def parse_sse(text: str) -> list[dict[str, Any]]:
    """Events from an SSE body; each frame's `event:` name must equal its JSON type."""
    events = []
    for frame in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in frame.splitlines())
        event = json.loads(lines["data"])
        assert lines["event"] == event["type"], frame
        events.append(event)
    return events


def check_stream(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Validate the protocol; returns the final response object."""
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1]["type"] in FINAL
    assert all(e["type"] not in FINAL for e in events[:-1])
    open_items: dict[int, dict[str, Any]] = {}
    done_items: dict[int, dict[str, Any]] = {}
    for event in events:
        validate_event(event)
        kind = event["type"]
        if kind == "response.output_item.added":
            assert not open_items, "one output item at a time"
            assert event["output_index"] == len(done_items)
            open_items[event["output_index"]] = event["item"]
        elif kind == "response.output_item.done":
            item = open_items.pop(event["output_index"])
            assert item["id"] == event["item"]["id"]
            done_items[event["output_index"]] = event["item"]
        elif "item_id" in event:
            item = open_items[event["output_index"]]
            assert event["item_id"] == item["id"]
    assert not open_items
    response: dict[str, Any] = events[-1]["response"]
    validate_response(response)
    assert response["output"] == [done_items[i] for i in range(len(done_items))], (
        response["output"],
        done_items,
    )
    return response


def texts(events: list[dict[str, Any]], kind: str) -> str:
    """The joined `delta`s of one delta event type."""
    return "".join(e["delta"] for e in events if e["type"] == kind)

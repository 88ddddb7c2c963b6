"""Anthropic wire checks for tests: SSE parsing, the event protocol, the hosted spec.

Events and bodies are validated with jsonschema against Anthropic's published
OpenAPI document (tests/fixtures/specs/anthropic-hosted_spec.json, $refs resolved within
it). That document predates extended thinking and does not list `ping`, so those
two are checked against small schemas written here from the current API reference.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import jsonschema

from tests.support.spec import SPECS

SPEC = SPECS / "anthropic-hosted_spec.json"

PING = {
    "type": "object",
    "properties": {"type": {"const": "ping"}},
    "required": ["type"],
    "additionalProperties": False,
}
THINKING_BLOCK = {
    "type": "object",
    "properties": {
        "type": {"const": "thinking"},
        "thinking": {"type": "string"},
        "signature": {"type": "string"},
    },
    "required": ["type", "thinking", "signature"],
}
THINKING_DELTA = {
    "type": "object",
    "properties": {"type": {"const": "thinking_delta"}, "thinking": {"type": "string"}},
    "required": ["type", "thinking"],
}


@functools.cache
def _spec() -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(SPEC.read_text())
    schemas = _without_null_types(spec["components"]["schemas"])
    schemas["ThinkingBlock"] = THINKING_BLOCK
    schemas["ThinkingContentBlockDelta"] = THINKING_DELTA
    ref = {"$ref": "#/components/schemas/ThinkingBlock"}
    schemas["ContentBlockStartEvent"]["properties"]["content_block"]["oneOf"].append(ref)
    schemas["ContentBlock"]["oneOf"].append(ref)
    schemas["ContentBlockDeltaEvent"]["properties"]["delta"]["oneOf"].append(
        {"$ref": "#/components/schemas/ThinkingContentBlockDelta"}
    )
    return {"components": {"schemas": schemas}}


def _without_null_types(node: Any) -> Any:
    """A copy without `"type": null` (OpenAPI generator noise that JSON Schema rejects)."""
    if isinstance(node, dict):
        return {
            k: _without_null_types(v) for k, v in node.items() if not (k == "type" and v is None)
        }
    if isinstance(node, list):
        return [_without_null_types(v) for v in node]
    return node


def validate(instance: Any, schema_name: str) -> None:
    """Raise jsonschema.ValidationError unless instance matches components/schemas/<name>."""
    schema = {"$ref": f"#/components/schemas/{schema_name}", **_spec()}
    jsonschema.Draft202012Validator(schema).validate(instance)


def validate_event(event: dict[str, Any]) -> None:
    if event.get("type") == "ping":
        jsonschema.Draft202012Validator(PING).validate(event)
    else:
        validate(event, "MessageStreamEvent")


def parse_sse(text: str) -> list[tuple[str, dict[str, Any]]]:
    """`event:` / `data:` frames as (event name, parsed JSON)."""
    frames = []
    for raw in text.replace("\r\n", "\n").split("\n\n"):
        if not raw.strip():
            continue
        name, data = "", []
        for line in raw.split("\n"):
            if line.startswith("event:"):
                name = line[len("event:") :].strip()
            elif line.startswith("data:"):
                data.append(line[len("data:") :].strip())
        frames.append((name, json.loads("\n".join(data))))
    return frames


def check_stream(frames: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Assert the Messages stream protocol; return the payloads.

    Every frame matches the spec and is named by its own type; message_start comes
    first, message_delta then message_stop last; blocks are started, filled and
    stopped one at a time with indices 0, 1, 2...
    """
    events = [payload for _, payload in frames]
    for name, payload in frames:
        assert name == payload["type"], (name, payload)
        validate_event(payload)
    types = [e["type"] for e in events]
    assert types[0] == "message_start"
    assert types[-2:] == ["message_delta", "message_stop"]
    assert types.count("message_start") == types.count("message_delta") == 1
    next_index, open_index = 0, None
    for event in events[1:-2]:
        if event["type"] == "content_block_start":
            assert open_index is None and event["index"] == next_index
            open_index, next_index = event["index"], next_index + 1
        elif event["type"] in ("content_block_delta", "content_block_stop"):
            assert event["index"] == open_index, event
            if event["type"] == "content_block_stop":
                open_index = None
        else:
            assert event["type"] == "ping", event
    assert open_index is None and next_index >= 1
    return events


def prompt_tokens(usage: Any) -> int:
    """The whole prompt of an SDK `Usage`: Anthropic counts the cached part apart."""
    read = usage.cache_read_input_tokens or 0
    created = usage.cache_creation_input_tokens or 0
    return int(usage.input_tokens + read + created)

"""Ollama wire checks for tests: NDJSON framing, the published spec, the final counters.

Bodies and stream objects are validated with jsonschema against Ollama's own OpenAPI
document (tests/fixtures/specs/ollama-openapi.yaml); where it is silent (the legacy
/api/embeddings, the error body's required field, timestamps) the checks follow
Ollama's prose reference beside it (ollama-api.md) and what its clients parse.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import httpx
from pydantic import TypeAdapter

from tests.support.spec import validator

SPEC = "ollama-openapi.yaml"
NDJSON = "application/x-ndjson"
# The final object of every generation carries these (ollama-api.md, "Generate a
# completion": "The final response ... also includes additional data").
COUNTERS = ("prompt_eval_count", "eval_count")
DURATIONS = ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration")
_TIMESTAMP = TypeAdapter(datetime)  # what the ollama client parses created_at with


def validate_ollama(schema_name: str, instance: Any) -> None:
    """`instance` against components/schemas/<schema_name> of Ollama's spec."""
    validator(SPEC, schema_name).validate(instance)


def ndjson(response: httpx.Response) -> list[dict[str, Any]]:
    """A streamed body's objects: one JSON object per line, each line ended by a newline,
    no blank lines, no SSE framing."""
    content_type = response.headers.get("content-type", "")
    assert content_type.startswith(NDJSON), content_type
    text = response.text
    assert text.endswith("\n"), text[-200:]
    objects = []
    for line in text[:-1].split("\n"):
        assert line.strip(), f"a blank line in the stream: {text[:500]!r}"
        value = json.loads(line)
        assert isinstance(value, dict), line
        objects.append(value)
    return objects


def check_error(response: httpx.Response, status: int | None = None) -> str:
    """Ollama's error shape, {"error": "message"}; returns the message."""
    if status is not None:
        assert response.status_code == status, (response.status_code, response.text[:500])
    assert response.status_code >= 400, response.text[:500]
    assert response.headers.get("content-type", "").startswith("application/json"), response.headers
    body = response.json()
    validate_ollama("ErrorResponse", body)
    assert isinstance(body, dict) and isinstance(body.get("error"), str), body
    assert body["error"].strip(), body
    return str(body["error"])


def check_timestamp(value: Any) -> None:
    assert isinstance(value, str), value
    _TIMESTAMP.validate_python(value)


def check_final(final: dict[str, Any]) -> None:
    """The last object of a generation: done, a reason, counters and durations (ns)."""
    assert final["done"] is True, final
    assert isinstance(final.get("done_reason"), str) and final["done_reason"], final
    for name in (*COUNTERS, *DURATIONS):
        assert isinstance(final.get(name), int) and not isinstance(final[name], bool), (
            name,
            final,
        )
        assert final[name] >= 0, (name, final)
    assert final["eval_count"] >= 1 or final["done_reason"] != "length", final
    # The whole request's time holds each of its parts.
    for part in ("prompt_eval_duration", "eval_duration", "load_duration"):
        assert final["total_duration"] >= final[part], (part, final)


def check_chat_stream(objects: list[dict[str, Any]], model: str | None = None) -> None:
    """Every object of a streamed /api/chat: the spec's stream event, the assistant's
    role, `done` false until the one final object, which is also a whole ChatResponse."""
    assert objects, "an empty stream"
    for index, item in enumerate(objects):
        validate_ollama("ChatStreamEvent", item)
        check_timestamp(item["created_at"])
        assert item["message"]["role"] == "assistant", item
        assert item["done"] is (index == len(objects) - 1), (index, item)
        if model is not None:
            assert item["model"] == model, item
    validate_ollama("ChatResponse", objects[-1])
    check_final(objects[-1])


def check_generate_stream(objects: list[dict[str, Any]], model: str | None = None) -> None:
    assert objects, "an empty stream"
    for index, item in enumerate(objects):
        validate_ollama("GenerateStreamEvent", item)
        check_timestamp(item["created_at"])
        assert isinstance(item["response"], str), item
        assert item["done"] is (index == len(objects) - 1), (index, item)
        if model is not None:
            assert item["model"] == model, item
    validate_ollama("GenerateResponse", objects[-1])
    check_final(objects[-1])


def streamed_text(objects: list[dict[str, Any]], field: str = "content") -> str:
    """The concatenated `message.<field>` (chat) or `<field>` (generate) of a stream."""
    parts = []
    for item in objects:
        holder = item.get("message", item)
        parts.append(holder.get(field) or "")
    return "".join(parts)

"""Ollama wire <-> neutral records: names, options, formats, and the builder's objects."""

from __future__ import annotations

import json
from typing import Any

import pytest

from vllm_mlx.api.errors import APIError
from vllm_mlx.api.ollama import convert
from vllm_mlx.api.ollama.builder import OllamaBuilder, ndjson
from vllm_mlx.api.ollama.schema import ChatRequest, Options
from vllm_mlx.engine.types import Finished, FinishReason, Usage
from vllm_mlx.parsers.types import (
    ContentDelta,
    ParserEvent,
    ReasoningDelta,
    ToolCallArgumentsDelta,
    ToolCallStart,
)

EVENTS: list[ParserEvent] = [
    ReasoningDelta("Let me think."),
    ContentDelta("It is "),
    ContentDelta("sunny."),
    ToolCallStart(0, "call_1", "get_weather"),
    ToolCallArgumentsDelta(0, '{"city": '),
    ToolCallArgumentsDelta(0, '"Paris"}'),
    ToolCallStart(1, "call_2", "get_time"),
    ToolCallArgumentsDelta(1, '{"zone": "CET"'),  # cut short: arguments {}
]
DONE = Finished(FinishReason.TOOL_CALLS, Usage(12, 9))


@pytest.mark.parametrize(
    ("name", "expected"),
    [("default:latest", "default"), ("default", "default"), ("org/m:latest", "org/m"),
     ("default:7b", "default:7b")],
)  # fmt: skip
def test_latest_is_the_default_tag(name: str, expected: str) -> None:
    assert convert.model_id(name) == expected


def test_listed_names_carry_a_tag_once() -> None:
    assert convert.listed_name("default") == "default:latest"
    assert convert.listed_name("qwen:7b") == "qwen:7b"
    assert convert.listed_name("mlx-community/Qwen3-0.6B-4bit") == (
        "mlx-community/Qwen3-0.6B-4bit:latest"
    )


def test_format_json_and_schema_become_constraints() -> None:
    assert convert.output_constraint(None) is None
    json_mode = convert.output_constraint("json")
    assert json_mode is not None and json_mode.kind == "json_object"
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    constrained = convert.output_constraint(schema)
    assert constrained is not None
    assert (constrained.kind, constrained.value, constrained.param) == (
        "json_schema",
        schema,
        "format",
    )


def test_stop_is_a_string_or_a_list() -> None:
    assert convert.stop(None) == ()
    assert convert.stop(Options(stop="\n")) == ("\n",)
    assert convert.stop(Options(stop=["a", "b"])) == ("a", "b")


def test_tool_messages_and_calls_reach_the_template() -> None:
    body = ChatRequest.model_validate({
        "model": "m",
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "",
             "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
        ],
    })  # fmt: skip
    messages = convert.template_messages(body)
    assert messages[1]["tool_calls"] == [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    ]
    assert messages[2] == {"role": "tool", "content": "sunny", "name": "get_weather"}


def test_images_are_refused_naming_the_message() -> None:
    body = ChatRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}
    )
    with pytest.raises(APIError) as raised:
        convert.template_messages(body)
    assert raised.value.status == 400 and raised.value.param == "messages[0].images"


def _builder(streaming: bool, kind: Any = "chat") -> OllamaBuilder:
    return OllamaBuilder(kind, "default", streaming=streaming, started_ns=0, load_ns=5)


def test_streamed_and_whole_chat_agree() -> None:
    streamed = _builder(True)
    frames = [f for e in EVENTS for f in streamed.feed(e)] + streamed.finish(DONE)
    # Every frame is one JSON line; only the last is done.
    lines = [json.loads(ndjson(f)) for f in frames]
    assert [line["done"] for line in lines] == [False] * (len(lines) - 1) + [True]
    text = "".join(line["message"].get("content", "") for line in lines)
    thinking = "".join(line["message"].get("thinking", "") for line in lines)
    calls = [c for line in lines for c in line["message"].get("tool_calls", [])]
    whole = _builder(False)
    for event in EVENTS:
        assert whole.feed(event) == []
    assert whole.finish(DONE) == []
    message = whole.result()["message"]
    assert (
        (text, thinking)
        == (message["content"], message["thinking"])
        == (
            "It is sunny.",
            "Let me think.",
        )
    )
    assert (
        calls
        == message["tool_calls"]
        == [
            {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"function": {"name": "get_time", "arguments": {}}},
        ]
    )


def test_the_last_object_has_the_counters() -> None:
    final = _builder(False, "generate")
    final.feed(ContentDelta("hi"))
    final.finish(Finished(FinishReason.LENGTH, Usage(7, 3)))
    body = final.result()
    assert body["response"] == "hi" and body["done"] is True and body["done_reason"] == "length"
    assert (body["prompt_eval_count"], body["eval_count"], body["load_duration"]) == (7, 3, 5)
    for key in ("total_duration", "prompt_eval_duration", "eval_duration"):
        assert isinstance(body[key], int) and body[key] >= 0


def test_a_failure_is_an_error_object() -> None:
    failed = _builder(True).fail(APIError(500, "generation failed: boom", "server_error"))
    assert failed == [{"error": "generation failed: boom"}]

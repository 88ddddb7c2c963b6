"""Tool use and thinking over /v1/messages: a full round trip with the anthropic SDK.

The bundled SmolLM2 cannot be relied on to call tools, so these tests use the
test-only `replay:` model source: the real model runs every step but its logits are
forced to a fixed reply, which then goes through the real tokenizer, engine,
detokenizer, parsers (hermes tool calls, qwen3 reasoning) and this adapter.

- model `replay` (tests/fixtures/replay/hermes_call.json) always answers with
  <think>...</think>, "Let me check.", then calls get_weather and get_time;
- model `replay-answer` (tests/fixtures/replay/anthropic_answer.json) always answers
  with a plain sentence, and serves as the second turn of the round trip, after the
  client sends the tool results back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from tests.conftest import DaemonProcess, running
from tests.support.anthropic import check_stream, parse_sse, prompt_tokens, validate
from tests.support.replay import (
    CALLS,
    FIXTURES,
    PARSERS,
    QUESTION,
    THOUGHT,
    TOOL_ARGS,
    tool_schema,
)

HEADERS = {"anthropic-version": "2023-06-01"}
TOOLS: list[Any] = [
    {
        "name": name,
        "description": f"{name} tool",
        "input_schema": tool_schema(arg),
    }
    for name, arg in TOOL_ARGS
]
ASK = {"role": "user", "content": QUESTION}


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path
) -> Iterator[DaemonProcess]:
    models = [
        {"name": "replay", "source": f"replay:{FIXTURES / 'hermes_call.json'}", **PARSERS},
        {"name": "replay-answer", "source": f"replay:{FIXTURES / 'anthropic_answer.json'}"},
    ]
    with running(
        tmp_path_factory.mktemp("anthropic-tools"), model_cache_dir, {"models": models}
    ) as process:
        yield process


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=daemon.base_url, api_key="unused", max_retries=0)


def request(**extra: Any) -> dict[str, Any]:
    return {"model": "replay", "messages": [ASK], "max_tokens": 120, "tools": TOOLS, **extra}


@pytest.fixture(scope="module")
def first_turn(client: anthropic.Anthropic) -> dict[str, Any]:
    """The raw JSON of the model's tool-calling reply (one request for several tests)."""
    raw = client.messages.with_raw_response.create(**request())
    body: dict[str, Any] = raw.http_response.json()
    return body


def test_reply_has_thinking_text_and_tool_use_blocks(first_turn: dict[str, Any]) -> None:
    validate(first_turn, "Message")
    content = first_turn["content"]
    assert [block["type"] for block in content] == ["thinking", "text", "tool_use", "tool_use"]
    assert content[0]["thinking"] == THOUGHT
    assert content[1]["text"] == "Let me check."
    assert [(block["name"], block["input"]) for block in content[2:]] == CALLS
    assert len({block["id"] for block in content[2:]}) == 2
    assert first_turn["stop_reason"] == "tool_use" and first_turn["stop_sequence"] is None


def test_stream_has_the_same_blocks_as_deltas(daemon: DaemonProcess) -> None:
    response = httpx.post(
        f"{daemon.base_url}/v1/messages",
        json=request(stream=True),
        headers=HEADERS,
        timeout=120,
    )
    events = check_stream(parse_sse(response.text))
    starts = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    assert [block["type"] for block in starts] == ["thinking", "text", "tool_use", "tool_use"]
    assert [block["input"] for block in starts[2:]] == [{}, {}]  # input comes as deltas
    by_index: dict[int, list[str]] = {}
    for event in events:
        if event["type"] == "content_block_delta":
            delta = event["delta"]
            piece = delta.get("thinking", delta.get("text", delta.get("partial_json")))
            by_index.setdefault(event["index"], []).append(piece)
    assert "".join(by_index[0]) == THOUGHT
    assert [json.loads("".join(by_index[i])) for i in (2, 3)] == [c[1] for c in CALLS]
    assert {e["delta"]["type"] for e in events if e["type"] == "content_block_delta"} == {
        "thinking_delta",
        "text_delta",
        "input_json_delta",
    }
    assert events[-2]["delta"]["stop_reason"] == "tool_use"


def test_sdk_stream_accumulates_tool_use(client: anthropic.Anthropic) -> None:
    with client.messages.stream(**request()) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    uses = [block for block in final.content if block.type == "tool_use"]
    assert [(block.name, block.input) for block in uses] == CALLS
    assert final.content[0].type == "thinking" and final.content[0].thinking == THOUGHT


def test_full_round_trip(client: anthropic.Anthropic, first_turn: dict[str, Any]) -> None:
    """The reply goes back verbatim, with a tool_result for each tool_use."""
    results = [
        {"type": "tool_result", "tool_use_id": block["id"], "content": text}
        for block, text in zip(first_turn["content"][2:], ["Sunny, 21 C", "14:05"], strict=True)
    ]
    messages = [
        ASK,
        {"role": "assistant", "content": first_turn["content"]},
        {"role": "user", "content": results},
    ]
    counted = client.messages.count_tokens(model="replay-answer", messages=messages, tools=TOOLS)
    answer = client.messages.create(
        model="replay-answer", messages=messages, tools=TOOLS, max_tokens=40
    )
    assert prompt_tokens(answer.usage) == counted.input_tokens
    assert answer.stop_reason == "end_turn"
    assert answer.content[0].text == "It is sunny and 21 degrees in Paris right now."
    # Without the results, the prompt is shorter: the tool results were rendered.
    without = client.messages.count_tokens(
        model="replay-answer", messages=messages[:1], tools=TOOLS
    )
    assert counted.input_tokens > without.input_tokens


def test_tool_choice_none_parses_no_calls(client: anthropic.Anthropic) -> None:
    message = client.messages.create(**request(tool_choice={"type": "none"}))
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert "<tool_call>" in message.content[1].text
    assert message.stop_reason == "end_turn"


def test_forced_tool_and_no_parallel_calls(client: anthropic.Anthropic) -> None:
    # Only get_weather is offered, so the get_time call is not a call: it stays text.
    named = client.messages.create(**request(tool_choice={"type": "tool", "name": "get_weather"}))
    uses = [block for block in named.content if block.type == "tool_use"]
    assert [block.name for block in uses] == ["get_weather"]
    assert named.stop_reason == "tool_use"
    single = client.messages.create(
        **request(tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    )
    assert [block.name for block in single.content if block.type == "tool_use"] == ["get_weather"]

"""Tool calls and reasoning through the real daemon, with the openai SDK.

The bundled SmolLM2 cannot be relied on to emit a tool-call format, so most tests use
the test-only `replay:` model source: the real bundled model runs every step, but its
logits are forced to a fixed Hermes/Qwen-style reply (reasoning, text, two tool calls),
which then goes through the real tokenizer, engine, detokenizer, parsers and API.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.conftest import DaemonProcess, running
from tests.support.replay import (
    CALLS,
    HERMES_CALL,
    PARSERS,
    QUESTION,
    THOUGHT,
    TOOL_ARGS,
    tool_schema,
)
from tests.support.spec import validate_openai

REPLAY = HERMES_CALL
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} tool",
            "parameters": tool_schema(arg),
        },
    }
    for name, arg in TOOL_ARGS
]
ASK = [{"role": "user", "content": QUESTION}]
REPLAY_MODEL = {"source": f"replay:{REPLAY}", **PARSERS}


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path
) -> Iterator[DaemonProcess]:
    models = [
        {"name": "replay", **REPLAY_MODEL},
        {"name": "replay-plain", "source": f"replay:{REPLAY}"},
        {
            "name": "smol",
            "source": "builtin:smollm2-135m-instruct",
            "enable_auto_tool_choice": True,
            "tool_call_parser": "hermes",
        },
    ]
    with running(tmp_path_factory.mktemp("tools"), model_cache_dir, {"models": models}) as process:
        yield process


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="x", max_retries=0)


def create(client: openai.OpenAI, **kwargs: Any) -> Any:
    args = {"model": "replay", "messages": ASK, "max_tokens": 120, "tools": TOOLS, **kwargs}
    return client.chat.completions.create(**args)


def test_calls_reasoning_and_content_non_streaming(client: openai.OpenAI) -> None:
    response = create(client)
    validate_openai("CreateChatCompletionResponse", response.model_dump(exclude_unset=True))
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    message = choice.message
    assert message.content == "Let me check."
    extra = message.model_extra or {}
    assert extra["reasoning"] == THOUGHT
    assert extra["reasoning_content"] == extra["reasoning"]
    calls = message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == CALLS
    assert all(c.id.startswith("call_") and c.type == "function" for c in calls)


def test_streamed_result_equals_non_streamed(client: openai.OpenAI) -> None:
    stream = create(client, stream=True)
    kinds: list[str] = []
    reasoning, content = "", ""
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in stream:
        validate_openai("CreateChatCompletionStreamResponse", chunk.model_dump(exclude_unset=True))
        delta = chunk.choices[0].delta
        extra = delta.model_extra or {}
        if extra.get("reasoning"):
            kinds.append("reasoning")
            reasoning += extra["reasoning"]
        if delta.content:
            kinds.append("content")
            content += delta.content
        for call in delta.tool_calls or []:
            kinds.append("tool")
            slot = calls.setdefault(call.index, {"name": "", "arguments": ""})
            if call.function and call.function.name:
                slot["name"] = call.function.name
                assert call.id and call.type == "function"  # name and id come first
            slot["arguments"] += (call.function.arguments if call.function else "") or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert kinds.index("content") > max(i for i, k in enumerate(kinds) if k == "reasoning")
    assert reasoning == THOUGHT
    assert content == "Let me check."
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == CALLS


def test_tool_choice_none_offers_no_tools_and_parses_no_calls(client: openai.OpenAI) -> None:
    response = create(client, tool_choice="none")
    choice = response.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert "<tool_call>" in (choice.message.content or "")


def test_named_tool_choice_offers_only_that_tool(client: openai.OpenAI) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    response = create(client, tool_choice=named)
    calls = response.choices[0].message.tool_calls or []
    # get_time is not offered, so its call is not a call: it stays in the content.
    assert [c.function.name for c in calls] == ["get_weather"]
    assert "get_time" in (response.choices[0].message.content or "")


def test_parallel_tool_calls_false_keeps_the_first(client: openai.OpenAI) -> None:
    response = create(client, parallel_tool_calls=False)
    calls = response.choices[0].message.tool_calls or []
    assert [c.function.name for c in calls] == ["get_weather"]


def test_without_auto_tool_choice_calls_stay_content(client: openai.OpenAI) -> None:
    response = create(client, model="replay-plain")
    choice = response.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert '"name": "get_weather"' in (choice.message.content or "")


def test_tool_history_is_rendered_through_the_template(client: openai.OpenAI) -> None:
    history: list[Any] = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees and sunny"},
    ]
    short = create(client, model="smol", messages=ASK, max_tokens=1)
    longer = create(client, model="smol", messages=history, max_tokens=1)
    assert longer.usage.prompt_tokens > short.usage.prompt_tokens + 5


def test_real_model_with_tools_is_protocol_valid(client: openai.OpenAI) -> None:
    response = create(client, model="smol", max_tokens=24, temperature=0)
    validate_openai("CreateChatCompletionResponse", response.model_dump(exclude_unset=True))
    choice = response.choices[0]
    assert (choice.finish_reason == "tool_calls") == bool(choice.message.tool_calls)

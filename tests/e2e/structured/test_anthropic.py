"""Forced tool use and JSON output over /v1/messages, with the anthropic SDK.

The bundled SmolLM2 at the configured temperature (0.7, sampled): the tool_use blocks
and the JSON text are valid because the grammar masks every token.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest

from tests.conftest import DaemonProcess
from tests.e2e.structured.conftest import TOOL_SCHEMAS, TOOLS
from tests.support.anthropic import validate
from tests.support.schemas import SCHEMAS

A_TOOLS: list[Any] = [
    {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS
]
ASK: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=daemon.base_url, api_key="unused", max_retries=0)


def _check_tool_use(message: Any, names: set[str]) -> list[Any]:
    assert message.stop_reason == "tool_use"
    blocks = [b for b in message.content if b.type == "tool_use"]
    assert blocks and len(blocks) == len(message.content)
    for block in blocks:
        assert block.name in names
        jsonschema.validate(block.input, TOOL_SCHEMAS[block.name])
    return blocks


def test_tool_choice_any_always_uses_a_tool(client: anthropic.Anthropic) -> None:
    raw = client.messages.with_raw_response.create(
        model="smol", max_tokens=96, messages=ASK, tools=A_TOOLS, tool_choice={"type": "any"}
    )
    _check_tool_use(raw.parse(), set(TOOL_SCHEMAS))
    validate(json.loads(raw.text()), "Message")


def test_tool_choice_any_streamed_without_parallel_calls(client: anthropic.Anthropic) -> None:
    with client.messages.stream(
        model="smol",
        max_tokens=96,
        messages=ASK,
        tools=A_TOOLS,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    ) as stream:
        deltas = sum(1 for e in stream if e.type == "content_block_delta")
        message = stream.get_final_message()
    assert len(_check_tool_use(message, set(TOOL_SCHEMAS))) == 1
    assert deltas > 1  # the input JSON streams in pieces


def test_named_tool_choice_uses_that_tool(client: anthropic.Anthropic) -> None:
    message = client.messages.create(
        model="smol",
        max_tokens=48,
        messages=ASK,
        tools=A_TOOLS,
        tool_choice={"type": "tool", "name": "get_time"},
    )
    (block,) = _check_tool_use(message, {"get_time"})
    assert block.name == "get_time"


def test_output_config_format_constrains_the_text(
    client: anthropic.Anthropic, daemon: DaemonProcess
) -> None:
    schema = SCHEMAS["nested_objects"]
    message = client.messages.create(
        model="smol",
        max_tokens=64,
        messages=[{"role": "user", "content": "A user."}],
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )
    assert message.stop_reason == "end_turn"
    jsonschema.validate(json.loads(message.content[0].text), schema)  # type: ignore[union-attr]
    # The older beta field, as raw JSON.
    body = {
        "model": "smol",
        "max_tokens": 32,
        "messages": [{"role": "user", "content": "Pick."}],
        "output_format": {"type": "json_schema", "schema": SCHEMAS["object_with_enum"]},
    }
    reply = httpx.post(f"{daemon.base_url}/v1/messages", json=body, timeout=60).json()
    jsonschema.validate(json.loads(reply["content"][0]["text"]), SCHEMAS["object_with_enum"])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"output_config": {"format": {"type": "json_schema", "schema": {"type": "strin"}}}},
            "at #/type: Invalid type: strin",
        ),
        (
            {
                "output_config": {"format": {"type": "json_schema", "schema": {}}},
                "output_format": {"type": "json_schema", "schema": {}},
            },
            "give the output format once",
        ),
        (
            {
                "tools": [{"name": "t", "input_schema": {"$ref": "#/$defs/none"}}],
                "tool_choice": {"type": "any"},
            },
            "tools[0].input_schema: invalid JSON schema at #/$ref",
        ),
    ],
)
def test_bad_schemas_get_an_anthropic_400(
    daemon: DaemonProcess, extra: dict[str, Any], message: str
) -> None:
    body = {"model": "smol", "max_tokens": 8, "messages": ASK, **extra}
    response = httpx.post(f"{daemon.base_url}/v1/messages", json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert message in error["error"]["message"]

"""count_tokens, tools, model listings, errors and disconnects on the Anthropic surface.

These run on the bundled SmolLM2-135M, whose chat template renders no tool
definitions and which cannot be relied on to emit a call: the tool tests here drive
the request side (a client-written tool_use turn, then its tool_result, rendered
through the template and charged exactly as counted). The response side (tool_use
and thinking blocks, input_json_delta, stop_reason tool_use) runs end to end on the
test-only replay: source in test_anthropic_tools.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import pytest

from tests.conftest import DaemonProcess
from tests.support.anthropic import check_stream, parse_sse, prompt_tokens, validate

MODEL = "default"
HEADERS = {"anthropic-version": "2023-06-01"}
# This SDK no longer has a temperature argument; the daemon still reads it from the body.
GREEDY = {"temperature": 0}
WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
ASK = {"role": "user", "content": "What is the weather in Paris?"}
CALL = {
    "role": "assistant",
    "content": [
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}},
    ],
}


def result(text: str, tool_use_id: str = "toolu_01") -> dict[str, Any]:
    block = {"type": "tool_result", "tool_use_id": tool_use_id, "content": text}
    return {"role": "user", "content": [block]}


ROUND_TRIP = [ASK, CALL, result("Sunny, 21 degrees.")]


@pytest.fixture(scope="module")
def client(shared_daemon: DaemonProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=shared_daemon.base_url, api_key="unused", max_retries=0)


CASES: dict[str, dict[str, Any]] = {
    "plain": {"messages": [ASK]},
    "system": {"messages": [ASK], "system": "Answer briefly."},
    "system-and-tools": {"messages": [ASK], "system": "Answer briefly.", "tools": [WEATHER]},
    "tool-choice-any": {"messages": [ASK], "tools": [WEATHER], "tool_choice": {"type": "any"}},
    "tool-round-trip": {"messages": ROUND_TRIP, "tools": [WEATHER]},
}


@pytest.mark.parametrize("case", list(CASES))
def test_count_tokens_equals_input_tokens(client: anthropic.Anthropic, case: str) -> None:
    request = CASES[case]
    counted = client.messages.count_tokens(model=MODEL, **request)
    message = client.messages.create(model=MODEL, max_tokens=1, **request)
    assert counted.input_tokens == prompt_tokens(message.usage) > 0


def test_tool_round_trip_renders_the_tool_result(client: anthropic.Anthropic) -> None:
    short = client.messages.count_tokens(model=MODEL, messages=ROUND_TRIP, tools=[WEATHER])
    longer = [ASK, CALL, result("Sunny, 21 degrees, light wind from the west, no rain today.")]
    long = client.messages.count_tokens(model=MODEL, messages=longer, tools=[WEATHER])
    assert long.input_tokens > short.input_tokens
    message = client.messages.create(
        model=MODEL,
        messages=ROUND_TRIP,
        tools=[WEATHER],
        max_tokens=8,
        extra_body=GREEDY,
    )
    assert message.content and message.stop_reason in ("end_turn", "max_tokens")


def test_forced_tool_choice_is_an_instruction(client: anthropic.Anthropic) -> None:
    """No constrained decoding: a forced tool is the only one offered, plus an instruction.

    When the model still answers in text, that is a valid end_turn / max_tokens message.
    """
    system = "You are a helpful assistant."
    auto = client.messages.count_tokens(
        model=MODEL,
        messages=[ASK],
        system=system,
        tools=[WEATHER],
    )
    forced_tool = {"type": "tool", "name": "get_weather"}
    forced = client.messages.count_tokens(
        model=MODEL,
        messages=[ASK],
        system=system,
        tools=[WEATHER],
        tool_choice=forced_tool,
    )
    assert forced.input_tokens > auto.input_tokens  # the instruction follows the system prompt
    message = client.messages.create(
        model=MODEL,
        messages=[ASK],
        system=system,
        tools=[WEATHER],
        tool_choice=forced_tool,
        max_tokens=6,
        extra_body=GREEDY,
    )
    assert prompt_tokens(message.usage) == forced.input_tokens
    assert message.stop_reason in ("end_turn", "max_tokens", "tool_use")
    with pytest.raises(anthropic.BadRequestError, match="not in 'tools'"):
        client.messages.count_tokens(
            model=MODEL,
            messages=[ASK],
            tools=[WEATHER],
            tool_choice={"type": "tool", "name": "get_time"},
        )


# --- errors ----------------------------------------------------------------------------


def _post(daemon: DaemonProcess, path: str, body: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(
        f"{daemon.base_url}{path}",
        content=content,
        headers={**HEADERS, "content-type": "application/json"},
        timeout=60,
    )


BAD_REQUESTS: dict[str, tuple[dict[str, Any] | bytes, str]] = {
    "missing-max-tokens": ({"model": MODEL, "messages": [ASK]}, "max_tokens"),
    "empty-messages": ({"model": MODEL, "messages": [], "max_tokens": 4}, "messages"),
    "tool-result-without-tool-use": (
        {"model": MODEL, "messages": [ASK, CALL, result("x", "toolu_99")], "max_tokens": 4},
        "toolu_99",
    ),
    "image": (
        {
            "model": MODEL,
            "max_tokens": 4,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
                        },
                        {"type": "text", "text": "What is this?"},
                    ],
                }
            ],
        },
        "model does not accept images",
    ),
    "not-json": (b"{not json", "not valid JSON"),
    "unknown-block": (
        {
            "model": MODEL,
            "max_tokens": 4,
            "messages": [{"role": "user", "content": [{"type": "x"}]}],
        },
        "messages[0].content[0]",
    ),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_requests_are_400_in_anthropic_shape(shared_daemon: DaemonProcess, case: str) -> None:
    body, needle = BAD_REQUESTS[case]
    response = _post(shared_daemon, "/v1/messages", body)
    assert response.status_code == 400, response.text
    payload = response.json()
    validate(payload, "ErrorResponse")
    assert payload["error"]["type"] == "invalid_request_error"
    assert needle in payload["error"]["message"]


def test_wrong_method_and_path_are_errors_in_anthropic_shape(shared_daemon: DaemonProcess) -> None:
    wrong_method = httpx.get(f"{shared_daemon.base_url}/v1/messages", timeout=30)
    assert wrong_method.status_code == 405
    validate(wrong_method.json(), "ErrorResponse")
    unknown = httpx.post(f"{shared_daemon.base_url}/v1/messages/batches", json={}, timeout=30)
    assert unknown.status_code == 404
    assert unknown.json()["error"]["type"] == "not_found_error"


def test_count_tokens_validates_like_messages(shared_daemon: DaemonProcess) -> None:
    response = _post(shared_daemon, "/v1/messages/count_tokens", {"model": MODEL, "messages": []})
    assert response.status_code == 400
    assert "messages" in response.json()["error"]["message"]


def test_sdk_raises_typed_errors(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as not_found:
        client.messages.create(model="no-such-model", messages=[ASK], max_tokens=4)
    assert not_found.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError, match="does not accept images"):
        client.messages.count_tokens(
            model=MODEL,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
                        }
                    ],
                }
            ],
        )


# --- Claude Code ---------------------------------------------------------------------

# The shape of a request Claude Code sends (its texts shortened): `?beta=true`, an
# anthropic-beta header, a bearer token, cache_control on blocks, a role "system"
# message between turns, adaptive thinking and fields this server does not use.
CLAUDE_CODE_REQUEST: dict[str, Any] = {
    "model": MODEL,
    "max_tokens": 32000,
    "system": [
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Answer briefly."},
    ],
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "<system-reminder>Today is 2026-11-29.</system-reminder>"},
                {"type": "text", "text": "Say hi", "cache_control": {"type": "ephemeral"}},
            ],
        },
        {"role": "system", "content": "Available agent types: claude, Explore."},
    ],
    "tools": [
        {
            "name": "Bash",
            "description": "Executes a bash command.",
            "input_schema": {
                "$schema": "http://json-schema.org/draft-07/schema#",
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
                "additionalProperties": False,
            },
        }
    ],
    "metadata": {"user_id": '{"device_id":"0","session_id":"1"}'},
    "thinking": {"type": "adaptive"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "output_config": {"effort": "high"},
}
CLAUDE_CODE_HEADERS = {
    **HEADERS,
    "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
    "authorization": "Bearer unused",
}


def test_a_claude_code_shaped_request(shared_daemon: DaemonProcess) -> None:
    url = f"{shared_daemon.base_url}/v1/messages"
    count_body = {k: v for k, v in CLAUDE_CODE_REQUEST.items() if k != "max_tokens"}
    counted = httpx.post(
        f"{url}/count_tokens?beta=true", json=count_body, headers=CLAUDE_CODE_HEADERS, timeout=60
    )
    assert counted.status_code == 200, counted.text
    body = {**CLAUDE_CODE_REQUEST, "max_tokens": 8, "stream": True}
    response = httpx.post(f"{url}?beta=true", json=body, headers=CLAUDE_CODE_HEADERS, timeout=120)
    assert response.status_code == 200, response.text
    events = check_stream(parse_sse(response.text))
    assert events[0]["message"]["usage"]["input_tokens"] == counted.json()["input_tokens"]


# --- models ----------------------------------------------------------------------------


def test_models_in_anthropic_shape(client: anthropic.Anthropic) -> None:
    models = client.models.list()
    ids = [model.id for model in models.data]
    assert "default" in ids and "smollm2-135m-instruct" in ids
    assert all(model.type == "model" and model.display_name for model in models.data)
    assert models.first_id == ids[0] and models.last_id == ids[-1] and models.has_more is False
    one = client.models.retrieve("default")
    assert one.id == "default" and one.created_at.tzinfo is not None
    with pytest.raises(anthropic.NotFoundError):
        client.models.retrieve("no-such-model")


def test_models_in_openai_shape_without_the_header(shared_daemon: DaemonProcess) -> None:
    listing = httpx.get(f"{shared_daemon.base_url}/v1/models", timeout=30).json()
    assert listing["object"] == "list" and "has_more" not in listing
    assert {"default", "smollm2-135m-instruct"} <= {m["id"] for m in listing["data"]}
    assert all(m["object"] == "model" for m in listing["data"])
    raw = httpx.get(f"{shared_daemon.base_url}/v1/models", headers=HEADERS, timeout=30).json()
    assert raw["data"][0]["created_at"].endswith("Z")


# --- disconnect ------------------------------------------------------------------------


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll until condition() is truthy (a readiness condition, not a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def live_requests(daemon: DaemonProcess) -> set[str]:
    status = httpx.get(f"{daemon.base_url}/v1/status", timeout=30).json()
    return {r["request_id"] for model in status["models"] for r in model["requests"]}


def request_log_line(daemon: DaemonProcess, request_id: str) -> dict[str, Any] | None:
    for line in daemon.log_text().splitlines():
        if request_id in line and line.startswith("{"):
            record = json.loads(line)
            if record.get("event") == "request" and record.get("request_id") == request_id:
                return dict(record)
    return None


def test_disconnect_mid_stream_frees_the_slot(shared_daemon: DaemonProcess) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
        "max_tokens": 400,
        "stream": True,
    }
    message_id = ""
    with (
        httpx.Client(timeout=120) as http,
        http.stream(
            "POST", f"{shared_daemon.base_url}/v1/messages", json=body, headers=HEADERS
        ) as response,
    ):
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            event = json.loads(line[len("data:") :])
            if event["type"] == "message_start":
                message_id = event["message"]["id"]
            if event["type"] == "content_block_delta":
                # Generating now, with the connection still open: the request is live.
                # (Asked before leaving: once the stream is closed it may end any time.)
                assert message_id in live_requests(shared_daemon)
                break  # leave mid-stream
    # Leaving the block closed the connection before the 400 tokens were done.
    wait_for(lambda: message_id not in live_requests(shared_daemon), 120, "the slot to be freed")
    record = wait_for(
        lambda: request_log_line(shared_daemon, message_id), 60, "the request log line"
    )
    assert record["status"] == 499 and record["route"] == "/v1/messages"
    assert record["completion_tokens"] < 400 and record["finish_reason"] is None

"""/v1/messages and count_tokens: the daemon as a subprocess, driven with the anthropic SDK.

The bundled SmolLM2-135M answers greedily (temperature 0), so its short answers
are stable; every request keeps max_tokens small because it runs on a shared CPU.
"""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import pytest

from tests.conftest import DaemonProcess
from tests.support.anthropic import check_stream, parse_sse, prompt_tokens, validate

MODEL = "default"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
HEADERS = {"anthropic-version": "2023-06-01"}
# This SDK no longer has a temperature argument; the daemon still reads it from the body.
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def client(shared_daemon: DaemonProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=shared_daemon.base_url, api_key="unused", max_retries=0)


def test_create_answers_with_a_text_message(client: anthropic.Anthropic) -> None:
    raw = client.messages.with_raw_response.create(
        model=MODEL,
        messages=FRANCE,
        max_tokens=12,
        extra_body=GREEDY,
    )
    validate(raw.http_response.json(), "Message")
    message = raw.parse()
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_") and message.model == MODEL
    assert [block.type for block in message.content] == ["text"]
    assert "Paris" in message.content[0].text
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert prompt_tokens(message.usage) > 0 and 0 < message.usage.output_tokens <= 12


def test_stream_text_and_final_message(client: anthropic.Anthropic) -> None:
    with client.messages.stream(
        model=MODEL,
        messages=FRANCE,
        max_tokens=12,
        extra_body=GREEDY,
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert "Paris" in text
    assert final.content[0].text == text
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens > 0 and prompt_tokens(final.usage) > 0


def _raw_stream(daemon: DaemonProcess, body: dict[str, Any]) -> list[dict[str, Any]]:
    response = httpx.post(
        f"{daemon.base_url}/v1/messages",
        json={**body, "stream": True},
        headers=HEADERS,
        timeout=120,
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return check_stream(parse_sse(response.text))


def test_stream_events_follow_the_protocol_and_the_spec(shared_daemon: DaemonProcess) -> None:
    events = _raw_stream(
        shared_daemon, {"model": MODEL, "messages": FRANCE, "max_tokens": 12, "temperature": 0}
    )
    assert [e["type"] for e in events[:2]] == ["message_start", "ping"]
    start = events[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["output_tokens"] == 0
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert "Paris" in text
    delta = events[-2]
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert 0 < delta["usage"]["output_tokens"] <= 12


def test_stop_sequence_in_a_stream(shared_daemon: DaemonProcess) -> None:
    events = _raw_stream(
        shared_daemon,
        {
            "model": MODEL,
            "messages": FRANCE,
            "max_tokens": 12,
            "temperature": 0,
            "stop_sequences": ["Paris"],
        },
    )
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert "capital" in text and "Paris" not in text
    assert events[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "Paris"}


def test_stop_sequence(client: anthropic.Anthropic) -> None:
    message = client.messages.create(
        model=MODEL,
        messages=FRANCE,
        max_tokens=12,
        extra_body=GREEDY,
        stop_sequences=["never-said", "Paris"],
    )
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == "Paris"
    assert "Paris" not in message.content[0].text


def test_max_tokens_stop(client: anthropic.Anthropic) -> None:
    message = client.messages.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Write a long story about a dragon."}],
        max_tokens=3,
        extra_body=GREEDY,
    )
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 3


def test_system_as_string_and_as_blocks(client: anthropic.Anthropic) -> None:
    system = "You are a helpful assistant."
    as_string = client.messages.count_tokens(model=MODEL, messages=FRANCE, system=system)
    as_blocks = client.messages.count_tokens(
        model=MODEL,
        messages=FRANCE,
        system=[{"type": "text", "text": system}],
    )
    without = client.messages.count_tokens(model=MODEL, messages=FRANCE)
    assert as_string.input_tokens == as_blocks.input_tokens != without.input_tokens
    message = client.messages.create(
        model=MODEL,
        messages=FRANCE,
        system=[{"type": "text", "text": system}],
        max_tokens=12,
        extra_body=GREEDY,
    )
    assert prompt_tokens(message.usage) == as_blocks.input_tokens
    assert "Paris" in message.content[0].text


def test_multi_turn_conversation(client: anthropic.Anthropic) -> None:
    messages: list[anthropic.types.MessageParam] = [
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "Nice to meet you, Ada!"},
        {"role": "user", "content": "What is my name?"},
    ]
    message = client.messages.create(
        model=MODEL, messages=messages, max_tokens=12, extra_body=GREEDY
    )
    assert "Ada" in message.content[0].text
    first_turn = client.messages.count_tokens(model=MODEL, messages=messages[:1])
    assert prompt_tokens(message.usage) > first_turn.input_tokens


def test_prefilled_assistant_turn_is_continued(client: anthropic.Anthropic) -> None:
    message = client.messages.create(
        model=MODEL,
        messages=[*FRANCE, {"role": "assistant", "content": "The capital of France is"}],
        max_tokens=4,
        extra_body=GREEDY,
    )
    text = message.content[0].text
    # The reply starts where the prefill stops: it does not repeat it, and its leading
    # space survives, so prefill + reply reads as one sentence.
    assert text.startswith(" Paris") and "capital" not in text

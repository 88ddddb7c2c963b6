"""Sampling values are checked against the model at the boundary; none can crash the
daemon, poison later requests or come back as an empty success."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.conftest import DaemonProcess

CHAT = {
    "model": "default",
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
    "max_tokens": 8,
}


def _post(daemon: DaemonProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{daemon.base_url}{path}", json=body, timeout=120)


def _still_serves(daemon: DaemonProcess) -> None:
    reply = _post(daemon, "/v1/chat/completions", {**CHAT, "temperature": 0.8})
    assert reply.status_code == 200
    assert reply.json()["choices"][0]["message"]["content"].strip()


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"logit_bias": {"49152": 100}}, "logit_bias"),  # once a native crash (double free)
        ({"logit_bias": {"99999999999999999999": 1}}, "logit_bias"),
        ({"seed": 2**64, "temperature": 1.0}, "seed"),
        ({"seed": -(2**63) - 1, "temperature": 1.0}, "seed"),
    ],
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_values_the_model_cannot_take_are_400s_naming_the_field(
    shared_daemon: DaemonProcess, extra: dict[str, Any], param: str, path: str
) -> None:
    body = {**CHAT, **extra}
    if path == "/v1/completions":
        body = {"model": "default", "prompt": "The capital of France is", **extra}
    reply = _post(shared_daemon, path, body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    _still_serves(shared_daemon)


def test_top_k_past_the_vocabulary_keeps_every_token(shared_daemon: DaemonProcess) -> None:
    """It once emptied the reply, cut the requests beside it short and broke every later
    unseeded sampled request until a restart."""
    client = openai.OpenAI(base_url=f"{shared_daemon.base_url}/v1", api_key="unused")
    for top_k in (49152, 10**6):
        reply = client.chat.completions.create(**CHAT, temperature=1.0, extra_body={"top_k": top_k})
        assert reply.choices[0].message.content
    messages = anthropic.Anthropic(base_url=shared_daemon.base_url, api_key="unused")
    message = messages.messages.create(
        model="default",
        max_tokens=8,
        messages=[{"role": "user", "content": "Say hello."}],
        # This SDK version takes neither as a keyword; the API still does.
        extra_body={"top_k": 10**6, "temperature": 1.0},
    )
    assert message.content and message.stop_reason in ("end_turn", "max_tokens")
    _still_serves(shared_daemon)


def test_a_negative_seed_is_accepted(shared_daemon: DaemonProcess) -> None:
    body = {**CHAT, "temperature": 1.0, "seed": -7}
    first = _post(shared_daemon, "/v1/chat/completions", body)
    second = _post(shared_daemon, "/v1/chat/completions", body)
    assert first.status_code == 200 and second.status_code == 200
    content = first.json()["choices"][0]["message"]["content"]
    assert content and content == second.json()["choices"][0]["message"]["content"]

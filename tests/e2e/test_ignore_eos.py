"""`ignore_eos` (vLLM's and llama.cpp's extra, sent by benchmark clients for fixed-length
replies) on the OpenAI routes, through the openai SDK's extra_body: the reply runs to
max_tokens past the model's end-of-sequence token, which is counted but never shown."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.conftest import DaemonProcess
from tests.support.spec import validate_openai

QUESTION = [{"role": "user", "content": "Say hello."}]
LENGTH = 48
EOS_TEXT = "<|im_end|>"  # the bundled model's end-of-sequence token


@pytest.fixture(scope="module")
def client(shared_daemon: DaemonProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{shared_daemon.base_url}/v1", api_key="none", max_retries=0)


def chat(client: openai.OpenAI, **extra: object) -> openai.types.chat.ChatCompletion:
    return client.chat.completions.create(
        model="default", messages=QUESTION, max_tokens=LENGTH, temperature=0, extra_body=extra
    )  # type: ignore[call-overload,no-any-return]


def test_a_chat_reply_runs_past_its_end_of_sequence(client: openai.OpenAI) -> None:
    usual = chat(client)
    assert usual.choices[0].finish_reason == "stop", "the greedy reply must end early here"
    assert usual.usage is not None and usual.usage.completion_tokens < LENGTH
    assert chat(client, ignore_eos=False).choices[0].message.content == (
        usual.choices[0].message.content
    )
    longer = chat(client, ignore_eos=True)
    assert longer.choices[0].finish_reason == "length"
    assert longer.usage is not None and longer.usage.completion_tokens == LENGTH
    text = longer.choices[0].message.content or ""
    assert text.startswith(usual.choices[0].message.content or "")  # greedy: the same start
    assert EOS_TEXT not in text


def test_a_streamed_reply_and_a_completion_run_to_max_tokens(client: openai.OpenAI) -> None:
    whole = chat(client, ignore_eos=True).choices[0].message.content
    stream = client.chat.completions.create(
        model="default",
        messages=QUESTION,  # type: ignore[arg-type]
        max_tokens=LENGTH,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    parts, usage, reasons = [], None, []
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            reasons += [choice.finish_reason] if choice.finish_reason else []
    assert "".join(parts) == whole and reasons == ["length"]
    assert usage is not None and usage.completion_tokens == LENGTH
    completion = client.completions.create(
        model="default",
        prompt="Hello",
        max_tokens=LENGTH,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert completion.usage is not None and completion.usage.completion_tokens == LENGTH
    assert completion.choices[0].finish_reason == "length"


def test_a_constrained_reply_refuses_it_by_name(shared_daemon: DaemonProcess) -> None:
    body = {
        "model": "default",
        "messages": QUESTION,
        "max_tokens": 8,
        "ignore_eos": True,
        "response_format": {"type": "json_object"},
    }
    reply = httpx.post(f"{shared_daemon.base_url}/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    validate_openai("ErrorResponse", reply.json())
    assert reply.json()["error"]["param"] == "ignore_eos"

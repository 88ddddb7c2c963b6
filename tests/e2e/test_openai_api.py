"""The daemon as a subprocess, driven with the official openai SDK and plain HTTP.

Bodies and stream chunks are validated against tests/fixtures/specs/openai-openapi.yaml.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import DaemonProcess
from tests.support.spec import validate_openai

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(shared_daemon: DaemonProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{shared_daemon.base_url}/v1", api_key="unused", max_retries=0)


def sse_payloads(response: httpx.Response) -> list[Any]:
    """`data:` payloads of an SSE body; the last one must be [DONE]."""
    events = [
        line[len("data: ") :] for line in response.text.splitlines() if line.startswith("data: ")
    ]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_chat_answers_paris_and_validates(shared_daemon: DaemonProcess) -> None:
    body = {"model": "default", "messages": QUESTION, "max_tokens": 12, "temperature": 0}
    response = httpx.post(f"{shared_daemon.base_url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200
    payload = response.json()
    validate_openai("CreateChatCompletionResponse", payload)
    assert "Paris" in payload["choices"][0]["message"]["content"]
    usage = payload["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert payload["model"] == "default"


def test_chat_stream_with_sdk_and_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="smollm2-135m-instruct",
        messages=QUESTION,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens > 0


def test_chat_stream_chunks_validate(shared_daemon: DaemonProcess) -> None:
    body = {
        "model": "default",
        "messages": QUESTION,
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    response = httpx.post(f"{shared_daemon.base_url}/v1/chat/completions", json=body, timeout=120)
    assert response.headers["content-type"].startswith("text/event-stream")
    payloads = sse_payloads(response)
    for chunk in payloads:
        validate_openai("CreateChatCompletionStreamResponse", chunk)
    assert payloads[-2]["choices"][0]["finish_reason"] == "length"
    assert payloads[-1]["usage"]["completion_tokens"] == 4


def test_completions_plain_and_streamed(
    client: openai.OpenAI, shared_daemon: DaemonProcess
) -> None:
    done = client.completions.create(
        model="default", prompt="The capital of France is", max_tokens=5, temperature=0
    )
    validate_openai("CreateCompletionResponse", done.model_dump(exclude_unset=True))
    assert done.choices[0].finish_reason in ("stop", "length")
    assert done.usage is not None and done.usage.completion_tokens <= 5
    body = {
        "model": "default",
        "prompt": "The capital of France is",
        "max_tokens": 5,
        "temperature": 0,
        "stream": True,
    }
    streamed = httpx.post(f"{shared_daemon.base_url}/v1/completions", json=body, timeout=120)
    payloads = sse_payloads(streamed)
    assert "".join(p["choices"][0]["text"] for p in payloads) == done.choices[0].text
    # OpenAI sends finish_reason null on intermediate completion chunks, which its own
    # schema's enum omits; every chunk validates once that null is allowed.
    for chunk in payloads:
        chunk = json.loads(json.dumps(chunk))
        if chunk["choices"][0]["finish_reason"] is None:
            chunk["choices"][0]["finish_reason"] = "stop"
        validate_openai("CreateCompletionResponse", chunk)


def test_models_listing(client: openai.OpenAI, shared_daemon: DaemonProcess) -> None:
    ids = [m.id for m in client.models.list()]
    # The default config serves the chat model (with its alias) and the embedding model.
    assert ids == ["smollm2-135m-instruct", "default", "all-minilm-l6-v2", "whisper-tiny-en"]
    listing = httpx.get(f"{shared_daemon.base_url}/v1/models").json()
    validate_openai("ListModelsResponse", listing)
    assert client.models.retrieve("default").id == "default"


def test_unknown_model_is_404_model_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-9", messages=QUESTION, max_tokens=2)
    assert caught.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"temperature": 5}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"n": 0}, "n"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"top_p": -0.1}, "top_p"),
    ],
)
def test_invalid_parameters_are_400_in_openai_shape(
    shared_daemon: DaemonProcess, change: dict[str, Any], param: str
) -> None:
    body = {"model": "default", "messages": QUESTION, "max_tokens": 2, **change}
    response = httpx.post(f"{shared_daemon.base_url}/v1/chat/completions", json=body)
    assert response.status_code == 400
    error = response.json()
    validate_openai("ErrorResponse", error)
    assert error["error"]["type"] == "invalid_request_error"
    assert error["error"]["param"] == param


def test_malformed_json_and_missing_fields_are_400(shared_daemon: DaemonProcess) -> None:
    url = f"{shared_daemon.base_url}/v1/chat/completions"
    bad_json = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert bad_json.status_code == 400 and "JSON" in bad_json.json()["error"]["message"]
    missing = httpx.post(url, json={"messages": QUESTION})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "model"


def test_images_are_refused_not_dropped(shared_daemon: DaemonProcess) -> None:
    content = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:,"}},
    ]
    body = {"model": "default", "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    response = httpx.post(f"{shared_daemon.base_url}/v1/chat/completions", json=body)
    assert response.status_code == 400
    assert "does not accept images" in response.json()["error"]["message"]


def test_prompt_over_the_context_is_400(shared_daemon: DaemonProcess) -> None:
    body = {"model": "default", "prompt": [1] * 9000, "max_tokens": 2}
    response = httpx.post(f"{shared_daemon.base_url}/v1/completions", json=body)
    assert response.status_code == 400
    assert "maximum context length" in response.json()["error"]["message"]


def test_eight_concurrent_streams_all_complete_with_correct_usage(
    shared_daemon: DaemonProcess,
) -> None:
    client = openai.AsyncOpenAI(base_url=f"{shared_daemon.base_url}/v1", api_key="x", max_retries=0)
    questions = [f"Give me fact number {i} about the sea." for i in range(8)]

    async def one(question: str) -> tuple[str, int, int]:
        stream = await client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": question}],
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, usage = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage:
                usage = chunk.usage
        assert usage is not None
        return text, usage.completion_tokens, usage.prompt_tokens

    async def main() -> list[tuple[str, int, int]]:
        return list(await asyncio.gather(*(one(q) for q in questions)))

    results = asyncio.run(main())
    assert len(results) == 8
    for text, completion_tokens, prompt_tokens in results:
        assert 0 < completion_tokens <= 6 and prompt_tokens > 10 and text


def test_health_lists_models(shared_daemon: DaemonProcess) -> None:
    health = httpx.get(f"{shared_daemon.base_url}/health")
    assert health.status_code == 200
    assert health.json()["models"][0]["state"] == "running"


def test_request_log_lines_are_json(shared_daemon: DaemonProcess) -> None:
    lines = [json.loads(x) for x in shared_daemon.log_text().splitlines() if x.startswith("{")]
    requests = [x for x in lines if x.get("event") == "request"]
    assert requests, "no request log lines"
    for field in (
        "request_id",
        "model",
        "prompt_tokens",
        "completion_tokens",
        "ttft_s",
        "duration_s",
    ):
        assert field in requests[0]

"""Every optional field's `null`, edge values, fields we refuse by name, and vLLM's
/tokenize and /detokenize (behind the same API key as /v1)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import DaemonProcess, running
from tests.support.spec import validate_openai

KEY = "sk-fields"
AUTH = {"authorization": f"Bearer {KEY}"}
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
CHAT = {"model": "default", "messages": QUESTION, "max_tokens": 3}
COMPLETION = {"model": "default", "prompt": "The capital of France is", "max_tokens": 3}

CHAT_NULLABLE = [
    "stream",
    "stream_options",
    "n",
    "stop",
    "temperature",
    "top_p",
    "seed",
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "max_completion_tokens",
    "audio",
    "prediction",
    "modalities",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "store",
    "metadata",
    "user",
]
COMPLETION_NULLABLE = [
    "stream",
    "n",
    "echo",
    "stop",
    "suffix",
    "best_of",
    "logprobs",
    "seed",
    "temperature",
    "top_p",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "stream_options",
]


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path
) -> Iterator[DaemonProcess]:
    config = {"auth": {"api_keys": [KEY]}, "limits": {"max_n": 4}}
    with running(tmp_path_factory.mktemp("fields"), model_cache_dir, config) as started:
        yield started


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key=KEY, max_retries=0)


def post(daemon: DaemonProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{daemon.base_url}{path}", json=body, headers=AUTH, timeout=120)


def test_every_nullable_chat_field_accepts_null(daemon: DaemonProcess) -> None:
    body = {**CHAT, **dict.fromkeys(CHAT_NULLABLE)}
    body["stream_options"] = {"include_usage": None}
    response = post(daemon, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    payload = response.json()
    validate_openai("CreateChatCompletionResponse", payload)
    assert len(payload["choices"]) == 1 and payload["choices"][0]["logprobs"] is None


def test_every_nullable_completion_field_accepts_null(daemon: DaemonProcess) -> None:
    body = {**COMPLETION, **dict.fromkeys(COMPLETION_NULLABLE)}
    response = post(daemon, "/v1/completions", body)
    assert response.status_code == 200, response.text
    payload = response.json()
    validate_openai("CreateCompletionResponse", payload)
    assert not payload["choices"][0]["text"].startswith("The capital")  # echo null = off


def test_null_prompt_is_the_spec_default(daemon: DaemonProcess) -> None:
    response = post(daemon, "/v1/completions", {**COMPLETION, "prompt": None})
    assert response.status_code == 200, response.text


def test_top_p_zero_is_greedy(client: openai.OpenAI) -> None:
    greedy = client.chat.completions.create(
        model="default", messages=QUESTION, max_tokens=8, temperature=0
    )
    hot = [
        client.chat.completions.create(
            model="default", messages=QUESTION, max_tokens=8, temperature=1.5, top_p=0, seed=s
        )
        for s in (1, 2)
    ]
    assert all(h.choices[0].message.content == greedy.choices[0].message.content for h in hot)


def test_max_tokens_zero_with_echo_returns_the_prompt(client: openai.OpenAI) -> None:
    done = client.completions.create(model="default", prompt="Hello there", max_tokens=0, echo=True)
    assert done.choices[0].text == "Hello there" and done.choices[0].finish_reason == "length"
    assert done.usage is not None and done.usage.completion_tokens == 0


def test_text_modality_and_best_of_equal_to_n_are_fine(daemon: DaemonProcess) -> None:
    chat = post(daemon, "/v1/chat/completions", {**CHAT, "modalities": ["text"]})
    assert chat.status_code == 200, chat.text
    completion = post(daemon, "/v1/completions", {**COMPLETION, "n": 2, "best_of": 2})
    assert completion.status_code == 200, completion.text
    assert len(completion.json()["choices"]) == 2


@pytest.mark.parametrize(
    ("path", "change", "param", "words"),
    [
        ("/v1/completions", {"suffix": "end"}, "suffix", "fill-in-the-middle"),
        (
            "/v1/chat/completions",
            {"audio": {"voice": "alloy", "format": "wav"}},
            "audio",
            "text only",
        ),
        ("/v1/chat/completions", {"modalities": ["text", "audio"]}, "modalities", "text only"),
        (
            "/v1/chat/completions",
            {"prediction": {"type": "text", "content": "x"}},
            "prediction",
            'must be {"type": "content"',
        ),
        ("/v1/completions", {"best_of": 3}, "best_of", "not supported"),
        ("/v1/chat/completions", {"n": 5}, "n", "limits.max_n"),
        ("/v1/chat/completions", {"n": 0}, "n", ""),
        ("/v1/completions", {"n": 129}, "n", ""),
        ("/v1/chat/completions", {"top_logprobs": 21, "logprobs": True}, "top_logprobs", ""),
        ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs", "requires logprobs"),
        ("/v1/completions", {"logprobs": 6}, "logprobs", ""),
        ("/v1/completions", {"logprobs": -1}, "logprobs", ""),
        ("/v1/completions", {"max_tokens": -1}, "max_tokens", ""),
        ("/v1/chat/completions", {"max_tokens": 0}, "max_tokens", ""),
        ("/v1/chat/completions", {"top_p": 1.5}, "top_p", ""),
    ],
)
def test_refusals_name_the_field(
    daemon: DaemonProcess, path: str, change: dict[str, Any], param: str, words: str
) -> None:
    base = CHAT if path == "/v1/chat/completions" else COMPLETION
    response = post(daemon, path, {**base, **change})
    assert response.status_code == 400, response.text
    error = response.json()
    validate_openai("ErrorResponse", error)
    assert error["error"]["param"] == param
    assert words in error["error"]["message"]


def test_negative_seed_is_accepted(client: openai.OpenAI) -> None:
    done = client.chat.completions.create(
        model="default", messages=QUESTION, max_tokens=3, temperature=1.0, seed=-5, n=2
    )
    assert len(done.choices) == 2


def test_tokenize_counts_what_chat_charges(client: openai.OpenAI, daemon: DaemonProcess) -> None:
    done = client.chat.completions.create(model="default", messages=QUESTION, max_tokens=2)
    response = post(daemon, "/tokenize", {"model": "default", "messages": QUESTION})
    assert response.status_code == 200, response.text
    body = response.json()
    assert done.usage is not None and body["count"] == done.usage.prompt_tokens
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 8192
    back = post(daemon, "/detokenize", {"model": "default", "tokens": body["tokens"]})
    assert "What is the capital of France?" in back.json()["prompt"]


def test_tokenize_prompt_round_trip_and_completion_usage(
    client: openai.OpenAI, daemon: DaemonProcess
) -> None:
    text = "Héllo wörld, 😀 tokens!"
    body = post(daemon, "/tokenize", {"prompt": text, "return_token_strs": True}).json()
    assert len(body["token_strs"]) == body["count"]
    assert post(daemon, "/detokenize", {"tokens": body["tokens"]}).json() == {"prompt": text}
    done = client.completions.create(model="default", prompt=text, max_tokens=1)
    assert done.usage is not None and done.usage.prompt_tokens == body["count"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/tokenize", {"prompt": "x", "messages": QUESTION}),
        ("/tokenize", {}),
        ("/tokenize", {"prompt": "x", "model": "gpt-9"}),
        ("/tokenize", {"messages": QUESTION, "chat_template_kwargs": {"chat_template": "x"}}),
        ("/detokenize", {"tokens": [10**9]}),
        ("/detokenize", {"tokens": "abc"}),
    ],
)
def test_tokenize_bad_input_is_an_openai_error(
    daemon: DaemonProcess, path: str, body: dict[str, Any]
) -> None:
    response = post(daemon, path, body)
    assert response.status_code in (400, 404), response.text
    validate_openai("ErrorResponse", response.json())


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
def test_tokenize_needs_the_api_key(daemon: DaemonProcess, path: str) -> None:
    response = httpx.post(f"{daemon.base_url}{path}", json={"prompt": "x", "tokens": [1]})
    assert response.status_code == 401
    validate_openai("ErrorResponse", response.json())

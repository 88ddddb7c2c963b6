"""Several prompts in one /v1/completions request: choices per prompt, numbered prompt by
prompt, each prompt's output equal to the same prompt sent alone (greedy)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import DaemonProcess, running
from tests.support.spec import validate_openai

PROMPTS = ["The capital of France is", "One, two, three,"]


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path
) -> Iterator[DaemonProcess]:
    config = {"limits": {"max_n": 2, "max_prompts": 3}}
    with running(tmp_path_factory.mktemp("batch"), model_cache_dir, config) as started:
        yield started


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="none", max_retries=0)


def _alone(client: openai.OpenAI, prompt: str | list[int], **extra: Any) -> Any:
    return client.completions.create(
        model="default", prompt=prompt, max_tokens=6, temperature=0, **extra
    )


def test_each_prompt_gets_n_choices_in_prompt_order(client: openai.OpenAI) -> None:
    batch = client.completions.create(
        model="default", prompt=PROMPTS, n=2, max_tokens=6, temperature=0
    )
    validate_openai("CreateCompletionResponse", batch.model_dump(exclude_unset=True))
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    alone = [_alone(client, p) for p in PROMPTS]
    for i, single in enumerate(alone):
        text = single.choices[0].text
        assert [c.text for c in batch.choices[2 * i : 2 * i + 2]] == [text, text]
    assert batch.usage is not None
    assert batch.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert batch.usage.completion_tokens == 2 * sum(a.usage.completion_tokens for a in alone)


def test_token_id_prompts_echo_their_own_prompt(
    client: openai.OpenAI, daemon: DaemonProcess
) -> None:
    ids = [
        httpx.post(f"{daemon.base_url}/tokenize", json={"prompt": p}, timeout=60).json()["tokens"]
        for p in PROMPTS
    ]
    batch = client.completions.create(
        model="default", prompt=ids, max_tokens=6, temperature=0, echo=True
    )
    assert [c.index for c in batch.choices] == [0, 1]
    for choice, own, text in zip(batch.choices, ids, PROMPTS, strict=True):
        assert choice.text.startswith(text)
        assert choice.text == _alone(client, own, echo=True).choices[0].text


def test_streamed_batch_finishes_every_choice_and_counts_usage(daemon: DaemonProcess) -> None:
    body = {
        "model": "default",
        "prompt": PROMPTS,
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    finished: dict[int, str] = {}
    texts: dict[int, str] = {0: "", 1: ""}
    usage: dict[str, Any] | None = None
    with httpx.stream("POST", f"{daemon.base_url}/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk["choices"]:
                texts[choice["index"]] += choice["text"]
                if choice["finish_reason"] is not None:
                    finished[choice["index"]] = choice["finish_reason"]
            # OpenAI's intermediate chunks carry finish_reason null, which its own enum
            # omits (as in test_openai_api): validate with that null allowed.
            for choice in chunk["choices"]:
                choice["finish_reason"] = choice["finish_reason"] or "stop"
            validate_openai("CreateCompletionResponse", chunk)
            usage = chunk.get("usage") or usage
    assert sorted(finished) == [0, 1]
    assert usage is not None and usage["completion_tokens"] == 8


@pytest.mark.parametrize(
    ("prompt", "param"),
    [
        (["a", "b", "c", "d"], "prompt"),  # over limits.max_prompts (3)
        ([[1, 2], []], "prompt"),
        (["a", ""], "prompt"),
        ([[1, 2], [3, 10**9]], "prompt[1]"),
        (["a", [1, 2]], "prompt"),
        ([[1, [2]]], "prompt"),
        ([True, 1], "prompt"),
        ([None], "prompt"),
    ],
)
def test_bad_batches_are_refused_naming_the_prompt(
    daemon: DaemonProcess, prompt: list[Any], param: str
) -> None:
    response = httpx.post(
        f"{daemon.base_url}/v1/completions",
        json={"model": "default", "prompt": prompt, "max_tokens": 2},
        timeout=60,
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"].startswith(param)
    assert "Input should be" not in error["message"]  # our words, naming what is allowed

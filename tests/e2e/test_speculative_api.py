"""Speculative decoding on a real daemon, through the OpenAI SDK: prompt lookup, and a
draft model (a random tiny llama with the bundled tokenizer, named by its directory)
give the same greedy text as the same weights without them (streamed and whole), and
vLLM's spec_decode counters on /metrics for the models that speculate only."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import DaemonProcess, running
from tests.e2e.ops_support import scrape, value
from tests.support.tiny_model import bundled_tokenizer_dir, make_tiny_model

SPEC, PLAIN, DRAFTED = "spec", "plain", "drafted"
NGRAM = {"model_name": SPEC, "method": "ngram"}  # the prompt-lookup model's metric labels
SOURCE = "builtin:smollm2-135m-instruct"
PROMPT = (
    "Copy this code exactly:\n"
    "def area(w, h):\n    return w * h\n\ndef total(items):\n    return sum(items)\n"
)


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path
) -> Iterator[DaemonProcess]:
    root = tmp_path_factory.mktemp("speculative")
    tiny = make_tiny_model(root / "tiny", bundled_tokenizer_dir(model_cache_dir), "llama", 7)
    config = {
        "models": [
            {"name": SPEC, "source": SOURCE,
             "speculative": {"method": "ngram", "num_tokens": 4}},
            {"name": PLAIN, "source": SOURCE, "load": "startup"},
            {"name": DRAFTED, "source": SOURCE, "load": "startup",
             "speculative": {"method": "draft", "draft_model": str(tiny), "num_tokens": 3}},
        ],
        "metrics": {"enabled": True},
    }  # fmt: skip
    with running(root, model_cache_dir, config) as process:
        yield process


def test_same_text_and_the_counters(daemon: DaemonProcess) -> None:
    client = openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": PROMPT}]

    def whole(model: str) -> str:
        done = client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=48,
            temperature=0,  # type: ignore[arg-type]
        )
        return done.choices[0].message.content or ""

    stream = client.chat.completions.create(
        model=SPEC,
        messages=messages,
        max_tokens=48,
        temperature=0,
        stream=True,  # type: ignore[arg-type]
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    plain = whole(PLAIN)
    assert whole(SPEC) == streamed == plain and "return w * h" in plain

    metrics = scrape(daemon)
    drafted = value(metrics, "vllm:spec_decode_num_draft_tokens_total", **NGRAM)
    accepted = value(metrics, "vllm:spec_decode_num_accepted_tokens_total", **NGRAM)
    first = value(
        metrics, "vllm:spec_decode_num_accepted_tokens_per_pos_total",
        model_name=SPEC, method="ngram", position="0",
    )  # fmt: skip
    assert drafted > 0 and 0 < accepted <= drafted and 0 < first <= accepted
    assert value(metrics, "vllm:spec_decode_num_drafts_total", **NGRAM) >= first
    assert not [key for key in metrics if "spec_decode" in key[0] and (
        ("model_name", PLAIN) in key[1])]  # fmt: skip


def test_a_draft_model_changes_nothing_and_is_counted(daemon: DaemonProcess) -> None:
    """The random draft is rarely right: the text is the plain model's all the same, and
    its rows soon stop proposing (docs/speculative.md, "A bad draft")."""
    client = openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="unused", max_retries=0)
    kwargs = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 48,
              "temperature": 0}  # fmt: skip
    drafted = client.chat.completions.create(model=DRAFTED, **kwargs)  # type: ignore[call-overload]
    stream = client.chat.completions.create(model=DRAFTED, stream=True, **kwargs)  # type: ignore[call-overload]
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    plain = client.chat.completions.create(model=PLAIN, **kwargs)  # type: ignore[call-overload]
    text = plain.choices[0].message.content
    assert drafted.choices[0].message.content == streamed == text
    looked_up = client.chat.completions.create(
        model=DRAFTED, extra_body={"speculative": "ngram"}, **kwargs
    )  # type: ignore[call-overload]
    assert looked_up.choices[0].message.content == text
    metrics = scrape(daemon)
    labels = {"model_name": DRAFTED, "method": "draft"}
    proposed = value(metrics, "vllm:spec_decode_num_draft_tokens_total", **labels)
    accepted = value(metrics, "vllm:spec_decode_num_accepted_tokens_total", **labels)
    assert proposed > 0 and accepted <= proposed


def test_a_request_opts_out(daemon: DaemonProcess) -> None:
    def drafts() -> float:
        return value(scrape(daemon), "vllm:spec_decode_num_drafts_total", **NGRAM)

    client = openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": PROMPT}]
    kwargs = {"messages": messages, "max_tokens": 48, "temperature": 0}
    before = drafts()
    out = client.chat.completions.create(model=SPEC, extra_body={"speculative": False}, **kwargs)  # type: ignore[call-overload]
    plain = client.chat.completions.create(model=PLAIN, **kwargs)  # type: ignore[call-overload]
    assert out.choices[0].message.content == plain.choices[0].message.content
    anthropic_body = {"model": SPEC, "max_tokens": 16, "temperature": 0,
                      "messages": messages, "speculative": False}  # fmt: skip
    response = httpx.post(f"{daemon.base_url}/v1/messages", json=anthropic_body, timeout=120)
    assert response.status_code == 200, response.text
    completions = httpx.post(
        f"{daemon.base_url}/v1/completions",
        json={"model": SPEC, "prompt": PROMPT, "max_tokens": 16, "speculative": False},
        timeout=120,
    )
    assert completions.status_code == 200, completions.text
    assert drafts() == before  # none of them drafted
    # Not a bool: the protocol's own 400, naming the field.
    for path, body in (
        ("/v1/chat/completions", {"model": SPEC, "messages": messages, "speculative": "no"}),
        ("/v1/messages", {**anthropic_body, "speculative": 0}),
    ):
        bad = httpx.post(f"{daemon.base_url}{path}", json=body, timeout=30)
        assert bad.status_code == 400, bad.text
        assert "speculative" in bad.text
    client.chat.completions.create(model=SPEC, **kwargs)  # type: ignore[call-overload]
    assert drafts() > before  # and without the opt-out it drafts again


def test_a_seeded_sampled_request_with_logprobs(daemon: DaemonProcess) -> None:
    """Sampled rows speculate too: with a seed, the same text and logprobs as the same
    weights without speculation (one request at a time: the same bits)."""

    def drafted() -> float:
        return value(scrape(daemon), "vllm:spec_decode_num_draft_tokens_total", **NGRAM)

    client = openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": PROMPT}]
    kwargs = {"messages": messages, "max_tokens": 48, "temperature": 0.7, "top_p": 0.95,
              "seed": 11, "logprobs": True, "top_logprobs": 2}  # fmt: skip
    before = drafted()
    spec = client.chat.completions.create(model=SPEC, **kwargs)  # type: ignore[call-overload]
    plain = client.chat.completions.create(model=PLAIN, **kwargs)  # type: ignore[call-overload]

    def entries(done: Any) -> list[Any]:
        return [
            (t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs])
            for t in done.choices[0].logprobs.content
        ]

    assert spec.choices[0].message.content == plain.choices[0].message.content
    assert entries(spec) == entries(plain) and len(entries(spec)) > 8
    assert drafted() > before


def test_a_method_the_model_cannot_run_is_a_400(daemon: DaemonProcess) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    cases = [
        ("/v1/chat/completions", {"model": SPEC, "messages": messages, "speculative": "draft"},
         "has none (its speculative method is ngram)"),
        ("/v1/completions", {"model": PLAIN, "prompt": "Hi", "speculative": "draft"},
         "has none (no speculative section)"),
        ("/v1/messages", {"model": PLAIN, "max_tokens": 4, "messages": messages,
                          "speculative": "draft"}, "asks for a draft model"),
        ("/v1/chat/completions", {"model": DRAFTED, "messages": messages,
                                  "speculative": "eagle"}, "speculative"),
    ]  # fmt: skip
    for path, body, words in cases:
        response = httpx.post(f"{daemon.base_url}{path}", json=body, timeout=30)
        assert response.status_code == 400, (path, response.text)
        assert words in response.text and "speculative" in response.text
    error = httpx.post(f"{daemon.base_url}/v1/messages", json=cases[2][1], timeout=30).json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    # Prompt lookup needs no section: any model can, for the request that asks.
    body = {"model": PLAIN, "prompt": PROMPT, "max_tokens": 8, "speculative": "ngram"}
    assert httpx.post(f"{daemon.base_url}/v1/completions", json=body, timeout=60).is_success


def test_predicted_outputs(daemon: DaemonProcess) -> None:
    """OpenAI's Predicted Outputs, on a model without a speculative section: the same
    text as without the prediction, streamed and whole, and usage counting the
    prediction's tokens accepted and rejected."""
    client = openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": PROMPT}]
    kwargs: dict[str, Any] = {"model": PLAIN, "messages": messages, "max_tokens": 48,
                              "temperature": 0}  # fmt: skip
    plain = client.chat.completions.create(**kwargs)
    text = plain.choices[0].message.content or ""
    assert plain.usage is not None and plain.usage.completion_tokens_details is None
    prediction = {"type": "content", "content": text}
    predicted = client.chat.completions.create(prediction=prediction, **kwargs)  # type: ignore[arg-type]
    assert predicted.choices[0].message.content == text
    usage = predicted.usage
    assert usage is not None and usage.completion_tokens_details is not None
    details = usage.completion_tokens_details
    accepted, rejected = details.accepted_prediction_tokens, details.rejected_prediction_tokens
    assert accepted is not None and rejected is not None
    assert accepted > usage.completion_tokens // 2 and rejected >= 0  # it was the reply
    parts = {"type": "content", "content": [{"type": "text", "text": text[:20]},
                                            {"type": "text", "text": text[20:]}]}  # fmt: skip
    stream = client.chat.completions.create(
        prediction=parts,
        stream=True,
        stream_options={"include_usage": True},
        **kwargs,  # type: ignore[arg-type]
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    last = chunks[-1].usage
    assert last is not None and last.completion_tokens_details is not None
    assert last.completion_tokens_details.accepted_prediction_tokens == accepted
    for bad, param in (
        ({"type": "content"}, "prediction"),
        ({"type": "text", "content": "x"}, "prediction"),
        ({"type": "content", "content": [{"type": "image_url"}]}, "prediction.content[0]"),
        ({"type": "content", "content": 7}, "prediction"),
    ):
        response = httpx.post(
            f"{daemon.base_url}/v1/chat/completions",
            json={"model": PLAIN, "messages": messages, "prediction": bad},
            timeout=30,
        )
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == param

"""A model with a quantized live KV cache (kv_cache.bits: 8) on a real daemon: the
OpenAI and Anthropic SDKs get their answers streamed and not, a repeated prompt is
served from the (quantized) prefix cache, and /v1/status and /metrics say the bits and
the bytes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

from tests.conftest import DaemonProcess, running
from tests.e2e.ops_support import scrape, status, value

MODEL = "smol-kv8"
PROMPT = "Name three rivers in Europe and say one thing about each."


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path
) -> Iterator[DaemonProcess]:
    base = tmp_path_factory.mktemp("kvq")
    config = {
        "models": [
            {
                "name": MODEL,
                "source": "builtin:smollm2-135m-instruct",
                "kv_cache": {"bits": 8, "group_size": 64},
            }
        ],
        "metrics": {"enabled": True},
    }
    with running(base, model_cache_dir, config) as process:
        yield process


def test_both_sdks_answer_streamed_and_not(daemon: DaemonProcess) -> None:
    client = openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="none")
    messages = [{"role": "user", "content": PROMPT}]
    whole = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=16,
        temperature=0,  # type: ignore[arg-type]
    )
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=16,
        temperature=0,
        stream=True,  # type: ignore[arg-type]
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert whole.choices[0].message.content == streamed and streamed
    # The repeat reused the first request's stored (quantized) prefix.
    again = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=16,
        temperature=0,  # type: ignore[arg-type]
    )
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert (again.usage.prompt_tokens_details.cached_tokens or 0) > 0
    assert again.choices[0].message.content == streamed
    claude = anthropic.Anthropic(base_url=daemon.base_url, api_key="none")
    message = claude.messages.create(
        model=MODEL,
        max_tokens=16,
        messages=[{"role": "user", "content": PROMPT}],
        extra_body={"temperature": 0},  # this SDK release takes no `temperature` argument
    )
    assert message.content[0].type == "text" and message.content[0].text == streamed


def test_status_and_metrics_report_the_bits_and_the_bytes(daemon: DaemonProcess) -> None:
    (block,) = [m for m in status(daemon)["models"] if m["model"] == MODEL]
    kv = block["kv_cache"]
    assert kv["bits"] == 8 and kv["quantized"] is True and kv["group_size"] == 64
    assert kv["bytes_per_token"] > 0 and kv["bytes"] == kv["tokens"] * kv["bytes_per_token"]
    samples = scrape(daemon)
    assert value(samples, "vllm_mlx_kv_cache_bits", model_name=MODEL) == 8
    assert ("vllm_mlx_kv_cache_bytes", frozenset({("model_name", MODEL)})) in samples

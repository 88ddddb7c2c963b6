"""LoRA adapters on a real daemon through the official SDKs: listed as their own ids,
answering with their effect beside the base in one engine, an adapter that does not fit
the base refused in each protocol's error shape, and an adapter change applied by a hot
reload without loading the base again. One daemon for the module."""

from __future__ import annotations

import concurrent.futures
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import yaml

from tests.conftest import DaemonProcess, running
from tests.e2e.ops_support import status, wait_for
from tests.unit.test_lora import write_adapter

UPPERCASE = Path(__file__).resolve().parents[1] / "fixtures" / "lora" / "uppercase"
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path
) -> Iterator[DaemonProcess]:
    directory = tmp_path_factory.mktemp("lora")
    # A LoRA adapter in good order, but for a 64-wide llama: it fails only once loaded.
    other = write_adapter(directory / "other-arch", seed=1)
    config = {
        "models": [
            {
                "name": "smol",
                "source": "builtin:smollm2-135m-instruct",
                "adapters": [
                    {"name": "upper", "path": str(UPPERCASE)},
                    {"name": "other", "path": str(other)},
                ],
            }
        ],
    }
    with running(directory, model_cache_dir, config) as process:
        yield process


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="unused", max_retries=0)


def ask(client: openai.OpenAI, model: str, question: str = QUESTION) -> str:
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": question}],
        max_tokens=12,
        temperature=0,
    )
    return reply.choices[0].message.content or ""


def test_adapters_are_listed_as_models(daemon: DaemonProcess, client: openai.OpenAI) -> None:
    ids = [model.id for model in client.models.list()]
    assert ids == ["smol", "upper", "smol:upper", "other", "smol:other"]
    tags = httpx.get(f"{daemon.base_url}/api/tags").json()["models"]
    assert {"smol:upper", "upper:latest"} <= {m["name"] for m in tags}
    listing = anthropic.Anthropic(base_url=daemon.base_url, api_key="unused").models.list()
    assert "smol:upper" in [m.id for m in listing.data]


def test_an_adapter_answers_with_its_effect_beside_the_base(
    daemon: DaemonProcess, client: openai.OpenAI
) -> None:
    base = ask(client, "smol")
    upper = ask(client, "upper")
    assert upper.strip() and upper == upper.upper() and upper != base
    assert ask(client, "smol:upper") == upper
    # The base and the adapter at once (one engine, one batch): each its own answer.
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        jobs = [pool.submit(ask, client, model) for model in ("smol", "upper") * 2]
        answers = [job.result() for job in jobs]
    assert answers == [base, upper] * 2
    (block,) = status(daemon)["models"]
    shown = {a["name"]: a for a in block["adapters"]}
    assert shown["upper"]["loaded"] and shown["upper"]["bytes"] > 0
    assert not shown["other"]["loaded"] and shown["upper"]["in_flight"] == 0


def test_an_adapter_that_does_not_fit_the_base_is_a_503(
    daemon: DaemonProcess, client: openai.OpenAI
) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        ask(client, "other")
    assert caught.value.status_code == 503
    body: Any = caught.value.body
    assert body["code"] == "adapter_not_ready" and "does not fit" in body["message"]
    claude = anthropic.Anthropic(base_url=daemon.base_url, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as refused:
        claude.messages.create(
            model="smol:other", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
    assert refused.value.status_code == 503
    error: Any = refused.value.body
    assert error["type"] == "error" and "does not fit" in error["error"]["message"]
    assert ask(client, "upper")  # the engine serves on


def _model_loads(daemon: DaemonProcess) -> int:
    lines = [json.loads(line) for line in daemon.log_text().splitlines() if line.startswith("{")]
    return sum(1 for line in lines if line.get("event") == "model loaded")


def test_an_adapter_change_is_hot_and_loads_no_base(
    daemon: DaemonProcess, client: openai.OpenAI
) -> None:
    upper = ask(client, "upper")
    loads = _model_loads(daemon)
    settings = yaml.safe_load(daemon.config_path.read_text())
    settings["models"][0]["adapters"] = [{"name": "caps", "path": str(UPPERCASE)}]
    scratch = daemon.config_path.with_suffix(".tmp")
    scratch.write_text(yaml.safe_dump(settings, sort_keys=False))
    os.replace(scratch, daemon.config_path)
    wait_for(lambda: "caps" in [m.id for m in client.models.list()], 60, "the new adapter")
    assert [m.id for m in client.models.list()] == ["smol", "caps", "smol:caps"]
    assert ask(client, "caps") == upper
    with pytest.raises(openai.NotFoundError):
        ask(client, "upper")
    assert _model_loads(daemon) == loads  # the base kept serving: no second load

"""Real Ollama clients against the daemon: ollama-js (npm) and LangChain's ChatOllama and
OllamaEmbeddings, each compared with what the official Python client gets for the same
request (greedy, so the text is the same whatever the tiny model writes).

ollama-js comes from npm (`ollama`, pinned), installed once into a cache directory; only
its test is skipped, with the reason, where npm or its registry cannot be reached.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import ollama
import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langchain_ollama import ChatOllama, OllamaEmbeddings
from pydantic import BaseModel, ConfigDict, Field

from tests.conftest import DaemonProcess
from tests.e2e.conftest import OLLAMA_EMBED as EMBED
from tests.support.npm import npm_install, npm_prefix
from tests.support.replay import CALLS, QUESTION, THOUGHT, TOOL_ARGS, tool_schema

OLLAMA_JS_VERSION = "0.6.3"
SCRIPT = Path(__file__).resolve().parents[1] / "support" / "ollama_client.mjs"
STORY = "Write a long story about a dragon."
ASK = [{"role": "user", "content": STORY}]
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": name, "parameters": tool_schema(arg)}}
    for name, arg in TOOL_ARGS
]


@pytest.fixture(scope="module")
def daemon(ollama_daemon: DaemonProcess) -> DaemonProcess:
    return ollama_daemon


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> Iterator[ollama.Client]:
    with ollama.Client(host=daemon.base_url, timeout=120) as api:
        yield api


def greedy_reply(client: ollama.Client, num_predict: int) -> ollama.ChatResponse:
    options = {"temperature": 0, "num_predict": num_predict}
    return client.chat(model="default", messages=ASK, options=options)


def cosine(a: Any, b: Any) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# --- ollama-js ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def ollama_js() -> tuple[str, Path]:
    """node and a directory holding node_modules/ollama, installed once per machine."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed, so ollama-js cannot run")
    prefix = npm_prefix(f"ollama-js-{OLLAMA_JS_VERSION}")
    installed = prefix / "node_modules" / "ollama" / "package.json"
    npm_install(f"ollama@{OLLAMA_JS_VERSION}", prefix, installed, "ollama-js")
    return node, prefix


def test_ollama_js_streams_chats_lists_and_reports_errors(
    ollama_js: tuple[str, Path], daemon: DaemonProcess, client: ollama.Client
) -> None:
    node, prefix = ollama_js
    script = prefix / SCRIPT.name  # beside node_modules, so `import "ollama"` resolves
    shutil.copyfile(SCRIPT, script)
    result = subprocess.run(
        [node, str(script), daemon.base_url, json.dumps(TOOLS)],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout)
    assert "default:latest" in out["list"] and f"{EMBED}:latest" in out["list"]
    assert out["version"]

    reference = greedy_reply(client, 12)
    parts = out["stream"]
    assert len(parts) > 2 and [p["done"] for p in parts] == [False] * (len(parts) - 1) + [True]
    assert all(p["message"]["role"] == "assistant" for p in parts)
    assert "".join(p["message"]["content"] for p in parts) == reference.message.content
    assert parts[-1]["eval_count"] == 12 and parts[-1]["done_reason"] == "length"
    assert out["whole"]["message"]["content"] == reference.message.content
    assert out["generated"] == reference.message.content  # generate: the same user turn

    message = out["tools"]["message"]
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]
    assert calls == CALLS
    assert message["thinking"] == THOUGHT

    assert [len(v) for v in out["embed"]["embeddings"]] == [384, 384]
    assert "completion" in out["show"]["capabilities"]
    assert any(name.startswith("smollm2-135m-instruct") for name in out["ps"]), out["ps"]
    for failure in (out["unknown"], out["unknown_stream"]):
        assert failure is not None and failure["name"] == "ResponseError", failure
        assert failure["status_code"] == 404 and "not found" in failure["error"], failure
    assert out["pull_other"] is not None and out["pull_other"]["status_code"] == 400
    assert out["after_abort"] == 12


# --- LangChain ---------------------------------------------------------------------------


def chat_model(daemon: DaemonProcess, **kwargs: Any) -> ChatOllama:
    settings: dict[str, Any] = {"model": "default", "temperature": 0, "num_predict": 12}
    return ChatOllama(base_url=daemon.base_url, validate_model_on_init=True, **settings | kwargs)


def test_langchain_invoke_stream_and_async(daemon: DaemonProcess, client: ollama.Client) -> None:
    reference = greedy_reply(client, 12)
    llm = chat_model(daemon)
    message = llm.invoke(STORY)
    assert isinstance(message, AIMessage)
    assert message.content == reference.message.content
    usage = message.usage_metadata
    assert usage is not None
    assert usage["output_tokens"] == 12 and usage["input_tokens"] == reference.prompt_eval_count
    assert message.response_metadata["done_reason"] == "length"
    assert message.response_metadata["model"] == "default"
    chunks = list(llm.stream(STORY))
    assert len(chunks) > 2
    assert "".join(str(c.content) for c in chunks) == reference.message.content

    async def both() -> tuple[AIMessage, str]:
        whole = await llm.ainvoke(STORY)
        parts = [str(c.content) async for c in llm.astream(STORY)]
        return whole, "".join(parts)

    whole, streamed = asyncio.run(both())
    assert whole.content == streamed == reference.message.content


def test_langchain_refuses_a_model_the_daemon_does_not_list(daemon: DaemonProcess) -> None:
    with pytest.raises(ValueError, match="not found"):
        chat_model(daemon, model="no-such-model")


class City(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=16)
    country: str = Field(min_length=1, max_length=16)
    population: int = Field(ge=0, le=10**8)


def test_langchain_structured_output_is_the_pydantic_model(daemon: DaemonProcess) -> None:
    # Sampled hot, seeded: the schema (constrained decoding), not luck, makes it valid.
    llm = chat_model(daemon, temperature=1.0, seed=1234, num_predict=128)
    city = llm.with_structured_output(City).invoke("Describe Paris.")
    assert isinstance(city, City)


@tool
def get_weather(city: str, unit: str = "celsius") -> str:
    """The current weather in a city."""
    return f"Sunny, 21 degrees {unit} in {city}."


@tool
def get_time(zone: str) -> str:
    """The current time in a time zone."""
    return f"It is noon in {zone}."


def test_langchain_tool_calls_and_reasoning(daemon: DaemonProcess) -> None:
    llm = chat_model(daemon, model="replay", num_predict=120, reasoning=True)
    message = llm.bind_tools([get_weather, get_time]).invoke(QUESTION)
    assert [(c["name"], c["args"]) for c in message.tool_calls] == CALLS
    assert all(c["id"] for c in message.tool_calls)
    assert message.additional_kwargs["reasoning_content"] == THOUGHT
    assert "<think>" not in str(message.content)


def test_langchain_embeddings(daemon: DaemonProcess, client: ollama.Client) -> None:
    embeddings = OllamaEmbeddings(base_url=daemon.base_url, model=EMBED)
    documents = embeddings.embed_documents(["a cat", "a dog", "the stock market"])
    assert [len(v) for v in documents] == [384, 384, 384]
    query = embeddings.embed_query("a cat")
    assert cosine(query, documents[0]) > 0.9999
    assert cosine(documents[0], documents[1]) > cosine(documents[0], documents[2])
    direct = client.embed(model=EMBED, input="a cat").embeddings[0]
    assert cosine(direct, query) > 0.9999

"""Ollama's native API (/api/*) on a real daemon, with the official `ollama` Python client
and plain HTTP.

Bodies and stream objects are validated against tests/fixtures/specs/ollama-openapi.yaml
(tests/support/ollama.py); behaviour the spec leaves to prose follows ollama-api.md
beside it. Generation is greedy or seeded, and many checks compare the same request
sent through /v1/chat/completions or /v1/completions: the same model and sampler behind
both protocols must give the same text and the same token counts, so an option that
is dropped or mapped to the wrong sampler field shows as a difference, whatever the
tiny model writes. Tool calls and thinking use the replayed Hermes/Qwen-style reply
(tests/support/replay.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import ollama
import pytest
from pydantic import BaseModel, ConfigDict, Field

from tests.conftest import DaemonProcess
from tests.e2e.conftest import OLLAMA_EMBED as EMBED
from tests.e2e.ops_support import Samples, scrape, status, value, wait_for
from tests.support.ollama import (
    check_chat_stream,
    check_error,
    check_final,
    check_generate_stream,
    check_timestamp,
    ndjson,
    streamed_text,
    validate_ollama,
)
from tests.support.replay import CALLS, QUESTION, THOUGHT, TOOL_ARGS, tool_schema

REFERENCE = Path(__file__).resolve().parents[1] / "fixtures" / "embeddings" / "reference.json"
ITEMS: list[dict[str, Any]] = json.loads(REFERENCE.read_text())["items"]
LONG_TEXT = "word " * 1000  # ~1000 tokens: over the embedding model's 256
CHAT_MODEL = "smollm2-135m-instruct"
STORY = "Write a long story about a dragon."  # greedy: a 24-token run, no early stop
ASK = [{"role": "user", "content": STORY}]
GREEDY: dict[str, Any] = {"temperature": 0, "num_predict": 24}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {"name": name, "description": f"{name} tool", "parameters": tool_schema(arg)},
    }
    for name, arg in TOOL_ARGS
]
WEATHER_ASK = [{"role": "user", "content": QUESTION}]


# Known gaps of the adapter (docs/ollama.md), strict: each fails loudly once it is fixed.
@pytest.fixture(scope="module")
def daemon(ollama_daemon: DaemonProcess) -> DaemonProcess:
    return ollama_daemon


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> Iterator[ollama.Client]:
    with ollama.Client(host=daemon.base_url, timeout=120) as api:
        yield api


def post(daemon: DaemonProcess, path: str, body: Any, **kwargs: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": "application/json", **kwargs.pop("headers", {})}
    return httpx.post(
        f"{daemon.base_url}{path}", content=content, headers=headers, timeout=120, **kwargs
    )


def openai_chat(
    daemon: DaemonProcess, messages: list[dict[str, Any]], **params: Any
) -> dict[str, Any]:
    body = {"model": "default", "messages": messages, **params}
    response = post(daemon, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def openai_text(daemon: DaemonProcess, prompt: str, **params: Any) -> dict[str, Any]:
    body = {"model": "default", "prompt": prompt, **params}
    response = post(daemon, "/v1/completions", body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def base_name(name: str) -> str:
    return name.split(":", 1)[0]


DONE_REASONS = {"stop": "stop", "length": "length"}  # Ollama's <- OpenAI's finish_reason


# --- the server, its models ------------------------------------------------------------


def test_root_says_ollama_is_running(daemon: DaemonProcess) -> None:
    """Clients (and `ollama` itself) probe GET / and HEAD / to find a server."""
    got = httpx.get(daemon.base_url + "/", timeout=30)
    assert got.status_code == 200
    assert got.text == "Ollama is running"
    assert got.headers["content-type"].startswith("text/plain")
    head = httpx.head(daemon.base_url + "/", timeout=30)
    assert head.status_code == 200 and head.content == b""


def test_version(daemon: DaemonProcess) -> None:
    response = httpx.get(f"{daemon.base_url}/api/version", timeout=30)
    assert response.status_code == 200
    body = response.json()
    validate_ollama("VersionResponse", body)
    # Clients compare it as a version (some refuse servers older than they need).
    assert re.fullmatch(r"\d+\.\d+\.\d+([-+.].*)?", body["version"]), body


def test_tags_list_every_model_and_alias_with_a_tag(
    client: ollama.Client, daemon: DaemonProcess
) -> None:
    raw = httpx.get(f"{daemon.base_url}/api/tags", timeout=30)
    assert raw.status_code == 200
    validate_ollama("ListResponse", raw.json())
    listing = client.list()  # the client's own model of the reply parses it
    names = [m.model or "" for m in listing.models]
    assert len(names) == len(set(names)), names
    # Ollama names are always `name:tag`, and clients match on that.
    assert all(":" in name for name in names), names
    assert {base_name(n) for n in names} == {CHAT_MODEL, "default", EMBED, "replay", "spare"}
    for entry in raw.json()["models"]:
        assert entry["name"] == entry["model"], entry
        assert isinstance(entry["size"], int) and entry["size"] > 0, entry
        assert isinstance(entry["digest"], str) and entry["digest"], entry
        check_timestamp(entry["modified_at"])
        assert isinstance(entry["details"]["family"], str), entry


def test_show_describes_capabilities_and_context(
    client: ollama.Client, daemon: DaemonProcess
) -> None:
    raw = post(daemon, "/api/show", {"model": "default"})
    assert raw.status_code == 200, raw.text
    validate_ollama("ShowResponse", raw.json())
    shown = client.show("default")
    assert shown.capabilities is not None and "completion" in shown.capabilities
    assert "embedding" not in shown.capabilities
    assert shown.details is not None and isinstance(shown.details.family, str)
    # Clients read the context length as model_info["<architecture>.context_length"].
    info = shown.modelinfo or {}
    architecture = info["general.architecture"]
    assert isinstance(architecture, str) and architecture
    assert isinstance(info[f"{architecture}.context_length"], int)
    assert info[f"{architecture}.context_length"] > 0
    assert client.show("default:latest").modelinfo == info
    embedding = client.show(EMBED)
    assert embedding.capabilities is not None and "embedding" in embedding.capabilities
    assert "completion" not in embedding.capabilities
    replay = client.show("replay")  # a tool-call parser and a reasoning parser
    assert replay.capabilities is not None
    assert {"completion", "tools", "thinking"} <= set(replay.capabilities)
    assert not {"tools", "thinking"} & set(shown.capabilities)


def test_tags_and_show_do_not_depend_on_the_model_being_loaded(
    client: ollama.Client, daemon: DaemonProcess
) -> None:
    """`spare` has the same source as `default`: unloaded, it is described the same (Ollama
    reads a model's metadata from its files, loaded or not; clients size their context
    from model_info before the first request)."""
    client.generate(model="spare", prompt="", keep_alive=0)
    wait_for(lambda: spare_state(daemon) == "not_loaded", 60, "spare to unload")
    listed = {m["name"]: m for m in httpx.get(f"{daemon.base_url}/api/tags").json()["models"]}
    assert listed["spare:latest"]["details"] == listed["default:latest"]["details"]
    assert listed["spare:latest"]["size"] == listed["default:latest"]["size"] > 0
    spare, default = client.show("spare"), client.show("default")
    assert spare.details == default.details and spare.modelinfo == default.modelinfo
    assert spare.template == default.template and spare.capabilities == default.capabilities
    assert spare_state(daemon) == "not_loaded"  # asking did not load it


def test_ps_lists_what_is_loaded(client: ollama.Client, daemon: DaemonProcess) -> None:
    client.chat(model="default", messages=ASK, options={"num_predict": 1})
    raw = httpx.get(f"{daemon.base_url}/api/ps", timeout=30)
    assert raw.status_code == 200
    validate_ollama("PsResponse", raw.json())
    running = client.ps()
    loaded = {base_name(m.model or ""): m for m in running.models}
    assert loaded.keys() & {CHAT_MODEL, "default"}, loaded
    for entry in raw.json()["models"]:
        assert entry["name"] == entry["model"] and ":" in entry["name"], entry
        assert isinstance(entry["size"], int) and entry["size"] > 0, entry
        assert isinstance(entry["size_vram"], int) and entry["size_vram"] >= 0, entry
        check_timestamp(entry["expires_at"])
    states = {b["model"]: b["state"] for b in status(daemon)["models"]}
    for name in loaded:  # what ps lists is what the daemon has running
        if name in states:
            assert states[name] == "running", states


# --- chat --------------------------------------------------------------------------------


def test_chat_matches_the_openai_route(client: ollama.Client, daemon: DaemonProcess) -> None:
    reply = client.chat(model="default", messages=ASK, options=GREEDY, stream=False)
    reference = openai_chat(daemon, ASK, temperature=0, max_tokens=24)
    choice = reference["choices"][0]
    assert reply.message.role == "assistant"
    assert reply.message.content == choice["message"]["content"]
    assert reply.done is True and reply.done_reason == DONE_REASONS[choice["finish_reason"]]
    assert reply.prompt_eval_count == reference["usage"]["prompt_tokens"]
    assert reply.eval_count == reference["usage"]["completion_tokens"]
    assert reply.model == "default"
    check_final(reply.model_dump(exclude_none=True))


def test_chat_stream_equals_the_whole_reply(client: ollama.Client) -> None:
    whole = client.chat(model="default", messages=ASK, options=GREEDY, stream=False)
    parts = list(client.chat(model="default", messages=ASK, options=GREEDY, stream=True))
    assert len(parts) > 2  # token by token, not one buffered object
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    final = parts[-1]
    assert final.done_reason == whole.done_reason
    assert final.eval_count == whole.eval_count == 24
    assert final.prompt_eval_count == whole.prompt_eval_count


def test_chat_wire_format_streamed_and_not(daemon: DaemonProcess) -> None:
    body = {"model": "default", "messages": ASK, "options": GREEDY}
    streamed = post(daemon, "/api/chat", body)  # streaming is the default
    assert streamed.status_code == 200
    objects = ndjson(streamed)
    check_chat_stream(objects, model="default")
    whole = post(daemon, "/api/chat", {**body, "stream": False})
    assert whole.status_code == 200
    assert whole.headers["content-type"].startswith("application/json")
    result = whole.json()
    validate_ollama("ChatResponse", result)
    check_timestamp(result["created_at"])
    check_final(result)
    assert result["message"]["role"] == "assistant"
    assert streamed_text(objects) == result["message"]["content"]
    for name in ("done_reason", "eval_count", "prompt_eval_count"):
        assert objects[-1][name] == result[name], name


@pytest.mark.parametrize("name", ["default", "default:latest", f"{CHAT_MODEL}:latest", CHAT_MODEL])
def test_model_names_with_and_without_the_latest_tag(client: ollama.Client, name: str) -> None:
    reply = client.chat(model=name, messages=ASK, options={"temperature": 0, "num_predict": 2})
    assert reply.eval_count == 2
    assert reply.model == name  # Ollama echoes the name the client sent


@pytest.mark.parametrize("name", ["no-such-model", "no-such-model:latest", "default:7b"])
def test_unknown_models_are_404(client: ollama.Client, name: str) -> None:
    calls = [
        lambda: client.chat(model=name, messages=ASK),
        lambda: list(client.chat(model=name, messages=ASK, stream=True)),
        lambda: client.generate(model=name, prompt="Hi"),
        lambda: list(client.generate(model=name, prompt="Hi", stream=True)),
        lambda: client.embed(model=name, input="Hi"),
        lambda: client.embeddings(model=name, prompt="Hi"),
        lambda: client.show(name),
    ]
    for call in calls:
        with pytest.raises(ollama.ResponseError) as caught:
            call()
        assert caught.value.status_code == 404, caught.value
        assert isinstance(caught.value.error, str) and caught.value.error


def test_unknown_model_body_is_ollama_shaped(daemon: DaemonProcess) -> None:
    for path, body in [
        ("/api/chat", {"model": "nope", "messages": ASK}),
        ("/api/generate", {"model": "nope", "prompt": "Hi"}),
        ("/api/embed", {"model": "nope", "input": "Hi"}),
        ("/api/embeddings", {"model": "nope", "prompt": "Hi"}),
        ("/api/show", {"model": "nope"}),
    ]:
        check_error(post(daemon, path, body), 404)


BAD_CHAT: list[tuple[str, Any]] = [
    ("not JSON", b"{"),
    ("an array", b"[]"),
    ("no model", {"messages": ASK}),
    ("model not a string", {"model": 5, "messages": ASK}),
    ("messages not a list", {"model": "default", "messages": "Hi"}),
    ("a message not an object", {"model": "default", "messages": ["Hi"]}),
    ("an unknown role", {"model": "default", "messages": [{"role": "wizard", "content": "x"}]}),
    ("content not a string", {"model": "default", "messages": [{"role": "user", "content": 5}]}),
    ("options not an object", {"model": "default", "messages": ASK, "options": "fast"}),
    (
        "temperature a word",
        {"model": "default", "messages": ASK, "options": {"temperature": "hot"}},
    ),
    ("num_predict a word", {"model": "default", "messages": ASK, "options": {"num_predict": "x"}}),
    ("top_k a word", {"model": "default", "messages": ASK, "options": {"top_k": "x"}}),
    ("seed a word", {"model": "default", "messages": ASK, "options": {"seed": "x"}}),
    ("stop a number", {"model": "default", "messages": ASK, "options": {"stop": 5}}),
    ("format neither json nor a schema", {"model": "default", "messages": ASK, "format": "xml"}),
    ("think a level that is not one", {"model": "default", "messages": ASK, "think": "extreme"}),
    ("keep_alive no duration", {"model": "default", "messages": ASK, "keep_alive": "forever"}),
    ("tools not a list", {"model": "default", "messages": ASK, "tools": {"type": "function"}}),
    ("stream not a boolean", {"model": "default", "messages": ASK, "stream": "yes"}),
    (
        "images on a text-only model",
        {"model": "default", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]},
    ),
]


@pytest.mark.parametrize(("why", "body"), BAD_CHAT, ids=[why for why, _ in BAD_CHAT])
def test_bad_chat_requests_are_400(daemon: DaemonProcess, why: str, body: Any) -> None:
    check_error(post(daemon, "/api/chat", body), 400)


BAD_OTHER: list[tuple[str, Any]] = [
    ("/api/generate", b"{"),
    ("/api/generate", {"prompt": "Hi"}),
    ("/api/generate", {"model": "default", "prompt": 5}),
    ("/api/generate", {"model": "default", "prompt": "Hi", "system": ["x"]}),
    ("/api/generate", {"model": "default", "prompt": "Hi", "options": {"top_p": "x"}}),
    ("/api/generate", {"model": "default", "prompt": "Hi", "format": "yaml"}),
    ("/api/embed", b"not json"),
    ("/api/embed", {"input": "Hi"}),
    ("/api/embed", {"model": EMBED, "input": 5}),
    ("/api/embed", {"model": EMBED, "input": [1, 2]}),
    ("/api/embed", {"model": EMBED, "input": "Hi", "truncate": "no"}),
    ("/api/embeddings", {"model": EMBED, "prompt": ["a", "b"]}),
    ("/api/show", {}),
    ("/api/show", {"model": 5}),
    ("/api/show", b"[1]"),
]


@pytest.mark.parametrize(
    ("path", "body"),
    BAD_OTHER,
    ids=[
        f"{path}:{body if isinstance(body, bytes) else json.dumps(body)}"
        for path, body in BAD_OTHER
    ],
)
def test_bad_requests_to_other_routes_are_400(daemon: DaemonProcess, path: str, body: Any) -> None:
    check_error(post(daemon, path, body), 400)


def test_bad_options_raise_a_400_response_error(client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(model="default", messages=ASK, options={"temperature": "hot"})
    assert caught.value.status_code == 400
    with pytest.raises(ollama.ResponseError) as caught:
        client.generate(model="default", prompt="Hi", options={"num_predict": "many"})
    assert caught.value.status_code == 400


def test_options_ollama_has_and_the_daemon_does_not_are_accepted(client: ollama.Client) -> None:
    """Ollama ignores runtime options it cannot apply (GPU layers, threads, mmap...), and
    clients send them (LangChain's ChatOllama sends mirostat, num_gpu, num_thread...)."""
    options = {
        **GREEDY,
        "num_predict": 3,
        "num_gpu": 1,
        "num_thread": 2,
        "num_batch": 512,
        "num_keep": 4,
        "numa": False,
        "use_mmap": True,
        "use_mlock": False,
        "mirostat": 0,
        "mirostat_eta": 0.1,
        "mirostat_tau": 5.0,
        "tfs_z": 1.0,
        "typical_p": 1.0,
        "penalize_newline": True,
        "low_vram": False,
        "main_gpu": 0,
    }
    reply = client.chat(model="default", messages=ASK, options=options)
    assert reply.eval_count == 3


# --- options: each one reaches the sampler -----------------------------------------------


@pytest.mark.parametrize("limit", [1, 4])
def test_num_predict_bounds_eval_count(client: ollama.Client, limit: int) -> None:
    options = {"temperature": 0, "num_predict": limit}
    chat = client.chat(model="default", messages=ASK, options=options)
    assert chat.eval_count == limit and chat.done_reason == "length"
    generated = client.generate(model="default", prompt=STORY, options=options)
    assert generated.eval_count == limit and generated.done_reason == "length"


@pytest.mark.parametrize("limit", [-1, -2])
def test_num_predict_minus_one_and_two_are_no_limit(client: ollama.Client, limit: int) -> None:
    """-1: generate until the model stops; -2: until the context is full (Modelfile docs)."""
    reply = client.chat(
        model="default",
        messages=[{"role": "user", "content": "Say hi."}],
        options={"temperature": 0, "num_predict": limit},
    )
    assert reply.done and reply.eval_count is not None and reply.eval_count > 0
    assert reply.done_reason in ("stop", "length")


# Each Ollama option, the OpenAI route's field for the same sampler setting, and the
# options without it (which must sample something else, or the row proves nothing).
SEEDED = {"temperature": 1.0, "seed": 7}
MAPPED: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = [
    ({"repeat_penalty": 1.5}, {"repetition_penalty": 1.5}, {}),
    # repeat_last_n 0 turns the penalties off (Ollama's reading); -1: all tokens.
    ({"repeat_penalty": 1.5, "repeat_last_n": 0}, {}, {"repeat_penalty": 1.5}),
    ({"repeat_penalty": 1.5, "repeat_last_n": -1}, {"repetition_penalty": 1.5}, {}),
    ({"presence_penalty": 2.0}, {"presence_penalty": 2.0}, {}),
    ({"frequency_penalty": 2.0}, {"frequency_penalty": 2.0}, {}),
    (SEEDED, SEEDED, {"temperature": 1.0, "seed": 8}),
    ({**SEEDED, "top_k": 3}, {**SEEDED, "top_k": 3}, SEEDED),
    ({**SEEDED, "top_p": 0.5}, {**SEEDED, "top_p": 0.5}, SEEDED),
    ({**SEEDED, "min_p": 0.3}, {**SEEDED, "min_p": 0.3}, SEEDED),
]


@pytest.mark.parametrize(
    ("options", "openai", "without"), MAPPED, ids=[str(o) for o, _, _ in MAPPED]
)
def test_each_option_reaches_the_sampler(
    client: ollama.Client,
    daemon: DaemonProcess,
    options: dict[str, Any],
    openai: dict[str, Any],
    without: dict[str, Any],
) -> None:
    reply = client.chat(model="default", messages=ASK, options={**GREEDY, **options})
    reference = openai_chat(daemon, ASK, **{"temperature": 0, "max_tokens": 24, **openai})
    assert reply.message.content == reference["choices"][0]["message"]["content"]
    other = client.chat(model="default", messages=ASK, options={**GREEDY, **without})
    assert reply.message.content != other.message.content  # the option changed the sample


def test_repeat_last_n_narrows_what_the_penalty_sees(client: ollama.Client) -> None:
    penalised = {**GREEDY, "repeat_penalty": 2.0, "frequency_penalty": 1.0}
    whole = client.chat(model="default", messages=ASK, options=penalised).message.content
    last_one = {**penalised, "repeat_last_n": 1}
    narrow = client.chat(model="default", messages=ASK, options=last_one).message.content
    assert narrow != whole


def test_a_repeat_last_n_below_minus_one_is_a_400(daemon: DaemonProcess) -> None:
    body = {"model": "default", "prompt": "Hi", "stream": False,
            "options": {"repeat_last_n": -2}}  # fmt: skip
    reply = httpx.post(f"{daemon.base_url}/api/generate", json=body, timeout=60)
    assert reply.status_code == 400 and "repeat_last_n" in reply.json()["error"]


def test_top_k_one_is_greedy(client: ollama.Client) -> None:
    greedy = client.chat(model="default", messages=ASK, options=GREEDY).message.content
    hot = {"num_predict": 24, "temperature": 1.0, "seed": 11}
    sampled = client.chat(model="default", messages=ASK, options=hot).message.content
    top_one = client.chat(model="default", messages=ASK, options={**hot, "top_k": 1})
    assert sampled != greedy
    assert top_one.message.content == greedy


def test_the_same_seed_reproduces_sampled_text(client: ollama.Client) -> None:
    def sample(seed: int) -> str:
        options = {"temperature": 1.0, "seed": seed, "num_predict": 16}
        return client.generate(model="default", prompt="Tell me a joke.", options=options).response

    first, again = sample(7), sample(7)
    assert first == again
    assert len({first, sample(1), sample(2), sample(3)}) > 1  # the seed is what fixed it


def test_stop_sequences_end_the_text_before_them(
    client: ollama.Client, daemon: DaemonProcess
) -> None:
    text = client.chat(model="default", messages=ASK, options=GREEDY).message.content or ""
    words = text.split()
    word = words[len(words) // 2]
    cut = text.index(word)
    assert cut > 0
    for stop in ([word], [word, "never-in-this-text"]):
        reply = client.chat(model="default", messages=ASK, options={**GREEDY, "stop": stop})
        assert reply.message.content == text[:cut]
        assert reply.done_reason == "stop"
    reference = openai_chat(daemon, ASK, temperature=0, max_tokens=24, stop=[word])
    assert reference["choices"][0]["message"]["content"] == text[:cut]


def test_num_ctx_is_accepted(client: ollama.Client) -> None:
    reply = client.chat(model="default", messages=ASK, options={**GREEDY, "num_ctx": 2048})
    assert reply.eval_count == 24


# --- generate ----------------------------------------------------------------------------


def test_generate_streamed_and_not(client: ollama.Client, daemon: DaemonProcess) -> None:
    whole = client.generate(model="default", prompt=STORY, options=GREEDY)
    parts = list(client.generate(model="default", prompt=STORY, options=GREEDY, stream=True))
    assert len(parts) > 2
    assert "".join(p.response or "" for p in parts) == whole.response
    assert parts[-1].done and parts[-1].eval_count == whole.eval_count == 24
    raw = post(daemon, "/api/generate", {"model": "default", "prompt": STORY, "options": GREEDY})
    objects = ndjson(raw)
    check_generate_stream(objects, model="default")
    assert streamed_text(objects, "response") == whole.response
    single = post(
        daemon,
        "/api/generate",
        {"model": "default", "prompt": STORY, "options": GREEDY, "stream": False},
    )
    assert single.headers["content-type"].startswith("application/json")
    validate_ollama("GenerateResponse", single.json())
    check_final(single.json())
    assert single.json()["response"] == whole.response


def test_generate_is_a_templated_user_turn_and_raw_is_not(
    client: ollama.Client, daemon: DaemonProcess
) -> None:
    templated = client.generate(model="default", prompt=STORY, options=GREEDY)
    chat = openai_chat(daemon, ASK, temperature=0, max_tokens=24)
    assert templated.prompt_eval_count == chat["usage"]["prompt_tokens"]
    assert templated.response == chat["choices"][0]["message"]["content"]
    raw = client.generate(model="default", prompt="The capital of France is", raw=True,
                          options={"temperature": 0, "num_predict": 5})  # fmt: skip
    completion = openai_text(daemon, "The capital of France is", temperature=0, max_tokens=5)
    assert raw.prompt_eval_count == completion["usage"]["prompt_tokens"]
    assert raw.response == completion["choices"][0]["text"]
    assert raw.prompt_eval_count is not None and templated.prompt_eval_count is not None
    assert raw.prompt_eval_count < templated.prompt_eval_count


def test_generate_system_replaces_the_system_turn(
    client: ollama.Client, daemon: DaemonProcess
) -> None:
    system = "You are a pirate. Answer like one."
    reply = client.generate(model="default", prompt=STORY, system=system, options=GREEDY)
    messages = [{"role": "system", "content": system}, *ASK]
    reference = openai_chat(daemon, messages, temperature=0, max_tokens=24)
    assert reply.prompt_eval_count == reference["usage"]["prompt_tokens"]
    assert reply.response == reference["choices"][0]["message"]["content"]


def test_chat_system_and_history_are_rendered(client: ollama.Client, daemon: DaemonProcess) -> None:
    history = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        *ASK,
    ]
    reply = client.chat(model="default", messages=history, options=GREEDY)
    reference = openai_chat(daemon, history, temperature=0, max_tokens=24)
    assert reply.prompt_eval_count == reference["usage"]["prompt_tokens"]
    assert reply.message.content == reference["choices"][0]["message"]["content"]


def test_suffix_on_a_model_without_fill_in_the_middle_is_400(client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as caught:
        client.generate(model="default", prompt="def f(", suffix="    return x")
    assert caught.value.status_code == 400


# --- keep_alive: loading and unloading -------------------------------------------------


def spare_state(daemon: DaemonProcess) -> str:
    return next(b["state"] for b in status(daemon)["models"] if b["model"] == "spare")


def spare_in_ps(client: ollama.Client) -> bool:
    return any(base_name(m.model or "") == "spare" for m in client.ps().models)


def wait_unloaded(client: ollama.Client, daemon: DaemonProcess) -> None:
    wait_for(lambda: spare_state(daemon) == "not_loaded", 60, "spare to unload")
    assert not spare_in_ps(client)


def test_keep_alive_zero_unloads_the_model_after_the_request(
    client: ollama.Client, daemon: DaemonProcess
) -> None:
    reply = client.chat(model="spare", messages=ASK, options={"num_predict": 2})
    assert reply.eval_count == 2
    assert spare_state(daemon) == "running" and spare_in_ps(client)
    last = client.chat(model="spare", messages=ASK, options={"num_predict": 2}, keep_alive=0)
    assert last.eval_count == 2 and last.message.content  # answered first, then unloaded
    wait_unloaded(client, daemon)
    again = client.generate(model="spare", prompt="Hi", options={"num_predict": 1})
    assert again.eval_count == 1  # a later request loads it again
    assert spare_in_ps(client)
    client.generate(model="spare", prompt="Hi", options={"num_predict": 1}, keep_alive="0s")
    wait_unloaded(client, daemon)


def test_an_empty_generate_loads_and_with_keep_alive_zero_unloads(
    client: ollama.Client, daemon: DaemonProcess
) -> None:
    client.generate(model="spare", prompt="", keep_alive=0)
    wait_unloaded(client, daemon)
    loaded = client.generate(model="spare", prompt="")
    assert loaded.done and loaded.response == ""
    assert not loaded.eval_count  # nothing generated
    assert spare_state(daemon) == "running" and spare_in_ps(client)
    unloaded = client.generate(model="spare", prompt="", keep_alive=0)
    assert unloaded.done and unloaded.done_reason == "unload" and unloaded.response == ""
    wait_unloaded(client, daemon)


def test_an_empty_chat_loads_and_with_keep_alive_zero_unloads(
    client: ollama.Client, daemon: DaemonProcess
) -> None:
    client.chat(model="spare", messages=[], keep_alive=0)
    wait_unloaded(client, daemon)
    raw = post(daemon, "/api/chat", {"model": "spare", "messages": []})
    assert raw.status_code == 200, raw.text
    # One object, streamed or not (ollama-api.md, "Load a model").
    body = raw.json() if "json" in raw.headers["content-type"] else ndjson(raw)[-1]
    assert body["done"] is True and body["done_reason"] == "load", body
    assert body["message"] == {"role": "assistant", "content": ""}, body
    assert spare_state(daemon) == "running"
    unloaded = client.chat(model="spare", messages=[], keep_alive=0)
    assert unloaded.done_reason == "unload"
    wait_unloaded(client, daemon)


@pytest.mark.parametrize("keep_alive", ["5m", "1h30m", "10s", 300, 300.5, "-1m", -1])
def test_keep_alive_durations_are_accepted(client: ollama.Client, keep_alive: Any) -> None:
    reply = client.chat(
        model="spare", messages=ASK, options={"num_predict": 1}, keep_alive=keep_alive
    )
    assert reply.eval_count == 1


@pytest.mark.parametrize("keep_alive", ["1h30m", "2h45m30s", "1m30.5s", "1.5h", "300ms"])
def test_keep_alive_takes_go_durations(client: ollama.Client, keep_alive: str) -> None:
    """Ollama parses keep_alive with Go's time.ParseDuration: units may be combined."""
    loaded = client.generate(model="spare", prompt="", keep_alive=keep_alive)
    assert loaded.done_reason == "load"


def test_keep_alive_zero_unloads_the_embedding_model(
    client: ollama.Client, daemon: DaemonProcess
) -> None:
    def state() -> str:
        return next(b["state"] for b in status(daemon)["models"] if b["model"] == EMBED)

    assert len(client.embed(model=EMBED, input="Hi").embeddings) == 1
    assert state() == "running"
    assert len(client.embed(model=EMBED, input="Hi", keep_alive=0).embeddings) == 1
    wait_for(lambda: state() == "not_loaded", 60, "the embedding model to unload")
    assert len(client.embed(model=EMBED, input="Hi").embeddings) == 1  # loads again


def test_keep_alive_sets_when_ps_says_the_model_expires(client: ollama.Client) -> None:
    client.chat(model="spare", messages=ASK, options={"num_predict": 1}, keep_alive="1h")
    entry = next(m for m in client.ps().models if base_name(m.model or "") == "spare")
    assert entry.expires_at is not None
    left = entry.expires_at - datetime.now(UTC)
    assert timedelta(minutes=50) < left <= timedelta(hours=1), left
    client.chat(model="spare", messages=ASK, options={"num_predict": 1}, keep_alive=-1)
    entry = next(m for m in client.ps().models if base_name(m.model or "") == "spare")
    assert entry.expires_at is not None  # never: Ollama shows a time far ahead
    assert entry.expires_at - datetime.now(UTC) > timedelta(days=365)


# --- structured outputs ------------------------------------------------------------------


class City(BaseModel):
    model_config = ConfigDict(extra="forbid")  # additionalProperties: false in the schema

    name: str = Field(min_length=1, max_length=16)
    country: str = Field(min_length=1, max_length=16)
    population: int = Field(ge=0, le=10**8)
    capital: bool


HOT = {"temperature": 1.0, "seed": 1234, "num_predict": 128}  # the grammar, not luck


def test_format_schema_from_a_pydantic_model(client: ollama.Client) -> None:
    ask = [{"role": "user", "content": "Describe Paris as JSON."}]
    schema = City.model_json_schema()
    reply = client.chat(model="default", messages=ask, format=schema, options=HOT)
    assert reply.done_reason == "stop", reply.message.content
    City.model_validate_json(reply.message.content or "")
    generated = client.generate(
        model="default", prompt="Describe Paris as JSON.", format=schema, options=HOT
    )
    City.model_validate_json(generated.response)
    parts = list(client.chat(model="default", messages=ask, format=schema, options=HOT,
                             stream=True))  # fmt: skip
    assert len(parts) > 3
    City.model_validate_json("".join(p.message.content or "" for p in parts))


def test_format_json_is_an_object(client: ollama.Client) -> None:
    ask = [{"role": "user", "content": "Answer in JSON."}]

    def sample(seed: int) -> Any:
        options = {"temperature": 1.0, "seed": seed, "num_predict": 64}
        return client.chat(model="default", messages=ask, format="json", options=options)

    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(sample, range(4)))
    # Any object is allowed, so one may run past num_predict; those that end must parse.
    assert all((r.message.content or "").lstrip().startswith("{") for r in replies)
    ended = [r for r in replies if r.done_reason == "stop"]
    assert ended and all(isinstance(json.loads(r.message.content), dict) for r in ended)


def test_an_invalid_format_schema_is_400(daemon: DaemonProcess) -> None:
    body = {"model": "default", "messages": ASK, "format": {"type": "not-a-type"}}
    check_error(post(daemon, "/api/chat", body), 400)


# --- tools and thinking (the replayed reply) ---------------------------------------------


def test_tool_calls_come_back_with_arguments_as_objects(
    client: ollama.Client, daemon: DaemonProcess
) -> None:
    reply = client.chat(model="replay", messages=WEATHER_ASK, tools=TOOLS,
                        options={"num_predict": 120})  # fmt: skip
    calls = reply.message.tool_calls or []
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == CALLS
    assert (reply.message.content or "").endswith("Let me check.")
    assert "<tool_call>" not in (reply.message.content or "")
    assert reply.done_reason == "stop"  # what Ollama sends after tool calls
    raw = post(daemon, "/api/chat", {"model": "replay", "messages": WEATHER_ASK, "tools": TOOLS,
                                     "stream": False})  # fmt: skip
    body = raw.json()
    validate_ollama("ChatResponse", body)
    for call in body["message"]["tool_calls"]:
        validate_ollama("ToolCall", call)
        assert isinstance(call["function"]["arguments"], dict), call


def test_streamed_tool_calls_arrive_whole(client: ollama.Client, daemon: DaemonProcess) -> None:
    parts = list(client.chat(model="replay", messages=WEATHER_ASK, tools=TOOLS, stream=True))
    calls = [c for p in parts for c in (p.message.tool_calls or [])]
    # Ollama sends each call in one object, its arguments already whole.
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == CALLS
    assert "".join(p.message.content or "" for p in parts).endswith("Let me check.")
    assert all(len(p.message.tool_calls or []) <= 2 for p in parts) and parts[-1].done
    raw = post(daemon, "/api/chat", {"model": "replay", "messages": WEATHER_ASK, "tools": TOOLS})
    check_chat_stream(ndjson(raw), model="replay")


def get_weather(city: str, unit: str) -> str:
    """Get the current weather in a city.

    Args:
      city: The name of the city
      unit: celsius or fahrenheit
    """
    return f"21 degrees {unit} in {city}"


def get_time(zone: str) -> str:
    """Get the current time in a time zone.

    Args:
      zone: An IANA time zone name
    """
    return f"noon in {zone}"


def test_python_functions_as_tools_and_the_result_round_trip(client: ollama.Client) -> None:
    """The client turns functions into tool schemas; the calls it gets back are run and
    their results sent as `tool` messages with `tool_name`, then rendered in the prompt."""
    messages: list[Any] = [*WEATHER_ASK]
    reply = client.chat(model="replay", messages=messages, tools=[get_weather, get_time])
    calls = reply.message.tool_calls or []
    assert [c.function.name for c in calls] == ["get_weather", "get_time"]
    functions = {"get_weather": get_weather, "get_time": get_time}
    messages.append(reply.message)
    for call in calls:
        result = functions[call.function.name](**call.function.arguments)
        messages.append({"role": "tool", "content": result, "tool_name": call.function.name})
    options = {"num_predict": 1}
    tools = [get_weather, get_time]
    short = client.chat(model="replay", messages=WEATHER_ASK, options=options, tools=tools)
    longer = client.chat(model="replay", messages=messages, options=options, tools=tools)
    assert longer.prompt_eval_count is not None and short.prompt_eval_count is not None
    assert longer.prompt_eval_count > short.prompt_eval_count + 10


def test_think_returns_the_thinking_apart(client: ollama.Client) -> None:
    reply = client.chat(model="replay", messages=WEATHER_ASK, think=True)
    assert reply.message.thinking == THOUGHT
    assert (reply.message.content or "").startswith("Let me check.")
    assert "<think>" not in (reply.message.content or "")
    parts = list(client.chat(model="replay", messages=WEATHER_ASK, think=True, tools=TOOLS,
                             stream=True))  # fmt: skip
    kinds = [
        kind
        for p in parts
        for kind, text in (("thinking", p.message.thinking), ("content", p.message.content))
        if text
    ]
    assert "thinking" in kinds and "content" in kinds
    assert kinds.index("content") > max(i for i, k in enumerate(kinds) if k == "thinking")
    assert "".join(p.message.thinking or "" for p in parts) == THOUGHT
    assert [c.function.name for p in parts for c in (p.message.tool_calls or [])] == [
        name for name, _ in CALLS
    ]
    generated = client.generate(model="replay", prompt=QUESTION, think=True)
    assert generated.thinking == THOUGHT
    assert generated.response.startswith("Let me check.")


def test_think_on_a_model_without_a_reasoning_parser_is_400(client: ollama.Client) -> None:
    """Ollama refuses `think` for a model that cannot think ("does not support thinking")."""
    for call in (
        lambda: client.chat(model="default", messages=ASK, think=True),
        lambda: client.chat(model="default", messages=ASK, think="high"),
        lambda: client.generate(model="default", prompt=STORY, think=True),
    ):
        with pytest.raises(ollama.ResponseError) as caught:
            call()
        assert caught.value.status_code == 400
    # Turning thinking off asks for no capability: always fine.
    reply = client.chat(model="default", messages=ASK, think=False, options={"num_predict": 1})
    assert reply.eval_count == 1 and not reply.message.thinking


def test_tools_on_a_model_without_a_tool_parser_are_400(client: ollama.Client) -> None:
    """Ollama refuses tools for a model whose capabilities (/api/show) lack "tools"
    ("does not support tools"), as it refuses `think` without "thinking": the client
    learns it at once instead of getting the calls back as text."""
    assert "tools" not in (client.show("default").capabilities or [])
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(model="default", messages=ASK, tools=TOOLS)
    assert caught.value.status_code == 400


# --- embeddings --------------------------------------------------------------------------


def cosine(a: Any, b: Any) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_embed_one_and_many_match_the_reference(
    client: ollama.Client, daemon: DaemonProcess
) -> None:
    one = client.embed(model=EMBED, input=ITEMS[0]["text"])
    assert len(one.embeddings) == 1 and len(one.embeddings[0]) == 384
    assert cosine(one.embeddings[0], ITEMS[0]["embedding"]) > 0.999
    items = ITEMS[:3]
    many = client.embed(model=EMBED, input=[item["text"] for item in items])
    assert len(many.embeddings) == 3
    for vector, item in zip(many.embeddings, items, strict=True):
        assert cosine(vector, item["embedding"]) > 0.999
        assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-3)  # /api/embed normalizes
    assert many.prompt_eval_count == sum(len(item["token_ids"]) for item in items)
    raw = post(daemon, "/api/embed", {"model": EMBED, "input": [ITEMS[0]["text"]]})
    validate_ollama("EmbedResponse", raw.json())
    assert raw.json()["model"] == EMBED


def test_embed_truncates_unless_told_not_to(client: ollama.Client) -> None:
    cut = client.embed(model=EMBED, input=["short", LONG_TEXT])
    assert len(cut.embeddings) == 2
    assert cut.prompt_eval_count == 3 + 256  # [CLS] short [SEP], and the model's 256
    with pytest.raises(ollama.ResponseError) as caught:
        client.embed(model=EMBED, input=["short", LONG_TEXT], truncate=False)
    assert caught.value.status_code == 400


def test_legacy_embeddings_route(client: ollama.Client, daemon: DaemonProcess) -> None:
    legacy = client.embeddings(model=EMBED, prompt=ITEMS[1]["text"])
    assert len(legacy.embedding) == 384
    assert cosine(legacy.embedding, ITEMS[1]["embedding"]) > 0.999
    raw = post(daemon, "/api/embeddings", {"model": EMBED, "prompt": ITEMS[1]["text"]})
    assert raw.status_code == 200
    assert set(raw.json()) == {"embedding"} and isinstance(raw.json()["embedding"], list)


def test_chat_and_embedding_models_refuse_each_other(client: ollama.Client) -> None:
    for call in (
        lambda: client.embed(model="default", input="Hi"),
        lambda: client.chat(model=EMBED, messages=ASK),
        lambda: client.generate(model=EMBED, prompt="Hi"),
    ):
        with pytest.raises(ollama.ResponseError) as caught:
            call()
        assert caught.value.status_code == 400, caught.value


# --- model management: models come from the YAML file ------------------------------------


def test_model_management_is_refused_in_ollama_shape(
    client: ollama.Client, daemon: DaemonProcess
) -> None:
    calls = [
        lambda: client.pull("llama3.2"),
        lambda: list(client.pull("llama3.2", stream=True)),
        lambda: client.push("someone/model"),
        lambda: client.create(model="mario", from_="default", system="You are Mario."),
        lambda: client.copy("default", "default-copy"),
        lambda: client.delete("default"),
    ]
    for call in calls:
        with pytest.raises(ollama.ResponseError) as caught:
            call()
        assert 400 <= caught.value.status_code < 500, caught.value
        assert "config" in caught.value.error.lower(), caught.value.error
    for method, path, body in [
        ("POST", "/api/pull", {"model": "llama3.2"}),
        ("POST", "/api/push", {"model": "someone/model"}),
        ("POST", "/api/create", {"model": "mario", "from": "default"}),
        ("POST", "/api/copy", {"source": "default", "destination": "x"}),
        ("DELETE", "/api/delete", {"model": "default"}),
    ]:
        response = httpx.request(method, f"{daemon.base_url}{path}", json=body, timeout=30)
        check_error(response)
    names = {base_name(m.model or "") for m in client.list().models}
    assert "default" in names and "default-copy" not in names and "mario" not in names


def test_pulling_a_configured_model_loads_it(client: ollama.Client, daemon: DaemonProcess) -> None:
    client.generate(model="spare", prompt="", keep_alive=0)
    wait_for(lambda: spare_state(daemon) == "not_loaded", 60, "spare to unload")
    assert client.pull("spare").status == "success"
    assert spare_state(daemon) == "running" and spare_in_ps(client)
    progress = list(client.pull("spare:latest", stream=True))
    assert progress and progress[-1].status == "success"


# --- content types: Ollama's clients and curl -d --------------------------------------


def test_json_with_any_content_type_from_a_non_browser_client(daemon: DaemonProcess) -> None:
    """Ollama's reference posts with `curl -d`, which says form encoding."""
    body = json.dumps({"model": "default", "prompt": "Hi", "stream": False,
                       "options": {"num_predict": 1}}).encode()  # fmt: skip
    for content_type in ("application/x-www-form-urlencoded", "text/plain", None):
        headers = {"content-type": content_type} if content_type else {}
        response = httpx.post(
            f"{daemon.base_url}/api/generate", content=body, headers=headers, timeout=60
        )
        assert response.status_code == 200, (content_type, response.text)
        assert response.json()["eval_count"] == 1
    # A page in a browser sends Origin: without JSON (a CORS preflight), it is refused.
    refused = httpx.post(
        f"{daemon.base_url}/api/generate",
        content=body,
        headers={"content-type": "text/plain", "origin": "https://page.example"},
        timeout=60,
    )
    check_error(refused, 415)


# --- metrics ---------------------------------------------------------------------------


def test_api_requests_are_counted_like_every_other(
    client: ollama.Client, daemon: DaemonProcess
) -> None:
    model = {"model_name": CHAT_MODEL}
    before = scrape(daemon)
    parts = list(client.chat(model="default", messages=ASK, options=GREEDY, stream=True))
    final = parts[-1]
    route = {"route": "/api/chat", "method": "POST", "status": "2xx"}

    def counted() -> Samples | None:
        after = scrape(daemon)
        done = value(after, "vllm_mlx_http_requests_total", **route)
        return after if done == value(before, "vllm_mlx_http_requests_total", **route) + 1 else None

    after = wait_for(counted, 30, "the /api/chat request to be counted")

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("vllm:generation_tokens_total", **model) == final.eval_count
    assert delta("vllm:prompt_tokens_total", **model) == final.prompt_eval_count
    assert delta("vllm:request_success_total", finished_reason="length", **model) == 1


# --- concurrency -------------------------------------------------------------------------


def test_concurrent_streams_each_get_their_own_answer(client: ollama.Client) -> None:
    def one(seed: int) -> tuple[str, list[Any]]:
        options = {"temperature": 1.0, "seed": seed, "num_predict": 12}
        parts = list(client.chat(model="default", messages=ASK, options=options, stream=True))
        return "".join(p.message.content or "" for p in parts), parts

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, [1, 2, 3, 1]))
    for _, parts in results:
        assert parts[-1].done and parts[-1].eval_count == 12
    # Batched together, each request keeps its own seed.
    assert results[0][0] == results[3][0]
    assert len({text for text, _ in results}) > 1

"""API keys, rate limits, body limits and the server timeout on Ollama's /api/* routes,
with the official ollama client and plain HTTP: every refusal in Ollama's shape
({"error": "..."}), and a failure after a stream started as its last NDJSON object.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from tests.conftest import DaemonProcess, free_port, running
from tests.e2e.ops_support import live_ids, logged_statuses, open_raw_request, status, wait_for
from tests.support.ollama import check_error, ndjson

KEY = "sk-ollama-test"
ASK = [{"role": "user", "content": "Hi"}]
# Every /api route: method, path, a valid body.
ROUTES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("POST", "/api/chat", {"model": "default", "messages": ASK, "stream": False}),
    ("POST", "/api/generate", {"model": "default", "prompt": "Hi", "stream": False}),
    ("POST", "/api/embed", {"model": "default", "input": "Hi"}),
    ("POST", "/api/embeddings", {"model": "default", "prompt": "Hi"}),
    ("POST", "/api/show", {"model": "default"}),
    ("POST", "/api/pull", {"model": "default", "stream": False}),
    ("POST", "/api/push", {"model": "default"}),
    ("POST", "/api/create", {"model": "x", "from": "default"}),
    ("POST", "/api/copy", {"source": "default", "destination": "x"}),
    ("DELETE", "/api/delete", {"model": "default"}),
    ("GET", "/api/tags", None),
    ("GET", "/api/ps", None),
    ("GET", "/api/version", None),
]


# --- API keys ----------------------------------------------------------------------------


LONG = "The sea is calm tonight, the tide is full. " * 600  # thousands of tokens


def long_model(directory: Path) -> dict[str, Any]:
    """The bundled model replayed into a reply of thousands of tokens: at any speed it
    outlasts a short server timeout, and its first tokens come long before it."""
    script = directory / "long.json"
    script.write_text(json.dumps({"base": "builtin:smollm2-135m-instruct", "text": LONG}))
    return {"name": "long", "source": f"replay:{script}"}


@pytest.fixture(scope="module")
def keyed(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path
) -> Iterator[DaemonProcess]:
    directory = tmp_path_factory.mktemp("ollama-keys")
    config = {
        "models": [
            {
                "name": "smollm2-135m-instruct",
                "source": "builtin:smollm2-135m-instruct",
                "aliases": ["default"],
            },
            long_model(directory),
        ],
        "auth": {"api_keys": [KEY]},
        "defaults": {"max_tokens": 8000},
        "ollama": {"listen": f"127.0.0.1:{free_port()}"},  # Ollama's port, elsewhere
    }
    with running(directory, model_cache_dir, config) as process:
        yield process


def ollama_port(daemon: DaemonProcess) -> str:
    """The second listener's base URL, from the config the daemon runs."""
    import yaml

    listen = yaml.safe_load(daemon.config_path.read_text())["ollama"]["listen"]
    return f"http://{listen}"


def send(
    daemon: DaemonProcess, method: str, path: str, body: Any, headers: dict[str, str] | None = None
) -> httpx.Response:
    content = None if body is None else json.dumps(body).encode()
    return httpx.request(
        method,
        f"{daemon.base_url}{path}",
        content=content,
        headers={"content-type": "application/json", **(headers or {})},
        timeout=120,
    )


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[p for _, p, _ in ROUTES])
@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"}],
    ids=["none", "wrong", "not-bearer"],
)
def test_every_api_route_refuses_a_missing_or_wrong_key(
    keyed: DaemonProcess, method: str, path: str, body: Any, headers: dict[str, str]
) -> None:
    message = check_error(send(keyed, method, path, body, headers), 401)
    assert "key" in message.lower(), message


def test_the_key_as_a_bearer_header_or_ollama_api_key(
    keyed: DaemonProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ollama.ResponseError) as caught:
        ollama.Client(host=keyed.base_url, timeout=60).list()
    assert caught.value.status_code == 401
    with_header = ollama.Client(
        host=keyed.base_url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120
    )
    reply = with_header.chat(model="default", messages=ASK, options={"num_predict": 2})
    assert reply.eval_count == 2
    parts = list(
        with_header.chat(model="default", messages=ASK, options={"num_predict": 2}, stream=True)
    )
    assert parts[-1].done and parts[-1].eval_count == 2
    monkeypatch.setenv("OLLAMA_API_KEY", KEY)  # the client's own way to send a key
    from_env = ollama.Client(host=keyed.base_url, timeout=60)
    assert "default:latest" in [m.model for m in from_env.list().models]


def test_leaving_a_stream_aborts_its_generation(keyed: DaemonProcess) -> None:
    """A client that goes away mid-stream (ollama-js's abort(), a closed app) frees the
    batch slot at once: the generation of thousands of tokens does not run on."""
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "long", "messages": ASK}
    sock = open_raw_request(keyed, "/api/chat", body, headers)
    try:
        received = b""
        while b'"done":false' not in received:  # the first object is out
            chunk = sock.recv(4096)
            assert chunk, received
            received += chunk
        running = wait_for(
            lambda: live_ids(status(keyed, headers), "generation"), 60, "the request to run"
        )
    finally:
        sock.close()
    [request_id] = running
    wait_for(
        lambda: (d := status(keyed, headers))["num_running"] == 0 and not d["requests"],
        60,
        "the slot to be free",
    )
    statuses = wait_for(
        lambda: (s := logged_statuses(keyed)).get(request_id) and s, 30, "the log line"
    )
    assert statuses[request_id] == 499


def test_the_root_probe_answers_without_a_key(keyed: DaemonProcess) -> None:
    """Clients probe the root before anything else (Ollama apps, uptime checks): GET and
    HEAD / answer 200 with keys set, and say only that the daemon runs."""
    response = httpx.get(keyed.base_url + "/", timeout=30)
    assert response.status_code == 200 and response.text == "Ollama is running"
    head = httpx.head(keyed.base_url + "/", timeout=30)
    assert head.status_code == 200 and head.content == b""
    # Nothing else opened with it.
    assert httpx.get(keyed.base_url + "/api/tags", timeout=30).status_code == 401
    assert httpx.get(keyed.base_url + "/v1/models", timeout=30).status_code == 401


def refusals(daemon: DaemonProcess) -> list[dict[str, Any]]:
    out = []
    for line in daemon.log_text().splitlines():
        if '"refused"' in line:
            with contextlib.suppress(json.JSONDecodeError):
                record = json.loads(line)
                if record.get("event") == "refused":
                    out.append(record)
    return out


def test_every_4xx_answer_is_one_log_line_without_body_or_key(keyed: DaemonProcess) -> None:
    secret = "sk-not-the-key-4242"
    url = keyed.base_url
    good = {"Authorization": f"Bearer {KEY}"}
    before = len(refusals(keyed))
    sent = [
        httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {secret}"}, timeout=30),
        httpx.post(
            f"{url}/v1/chat/completions",
            # Refused after the model is resolved: client templates are off by default.
            json={"model": "default", "messages": [{"role": "user", "content": secret}],
                  "chat_template": "{{ messages }}"},
            headers=good, timeout=30,
        ),
        httpx.post(
            f"{url}/v1/messages",
            json={"model": "nope", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]},
            headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"}, timeout=30,
        ),
        httpx.post(f"{url}/api/chat", json={"model": "default", "messages": [],
                   "keep_alive": "soon"}, headers=good, timeout=30),
        httpx.get(f"{url}/v1/no-such-route", headers=good, timeout=30),
    ]  # fmt: skip
    assert [r.status_code for r in sent] == [401, 400, 404, 400, 404]

    def logged() -> list[dict[str, Any]] | None:
        found = refusals(keyed)[before:]
        return found if len(found) >= len(sent) else None

    lines = wait_for(logged, 30, "the refusal log lines")
    assert [line["status"] for line in lines] == [401, 400, 404, 400, 404]
    by_status = {(line["status"], line["route"]): line for line in lines}
    chat = by_status[(400, "/v1/chat/completions")]
    assert chat["model"] == "default" and chat["error_type"] == "invalid_request_error"
    assert "chat_template" in chat["message"]
    assert by_status[(404, "/v1/messages")]["error_type"] == "not_found_error"
    assert "keep_alive" in by_status[(400, "/api/chat")]["message"]
    assert by_status[(401, "/v1/models")]["peer"] == "127.0.0.1"
    assert all(line["method"] in ("GET", "POST") and line["message"] for line in lines)
    # Neither the body nor a key, presented or configured, reaches the log.
    text = keyed.log_text()
    assert secret not in text and KEY not in text


# --- rate limits, body limits, the server timeout ----------------------------------------

KEYS = [f"key-{n}" for n in range(8)]
PER_MINUTE = 3
BODY_MB = 1
MAX_CHARS = 50_000
TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def limited(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path
) -> Iterator[DaemonProcess]:
    directory = tmp_path_factory.mktemp("ollama-limits")
    config = {
        "models": [{**long_model(directory), "aliases": ["default"]}],
        "auth": {"api_keys": KEYS, "rate_limit": PER_MINUTE},
        "limits": {"max_body_mb": BODY_MB, "max_prompt_chars": MAX_CHARS},
        "defaults": {"max_tokens": 8000},
        "server": {"timeout": TIMEOUT_S},
    }
    with running(directory, model_cache_dir, config) as process:
        yield process


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_over_the_rate_limit_is_a_429_with_retry_after(limited: DaemonProcess) -> None:
    for _ in range(PER_MINUTE):
        assert send(limited, "GET", "/api/tags", None, bearer(KEYS[0])).status_code == 200
    refused = send(limited, "GET", "/api/tags", None, bearer(KEYS[0]))
    check_error(refused, 429)
    assert int(refused.headers["retry-after"]) >= 1
    client = ollama.Client(host=limited.base_url, headers=bearer(KEYS[0]), timeout=60)
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(model="default", messages=ASK)
    assert caught.value.status_code == 429
    # Per client: another key is not held back.
    assert send(limited, "GET", "/api/version", None, bearer(KEYS[1])).status_code == 200


def test_a_body_over_the_limit_is_a_413(limited: DaemonProcess) -> None:
    text = "a" * (BODY_MB * 1024 * 1024 + 10)
    body = {"model": "default", "messages": [{"role": "user", "content": text}]}
    message = check_error(send(limited, "POST", "/api/chat", body, bearer(KEYS[2])), 413)
    assert "max_body_mb" in message, message


def test_text_over_max_prompt_chars_is_a_413(limited: DaemonProcess) -> None:
    body = {"model": "default", "prompt": "a" * (MAX_CHARS + 1), "stream": False}
    message = check_error(send(limited, "POST", "/api/generate", body, bearer(KEYS[3])), 413)
    assert "max_prompt_chars" in message, message


def test_a_timeout_before_the_reply_is_an_error_body(limited: DaemonProcess) -> None:
    body = {"model": "long", "messages": ASK, "stream": False}
    check_error(send(limited, "POST", "/api/chat", body, bearer(KEYS[4])), 504)


def test_a_timeout_mid_stream_is_a_last_object_with_error(limited: DaemonProcess) -> None:
    body = {"model": "long", "messages": ASK}
    response = send(limited, "POST", "/api/chat", body, bearer(KEYS[5]))
    assert response.status_code == 200  # the stream had started
    objects = ndjson(response)
    *parts, last = objects
    assert parts and all(p["done"] is False and p["message"]["content"] for p in parts)
    assert set(last) == {"error"} and isinstance(last["error"], str) and last["error"], last
    assert "".join(p["message"]["content"] for p in parts) in LONG


def test_the_client_raises_the_mid_stream_error(limited: DaemonProcess) -> None:
    client = ollama.Client(host=limited.base_url, headers=bearer(KEYS[6]), timeout=120)
    received: list[Any] = []
    with pytest.raises(ollama.ResponseError) as caught:
        for part in client.generate(model="long", prompt="Hi", stream=True):
            received.append(part)
    assert received and not any(p.done for p in received)
    assert caught.value.error


# --- the second listener (ollama.listen) ------------------------------------------------


def test_the_second_listener_serves_the_ollama_client(keyed: DaemonProcess) -> None:
    client = ollama.Client(host=ollama_port(keyed), headers={"Authorization": f"Bearer {KEY}"})
    reply = client.chat(model="default", messages=ASK, options={"num_predict": 2})
    assert reply.done and reply.eval_count == 2
    assert "default:latest" in [m.model for m in client.list().models]
    parts = list(client.generate(model="default", prompt="Hi", stream=True,
                                 options={"num_predict": 2}))  # fmt: skip
    assert parts[-1].done and parts[-1].eval_count == 2


def test_the_second_listener_serves_every_route_behind_the_same_keys(
    keyed: DaemonProcess,
) -> None:
    base = ollama_port(keyed)
    check_error(httpx.get(f"{base}/api/tags", timeout=30), 401)
    root = httpx.get(f"{base}/", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert root.status_code == 200 and root.text == "Ollama is running"
    # Ollama serves its OpenAI-compatible routes on its port too: so does this one.
    chat = httpx.post(
        f"{base}/v1/chat/completions",
        json={"model": "default", "messages": ASK, "max_tokens": 2},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=120,
    )
    assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] <= 2
    assert httpx.get(f"{base}/health", timeout=30).status_code == 200

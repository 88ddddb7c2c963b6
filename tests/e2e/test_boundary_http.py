"""The HTTP boundary against a real daemon: what a browser, a careless client or an
attacker can send, and what comes back (always the protocol's error shape, never a 5xx).
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import DaemonProcess, StartDaemon, running
from tests.e2e.ops_support import scrape, value

BODY_MB = 20
MAX_CHARS = 9_500_000
CHAT = {"model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
COMPLETION = {"model": "default", "prompt": "Hi", "max_tokens": 1}
MESSAGE = {"model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
JSON = {"content-type": "application/json"}
CACHED_LIST_BLOCK = {"type": "text", "text": "x", "cache_control": ["ephemeral"]}
CACHED_TOOL = {"name": "f", "input_schema": {"type": "object"}, "cache_control": 5}
TOOL_TURNS = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f"}]},
    {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "t1", "cache_control": "ephemeral"}],
    },
]


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path
) -> Iterator[DaemonProcess]:
    config = {
        "metrics": {"enabled": True},
        "server": {"allowed_hosts": ["llm.example.com"]},
        "limits": {"max_body_mb": BODY_MB, "max_prompt_chars": MAX_CHARS},
    }
    with running(tmp_path_factory.mktemp("boundary"), model_cache_dir, config) as process:
        yield process


def post(daemon: DaemonProcess, path: str, body: Any, **kwargs: Any) -> httpx.Response:
    headers = {**JSON, **kwargs.pop("headers", {})}
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(
        f"{daemon.base_url}{path}", content=content, headers=headers, timeout=120, **kwargs
    )


def assert_openai_error(response: httpx.Response, status: int, needle: str = "") -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["type"] and needle.lower() in error["message"].lower(), error


def assert_anthropic_error(
    response: httpx.Response, status: int, kind: str, needle: str = ""
) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    assert needle.lower() in body["error"]["message"].lower(), body


def assert_still_serves(daemon: DaemonProcess) -> None:
    response = post(daemon, "/v1/chat/completions", CHAT)
    assert response.status_code == 200, response.text


# --- browsers: content type and Host ---------------------------------------------------


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION), ("/v1/messages", MESSAGE)],
)
def test_json_bodies_need_a_json_content_type(
    daemon: DaemonProcess, path: str, body: dict[str, Any], content_type: str | None
) -> None:
    """A cross-origin page can POST text/plain without a CORS preflight; never JSON."""
    headers = {"content-type": content_type} if content_type else {}
    response = httpx.post(
        f"{daemon.base_url}{path}", content=json.dumps(body).encode(), headers=headers, timeout=60
    )
    if path == "/v1/messages":
        assert_anthropic_error(response, 415, "invalid_request_error", "application/json")
    else:
        assert_openai_error(response, 415, "application/json")


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON",
        "application/vnd.api+json",
    ],
)
def test_json_content_types_are_accepted(daemon: DaemonProcess, content_type: str) -> None:
    response = post(daemon, "/v1/completions", COMPLETION, headers={"content-type": content_type})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:8000", "127.0.0.1.evil.example", "llm.example.com.evil"]
)
def test_foreign_host_headers_are_refused(daemon: DaemonProcess, host: str) -> None:
    """DNS rebinding: a page whose name resolves to 127.0.0.1 still sends its own name."""
    for path, check in (
        ("/v1/chat/completions", lambda r: assert_openai_error(r, 403, "allowed_hosts")),
        (
            "/v1/messages",
            lambda r: assert_anthropic_error(r, 403, "permission_error", "allowed_hosts"),
        ),
    ):
        check(post(daemon, path, CHAT, headers={"host": host}))
    response = httpx.get(f"{daemon.base_url}/v1/models", headers={"host": host}, timeout=30)
    assert response.status_code == 403


@pytest.mark.parametrize(
    "host",
    ["localhost", "localhost:9", "127.0.0.1", "[::1]:8000", "LOCALHOST:1", "llm.example.com:443"],
)
def test_loopback_names_and_listed_hosts_are_served(daemon: DaemonProcess, host: str) -> None:
    response = httpx.get(f"{daemon.base_url}/v1/models", headers={"host": host}, timeout=30)
    assert response.status_code == 200, response.text


# --- bodies ------------------------------------------------------------------------------


def test_deeply_nested_json_is_a_400(daemon: DaemonProcess) -> None:
    deep = b'{"model": "default", "messages": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"
    assert_openai_error(post(daemon, "/v1/chat/completions", deep), 400, "nest")
    nested: Any = "x"
    for _ in range(500):
        nested = {"a": nested}
    body = {**CHAT, "chat_template_kwargs": {"deep": nested}}
    assert_openai_error(post(daemon, "/v1/chat/completions", body), 400, "nest")
    anthropic_deep = b'{"model": "default", "max_tokens": 1, "messages": ' + b"[" * 10_000
    anthropic_deep += b"]" * 10_000 + b"}"
    assert_anthropic_error(
        post(daemon, "/v1/messages", anthropic_deep), 400, "invalid_request_error", "nest"
    )
    assert_still_serves(daemon)


def _raw_exchange(daemon: DaemonProcess, head: bytes, chunks: Iterator[bytes]) -> bytes:
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=120) as sock:
        sock.sendall(head)
        try:
            for chunk in chunks:
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before the whole body was read: the answer is waiting
        data = b""
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            more = sock.recv(65536)
            if not more:
                break
            data += more
        return data


def test_body_over_the_limit_is_a_413(daemon: DaemonProcess) -> None:
    too_big = BODY_MB * 1024 * 1024 + 1
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{daemon.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {too_big}\r\n\r\n"
    ).encode()
    answer = _raw_exchange(daemon, head, iter(()))  # refused on the declared length alone
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"max_body_mb" in answer
    # Chunked: no length declared; counted while read.
    chunk = b"x" * (1024 * 1024)
    head = (
        f"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1:{daemon.port}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    framed = (b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(BODY_MB + 2))
    answer = _raw_exchange(daemon, head, framed)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    payload = json.loads(answer.split(b"\r\n\r\n", 1)[1].split(b"\r\n")[-1] or b"{}")
    assert payload.get("error", {}).get("type") == "request_too_large", answer[-300:]
    assert_still_serves(daemon)


def test_text_over_max_prompt_chars_is_a_413(daemon: DaemonProcess) -> None:
    body = {**COMPLETION, "prompt": "a" * (MAX_CHARS + 1)}
    assert_openai_error(post(daemon, "/v1/completions", body), 413, "max_prompt_chars")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {**COMPLETION, "prompt": "\ud800"}),
        ("/v1/completions", {**COMPLETION, "prompt": ["ok \udfff"]}),
        ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "\ud800"}]}),
        ("/v1/chat/completions", {**CHAT, "stop": ["\ud83d"]}),
    ],
)
def test_lone_surrogates_are_a_400(daemon: DaemonProcess, path: str, body: dict[str, Any]) -> None:
    # json.dumps writes \\ud800 escapes: exactly what an attacker sends.
    assert_openai_error(post(daemon, path, body), 400, "surrogate")


@pytest.mark.parametrize("key", ["²", "١٢", "9" * 5000, "-1", " 1", "1.0", ""])
def test_logit_bias_keys_must_be_plain_token_ids(daemon: DaemonProcess, key: str) -> None:
    body = {**CHAT, "logit_bias": {key: 1}}
    assert_openai_error(post(daemon, "/v1/chat/completions", body), 400, "logit_bias")


@pytest.mark.parametrize(
    ("path", "field", "bad"),
    [
        ("/v1/chat/completions", "stream", "yes"),
        ("/v1/chat/completions", "stream", 1),
        ("/v1/chat/completions", "parallel_tool_calls", "false"),
        ("/v1/chat/completions", "stream_options", {"include_usage": "true"}),
        ("/v1/chat/completions", "max_tokens", "5"),
        ("/v1/chat/completions", "temperature", "0.5"),
        ("/v1/chat/completions", "seed", 1.5),
        ("/v1/completions", "echo", "yes"),
        ("/v1/completions", "stream", 0),
    ],
)
def test_openai_fields_take_their_own_type_only(
    daemon: DaemonProcess, path: str, field: str, bad: Any
) -> None:
    base = COMPLETION if path == "/v1/completions" else CHAT
    response = post(daemon, path, {**base, field: bad})
    assert_openai_error(response, 400, field)
    assert response.json()["error"]["param"].startswith(field)


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"temperature": None}, "temperature"),
        ({"top_p": None}, "top_p"),
        ({"top_k": None}, "top_k"),
        ({"stream": "yes"}, "stream"),
        ({"max_tokens": "5"}, "max_tokens"),
        ({"messages": [{"role": "user", "content": ""}]}, "non-empty"),
        ({"messages": [{"role": "user", "content": []}]}, "non-empty"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]}, "text"),
        ({"system": [{"type": "text", "text": ""}]}, "system"),
        (
            {"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "x"}]},
            "non-empty",
        ),
        ({"tools": None}, "tools"),
        ({"system": [{"type": "text", "text": "x", "cache_control": "yes"}]}, "cache_control"),
        ({"messages": [{"role": "user", "content": [CACHED_LIST_BLOCK]}]}, "cache_control"),
        ({"cache_control": {"type": "forever"}}, "cache_control"),
        ({"tools": [CACHED_TOOL]}, "cache_control"),
        ({"messages": TOOL_TURNS}, "cache_control"),
        ({"system": [{"type": "text", "text": "x", "cache_control": True}]}, "cache_control"),
    ],
)
def test_anthropic_validation_is_as_strict_as_the_api(
    daemon: DaemonProcess, fields: dict[str, Any], needle: str
) -> None:
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        body = {**MESSAGE, **fields}
        if path.endswith("count_tokens") and set(fields) - {"messages", "system", "tools"}:
            continue  # count_tokens takes no sampling fields
        response = post(daemon, path, body)
        assert_anthropic_error(response, 400, "invalid_request_error", needle)


def test_a_completion_needs_a_prompt(daemon: DaemonProcess) -> None:
    body = {k: v for k, v in COMPLETION.items() if k != "prompt"}
    response = post(daemon, "/v1/completions", body)
    assert_openai_error(response, 400, "prompt")
    assert response.json()["error"]["param"] == "prompt"


def test_anthropic_final_assistant_turn_may_be_empty(daemon: DaemonProcess) -> None:
    body = {**MESSAGE, "messages": [*MESSAGE["messages"], {"role": "assistant", "content": ""}]}
    response = post(daemon, "/v1/messages", body)
    assert response.status_code == 200, response.text


# --- client templates ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {"chat_template_kwargs": {"chat_template": "{{ 'x' }}"}},
            "chat_template_kwargs.chat_template",
        ),
        ({"chat_template": "{% for i in range(10**9) %}{% endfor %}"}, "chat_template"),
    ],
)
def test_client_templates_are_refused_by_default(
    daemon: DaemonProcess, fields: dict[str, Any], param: str
) -> None:
    response = post(daemon, "/v1/chat/completions", {**CHAT, **fields})
    assert_openai_error(response, 400, "allow_client_chat_templates")
    assert response.json()["error"]["param"] == param


# --- the event loop ------------------------------------------------------------------


def test_a_huge_prompt_is_tokenised_off_the_event_loop(daemon: DaemonProcess) -> None:
    """While a 9 MB prompt is tokenised, /metrics and /health still answer.

    The preparing gauge is 1 only while the worker thread tokenises; a scrape that
    reads it proves the event loop answered during the tokenising.
    """
    body = {**COMPLETION, "prompt": "hello world " * 750_000}  # 9 MB
    done = threading.Event()
    result: list[httpx.Response] = []

    def big() -> None:
        try:
            result.append(post(daemon, "/v1/completions", body))
        finally:
            done.set()

    worker = threading.Thread(target=big)
    worker.start()
    seen_during: list[int] = []
    while not done.is_set():
        preparing = value(scrape(daemon), "vllm_mlx_prompts_preparing")
        if preparing >= 1 and not done.is_set():
            health = httpx.get(f"{daemon.base_url}/health", timeout=120)
            if not done.is_set():  # both answered while the big request was in flight
                seen_during.append(health.status_code)
                break
    worker.join()
    assert seen_during == [200]
    # Far past the context: refused, and only after tokenising it.
    assert_openai_error(result[0], 400, "context")
    assert value(scrape(daemon), "vllm_mlx_prompts_preparing") == 0


# --- small protocol defects ----------------------------------------------------------


def test_metrics_content_type_is_one_valid_header(daemon: DaemonProcess) -> None:
    response = httpx.get(f"{daemon.base_url}/metrics", timeout=30)
    content_type = response.headers["content-type"]
    params = [p.split("=", 1)[0].strip().lower() for p in content_type.split(";")[1:]]
    assert len(params) == len(set(params)), content_type
    assert content_type.split(";")[0] == "text/plain" and "charset" in params
    list(text_string_to_metric_families(response.text))


@pytest.mark.parametrize("path", ["/health", "/metrics"])
def test_head_answers_like_get_without_a_body(daemon: DaemonProcess, path: str) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=30)
    try:
        connection.request("HEAD", path)
        response = connection.getresponse()
        assert response.status == 200
        assert response.read() == b""
        head_type = response.getheader("content-type")
    finally:
        connection.close()
    get = httpx.get(f"{daemon.base_url}{path}", timeout=30)
    assert head_type == get.headers["content-type"]


@pytest.mark.parametrize(
    ("method", "path", "protocol"),
    [
        ("POST", "/v1/audio/speech", "openai"),
        ("POST", "/v1/images/generations", "openai"),
        ("GET", "/v1/files", "openai"),
        ("POST", "/v1/messages/batches", "anthropic"),
    ],
)
def test_unknown_api_paths_say_they_are_not_served(
    daemon: DaemonProcess, method: str, path: str, protocol: str
) -> None:
    response = httpx.request(
        method, f"{daemon.base_url}{path}", content=b"{}", headers=JSON, timeout=30
    )
    needle = f"{method} {path} is not served by this daemon"
    if protocol == "anthropic":
        assert_anthropic_error(response, 404, "not_found_error", needle)
    else:
        assert_openai_error(response, 404, needle)


def test_allowed_client_templates_are_used_and_time_bounded(start_daemon: StartDaemon) -> None:
    """With the key on, a client's template renders the prompt; a runaway one gets 413
    after limits.prompt_timeout, the daemon keeps serving, and SIGTERM still exits."""
    daemon = start_daemon(
        {"server": {"allow_client_chat_templates": True}, "limits": {"prompt_timeout": 3.0}}
    )
    own = "{% for m in messages %}{{ m.content }}{% endfor %}"
    plain = post(daemon, "/v1/chat/completions", CHAT).json()["usage"]["prompt_tokens"]
    bare = post(daemon, "/v1/chat/completions", {**CHAT, "chat_template": own})
    assert bare.status_code == 200, bare.text
    assert bare.json()["usage"]["prompt_tokens"] < plain  # no role markers: "Hi" alone
    runaway = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    kwargs = {"chat_template_kwargs": {"chat_template": runaway}}
    assert_openai_error(post(daemon, "/v1/chat/completions", {**CHAT, **kwargs}), 413, "timeout")
    assert_still_serves(daemon)
    assert daemon.stop(timeout=30) == 0  # the spinning worker thread does not hold the exit

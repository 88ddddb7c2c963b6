"""The boundary checks as pure functions: paths, Host, content types, text bounds."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from vllm_mlx.api.edge import boundary
from vllm_mlx.api.edge.body import MAX_DEPTH, check_text, parse_json
from vllm_mlx.api.errors import APIError
from vllm_mlx.api.openai.convert import template_kwargs
from vllm_mlx.api.openai.schema import ChatCompletionRequest
from vllm_mlx.api.pipeline.offload import off_loop
from vllm_mlx.config.settings import Settings


@pytest.mark.parametrize(
    ("raw", "routed"),
    [
        ("//v1/chat/completions", "/v1/chat/completions"),
        ("/v1//chat///completions/", "/v1/chat/completions"),
        ("/health/", "/health"),
        ("", "/"),
    ],
)
def test_route_path_is_what_the_router_matches(raw: str, routed: str) -> None:
    assert boundary.route_path(raw) == routed


def test_every_path_but_the_open_ones_needs_a_key() -> None:
    settings = Settings()
    closed = Settings(auth={"metrics_require_key": True})
    assert not boundary.needs_key("/health", settings)
    assert not boundary.needs_key("/", settings)  # the root probe says only "running"
    assert not boundary.needs_key("/metrics", settings)
    assert boundary.needs_key("/metrics", closed)
    for path in ("/v1/models", "/V1/models", "/./v1/models", "/anything", "/api", "/v1"):
        assert boundary.needs_key(path, settings), path


@pytest.mark.parametrize(
    ("host", "listen", "allowed", "ok"),
    [
        ("127.0.0.1:8000", "127.0.0.1", [], True),
        ("localhost", "127.0.0.1", [], True),
        ("[::1]:8000", "::1", [], True),
        (None, "127.0.0.1", [], True),
        ("evil.example", "127.0.0.1", [], False),
        ("evil.example:8000", "127.0.0.1", [], False),
        ("localhost.evil.example", "127.0.0.1", [], False),
        ("evil.example", "0.0.0.0", [], True),  # not loopback: any host unless listed
        ("evil.example", "0.0.0.0", ["llm.example.com"], False),
        ("LLM.example.com:8443", "0.0.0.0", ["llm.example.com"], True),
        ("llm.example.com:80", "0.0.0.0", ["llm.example.com:8443"], False),
        ("llm.example.com:8443", "127.0.0.1", ["llm.example.com:8443"], True),
        ("10.0.0.5:8000", "10.0.0.5", ["x"], True),  # the listen address itself
        ("anything", "127.0.0.1", ["*"], True),
    ],
)
def test_host_allowed(host: str | None, listen: str, allowed: list[str], ok: bool) -> None:
    assert boundary.host_allowed(host, listen, allowed) is ok


@pytest.mark.parametrize(
    ("content_type", "ok"),
    [
        ("application/json", True),
        ("application/json; charset=utf-8", True),
        ("APPLICATION/JSON", True),
        ("application/problem+json", True),
        ("text/plain", False),
        ("text/json", False),
        ("application/jsonx", False),
        ("multipart/form-data; boundary=x", False),
        ("", False),
        (None, False),
    ],
)
def test_is_json_type(content_type: str | None, ok: bool) -> None:
    assert boundary.is_json_type(content_type) is ok


def test_content_type_only_matters_for_bodies() -> None:
    assert boundary.content_type_refusal("GET", {}) is None
    refusal = boundary.content_type_refusal("POST", {"content-type": "text/plain"})
    assert refusal is not None and refusal.status == 415


def test_declared_length_over_the_limit() -> None:
    assert boundary.length_refusal({"content-length": "11"}, 10) is not None
    assert boundary.length_refusal({"content-length": "10"}, 10) is None
    assert boundary.length_refusal({"content-length": "²"}, 10) is None  # not a length


def test_check_text_bounds() -> None:
    check_text({"a": ["b" * 5, {"c": "d"}]}, max_chars=8)
    with pytest.raises(APIError) as too_much:
        check_text({"a": "x" * 10}, max_chars=5)
    assert too_much.value.status == 413
    with pytest.raises(APIError) as surrogate:
        check_text({"messages": [{"content": "ok \ud800"}]}, max_chars=100)
    assert surrogate.value.param == "messages[0].content"
    deep: Any = 1
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(APIError, match="nests deeper"):
        check_text({"a": deep}, max_chars=100)


@pytest.mark.parametrize(
    "raw", [b"[" * 100_000 + b"]" * 100_000, b'{"a": NaN}', b'{"a": Infinity}', b"\xff", b"[]"]
)
def test_parse_json_refusals_are_400(raw: bytes) -> None:
    with pytest.raises(APIError) as caught:
        parse_json(raw, 1000)
    assert caught.value.status == 400


def test_error_messages_never_carry_lone_surrogates() -> None:
    error = APIError(400, "bad key '\ud800'", param="x.\udc00")
    assert error.message.encode() and error.param is not None and error.param.encode()


def test_off_loop_runs_in_a_worker_and_bounds_time() -> None:
    release = threading.Event()

    async def main() -> None:
        name = await off_loop(lambda: threading.current_thread().name, limit_s=10)
        assert name.startswith("vllm-mlx-prepare")
        with pytest.raises(APIError) as caught:
            await off_loop(release.wait, 30, limit_s=0.05)
        assert caught.value.status == 413

    try:
        asyncio.run(main())
    finally:
        release.set()


def _chat(**fields: Any) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], **fields}
    return ChatCompletionRequest.model_validate(body)


def test_client_templates_need_the_config_key() -> None:
    own = {"chat_template": "{{ 'x' }}"}
    for request, param in (
        (_chat(chat_template_kwargs=own), "chat_template_kwargs.chat_template"),
        (_chat(**own), "chat_template"),
    ):
        with pytest.raises(APIError) as caught:
            template_kwargs(request, allow_templates=False)
        assert caught.value.param == param and "allow_client_chat_templates" in str(caught.value)
        assert template_kwargs(request, allow_templates=True) == own
    plain = _chat(chat_template_kwargs={"enable_thinking": False})
    assert template_kwargs(plain, allow_templates=False) == {"enable_thinking": False}


@pytest.mark.parametrize("host", ["", "llm.example.com ", "http://llm.example.com", "a@b"])
def test_allowed_hosts_entries_must_be_host_names(host: str) -> None:
    with pytest.raises(ValueError, match="host"):
        Settings(server={"allowed_hosts": [host]})

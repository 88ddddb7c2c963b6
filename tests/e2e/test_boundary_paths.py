"""Odd spellings of a path cannot skip the API key or the rate limit (real daemon, raw HTTP).

http.client sends the path exactly as given (curl --path-as-is), so `//v1/...` reaches
the server unnormalised, as an attacker would send it.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DaemonProcess, running

KEY, LIMITED_KEY = "sk-boundary-key", "sk-limited-key"
RATE = 3  # requests a minute per client
CHAT = {"model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
MESSAGES = {**CHAT, "max_tokens": 1}

# Spellings of real routes that a router (or a proxy) may take for the route itself.
ODD_PATHS = [
    "//v1/chat/completions",
    "///v1/chat/completions",
    "/v1//chat/completions",
    "/v1/chat//completions/",
    "/./v1/chat/completions",
    "/v1/./chat/completions",
    "/v1/%2Fchat/completions",
    "/%2Fv1/chat/completions",
    "/v1%2Fchat%2Fcompletions",
    "/V1/chat/completions",
    "/v1/chat/completions/",
    "//v1/messages",
    "//v1/messages/count_tokens",
    "//v1/completions",
    "//v1/models",
    "//v1/status",
    "/v1/models//default",
]


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path
) -> Iterator[DaemonProcess]:
    config = {"auth": {"api_keys": [KEY, LIMITED_KEY], "rate_limit": RATE}}
    with running(tmp_path_factory.mktemp("paths"), model_cache_dir, config) as process:
        yield process


def raw(
    daemon: DaemonProcess,
    method: str,
    path: str,
    body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any]]:
    connection = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=60)
    try:
        payload = json.dumps(body).encode() if body is not None else None
        sent = {"Content-Type": "application/json", **(headers or {})}
        connection.request(method, path, body=payload, headers=sent)
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        connection.close()


def _method_and_body(path: str) -> tuple[str, dict[str, Any] | None]:
    if "models" in path or "status" in path:
        return "GET", None
    return "POST", MESSAGES if "messages" in path else CHAT


@pytest.mark.parametrize("path", ODD_PATHS)
def test_odd_paths_need_the_key(daemon: DaemonProcess, path: str) -> None:
    method, body = _method_and_body(path)
    status, payload = raw(daemon, method, path, body)
    assert status == 401, (path, payload)
    # In the protocol's own shape, judged on the path the router matches.
    if "messages" in path:
        assert payload["type"] == "error" and payload["error"]["type"] == "authentication_error"
    else:
        assert payload["error"]["type"] == "authentication_error"


@pytest.mark.parametrize("path", ["//v1/chat/completions", "/v1//chat/completions/"])
def test_odd_paths_are_served_with_the_key(daemon: DaemonProcess, path: str) -> None:
    """The same spelling with a key reaches the route (the gate judged the right path)."""
    status, payload = raw(daemon, "POST", path, CHAT, {"Authorization": f"Bearer {KEY}"})
    assert status == 200, payload
    assert payload["object"] == "chat.completion"


def test_odd_paths_count_against_the_rate_limit(daemon: DaemonProcess) -> None:
    headers = {"Authorization": f"Bearer {LIMITED_KEY}"}
    statuses = [raw(daemon, "GET", "//v1/models", None, headers)[0] for _ in range(RATE)]
    assert statuses == [200] * RATE
    status, payload = raw(daemon, "GET", "/v1//models/", None, headers)
    assert status == 429, payload
    assert payload["error"]["type"] == "rate_limit_error"


def test_health_stays_open(daemon: DaemonProcess) -> None:
    for path in ("/health", "//health", "/health/"):
        status, payload = raw(daemon, "GET", path)
        assert status == 200 and payload["status"] == "ok", path

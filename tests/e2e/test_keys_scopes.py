"""Named keys against a real daemon: every scope x route pair, model lists per key, a
key's own rate limit, rotation by hot reload, and secrets kept out of logs, metrics and
/v1/status."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import DaemonProcess, running
from tests.e2e.ops_support import NO_EOS, wait_for
from vllm_mlx.config.auth import key_digest

MAIN = "smollm2-135m-instruct"
SPARE = "spare"
SECRETS = {
    "inference": "sk-test-inference-0c1f",
    "models": "sk-test-models-88aa",
    "mcp": "sk-test-mcp-31d2",
    "admin": "sk-test-admin-f00d",
}
LIMITED = "sk-test-limited-7e7e"  # inference, the spare model only
SLOW = "sk-test-slow-4b4b"  # inference, 2 requests a minute
FLAT = "sk-test-flat-9999"  # auth.api_keys: every scope
ROTATED = "sk-test-rotated-5a5a"


def _named(name: str, secret: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "key_sha256": key_digest(secret).hex(), **extra}


KEYS = [
    *(_named(f"{scope}-key", secret, scopes=[scope]) for scope, secret in SECRETS.items()),
    _named("limited", LIMITED, models=[SPARE]),
    _named("slow", SLOW, rate_limit={"requests_per_minute": 2}),
]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path) -> Iterator[Any]:
    config = {
        "models": [
            {"name": MAIN, "source": f"builtin:{MAIN}", "aliases": ["default"]},
            {"name": SPARE, "source": f"builtin:{MAIN}", "load": "on_demand"},
        ],
        "auth": {"api_keys": [FLAT], "keys": KEYS, "metrics_require_key": True},
        "metrics": {"enabled": True},
    }
    with running(tmp_path_factory.mktemp("keys"), model_cache_dir, config) as process:
        yield process


CHAT = {"model": MAIN, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
# Ollama's /api/chat ignores max_tokens: without num_predict it samples up to the default
# limit (1024 tokens), tens of seconds when the model does not stop early.
OLLAMA_CHAT = {**CHAT, "stream": False, "options": {"num_predict": 1}}
# (method, path, body, the scope it needs): a route of every family of each scope.
ROUTES: list[tuple[str, str, dict[str, Any] | None, str]] = [
    ("POST", "/v1/chat/completions", CHAT, "inference"),
    ("POST", "/v1/completions", {"model": MAIN, "prompt": "a", "max_tokens": 1}, "inference"),
    ("POST", "/v1/responses", {"model": MAIN, "input": "hi", "max_output_tokens": 16}, "inference"),
    ("POST", "/v1/messages", {**CHAT, "max_tokens": 1}, "inference"),
    ("POST", "/tokenize", {"model": MAIN, "prompt": "hello"}, "inference"),
    ("GET", "/v1/models", None, "inference"),
    ("POST", "/api/chat", OLLAMA_CHAT, "inference"),
    ("GET", "/api/tags", None, "inference"),
    ("POST", f"/v1/models/{MAIN}/load", None, "models"),
    ("POST", f"/v1/models/{SPARE}/unload", None, "models"),
    ("GET", "/v1/mcp/servers", None, "mcp"),
    ("POST", "/v1/mcp/execute", {"tool_name": "none__here", "arguments": {}}, "mcp"),
    ("GET", "/v1/status", None, "admin"),
    ("GET", "/v1/cache/stats", None, "admin"),
    ("GET", "/v1/usage", None, "admin"),
    ("GET", "/metrics", None, "admin"),
]


def _call(
    daemon: DaemonProcess, method: str, path: str, body: dict[str, Any] | None, key: str
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    if path.startswith("/v1/messages"):
        headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
    return httpx.request(
        method, f"{daemon.base_url}{path}", json=body, headers=headers, timeout=120
    )


def _error_message(response: httpx.Response, path: str) -> str:
    body = response.json()
    if path.startswith("/api/"):
        assert isinstance(body["error"], str)  # Ollama's shape
        return str(body["error"])
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and body["error"]["type"] == "permission_error"
        return str(body["error"]["message"])
    assert (
        body["error"]["code"] == "missing_scope"
    )  # OpenAI's type for a 403: invalid_request_error
    return str(body["error"]["message"])


@pytest.mark.parametrize("holder", [*SECRETS, "flat"])
@pytest.mark.parametrize(("method", "path", "body", "needed"), ROUTES)
def test_scope_matrix(
    daemon: DaemonProcess,
    holder: str,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    needed: str,
) -> None:
    key = FLAT if holder == "flat" else SECRETS[holder]
    response = _call(daemon, method, path, body, key)
    allowed = holder in ("flat", "admin", needed)
    if allowed:
        assert response.status_code not in (401, 403), response.text
        return
    assert response.status_code == 403, response.text
    message = _error_message(response, path)
    assert f"'{holder}-key'" in message and f"'{needed}' scope" in message
    assert key not in response.text


def test_a_key_sees_and_uses_only_its_models(daemon: DaemonProcess) -> None:
    listed = _call(daemon, "GET", "/v1/models", None, LIMITED).json()["data"]
    assert [card["id"] for card in listed] == [SPARE]
    tags = _call(daemon, "GET", "/api/tags", None, LIMITED).json()["models"]
    assert [m["name"] for m in tags] == [f"{SPARE}:latest"]
    refused = _call(daemon, "POST", "/v1/chat/completions", CHAT, LIMITED)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "model_not_allowed"
    assert f"'{MAIN}'" in refused.json()["error"]["message"]
    by_alias = _call(daemon, "POST", "/v1/chat/completions", {**CHAT, "model": "default"}, LIMITED)
    assert by_alias.status_code == 403
    anthropic = _call(daemon, "POST", "/v1/messages", CHAT, LIMITED)
    assert anthropic.status_code == 403 and anthropic.json()["error"]["type"] == "permission_error"
    ollama = _call(daemon, "POST", "/api/chat", OLLAMA_CHAT, LIMITED)
    assert ollama.status_code == 403 and MAIN in ollama.json()["error"]
    allowed = _call(daemon, "POST", "/v1/chat/completions", {**CHAT, "model": SPARE}, LIMITED)
    assert allowed.status_code == 200
    assert _call(daemon, "GET", "/v1/models", None, SECRETS["inference"]).json()["data"][0]["id"]


def test_a_key_has_its_own_rate_limit(daemon: DaemonProcess) -> None:
    for _ in range(2):
        assert _call(daemon, "GET", "/v1/models", None, SLOW).status_code == 200
    over = _call(daemon, "GET", "/v1/models", None, SLOW)
    assert over.status_code == 429 and int(over.headers["retry-after"]) >= 1
    assert _call(daemon, "GET", "/v1/models", None, SECRETS["inference"]).status_code == 200


def test_secrets_stay_out_of_logs_metrics_and_status(daemon: DaemonProcess) -> None:
    _call(daemon, "POST", "/v1/chat/completions", CHAT, SECRETS["inference"])
    _call(daemon, "POST", "/v1/mcp/execute", {"tool_name": "x"}, SECRETS["inference"])
    status = _call(daemon, "GET", "/v1/status", None, SECRETS["admin"]).text
    metrics = _call(daemon, "GET", "/metrics", None, SECRETS["admin"]).text
    log = daemon.log_text()
    for secret in [*SECRETS.values(), LIMITED, SLOW, FLAT]:
        for where, text in (("log", log), ("metrics", metrics), ("status", status)):
            assert secret not in text, f"a key is in the {where}"
            assert key_digest(secret).hex() not in text
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    refused = [e for e in lines if e.get("event") == "refused" and e.get("status") == 403]
    assert any(e.get("key") == "inference-key" for e in refused)  # names are logged
    served = [e for e in lines if e.get("event") == "request" and e.get("key") == "inference-key"]
    assert served


def _save(daemon: DaemonProcess, settings: dict[str, Any]) -> None:
    scratch = daemon.config_path.with_suffix(".tmp")
    scratch.write_text(yaml.safe_dump(settings, sort_keys=False))
    os.replace(scratch, daemon.config_path)


def test_a_key_rotated_by_hot_reload(daemon: DaemonProcess) -> None:
    """The old key is refused at once; the request it started finishes."""
    good = yaml.safe_load(daemon.config_path.read_text())
    old = SECRETS["inference"]
    # Long enough to outlast the reload (applied in about 0.4 s) many times over.
    body = {**CHAT, "max_tokens": 200, "logit_bias": NO_EOS, "stream": True}
    first_chunk, chunks = threading.Event(), []

    def stream() -> None:
        headers = {"Authorization": f"Bearer {old}"}
        with httpx.stream(
            "POST",
            f"{daemon.base_url}/v1/chat/completions",
            json=body,
            headers=headers,
            timeout=300,
        ) as response:
            for line in response.iter_lines():
                if line:
                    chunks.append(line)
                first_chunk.set()

    worker = threading.Thread(target=stream)
    worker.start()
    try:
        assert first_chunk.wait(120)
        keys = [k for k in good["auth"]["keys"] if k["name"] != "inference-key"]
        keys.append(_named("inference-key", ROTATED))
        _save(daemon, {**good, "auth": {**good["auth"], "keys": keys}})
        wait_for(
            lambda: _call(daemon, "GET", "/v1/models", None, ROTATED).status_code == 200,
            60,
            "the rotated key",
        )
        # Still generating after the rotation applied: it was in flight across it.
        running_now = _call(daemon, "GET", "/v1/status", None, SECRETS["admin"]).json()
        assert running_now["num_running"] >= 1
        assert _call(daemon, "GET", "/v1/models", None, old).status_code == 401
    finally:
        worker.join(timeout=300)
        _save(daemon, good)
    wait_for(
        lambda: _call(daemon, "GET", "/v1/models", None, old).status_code == 200, 60, "restore"
    )
    assert chunks[-1] == "data: [DONE]"
    last = json.loads(next(c for c in reversed(chunks) if '"finish_reason":"length"' in c)[6:])
    assert last["choices"][0]["finish_reason"] == "length"

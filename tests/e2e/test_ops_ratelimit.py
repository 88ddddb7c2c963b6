"""Rate limits, /metrics behind a key, and the server timeout, set by CLI flags."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import DaemonProcess, running
from tests.e2e.ops_support import NO_EOS, chat_body, scrape, value

KEYS = ("key-a", "key-b", "key-c", "key-d", "key-status")
PER_MINUTE = 2


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path
) -> Iterator[DaemonProcess]:
    args = [arg for key in KEYS for arg in ("--api-key", key)]
    args += ["--rate-limit", str(PER_MINUTE), "--enable-metrics", "--timeout", "1.5"]
    config = {"auth": {"metrics_require_key": True}}
    with running(
        tmp_path_factory.mktemp("ops-ratelimit"), model_cache_dir, config, args
    ) as process:
        yield process


def _models(daemon: DaemonProcess, key: str, **headers: str) -> httpx.Response:
    return httpx.get(f"{daemon.base_url}/v1/models", headers={"x-api-key": key, **headers})


def test_over_the_limit_is_a_429_with_retry_after(daemon: DaemonProcess) -> None:
    for _ in range(PER_MINUTE):
        assert _models(daemon, "key-a").status_code == 200
    refused = _models(daemon, "key-a")
    assert refused.status_code == 429
    assert int(refused.headers["retry-after"]) >= 1
    error = refused.json()["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded"
    # The limit is per client: another key is not held back by key-a's requests.
    assert _models(daemon, "key-d").status_code == 200


def test_reading_the_status_is_not_limited(daemon: DaemonProcess) -> None:
    """The status page polls /v1/status every 2 s: that must not spend a key's requests."""
    headers = {"x-api-key": "key-status"}
    for _ in range(3 * PER_MINUTE):
        assert httpx.get(f"{daemon.base_url}/v1/status", headers=headers).status_code == 200
    for _ in range(PER_MINUTE):
        assert _models(daemon, "key-status").status_code == 200
    assert _models(daemon, "key-status").status_code == 429
    assert httpx.get(f"{daemon.base_url}/v1/status").status_code == 401  # still needs a key


def test_anthropic_clients_get_their_shape(daemon: DaemonProcess) -> None:
    for _ in range(PER_MINUTE):
        assert _models(daemon, "key-b").status_code == 200
    refused = httpx.post(
        f"{daemon.base_url}/v1/messages",
        headers={"x-api-key": "key-b", "anthropic-version": "2023-06-01"},
        json={"model": "default", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]},
    )
    assert refused.status_code == 429
    assert refused.headers["retry-after"]
    body = refused.json()
    assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"


def test_metrics_can_require_the_key(daemon: DaemonProcess) -> None:
    assert httpx.get(f"{daemon.base_url}/metrics").status_code == 401
    samples = scrape(daemon, {"Authorization": "Bearer key-d"})
    assert value(samples, "vllm_mlx_rate_limited_requests_total") >= 2
    # /metrics is outside the rate limit: scraping never eats into a client's requests.
    for _ in range(PER_MINUTE + 1):
        scrape(daemon, {"Authorization": "Bearer key-d"})


def test_a_request_cannot_raise_the_server_timeout(daemon: DaemonProcess) -> None:
    # --timeout 1.5 bounds every request; asking for 600 s does not lift it, so a
    # generation of 4000 tokens ends in a 504.
    body = chat_body("Write a long essay.", 4000, logit_bias=NO_EOS, timeout=600)
    response = httpx.post(
        f"{daemon.base_url}/v1/chat/completions",
        json=body,
        headers={"Authorization": "Bearer key-c"},
        timeout=600,
    )
    assert response.status_code == 504
    assert response.json()["error"]["type"] == "timeout_error"

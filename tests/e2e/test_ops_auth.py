"""API keys and CORS against a real daemon, with both official SDKs and plain HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.conftest import DaemonProcess, running
from tests.e2e.ops_support import scrape, value

KEY, OTHER_KEY = "sk-test-0123456789", "second-key"
ORIGIN = "https://app.example"

# Every /v1 route, and the protocol whose error shape it answers in.
ROUTES = [
    ("GET", "/v1/models", "openai"),
    ("GET", "/v1/models/default", "openai"),
    ("POST", "/v1/chat/completions", "openai"),
    ("POST", "/v1/completions", "openai"),
    ("GET", "/v1/status", "openai"),
    ("POST", "/v1/messages", "anthropic"),
    ("POST", "/v1/messages/count_tokens", "anthropic"),
]


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path
) -> Iterator[DaemonProcess]:
    config = {
        "auth": {"api_keys": [KEY, OTHER_KEY]},
        "server": {"cors_origins": [ORIGIN]},
        "metrics": {"enabled": True},
    }
    with running(tmp_path_factory.mktemp("ops-auth"), model_cache_dir, config) as process:
        yield process


def _assert_shape(response: httpx.Response, protocol: str, status: int, kind: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    if protocol == "anthropic":
        assert body["type"] == "error" and body["error"]["type"] == kind
        assert body["error"]["message"]
    else:
        assert body["error"]["type"] == kind and body["error"]["message"]


@pytest.mark.parametrize(("method", "path", "protocol"), ROUTES)
@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"x-api-key": "wrong"},
        {"Authorization": f"Basic {KEY}"},
        {"Authorization": f"Bearer {KEY}x"},
    ],
    ids=["none", "wrong-bearer", "wrong-x-api-key", "not-bearer", "longer"],
)
def test_every_v1_route_refuses_a_missing_or_wrong_key(
    daemon: DaemonProcess, method: str, path: str, protocol: str, headers: dict[str, str]
) -> None:
    response = httpx.request(method, f"{daemon.base_url}{path}", headers=headers, json={})
    _assert_shape(response, protocol, 401, "authentication_error")


def test_anthropic_version_header_picks_the_anthropic_shape(daemon: DaemonProcess) -> None:
    response = httpx.get(
        f"{daemon.base_url}/v1/models", headers={"anthropic-version": "2023-06-01"}
    )
    _assert_shape(response, "anthropic", 401, "authentication_error")


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": f"Bearer {KEY}"},
        {"x-api-key": OTHER_KEY},
        {"authorization": f"bearer {KEY}"},
    ],
    ids=["bearer", "x-api-key", "lowercase"],
)
def test_both_header_forms_are_accepted(daemon: DaemonProcess, headers: dict[str, str]) -> None:
    assert httpx.get(f"{daemon.base_url}/v1/models", headers=headers).status_code == 200
    assert httpx.get(f"{daemon.base_url}/v1/status", headers=headers).status_code == 200


def test_openai_sdk_with_and_without_the_key(daemon: DaemonProcess) -> None:
    url = f"{daemon.base_url}/v1"
    wrong = openai.OpenAI(base_url=url, api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    right = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
    response = right.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    )
    assert response.usage is not None and response.usage.completion_tokens > 0


def test_anthropic_sdk_gets_its_own_authentication_error(daemon: DaemonProcess) -> None:
    client = anthropic.Anthropic(base_url=daemon.base_url, api_key="nope", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        client.messages.create(
            model="default", max_tokens=2, messages=[{"role": "user", "content": "Hi"}]
        )
    assert caught.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


def test_health_and_metrics_stay_open_and_count_refusals(daemon: DaemonProcess) -> None:
    assert httpx.get(f"{daemon.base_url}/health").status_code == 200
    before = scrape(daemon)  # no key: /metrics is open unless auth.metrics_require_key
    httpx.get(f"{daemon.base_url}/v1/models")
    httpx.get(f"{daemon.base_url}/v1/models", headers={"x-api-key": "wrong"})
    after = scrape(daemon)
    for reason in ("missing", "invalid"):
        name = "vllm_mlx_unauthorized_requests_total"
        assert value(after, name, reason=reason) == value(before, name, reason=reason) + 1


def test_cors_preflight_from_an_allowed_origin(daemon: DaemonProcess) -> None:
    headers = {
        "Origin": ORIGIN,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    response = httpx.options(f"{daemon.base_url}/v1/chat/completions", headers=headers)
    assert response.status_code == 204  # preflights carry no key and need none
    assert response.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in response.headers["access-control-allow-methods"]
    assert "authorization" in response.headers["access-control-allow-headers"]


def test_cors_preflight_from_another_origin_is_refused(daemon: DaemonProcess) -> None:
    headers = {"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}
    response = httpx.options(f"{daemon.base_url}/v1/chat/completions", headers=headers)
    assert response.status_code == 400
    assert "access-control-allow-origin" not in response.headers


@pytest.mark.parametrize("path", ["/v1/models", "/health", "/metrics"])
def test_cors_headers_on_every_route(daemon: DaemonProcess, path: str) -> None:
    allowed = httpx.get(f"{daemon.base_url}{path}", headers={"Origin": ORIGIN, "x-api-key": KEY})
    assert allowed.headers["access-control-allow-origin"] == ORIGIN
    other = httpx.get(f"{daemon.base_url}{path}", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers


def test_cors_headers_on_refusals_let_browsers_read_them(daemon: DaemonProcess) -> None:
    response = httpx.get(f"{daemon.base_url}/v1/models", headers={"Origin": ORIGIN})
    assert response.status_code == 401
    assert response.headers["access-control-allow-origin"] == ORIGIN

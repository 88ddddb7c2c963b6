"""API key checks, protocol detection and error shapes (api/auth.py), and CORS helpers."""

from __future__ import annotations

import pytest

from vllm_mlx.api.edge import cors
from vllm_mlx.api.edge.auth import (
    authenticate,
    is_api_path,
    matching_key,
    presented_keys,
    protocol_of,
    required_scope,
    scope_refusal,
)
from vllm_mlx.api.error_shapes import error_body
from vllm_mlx.api.errors import APIError
from vllm_mlx.config.auth import AuthSettings, key_digest

KEYS = ["alpha-key", "beta-key"]
FLAT = AuthSettings(api_keys=KEYS)


def test_both_header_forms_are_read() -> None:
    assert presented_keys({"authorization": "Bearer alpha-key"}) == ["alpha-key"]
    assert presented_keys({"authorization": "bearer  alpha-key "}) == ["alpha-key"]
    assert presented_keys({"x-api-key": "beta-key"}) == ["beta-key"]
    assert presented_keys({"authorization": "Bearer a", "x-api-key": "b"}) == ["a", "b"]
    assert presented_keys({"authorization": "Basic alpha-key"}) == []
    assert presented_keys({"authorization": "Bearer "}) == []


def test_matching_key_needs_an_exact_match() -> None:
    assert matching_key(["beta-key"], KEYS) == "beta-key"
    assert matching_key(["beta-ke"], KEYS) is None
    assert matching_key(["beta-keyy"], KEYS) is None
    assert matching_key(["BETA-KEY"], KEYS) is None
    assert matching_key(["wrong", "alpha-key"], KEYS) == "alpha-key"
    assert matching_key([], KEYS) is None


def test_authenticate_reasons() -> None:
    open_api = authenticate({}, AuthSettings())  # no keys configured: open
    assert open_api.refusal is None and open_api.principal is None
    missing = authenticate({}, FLAT)
    assert missing.reason == "missing" and missing.refusal is not None
    assert missing.refusal.status == 401 and missing.refusal.code == "missing_api_key"
    wrong = authenticate({"x-api-key": "nope"}, FLAT)
    assert wrong.reason == "invalid" and wrong.refusal is not None
    assert wrong.refusal.code == "invalid_api_key"
    ok = authenticate({"authorization": "Bearer beta-key"}, FLAT)
    assert ok.refusal is None and ok.principal is not None
    assert ok.principal.name == "api_keys[1]" and ok.principal.has("admin")  # every scope


def test_named_keys_carry_their_scopes_models_and_rate() -> None:
    auth = AuthSettings(
        api_keys=["flat-key"],
        keys=[
            {"name": "app", "key_sha256": key_digest("app-key").hex(), "models": ["default"]},
            {
                "name": "ops",
                "key_sha256": key_digest("ops-key").hex().upper(),  # any case
                "scopes": ["models", "mcp"],
                "rate_limit": {"requests_per_minute": 5},
            },
        ],
    )
    app = authenticate({"x-api-key": "app-key"}, auth).principal
    assert app is not None and app.name == "app" and app.scopes == {"inference"}
    assert app.may_use("smollm2", ["default"]) and not app.may_use("other")
    ops = authenticate({"authorization": "Bearer ops-key"}, auth).principal
    assert ops is not None and ops.requests_per_minute == 5 and not ops.has("inference")
    assert authenticate({"x-api-key": "ops-keyy"}, auth).refusal is not None  # exact only


@pytest.mark.parametrize(
    ("method", "path", "scope"),
    [
        ("POST", "/v1/chat/completions", "inference"),
        ("POST", "/v1/messages", "inference"),
        ("POST", "/v1/responses", "inference"),
        ("POST", "/v1/embeddings", "inference"),
        ("POST", "/tokenize", "inference"),
        ("POST", "/v1/rerank", "inference"),
        ("POST", "/v2/rerank", "inference"),
        ("POST", "/rerank", "inference"),
        ("POST", "/score", "inference"),
        ("GET", "/v1/models", "inference"),
        ("POST", "/api/chat", "inference"),
        ("POST", "/v1/models/default/load", "models"),
        ("POST", "/v1/models/org/name/unload", "models"),
        ("POST", "/v1/mcp/execute", "mcp"),
        ("GET", "/v1/mcp/tools", "mcp"),
        ("GET", "/v1/status", "admin"),
        ("GET", "/metrics", "admin"),
        ("DELETE", "/v1/cache", "admin"),
        ("GET", "/elsewhere", "admin"),  # deny by default
    ],
)
def test_required_scope(method: str, path: str, scope: str) -> None:
    assert required_scope(method, path) == scope


def test_a_scope_refusal_names_the_key_and_the_scope() -> None:
    auth = AuthSettings(keys=[{"name": "app", "key_sha256": key_digest("sk-s3cr3t").hex()}])
    app = authenticate({"x-api-key": "sk-s3cr3t"}, auth).principal
    assert app is not None
    refusal = scope_refusal(app, "POST", "/v1/mcp/execute")
    assert refusal is not None and refusal.status == 403 and refusal.code == "missing_scope"
    assert "'app'" in refusal.message and "'mcp'" in refusal.message
    assert "s3cr3t" not in refusal.message  # the secret is never echoed


@pytest.mark.parametrize(
    ("path", "headers", "protocol"),
    [
        ("/v1/messages", {}, "anthropic"),
        ("/v1/messages/count_tokens", {}, "anthropic"),
        ("/v1/models", {"anthropic-version": "2023-06-01"}, "anthropic"),
        ("/v1/models", {}, "openai"),
        ("/v1/chat/completions", {}, "openai"),
    ],
)
def test_protocol_of(path: str, headers: dict[str, str], protocol: str) -> None:
    assert protocol_of(path, headers) == protocol


def test_api_paths() -> None:
    assert is_api_path("/v1/models") and is_api_path("/v1")
    assert not is_api_path("/health") and not is_api_path("/v1x") and not is_api_path("/metrics")


def test_error_shapes() -> None:
    error = APIError(429, "slow down", "rate_limit", code="rate_limit_exceeded")
    assert error_body("anthropic", error) == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "slow down"},
    }
    body = error_body("openai", error)["error"]
    assert body["type"] == "rate_limit_error" and body["code"] == "rate_limit_exceeded"
    unauthorized = APIError(401, "no", "authentication")
    assert error_body("anthropic", unauthorized)["error"]["type"] == "authentication_error"
    assert error_body("openai", unauthorized)["error"]["type"] == "authentication_error"


def test_cors_origin_matching() -> None:
    allowed = ["https://app.example", "http://localhost:3000/"]
    assert cors.allowed_origin("https://app.example", allowed) == "https://app.example"
    assert cors.allowed_origin("http://localhost:3000", allowed) == "http://localhost:3000"
    assert cors.allowed_origin("https://evil.example", allowed) is None
    assert cors.allowed_origin(None, allowed) is None
    assert cors.allowed_origin("https://any.example", ["*"]) == "*"
    assert cors.allowed_origin("https://app.example", []) is None


def test_cors_preflight_detection_and_headers() -> None:
    preflight = {"origin": "https://a", "access-control-request-method": "POST"}
    assert cors.is_preflight("OPTIONS", preflight)
    assert not cors.is_preflight("OPTIONS", {"origin": "https://a"})
    assert not cors.is_preflight("POST", preflight)
    headers = dict(cors.preflight_headers({"access-control-request-headers": "x-api-key"}))
    assert headers[b"access-control-allow-headers"] == b"x-api-key"
    assert b"POST" in headers[b"access-control-allow-methods"]

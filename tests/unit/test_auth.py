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
)
from vllm_mlx.api.error_shapes import error_body
from vllm_mlx.api.errors import APIError

KEYS = ["alpha-key", "beta-key"]


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
    assert authenticate({}, []).refusal is None  # no keys configured: open
    missing = authenticate({}, KEYS)
    assert missing.reason == "missing" and missing.refusal is not None
    assert missing.refusal.status == 401 and missing.refusal.code == "missing_api_key"
    wrong = authenticate({"x-api-key": "nope"}, KEYS)
    assert wrong.reason == "invalid" and wrong.refusal is not None
    assert wrong.refusal.code == "invalid_api_key"
    ok = authenticate({"authorization": "Bearer alpha-key"}, KEYS)
    assert ok.refusal is None and ok.key == "alpha-key"


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

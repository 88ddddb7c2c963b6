"""API keys: which paths need one, where clients send it, how it is checked.

Both SDKs' headers are accepted: the OpenAI SDK sends `Authorization: Bearer KEY`,
the Anthropic SDK `x-api-key: KEY`. Refusals are rendered in the shape of the
protocol the client speaks, so each SDK raises its own AuthenticationError.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from vllm_mlx.api.errors import APIError

Protocol = Literal["openai", "anthropic", "ollama"]


def protocol_of(path: str, headers: Mapping[str, str]) -> Protocol:
    """Ollama for /api/*; Anthropic for /v1/messages* or when the client sends
    `anthropic-version`; OpenAI otherwise."""
    if path == "/api" or path.startswith("/api/"):
        return "ollama"
    if path.startswith("/v1/messages") or "anthropic-version" in headers:
        return "anthropic"
    return "openai"


# vLLM serves these beside /v1, not under it; the rate limit counts them like /v1.
_ROOT_API_PATHS = frozenset({"/tokenize", "/detokenize"})


def is_api_path(path: str) -> bool:
    return path in ("/v1", "/api") or path.startswith(("/v1/", "/api/")) or path in _ROOT_API_PATHS


def presented_keys(headers: Mapping[str, str]) -> list[str]:
    """Every key the request carries (a client may send both headers)."""
    keys = []
    scheme, _, value = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        keys.append(value.strip())
    if headers.get("x-api-key", "").strip():
        keys.append(headers["x-api-key"].strip())
    return keys


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def matching_key(presented: Sequence[str], keys: Sequence[str]) -> str | None:
    """The configured key a request presented, compared in constant time.

    Digests make every comparison the same length, and every configured key is
    compared, so timing reveals neither a key's prefix nor which key matched.
    """
    found: str | None = None
    for candidate in presented:
        wanted = _digest(candidate)
        for key in keys:
            if hmac.compare_digest(wanted, _digest(key)):
                found = key
    return found


@dataclass(frozen=True)
class AuthResult:
    key: str | None  # the configured key the request presented, if any
    refusal: APIError | None = None
    reason: str = ""  # "missing" or "invalid" when refused


def authenticate(headers: Mapping[str, str], keys: Sequence[str]) -> AuthResult:
    if not keys:
        return AuthResult(None)
    presented = presented_keys(headers)
    if not presented:
        message = "Missing API key: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'."
        refusal = APIError(401, message, "authentication", code="missing_api_key")
        return AuthResult(None, refusal, "missing")
    key = matching_key(presented, keys)
    if key is None:
        error = APIError(
            401, "Incorrect API key provided.", "authentication", code="invalid_api_key"
        )
        return AuthResult(None, error, "invalid")
    return AuthResult(key)

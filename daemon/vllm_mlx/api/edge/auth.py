"""API keys: which paths need one, where clients send it, how it is checked.

Both SDKs' headers are accepted: the OpenAI SDK sends `Authorization: Bearer KEY`,
the Anthropic SDK `x-api-key: KEY`. Refusals are rendered in the shape of the
protocol the client speaks, so each SDK raises its own AuthenticationError.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from vllm_mlx.api.errors import APIError
from vllm_mlx.api.principal import Principal
from vllm_mlx.config.auth import SCOPES, AuthSettings, Scope, key_digest

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
_ROOT_API_PATHS = frozenset({"/tokenize", "/detokenize", "/score", "/rerank", "/v2/rerank"})


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


def matching_key(presented: Sequence[str], keys: Sequence[str]) -> str | None:
    """The configured key a request presented, compared in constant time.

    Digests make every comparison the same length, and every configured key is
    compared, so timing reveals neither a key's prefix nor which key matched.
    """
    found: str | None = None
    for candidate in presented:
        wanted = key_digest(candidate)
        for key in keys:
            if hmac.compare_digest(wanted, key_digest(key)):
                found = key
    return found


KeyTable = list[tuple[bytes, Principal]]
# The table of the settings in force: they are frozen and replaced whole by a reload, so
# the object's identity says when to build it again. Building it per request cost ~0.5
# ms with 20 keys (pydantic's private-attribute lookups; bench/edge_overhead.py).
_table_of: tuple[AuthSettings, KeyTable] | None = None


def _principals(auth: AuthSettings) -> KeyTable:
    """Every configured key as (digest, who): the flat list with every scope, then the
    named keys with theirs; built once per settings object."""
    global _table_of
    cached = _table_of
    if cached is not None and cached[0] is auth:
        return cached[1]
    table = _build_table(auth)
    _table_of = (auth, table)
    return table


def _build_table(auth: AuthSettings) -> KeyTable:
    table = [
        (key_digest(key), Principal(f"api_keys[{n}]", frozenset(SCOPES)))
        for n, key in enumerate(auth.api_keys)
    ]
    for named in auth.keys:
        models = frozenset(named.models) if named.models is not None else None
        who = Principal(
            named.name,
            frozenset(named.scopes),
            models,
            named.rate_limit.requests_per_minute,
            named.rate_limit.tokens_per_minute,
            named.quota.tokens_per_day,
            named.quota.tokens_per_month,
        )
        table.append((named.digest, who))
    return table


def matching_principal(presented: Sequence[str], auth: AuthSettings) -> Principal | None:
    """Who presented one of the configured keys; every presented key is compared with
    every configured digest (constant time), and the first configured match wins."""
    found: Principal | None = None
    table = _principals(auth)
    for candidate in reversed(presented):
        wanted = key_digest(candidate)
        for digest, who in reversed(table):
            if hmac.compare_digest(wanted, digest):
                found = who
    return found


@dataclass(frozen=True)
class AuthResult:
    principal: Principal | None  # who the request is, when keys are configured
    refusal: APIError | None = None
    reason: str = ""  # "missing" or "invalid" when refused


def authenticate(headers: Mapping[str, str], auth: AuthSettings) -> AuthResult:
    if not auth.enabled:
        return AuthResult(None)
    presented = presented_keys(headers)
    if not presented:
        message = "Missing API key: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'."
        refusal = APIError(401, message, "authentication", code="missing_api_key")
        return AuthResult(None, refusal, "missing")
    principal = matching_principal(presented, auth)
    if principal is None:
        error = APIError(
            401, "Incorrect API key provided.", "authentication", code="invalid_api_key"
        )
        return AuthResult(None, error, "invalid")
    return AuthResult(principal)


# --- scopes ---------------------------------------------------------------------------


def required_scope(method: str, path: str) -> Scope:
    """The scope a route needs. Deny by default: a path not listed needs `admin` unless
    it is one of the API families below."""
    if path == "/v1/mcp" or path.startswith("/v1/mcp/"):
        return "mcp"
    if method == "POST" and path.startswith("/v1/models/") and path.endswith(("/load", "/unload")):
        return "models"
    if path in ("/v1/status", "/v1/usage", "/metrics") or path.startswith("/v1/cache"):
        return "admin"
    if is_api_path(path):
        return "inference"
    return "admin"


def scope_refusal(principal: Principal, method: str, path: str) -> APIError | None:
    scope = required_scope(method, path)
    if principal.has(scope):
        return None
    held = ", ".join(sorted(principal.scopes))
    return APIError(
        403,
        f"the API key '{principal.name}' lacks the '{scope}' scope that {method} {path} "
        f"needs (its scopes: {held})",
        "permission",
        code="missing_scope",
    )

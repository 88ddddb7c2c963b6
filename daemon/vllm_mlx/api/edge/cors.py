"""CORS for browser clients: `server.cors_origins`, read per request (hot-reloadable).

Credentials travel in headers (Authorization / x-api-key), never cookies, so
`Access-Control-Allow-Credentials` is not needed and `*` is a usable origin list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

ALLOW_METHODS = "GET, POST, DELETE, OPTIONS"
DEFAULT_ALLOW_HEADERS = "authorization, content-type, x-api-key, anthropic-version, anthropic-beta"
EXPOSE_HEADERS = "retry-after"
MAX_AGE_S = "600"

Headers = list[tuple[bytes, bytes]]


def allowed_origin(origin: str | None, allowed: Sequence[str]) -> str | None:
    """The Access-Control-Allow-Origin value for this request, or None for no CORS."""
    if not origin or not allowed:
        return None
    if "*" in allowed:
        return "*"
    wanted = origin.rstrip("/").lower()
    return origin if any(a.rstrip("/").lower() == wanted for a in allowed) else None


def is_preflight(method: str, headers: Mapping[str, str]) -> bool:
    return (
        method == "OPTIONS" and "origin" in headers and "access-control-request-method" in headers
    )


def response_headers(allow_origin: str) -> Headers:
    """Added to every response a permitted origin receives."""
    return [
        (b"access-control-allow-origin", allow_origin.encode()),
        (b"access-control-expose-headers", EXPOSE_HEADERS.encode()),
        (b"vary", b"Origin"),
    ]


def preflight_headers(headers: Mapping[str, str]) -> Headers:
    """A permitted preflight's answer, on top of response_headers."""
    # Echo the requested headers: a bare `*` would not cover Authorization.
    requested = headers.get("access-control-request-headers") or DEFAULT_ALLOW_HEADERS
    return [
        (b"access-control-allow-methods", ALLOW_METHODS.encode()),
        (b"access-control-allow-headers", requested.encode()),
        (b"access-control-max-age", MAX_AGE_S.encode()),
    ]

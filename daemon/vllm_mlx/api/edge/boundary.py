"""What every request must pass before routing: its path, Host, content type and size.

The ops middleware calls these on every request. They exist to keep a browser page
and an odd URL from reaching the API by a side door:
- the path is normalised exactly as the router normalises it, so the key check and
  the rate limit judge the path that is then served (`//v1/...` is `/v1/...`);
- `Host` must name this daemon (DNS rebinding: a page whose domain resolves to
  127.0.0.1 sends its own name);
- a body must be declared JSON (a cross-origin page may POST `text/plain` without a
  CORS preflight, never `application/json`);
- a body may not exceed `limits.max_body_mb`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence

from litestar.utils import normalize_path

from vllm_mlx.api.dashboard import OPEN_UI_PATHS
from vllm_mlx.api.errors import APIError
from vllm_mlx.config.settings import Settings

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
# No key ever: health checks, the root that clients probe (it says only that the
# daemon runs) and the status page's static files (the page asks for a key before it
# reads anything); /metrics unless metrics_require_key.
OPEN_PATHS = frozenset({"/", "/health", *OPEN_UI_PATHS})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
MIB = 1024 * 1024


def route_path(path: str, root_path: str = "") -> str:
    """The path the router matches (Litestar's own normalisation, after root_path)."""
    if root_path:
        path = path.split(root_path, maxsplit=1)[-1]
    return normalize_path(path)


def needs_key(path: str, settings: Settings) -> bool:
    """Every path needs a key when keys are set, except the open ones (deny by default)."""
    if path in OPEN_PATHS:
        return False
    return not (path == "/metrics" and not settings.auth.metrics_require_key)


def _host_name(host: str) -> tuple[str, str | None]:
    """`name[:port]` (IPv6 in brackets) as lower-case name and port."""
    host = host.strip().lower()
    if host.startswith("["):
        name, _, rest = host[1:].partition("]")
        return name, rest[1:] if rest.startswith(":") else None
    name, sep, port = host.rpartition(":")
    return (name, port) if sep and port.isdigit() else (host, None)


def is_loopback(address: str) -> bool:
    if address.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def _allowed_by(entry: str, name: str, port: str | None) -> bool:
    want_name, want_port = _host_name(entry)
    return want_name == name and (want_port is None or want_port == port)


def host_allowed(host: str | None, listen: str, allowed: Sequence[str]) -> bool:
    """Whether a request's Host header names this daemon."""
    if host is None:
        return True  # HTTP/1.0 clients; a browser always sends Host
    if "*" in allowed or (not allowed and not is_loopback(listen)):
        return True
    name, port = _host_name(host)
    if name in LOOPBACK_NAMES or name == _host_name(listen)[0]:
        return True
    return any(_allowed_by(entry, name, port) for entry in allowed)


def host_refusal(headers: Mapping[str, str], settings: Settings) -> APIError | None:
    host = headers.get("host")
    server = settings.server
    if host_allowed(host, server.host, server.allowed_hosts):
        return None
    return APIError(
        403,
        f"Host {host!r} is not allowed; add it to server.allowed_hosts to serve it.",
        "permission",
        code="host_not_allowed",
    )


def is_json_type(content_type: str | None) -> bool:
    """application/json or application/*+json, with any parameters."""
    if not content_type:
        return False
    mime = content_type.split(";", 1)[0].strip().lower()
    kind, _, subtype = mime.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


def content_type_refusal(
    method: str, headers: Mapping[str, str], path: str = ""
) -> APIError | None:
    if method not in BODY_METHODS or is_json_type(headers.get("content-type")):
        return None
    if _bodyless_control(path, headers) or _ollama_client(path, headers):
        return None
    if _audio_upload(path, headers):
        return None
    sent = headers.get("content-type")
    return APIError(
        415,
        f"Request bodies must be JSON, sent with 'Content-Type: application/json' (got {sent!r}).",
        "invalid_request",
        code="unsupported_media_type",
    )


def _audio_upload(path: str, headers: Mapping[str, str]) -> bool:
    """OpenAI's audio routes take multipart/form-data (the SDKs upload the file so). A
    browser can send that cross-site without a preflight, but always with `Origin`: such
    uploads are refused, as any non-JSON body is (docs/audio.md)."""
    mime = (headers.get("content-type") or "").split(";", 1)[0].strip().lower()
    return (
        path.startswith("/v1/audio/") and mime == "multipart/form-data" and "origin" not in headers
    )


def _ollama_client(path: str, headers: Mapping[str, str]) -> bool:
    """Ollama's clients and its documented `curl -d` post JSON with any content type
    (curl sends form encoding). A page in a browser always sends `Origin` with a
    cross-site POST, so refusing only those keeps the cross-site defence for /api/*."""
    return (path == "/api" or path.startswith("/api/")) and "origin" not in headers


def _bodyless_control(path: str, headers: Mapping[str, str]) -> bool:
    """`POST /v1/models/{id}/load|unload` takes no body (`curl -X POST URL` works); any
    other bodyless POST there reaches the route too, which names the valid actions."""
    control = path.startswith("/v1/models/")
    empty = headers.get("content-length", "0") == "0" and "transfer-encoding" not in headers
    return control and empty


def max_body_bytes(settings: Settings) -> int:
    return int(settings.limits.max_body_mb * MIB)


def body_too_large(limit: int) -> APIError:
    return APIError(
        413,
        f"The request body exceeds limits.max_body_mb ({limit / MIB:g} MiB).",
        "too_large",
        code="request_too_large",
    )


def length_refusal(headers: Mapping[str, str], limit: int) -> APIError | None:
    """413 up front when Content-Length already says too much."""
    declared = headers.get("content-length", "").strip()
    if declared.isdigit() and declared.isascii() and int(declared) > limit:
        return body_too_large(limit)
    return None

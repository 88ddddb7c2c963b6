"""One log line for every 4xx answer, so a user whose client fails can see why in
`journalctl` or the launchd log without turning on debug logging.

The line has the route, the model (when the request got as far as naming a served
one), the status, the error type and its message: read back from the error body the
daemon sent, so refusals from the edge (keys, rate, Host, body size), from Litestar
(unknown path, wrong method) and from the handlers all log the same way. Never the
request body or a key: error messages name fields, not their values.
"""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from typing import Any

import structlog

log = structlog.get_logger("vllm_mlx.requests")

MAX_CAPTURED = 16 * 1024  # error bodies are small; a larger 4xx body is cut, not held
MAX_MESSAGE = 500


class BodyCapture:
    """The first bytes of a 4xx or 5xx response's body, as they are sent."""

    def __init__(self) -> None:
        self.status = 0
        self.chunks: list[bytes] = []
        self.size = 0

    def see(self, message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
        elif message["type"] == "http.response.body" and 400 <= self.status < 600:
            body = bytes(message.get("body", b""))
            if self.size < MAX_CAPTURED:
                self.chunks.append(body[: MAX_CAPTURED - self.size])
                self.size += len(self.chunks[-1])


def error_fields(body: bytes) -> tuple[str | None, str | None]:
    """(type, message) from an OpenAI, Anthropic or Ollama error body."""
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None, None
    if not isinstance(document, dict):
        return None, None
    error = document.get("error")
    if isinstance(error, str):  # Ollama: {"error": "..."}
        return None, error[:MAX_MESSAGE]
    if isinstance(error, dict):  # OpenAI and Anthropic nest it
        kind, message = error.get("type"), error.get("message")
        return (
            kind if isinstance(kind, str) else None,
            message[:MAX_MESSAGE] if isinstance(message, str) else None,
        )
    return None, None


def log_refusal(
    capture: BodyCapture, route: str, method: str, note: dict[str, Any], peer: str | None
) -> None:
    if not 400 <= capture.status < 500:
        return
    kind, message = error_fields(b"".join(capture.chunks))
    log.info(
        "refused",
        route=route,
        method=method,
        model=note.get("model"),
        key=note.get("key"),  # the key's name, never the key
        status=capture.status,
        error_type=kind,
        message=message,
        peer=peer,
    )


def error_message(capture: BodyCapture) -> str | None:
    """The message of a captured error body (None for a success or an unreadable one)."""
    if capture.status < 400:
        return None
    return error_fields(b"".join(capture.chunks))[1]

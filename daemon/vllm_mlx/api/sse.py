"""Server-sent event framing."""

from __future__ import annotations

import json
from typing import Any


def _dumps(payload: Any) -> str:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))


def data_event(payload: Any) -> bytes:
    """`data: <json>` + blank line (OpenAI style: no event name)."""
    return f"data: {_dumps(payload)}\n\n".encode()


def named_event(event: str, payload: Any) -> bytes:
    """`event: <name>` + `data: <json>` (Anthropic style)."""
    return f"event: {event}\ndata: {_dumps(payload)}\n\n".encode()


DONE = b"data: [DONE]\n\n"

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

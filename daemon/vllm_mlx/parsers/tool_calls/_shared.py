"""Pieces several formats share: JSON call objects and mlx-lm's own parsers."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from vllm_mlx.parsers._text import loads
from vllm_mlx.parsers.tool_calls.base import RawCall
from vllm_mlx.parsers.types import ToolSpec


def json_calls(
    value: Any, argument_keys: tuple[str, ...] = ("arguments", "parameters")
) -> list[RawCall] | None:
    """Calls from ``{"name": ..., "arguments": {...}}`` or a list of such objects.

    The arguments key is required: without it a plain JSON answer such as
    ``{"name": "Ada"}`` would pass for a call when no tools constrain the names.
    """
    items = value if isinstance(value, list) else [value]
    if not items:
        return None
    calls: list[RawCall] = []
    for item in items:
        if not isinstance(item, dict):
            return None
        if isinstance(item.get("function"), dict):
            # OpenAI-shaped {"type": "function", "function": {...}}, seen from some models.
            item = {**item["function"], "id": item.get("id")}
        key = next((k for k in argument_keys if k in item), None)
        if key is None or "name" not in item:
            return None
        call_id = item.get("id")
        calls.append(
            RawCall(item["name"], item[key], call_id if isinstance(call_id, str) else None)
        )
    return calls


def json_text_calls(text: str) -> list[RawCall] | None:
    return json_calls(loads(text))


def openai_tools(tools: Sequence[ToolSpec] | None) -> list[dict[str, Any]] | None:
    """Tools in the OpenAI request shape, which mlx-lm's parsers read for types."""
    if tools is None:
        return None
    return [
        {"type": "function", "function": {"name": t.name, "parameters": t.parameters or {}}}
        for t in tools
    ]


def mlx_calls(module: str, text: str, tools: Sequence[ToolSpec] | None) -> list[RawCall] | None:
    """Run ``mlx_lm.tool_parsers.<module>.parse_tool_call``; None when it rejects the text.

    Imported on first use: importing mlx_lm loads mlx itself, which the API layer (the
    parsers' other user) must not need just to be imported.
    """
    parser = importlib.import_module(f"mlx_lm.tool_parsers.{module}")
    try:
        result = parser.parse_tool_call(text, openai_tools(tools))
    except Exception:
        # These parsers raise assorted errors (ValueError, SyntaxError, AttributeError,
        # ...) on malformed model output; any of them means "not a call".
        return None
    items = result if isinstance(result, list) else [result]
    calls: list[RawCall] = []
    for item in items:
        if not isinstance(item, dict):
            return None
        call_id = item.get("id")
        calls.append(
            RawCall(
                item.get("name"),
                item.get("arguments"),
                call_id if isinstance(call_id, str) else None,
            )
        )
    return calls or None

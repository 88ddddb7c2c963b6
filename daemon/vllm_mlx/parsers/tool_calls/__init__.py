"""Tool-call parsers, chosen by name from the model's config (``tool_call_parser``)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from vllm_mlx.parsers.errors import UnknownParserError
from vllm_mlx.parsers.tool_calls.auto import CANDIDATES, AutoToolCallParser
from vllm_mlx.parsers.tool_calls.base import RawCall, ToolCallParser

_ALL: tuple[type[ToolCallParser], ...] = (AutoToolCallParser, *CANDIDATES)
TOOL_CALL_PARSERS: Mapping[str, type[ToolCallParser]] = MappingProxyType(
    {cls.name: cls for cls in _ALL}
)


def tool_call_parser_names() -> list[str]:
    return sorted(TOOL_CALL_PARSERS)


def get_tool_call_parser(name: str) -> type[ToolCallParser]:
    try:
        return TOOL_CALL_PARSERS[name]
    except KeyError:
        raise UnknownParserError("tool call", name, tool_call_parser_names()) from None


__all__ = [
    "TOOL_CALL_PARSERS",
    "RawCall",
    "ToolCallParser",
    "UnknownParserError",
    "get_tool_call_parser",
    "tool_call_parser_names",
]

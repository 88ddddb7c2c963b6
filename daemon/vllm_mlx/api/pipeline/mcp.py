"""MCP tools in generation requests, for every protocol (`mcp_tools`, per model).

`offer`: the allowed MCP tools join the tools a request offers (a request tool of the
same name wins). `execute`: when every call of a reply is an MCP tool, the daemon runs
them, appends the calls and results to the conversation and generates again, up to
`mcp.max_tool_rounds` rounds. The protocols' loops (api/openai/mcp_loop.py,
api/anthropic/mcp_loop.py) render the rounds; what they share is here.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from vllm_mlx.api.pipeline.turn import Turn
from vllm_mlx.engine.types import Usage
from vllm_mlx.mcp.manager import McpManager
from vllm_mlx.mcp.tools import McpTool, ToolResult, error_result

Call = tuple[str, str, Any]  # id, name, arguments (JSON text, or an already parsed object)


def mcp_mode(turn: Turn) -> str:
    return turn.model.mcp_tools if turn.model is not None else "none"


def offered_mcp_tools(mcp: McpManager, turn: Turn, taken: set[str]) -> list[McpTool]:
    """The MCP tools a request of this model is offered (none unless `mcp_tools` says)."""
    if mcp_mode(turn) == "none":
        return []
    return [tool for tool in mcp.tools() if tool.full_name not in taken]


def _arguments(value: Any) -> dict[str, Any] | None:
    if isinstance(value, dict):
        return value
    try:
        parsed = json.loads(value or "{}")
    except json.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None


def all_mcp(calls: Sequence[Call], names: set[str] | dict[str, str]) -> bool:
    """A reply's calls run here only when there are some and every one is an MCP tool."""
    return bool(calls) and all(name in names for _, name, _ in calls)


async def execute(mcp: McpManager, calls: Sequence[Call]) -> list[ToolResult]:
    """Every call at once; arguments that are not a JSON object are the call's error."""

    async def one(name: str, value: Any) -> ToolResult:
        arguments = _arguments(value)
        if arguments is None:
            return error_result(name, "the arguments are not a JSON object")
        return await mcp.execute_or_error(name, arguments)

    return list(await asyncio.gather(*(one(name, value) for _, name, value in calls)))


def added(a: Usage, b: Usage) -> Usage:
    return Usage(
        a.prompt_tokens + b.prompt_tokens,
        a.completion_tokens + b.completion_tokens,
        a.cached_tokens + b.cached_tokens,
        a.cache_write_tokens + b.cache_write_tokens,
    )

"""MCP tools and results as the daemon's APIs show them (OpenAI `tools`, plain text)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from vllm_mlx.config.mcp import TOOL_SEPARATOR

# OpenAI function names: letters, digits, `_` and `-`, at most 64 characters.
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
MAX_NAME = 64
EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class McpTool:
    """One tool of one server: `name` is the server's own, `full_name` what models see."""

    server: str
    name: str
    full_name: str
    description: str
    input_schema: dict[str, Any]

    def openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.full_name,
                "description": self.description,
                "parameters": self.input_schema,
            },
        }


def full_name(server: str, tool: str) -> str:
    """`server__tool`, with characters OpenAI names cannot hold replaced by `_`."""
    return _UNSAFE.sub("_", f"{server}{TOOL_SEPARATOR}{tool}")[:MAX_NAME]


def make_tool(server: str, tool: Any) -> McpTool:
    """From the SDK's Tool record (name, description, input_schema)."""
    schema = tool.input_schema if isinstance(tool.input_schema, dict) else None
    return McpTool(
        server=server,
        name=str(tool.name),
        full_name=full_name(server, str(tool.name)),
        description=str(tool.description or ""),
        input_schema=schema or dict(EMPTY_SCHEMA),
    )


@dataclass(frozen=True)
class ToolResult:
    """A finished call: the content blocks as JSON, and whether the tool said it failed."""

    tool_name: str
    content: list[dict[str, Any]]
    is_error: bool
    structured: dict[str, Any] | None = None

    @property
    def text(self) -> str:
        """What a model reads back: the text blocks, other blocks as JSON."""
        parts = []
        for block in self.content:
            if block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            else:
                parts.append(json.dumps(block, ensure_ascii=False))
        return "\n".join(parts)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "tool_name": self.tool_name,
            "content": self.content,
            "is_error": self.is_error,
        }
        if self.structured is not None:
            out["structured_content"] = self.structured
        if self.is_error:
            out["error_message"] = self.text  # the seed's field
        return out


def error_result(tool_name: str, message: str) -> ToolResult:
    return ToolResult(tool_name, [{"type": "text", "text": message}], True)


def from_call_result(tool_name: str, result: Any) -> ToolResult:
    """From the SDK's CallToolResult."""
    content = [block.model_dump(mode="json", exclude_none=True) for block in result.content]
    structured = result.structured_content if isinstance(result.structured_content, dict) else None
    return ToolResult(tool_name, content, bool(result.is_error), structured)

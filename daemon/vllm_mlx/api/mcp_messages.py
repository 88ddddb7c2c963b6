"""MCP tools in /v1/messages (Anthropic), per model (`mcp_tools`).

`offer` and `execute` add the allowed MCP tools to the request's tools (a request tool
of the same name wins). With `execute`, a non-streamed request runs the loop of
api/mcp_chat.py: every `tool_use` of a reply naming an MCP tool is run, the reply and
the `tool_result`s are appended, and the model generates again (at most
`mcp.max_tool_rounds` rounds); the response lists what ran in `mcp_tool_calls`. A
streamed request is offered the tools; its calls go back to the client.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from vllm_mlx.api.anthropic.schema import InputMessage, MessagesRequest, PromptFields
from vllm_mlx.api.anthropic.schema import Tool as AnthropicTool
from vllm_mlx.api.generation import Target
from vllm_mlx.api.mcp_chat import mcp_mode, offered_mcp_tools
from vllm_mlx.mcp.manager import McpManager
from vllm_mlx.mcp.tools import ToolResult

P = TypeVar("P", bound=PromptFields)
OneMessage = Callable[[MessagesRequest], Awaitable[dict[str, Any]]]


def attach(mcp: McpManager, target: Target, body: P) -> tuple[P, MessagesLoop | None]:
    """The request with MCP tools added, and the loop that runs them (`execute`)."""
    if body.tool_choice is not None and body.tool_choice.type == "none":
        return body, None
    client = {tool.name for tool in body.tools or []}
    offered = offered_mcp_tools(mcp, target, client)
    if not offered:
        return body, None
    extra = [
        AnthropicTool(name=t.full_name, description=t.description, input_schema=t.input_schema)
        for t in offered
    ]
    body = body.model_copy(update={"tools": [*(body.tools or []), *extra]})
    if mcp_mode(target) != "execute":
        return body, None
    names = {tool.full_name for tool in offered}
    return body, MessagesLoop(mcp, names, target.settings.mcp.max_tool_rounds)


def _history_blocks(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # Text and tool calls go back into the prompt; thinking is the model's own scratch.
    return [block for block in content if block["type"] in ("text", "tool_use")]


@dataclass
class MessagesLoop:
    mcp: McpManager
    names: set[str]  # the MCP tools this request was offered
    rounds: int

    async def complete(self, body: MessagesRequest, one: OneMessage) -> dict[str, Any]:
        executed: list[dict[str, Any]] = []
        input_tokens = output_tokens = 0
        for round_no in range(self.rounds + 1):
            message = await one(body)
            input_tokens += message["usage"]["input_tokens"]
            output_tokens += message["usage"]["output_tokens"]
            uses = [block for block in message["content"] if block["type"] == "tool_use"]
            runnable = uses and all(use["name"] in self.names for use in uses)
            if round_no == self.rounds or not runnable or message["stop_reason"] != "tool_use":
                break
            results = await asyncio.gather(
                *(self.mcp.execute_or_error(use["name"], use["input"]) for use in uses)
            )
            executed.extend(_record(round_no + 1, u, r) for u, r in zip(uses, results, strict=True))
            body = _extended(body, message["content"], uses, list(results))
        message["usage"] = {**message["usage"], "input_tokens": input_tokens,
                            "output_tokens": output_tokens}  # fmt: skip
        if executed:
            message["mcp_tool_calls"] = executed
        return message


def _extended(
    body: MessagesRequest,
    content: list[dict[str, Any]],
    uses: list[dict[str, Any]],
    results: list[ToolResult],
) -> MessagesRequest:
    assistant = InputMessage.model_validate(
        {"role": "assistant", "content": _history_blocks(content)}
    )
    answers = InputMessage.model_validate({
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": use["id"], "is_error": result.is_error,
             "content": [{"type": "text", "text": result.text}]}
            for use, result in zip(uses, results, strict=True)
        ],
    })  # fmt: skip
    return body.model_copy(update={"messages": [*body.messages, assistant, answers]})


def _record(round_no: int, use: dict[str, Any], result: ToolResult) -> dict[str, Any]:
    return {
        "round": round_no,
        "id": use["id"],
        "name": use["name"],
        "input": use["input"],
        "arguments": json.dumps(use["input"]),
        "content": result.text,
        "is_error": result.is_error,
    }

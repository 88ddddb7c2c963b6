"""MCP tools in /v1/messages (Anthropic), per model (`mcp_tools`).

`offer` and `execute` add the allowed MCP tools to the request's tools (a request tool
of the same name wins). With `execute`, a non-streamed request runs the loop of
api/mcp_chat.py: every `tool_use` of a reply naming an MCP tool is run, the reply and
the `tool_result`s are appended, and the model generates again (at most
`mcp.max_tool_rounds` rounds); the response lists what ran in `mcp_tool_calls`. A
streamed one sends every round's blocks in one message: the executed `tool_use` blocks
carry `"mcp": {"server": NAME}`, each followed by an `mcp_tool_result` block (the
block type of Anthropic's own MCP connector).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, TypeVar

from litestar import Response
from litestar.response import Stream

from vllm_mlx.api.anthropic.builder import MessageBuilder
from vllm_mlx.api.anthropic.message_request import MessageGeneration, message_generation
from vllm_mlx.api.anthropic.schema import InputMessage, MessagesRequest, PromptFields
from vllm_mlx.api.anthropic.schema import Tool as AnthropicTool
from vllm_mlx.api.pipeline import driver, mcp
from vllm_mlx.api.pipeline.driver import Event, Run
from vllm_mlx.api.pipeline.turn import Turn
from vllm_mlx.api.sse import SSE_HEADERS
from vllm_mlx.engine.types import Finished, Usage
from vllm_mlx.mcp.manager import McpManager
from vllm_mlx.mcp.tools import ToolResult

P = TypeVar("P", bound=PromptFields)


def attach(manager: McpManager, turn: Turn, body: P) -> tuple[P, MessagesLoop | None]:
    """The request with MCP tools added, and the loop that runs them (`execute`)."""
    if body.tool_choice is not None and body.tool_choice.type == "none":
        return body, None
    client = {tool.name for tool in body.tools or []}
    offered = mcp.offered_mcp_tools(manager, turn, client)
    if not offered:
        return body, None
    extra = [
        AnthropicTool(name=t.full_name, description=t.description, input_schema=t.input_schema)
        for t in offered
    ]
    body = body.model_copy(update={"tools": [*(body.tools or []), *extra]})
    if mcp.mcp_mode(turn) != "execute":
        return body, None
    servers = {tool.full_name: tool.server for tool in offered}
    return body, MessagesLoop(manager, turn, servers, turn.settings.mcp.max_tool_rounds)


def _history_blocks(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # Text and tool calls go back into the prompt; thinking is the model's own scratch.
    return [block for block in content if block["type"] in ("text", "tool_use")]


def _calls(uses: list[dict[str, Any]]) -> list[mcp.Call]:
    return [(use["id"], use["name"], use["input"]) for use in uses]


@dataclass
class MessagesLoop:
    manager: McpManager
    turn: Turn
    servers: dict[str, str]  # the MCP tools this request was offered -> their servers
    rounds: int

    async def respond(self, body: MessagesRequest) -> Response[Any]:
        if body.stream:
            first = await message_generation(self.turn, body)  # errors are HTTP errors
            return Stream(self._stream(body, first), media_type="text/event-stream",
                          headers=SSE_HEADERS)  # fmt: skip
        return Response(await self._complete(body))

    async def _complete(self, body: MessagesRequest) -> dict[str, Any]:
        executed: list[dict[str, Any]] = []
        totals: dict[str, int] = {}
        for round_no in range(self.rounds + 1):
            generation = await message_generation(self.turn, body)
            message = await driver.complete([generation.run], generation.builder)
            for name, count in message["usage"].items():
                totals[name] = totals.get(name, 0) + count
            uses = [block for block in message["content"] if block["type"] == "tool_use"]
            if (
                round_no == self.rounds
                or not mcp.all_mcp(_calls(uses), self.servers)
                or message["stop_reason"] != "tool_use"
            ):
                break
            results = await mcp.execute(self.manager, _calls(uses))
            executed.extend(_record(round_no + 1, u, r) for u, r in zip(uses, results, strict=True))
            body = _extended(body, message["content"], uses, results)
        message["usage"] = totals
        if executed:
            message["mcp_tool_calls"] = executed
        return message

    def _stream(self, body: MessagesRequest, first: MessageGeneration) -> Any:
        """Every round's blocks in one message, from `first`'s builder."""
        first.builder.mcp_servers = self.servers
        rounds = _StreamRounds(self, body, first.builder)
        interval = self.turn.settings.engine.stream_interval
        return driver.stream([first.run], first.builder, interval, rounds)


@dataclass
class _StreamRounds:
    loop: MessagesLoop
    body: MessagesRequest
    builder: MessageBuilder
    round_no: int = 0
    start: int = 0  # the first block of this round in the message
    usage: Usage = field(default_factory=lambda: Usage(0, 0))

    async def next(self, finished: Finished) -> tuple[list[Event], list[Run] | Finished]:
        builder = self.builder
        sent = builder.close()  # the round's last block: tool_use input is complete now
        self.usage = mcp.added(self.usage, finished.usage)
        blocks = builder.content[self.start :]
        uses = [block for block in blocks if block["type"] == "tool_use"]
        if self.round_no == self.loop.rounds or not mcp.all_mcp(_calls(uses), self.loop.servers):
            last = Finished(finished.reason, self.usage, finished.stop_sequence, finished.message)
            return sent, last
        self.round_no += 1
        results = await mcp.execute(self.loop.manager, _calls(uses))
        sent.extend(_result_blocks(builder, uses, results))
        builder.used_tools = False  # a later round that only answers ends the turn
        self.body = _extended(self.body, blocks, uses, results)
        self.start = len(builder.content)
        generation = await message_generation(self.loop.turn, self.body)
        return sent, [generation.run]


def _result_blocks(
    builder: MessageBuilder, uses: list[dict[str, Any]], results: list[ToolResult]
) -> list[Event]:
    """One `mcp_tool_result` block per executed call, in the message being streamed."""
    events: list[Event] = []
    for use, result in zip(uses, results, strict=True):
        block = {
            "type": "mcp_tool_result",
            "tool_use_id": use["id"],
            "is_error": result.is_error,
            "content": [{"type": "text", "text": result.text}],
        }
        builder.content.append(block)
        index = len(builder.content) - 1
        events.append({"type": "content_block_start", "index": index, "content_block": block})
        events.append({"type": "content_block_stop", "index": index})
    return events


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
    # A forced choice (any, a named tool) was honoured by this round's calls; forcing it
    # again would leave the model no way to answer with the results.
    choice = body.tool_choice
    if choice is not None and choice.type in ("any", "tool"):
        choice = choice.model_copy(update={"type": "auto", "name": None})
    messages = [*body.messages, assistant, answers]
    return body.model_copy(update={"messages": messages, "tool_choice": choice})


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

"""MCP tools in /v1/chat/completions, per model (`mcp_tools`).

`offer`: the allowed MCP tools join the tools the request offers (a request tool of
the same name wins); the model's calls come back to the client like any other.
`execute`: when every call of a reply is an MCP tool, the daemon runs them, appends the
calls and results to the conversation and generates again, up to
`mcp.max_tool_rounds` rounds. A reply that calls a client tool ends the loop: its
calls go to the client, unexecuted. What ran is visible: non-streamed responses carry
`mcp_tool_calls`; streams send each executed call as ordinary `tool_calls` deltas
(marked `"mcp": {"server": NAME}`) followed by a delta with `mcp_tool_results`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from litestar import Response
from litestar.response import Stream

from vllm_mlx.api.openai import convert
from vllm_mlx.api.openai.chat_builder import Call, ChatBuilder
from vllm_mlx.api.openai.chat_request import ChatGeneration, chat_generation
from vllm_mlx.api.openai.schema import (
    ChatCompletionRequest,
    ChatMessage,
    MessageToolCall,
    NamedToolChoice,
    Tool,
    ToolCallFunction,
)
from vllm_mlx.api.pipeline import driver, mcp
from vllm_mlx.api.pipeline.driver import Event, Run
from vllm_mlx.api.pipeline.ids import new_id
from vllm_mlx.api.pipeline.turn import Turn
from vllm_mlx.api.sse import SSE_HEADERS
from vllm_mlx.engine.types import Finished, FinishReason, Usage
from vllm_mlx.mcp.manager import McpManager
from vllm_mlx.mcp.tools import ToolResult


def attach(
    manager: McpManager, turn: Turn, body: ChatCompletionRequest
) -> tuple[ChatCompletionRequest, ChatLoop | None]:
    """The request with MCP tools added, and the loop that runs them (`execute` only)."""
    if body.tool_choice == "none":
        return body, None
    client = {tool.function.name for tool in body.tools or []}
    extra = mcp.offered_mcp_tools(manager, turn, client)
    if not extra:
        return body, None
    tools = [*(body.tools or []), *(Tool.model_validate(t.openai()) for t in extra)]
    body = body.model_copy(update={"tools": tools})
    if mcp.mcp_mode(turn) != "execute":
        return body, None
    servers = {tool.full_name: tool.server for tool in extra}
    return body, ChatLoop(manager, turn, servers, turn.settings.mcp.max_tool_rounds)


def extended(
    body: ChatCompletionRequest, content: str, calls: list[Call], results: list[ToolResult]
) -> ChatCompletionRequest:
    """The conversation with the assistant's calls and their results appended."""
    assistant = ChatMessage(
        role="assistant",
        content=content,
        tool_calls=[
            MessageToolCall(id=i, function=ToolCallFunction(name=n, arguments=a))
            for i, n, a in calls
        ],
    )
    answers = [
        ChatMessage(role="tool", tool_call_id=call[0], content=result.text)
        for call, result in zip(calls, results, strict=True)
    ]
    # A forced choice (required, a named function) was honoured by this round's calls;
    # forcing it again would leave the model no way to answer with the results.
    choice = body.tool_choice
    if choice == "required" or isinstance(choice, NamedToolChoice):
        choice = "auto"
    messages = [*body.messages, assistant, *answers]
    return body.model_copy(update={"messages": messages, "tool_choice": choice})


def _record(round_no: int, call: Call, result: ToolResult) -> dict[str, Any]:
    return {
        "round": round_no,
        "id": call[0],
        "name": call[1],
        "arguments": call[2],
        "content": result.text,
        "is_error": result.is_error,
    }


@dataclass
class ChatLoop:
    manager: McpManager
    turn: Turn
    servers: dict[str, str]  # offered MCP tool name -> its server
    rounds: int

    async def generation(self, body: ChatCompletionRequest) -> ChatGeneration:
        return await chat_generation(self.turn, body, new_id("chatcmpl-"))

    async def respond(self, body: ChatCompletionRequest) -> Response[Any]:
        if body.stream:
            first = await self.generation(body)  # its errors are still HTTP errors
            return Stream(self._stream(body, first), media_type="text/event-stream",
                          headers=SSE_HEADERS)  # fmt: skip
        return Response(await self._complete(body))

    async def _complete(self, body: ChatCompletionRequest) -> dict[str, Any]:
        executed: list[dict[str, Any]] = []
        usage = Usage(0, 0)
        for round_no in range(self.rounds + 1):
            generation = await self.generation(body)
            runs, logprobs = generation.runs(1, logprobs=False)
            builder = ChatBuilder(generation.base.request_id, body.model, logprobs,
                                  streaming=False)  # fmt: skip
            response = await driver.complete(runs, builder)
            usage = mcp.added(usage, builder.usage())
            content, calls = builder.round_calls()
            if round_no == self.rounds or not mcp.all_mcp(calls, self.servers):
                break
            results = await mcp.execute(self.manager, calls)
            executed.extend(
                _record(round_no + 1, c, r) for c, r in zip(calls, results, strict=True)
            )
            body = extended(body, content, calls, results)
        response["usage"] = convert.usage_dict(usage)
        if executed:
            response["mcp_tool_calls"] = executed
        return response

    def _stream(self, body: ChatCompletionRequest, first: ChatGeneration) -> AsyncIterator[bytes]:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        runs, logprobs = first.runs(1, logprobs=False)
        builder = ChatBuilder(first.base.request_id, body.model, logprobs, streaming=True,
                              include_usage=include_usage, mcp_servers=self.servers)  # fmt: skip
        rounds = _StreamRounds(self, body, builder)
        return driver.stream(runs, builder, self.turn.settings.engine.stream_interval, rounds)


@dataclass
class _StreamRounds:
    """The tool rounds of one streamed chat completion, all in one chunk stream."""

    loop: ChatLoop
    body: ChatCompletionRequest
    builder: ChatBuilder
    round_no: int = 0
    usage: Usage = field(default_factory=lambda: Usage(0, 0))

    async def next(self, finished: Finished) -> tuple[list[Event], list[Run] | Finished]:
        self.usage = mcp.added(self.usage, finished.usage)
        content, calls = self.builder.round_calls()
        if (
            self.round_no == self.loop.rounds
            or finished.reason is not FinishReason.TOOL_CALLS
            or not mcp.all_mcp(calls, self.loop.servers)
        ):
            return [], Finished(
                finished.reason, self.usage, finished.stop_sequence, finished.message
            )
        self.round_no += 1
        results = await mcp.execute(self.loop.manager, calls)
        records = [_record(self.round_no, c, r) for c, r in zip(calls, results, strict=True)]
        sent = self.builder.next_round(records)
        self.body = extended(self.body, content, calls, results)
        generation = await self.loop.generation(self.body)
        runs, _ = generation.runs(1, logprobs=False)
        return [sent], runs

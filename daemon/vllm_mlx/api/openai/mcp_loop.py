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

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from litestar import Response
from litestar.response import Stream

from vllm_mlx.api.errors import APIError, to_api_error
from vllm_mlx.api.openai import convert
from vllm_mlx.api.openai.schema import (
    ChatCompletionRequest,
    ChatMessage,
    MessageToolCall,
    NamedToolChoice,
    Tool,
    ToolCallFunction,
)
from vllm_mlx.api.pipeline.turn import Target, model_settings_of, run_parsed
from vllm_mlx.api.sse import DONE, SSE_HEADERS, data_event
from vllm_mlx.engine.types import Finished, FinishReason, GenerationRequest, Usage
from vllm_mlx.mcp.manager import McpManager
from vllm_mlx.mcp.tools import McpTool, ToolResult, error_result
from vllm_mlx.parsers.pipeline import OutputParser
from vllm_mlx.parsers.types import (
    ContentDelta,
    ReasoningDelta,
    ToolCallArgumentsDelta,
    ToolCallStart,
)

ROUTE = "/v1/chat/completions"

Prepared = tuple[GenerationRequest, OutputParser | None, int | None]
Prepare = Callable[[Target, ChatCompletionRequest], Awaitable[Prepared]]
Complete = Callable[
    [Target, GenerationRequest, str, OutputParser | None, int | None], Awaitable[dict[str, Any]]
]
Call = tuple[str, str, str]  # id, name, arguments (JSON text)


def mcp_mode(target: Target) -> str:
    model = model_settings_of(target)
    return model.mcp_tools if model is not None else "none"


def offered_mcp_tools(mcp: McpManager, target: Target, taken: set[str]) -> list[McpTool]:
    """The MCP tools a request of this model is offered (none unless `mcp_tools` says)."""
    if mcp_mode(target) == "none":
        return []
    return [tool for tool in mcp.tools() if tool.full_name not in taken]


def attach(
    mcp: McpManager, target: Target, body: ChatCompletionRequest
) -> tuple[ChatCompletionRequest, ChatLoop | None]:
    """The request with MCP tools added, and the loop that runs them (`execute` only)."""
    if body.tool_choice == "none":
        return body, None
    client = {tool.function.name for tool in body.tools or []}
    extra = offered_mcp_tools(mcp, target, client)
    if not extra:
        return body, None
    tools = [*(body.tools or []), *(Tool.model_validate(t.openai()) for t in extra)]
    body = body.model_copy(update={"tools": tools})
    if mcp_mode(target) != "execute":
        return body, None
    servers = {tool.full_name: tool.server for tool in extra}
    return body, ChatLoop(mcp, target, servers, target.settings.mcp.max_tool_rounds)


def _arguments(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


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
    mcp: McpManager
    target: Target
    servers: dict[str, str]  # offered MCP tool name -> its server
    rounds: int

    async def respond(
        self, body: ChatCompletionRequest, prepare: Prepare, complete: Complete
    ) -> Response[Any]:
        if body.stream:
            first = await prepare(self.target, body)  # its errors are still HTTP errors
            return Stream(self._stream(body, prepare, first), media_type="text/event-stream",
                          headers=SSE_HEADERS)  # fmt: skip
        return Response(await self._complete(body, prepare, complete))

    def _runs(self, calls: list[Call]) -> bool:
        return bool(calls) and all(name in self.servers for _, name, _ in calls)

    async def _run(self, calls: list[Call]) -> list[ToolResult]:
        async def one(name: str, text: str) -> ToolResult:
            arguments = _arguments(text)
            if arguments is None:
                return error_result(name, "the arguments are not a JSON object")
            return await self.mcp.execute_or_error(name, arguments)

        return list(await asyncio.gather(*(one(name, text) for _, name, text in calls)))

    async def _complete(
        self, body: ChatCompletionRequest, prepare: Prepare, complete: Complete
    ) -> dict[str, Any]:
        executed: list[dict[str, Any]] = []
        prompt = completion = 0
        for round_no in range(self.rounds + 1):
            gen, parser, max_calls = await prepare(self.target, body)
            response = await complete(self.target, gen, body.model, parser, max_calls)
            prompt += response["usage"]["prompt_tokens"]
            completion += response["usage"]["completion_tokens"]
            message = response["choices"][0]["message"]
            calls = [
                (c["id"], c["function"]["name"], c["function"]["arguments"])
                for c in message.get("tool_calls") or []
            ]
            if round_no == self.rounds or not self._runs(calls):
                break
            results = await self._run(calls)
            executed.extend(
                _record(round_no + 1, c, r) for c, r in zip(calls, results, strict=True)
            )
            body = extended(body, message.get("content") or "", calls, results)
        response["usage"] = convert.usage_dict(Usage(prompt, completion))
        if executed:
            response["mcp_tool_calls"] = executed
        return response

    async def _stream(
        self, body: ChatCompletionRequest, prepare: Prepare, first: Prepared
    ) -> AsyncIterator[bytes]:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        chunks: convert.ChatChunks | None = None
        usage = Usage(0, 0)
        base = 0  # tool-call indexes keep counting across rounds
        try:
            for round_no in range(self.rounds + 1):
                gen, parser, max_calls = await prepare(self.target, body) if round_no else first
                if chunks is None:
                    chunks = convert.ChatChunks(gen.request_id, body.model)
                    yield data_event(chunks.chunk({"role": "assistant", "content": ""}))
                state = _Round(base, max_calls)
                async for event in run_parsed(self.target, gen, ROUTE, parser):
                    delta = state.take(event, self.servers)
                    if delta is not None:
                        yield data_event(chunks.chunk(delta))
                finished = state.finished
                if finished is None:
                    raise APIError(500, "generation ended without a result", "server_error")
                usage = _added(usage, finished.usage)
                calls = state.calls()
                if (
                    round_no < self.rounds
                    and finished.reason is FinishReason.TOOL_CALLS
                    and self._runs(calls)
                ):
                    results = await self._run(calls)
                    records = [
                        _record(round_no + 1, c, r) for c, r in zip(calls, results, strict=True)
                    ]
                    yield data_event(chunks.chunk({"mcp_tool_results": records}))
                    body = extended(body, "".join(state.content), calls, results)
                    base += len(calls)
                    continue
                yield data_event(chunks.chunk({}, convert.finish_reason(finished.reason)))
                if include_usage:
                    yield data_event(chunks.usage(usage))
                break
        except Exception as exc:  # headers are sent: the error travels as an event
            yield data_event(convert.error_body(to_api_error(exc)))
        yield DONE


def _added(a: Usage, b: Usage) -> Usage:
    return Usage(a.prompt_tokens + b.prompt_tokens, a.completion_tokens + b.completion_tokens)


class _Round:
    """One generation of a streamed loop: deltas out, content and calls remembered."""

    def __init__(self, base: int, max_calls: int | None) -> None:
        self.base = base
        self.max_calls = max_calls
        self.content: list[str] = []
        self._calls: dict[int, list[str]] = {}
        self.finished: Finished | None = None

    def calls(self) -> list[Call]:
        return [(c[0], c[1], "".join(c[2:]) or "{}") for c in self._calls.values()]

    def take(self, event: Any, servers: dict[str, str]) -> dict[str, Any] | None:
        if isinstance(event, Finished):
            self.finished = event
            return None
        if isinstance(event, ContentDelta):
            self.content.append(event.text)
            return {"content": event.text}
        if isinstance(event, ReasoningDelta):
            return convert.reasoning_delta(event.text)
        if not isinstance(event, ToolCallStart | ToolCallArgumentsDelta):
            return None
        if self.max_calls is not None and event.index >= self.max_calls:
            return None
        index = self.base + event.index
        if isinstance(event, ToolCallArgumentsDelta):
            self._calls[event.index].append(event.fragment)
            return convert.tool_arguments_delta(index, event.fragment)
        self._calls[event.index] = [event.id, event.name]
        delta = convert.tool_start_delta(index, event.id, event.name)
        if event.name in servers:
            delta["tool_calls"][0]["mcp"] = {"server": servers[event.name]}
        return delta

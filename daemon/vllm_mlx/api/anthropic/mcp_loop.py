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

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from vllm_mlx.api.anthropic import convert
from vllm_mlx.api.anthropic.schema import InputMessage, MessagesRequest, PromptFields
from vllm_mlx.api.anthropic.schema import Tool as AnthropicTool
from vllm_mlx.api.anthropic.stream import PING_EVERY_S, Event, MessageBuilder, with_keepalive
from vllm_mlx.api.errors import APIError, to_api_error
from vllm_mlx.api.openai.mcp_loop import mcp_mode, offered_mcp_tools
from vllm_mlx.api.pipeline.turn import Target
from vllm_mlx.api.sse import named_event
from vllm_mlx.engine.types import Finished, Usage
from vllm_mlx.mcp.manager import McpManager
from vllm_mlx.mcp.tools import ToolResult

P = TypeVar("P", bound=PromptFields)
OneMessage = Callable[[MessagesRequest], Awaitable[dict[str, Any]]]
RoundOutput = tuple[AsyncGenerator[Any, None], MessageBuilder]
Round = Callable[[MessagesRequest], Awaitable[RoundOutput]]


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
            if (
                round_no == self.rounds
                or not self._runs(uses)
                or message["stop_reason"] != "tool_use"
            ):
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

    async def stream(
        self, body: MessagesRequest, next_round: Round, first: RoundOutput
    ) -> AsyncIterator[bytes]:
        """`first` is prepared before the response starts, so its errors are HTTP errors."""
        events, builder = first
        for event in builder.start():
            yield _sse(event)
        used = Usage(0, 0)
        try:
            for round_no in range(self.rounds + 1):
                if round_no:
                    events, _ = await next_round(body)  # the first builder spans every round
                start = len(builder.content)
                ended: list[Finished] = []
                async for chunk in self._generate(events, builder, ended):
                    yield chunk
                finished = ended[0]
                used = Usage(used.prompt_tokens + finished.usage.prompt_tokens,
                             used.completion_tokens + finished.usage.completion_tokens)  # fmt: skip
                blocks = builder.content[start:]
                uses = [block for block in blocks if block["type"] == "tool_use"]
                if round_no == self.rounds or not self._runs(uses):
                    last = Finished(finished.reason, used, finished.stop_sequence, finished.message)
                    for event in builder.finish(last):
                        yield _sse(event)
                    return
                results = list(await asyncio.gather(
                    *(self.mcp.execute_or_error(use["name"], use["input"]) for use in uses)
                ))  # fmt: skip
                for event in _result_blocks(builder, uses, results):
                    yield _sse(event)
                builder.used_tools = False  # a later round that only answers ends the turn
                body = _extended(body, blocks, uses, results)
        except Exception as exc:  # headers are sent: the error travels as an `error` event
            yield _sse(dict(convert.error_body(to_api_error(exc))))

    def _runs(self, uses: list[dict[str, Any]]) -> bool:
        return bool(uses) and all(use["name"] in self.names for use in uses)

    async def _generate(
        self, events: AsyncGenerator[Any, None], builder: MessageBuilder, ended: list[Finished]
    ) -> AsyncIterator[bytes]:
        """One round's events, its last block closed; its Finished goes into `ended`."""
        async for output in with_keepalive(events, PING_EVERY_S):
            if output is None:
                yield _sse({"type": "ping"})
            elif isinstance(output, Finished):
                ended.append(output)
            else:
                for event in builder.feed(output):
                    yield _sse(self._marked(event))
        if not ended:  # (a failed generation raised already, in api.generation.run)
            raise APIError(500, "generation ended without a result", "server_error")
        for event in builder.close():
            yield _sse(event)

    def _marked(self, event: Event) -> Event:
        block = event.get("content_block")
        if event["type"] == "content_block_start" and block and block["type"] == "tool_use":
            server = self.mcp.find(block["name"])
            if block["name"] in self.names and server is not None:
                event["content_block"] = {**block, "mcp": {"server": server.server}}
        return event


def _sse(event: Event) -> bytes:
    return named_event(event["type"], event)


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

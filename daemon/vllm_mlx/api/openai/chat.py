"""POST /v1/chat/completions: content, reasoning and tool calls, streamed or not."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from litestar import Request, Response, post
from litestar.response import Stream

from vllm_mlx.api import mcp_chat, structured
from vllm_mlx.api.common import parse_body, server_state
from vllm_mlx.api.errors import APIError, bad_request, to_api_error
from vllm_mlx.api.generation import (
    ParsedEvent,
    Target,
    build_request,
    new_request_id,
    output_parser_for,
    resolve_target,
    run_parsed,
)
from vllm_mlx.api.openai import convert
from vllm_mlx.api.openai.schema import ChatCompletionRequest
from vllm_mlx.api.prepare import prompt_tokens
from vllm_mlx.api.sse import DONE, SSE_HEADERS, data_event
from vllm_mlx.engine.types import Finished, GenerationRequest
from vllm_mlx.parsers.pipeline import OutputParser
from vllm_mlx.parsers.types import (
    ContentDelta,
    ReasoningDelta,
    ToolCall,
    ToolCallArgumentsDelta,
    ToolCallStart,
)

ROUTE = "/v1/chat/completions"


@post("/chat/completions", status_code=200)
async def chat_completions(request: Request[Any, Any, Any]) -> Response[Any]:
    body = await parse_body(request, ChatCompletionRequest)
    state = server_state(request)
    target = resolve_target(state, body.model)
    # mcp_tools (per model): MCP tools join the offer; `execute` runs them here.
    body, mcp_loop = mcp_chat.attach(state.mcp, target, body)
    if mcp_loop is not None:
        return await mcp_loop.respond(body, _prepare, _complete)
    gen, parser, max_calls = await _prepare(target, body)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        events = _limit_calls(run_parsed(target, gen, ROUTE, parser), max_calls)
        return Stream(
            _stream(target, gen, body.model, events, include_usage),
            media_type="text/event-stream",
            headers=SSE_HEADERS,
        )
    return Response(await _complete(target, gen, body.model, parser, max_calls))


async def _prepare(
    target: Target, body: ChatCompletionRequest
) -> tuple[GenerationRequest, OutputParser | None, int | None]:
    kwargs = convert.template_kwargs(body, target.settings.server.allow_client_chat_templates)
    prompt = await prompt_tokens(
        target, convert.chat_prompt_tokens, target.engine.tokenizer, body, kwargs
    )
    gen = build_request(
        target,
        new_request_id("chatcmpl"),
        prompt,
        body.wanted_max_tokens(),
        convert.sampling_from(target, body),
        body.stop_tuple(),
        timeout=body.timeout,
    )
    parser = await _structured(target, gen, body)
    # parallel_tool_calls: false keeps the first call only.
    max_calls = 1 if body.parallel_tool_calls is False else None
    return gen, parser, max_calls


async def _structured(
    target: Target, gen: GenerationRequest, body: ChatCompletionRequest
) -> OutputParser | None:
    """Attach the output's constraint; a forced tool choice gets its own call reader."""
    constraint = convert.output_constraint(body)
    forced = convert.forced_tools(body) if structured.enabled(target) else None
    if forced is not None:
        if constraint is not None:
            raise bad_request(
                "a forced tool_choice cannot be combined with an output format",
                constraint.param,
            )
        await structured.constrain_calls(target, gen, forced)
        return structured.forced_output_parser(target, gen, forced)
    if constraint is not None:
        await structured.constrain(target, gen, constraint)
    return output_parser_for(target, gen, convert.tool_specs(convert.offered_tools(body)))


async def _limit_calls(
    events: AsyncIterator[ParsedEvent], max_calls: int | None
) -> AsyncIterator[ParsedEvent]:
    async for event in events:
        if (
            max_calls is not None
            and isinstance(event, ToolCallStart | ToolCallArgumentsDelta)
            and event.index >= max_calls
        ):
            continue
        yield event


async def _complete(
    target: Target,
    gen: GenerationRequest,
    model: str,
    parser: OutputParser | None,
    max_calls: int | None,
) -> dict[str, Any]:
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, list[str]] = {}  # index -> [id, name, arguments...]
    async for event in _limit_calls(run_parsed(target, gen, ROUTE, parser), max_calls):
        if isinstance(event, ContentDelta):
            content.append(event.text)
        elif isinstance(event, ReasoningDelta):
            reasoning.append(event.text)
        elif isinstance(event, ToolCallStart):
            calls[event.index] = [event.id, event.name]
        elif isinstance(event, ToolCallArgumentsDelta):
            calls[event.index].append(event.fragment)
        else:
            tool_calls = [ToolCall(c[0], c[1], "".join(c[2:]) or "{}") for c in calls.values()]
            message = convert.chat_message("".join(content), "".join(reasoning), tool_calls)
            reason = convert.finish_reason(event.reason)
            return convert.chat_response(gen.request_id, model, message, reason, event.usage)
    raise APIError(500, "generation ended without a result", "server_error")


async def _stream(
    target: Target,
    gen: GenerationRequest,
    model: str,
    events: AsyncIterator[ParsedEvent],
    include_usage: bool,
) -> AsyncIterator[bytes]:
    chunks = convert.ChatChunks(gen.request_id, model)
    interval = target.settings.engine.stream_interval
    yield data_event(chunks.chunk({"role": "assistant", "content": ""}))
    pending: list[str] = []  # content is batched by stream_interval; the rest goes at once
    try:
        async for event in events:
            if isinstance(event, ContentDelta):
                pending.append(event.text)
                if len(pending) >= interval:
                    yield data_event(chunks.chunk({"content": "".join(pending)}))
                    pending = []
                continue
            if pending:
                yield data_event(chunks.chunk({"content": "".join(pending)}))
                pending = []
            if isinstance(event, Finished):
                yield data_event(chunks.chunk({}, convert.finish_reason(event.reason)))
                if include_usage:
                    yield data_event(chunks.usage(event.usage))
            else:
                yield data_event(chunks.chunk(_delta(event)))
    except Exception as exc:  # headers are sent: the error travels as an event
        yield data_event(convert.error_body(to_api_error(exc)))
    yield DONE


def _delta(event: ReasoningDelta | ToolCallStart | ToolCallArgumentsDelta) -> dict[str, Any]:
    if isinstance(event, ReasoningDelta):
        return convert.reasoning_delta(event.text)
    if isinstance(event, ToolCallStart):
        return convert.tool_start_delta(event.index, event.id, event.name)
    return convert.tool_arguments_delta(event.index, event.fragment)

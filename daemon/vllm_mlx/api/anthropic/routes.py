"""Anthropic-compatible routes: /v1/messages and /v1/messages/count_tokens.

Errors on these routes come back in Anthropic's shape ({"type": "error", ...}); the
model listing is shared with the OpenAI router, which answers in Anthropic's shape
when the request carries an anthropic-version header.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import structlog
from litestar import Request, Response, Router, post
from litestar.exceptions import HTTPException
from litestar.response import Stream

from vllm_mlx.api.anthropic import convert
from vllm_mlx.api.anthropic import mcp_loop as mcp_messages
from vllm_mlx.api.anthropic.schema import CountTokensRequest, MessagesRequest
from vllm_mlx.api.anthropic.stream import PING_EVERY_S, Event, MessageBuilder, with_keepalive
from vllm_mlx.api.edge.body import parse_body, server_state
from vllm_mlx.api.errors import APIError, to_api_error
from vllm_mlx.api.pipeline import structured
from vllm_mlx.api.pipeline.offload import prompt_tokens
from vllm_mlx.api.pipeline.turn import (
    Target,
    build_request,
    coalesced,
    limit_calls,
    resolve_target,
    run_parsed,
    sampling_params,
)
from vllm_mlx.api.sse import SSE_HEADERS, named_event
from vllm_mlx.engine.types import Finished, GenerationRequest
from vllm_mlx.parsers.pipeline import OutputParser
from vllm_mlx.parsers.types import ParserEvent

log = structlog.get_logger(__name__)

ROUTE = "/v1/messages"

Output = ParserEvent | Finished


def anthropic_error_response(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    if isinstance(exc, HTTPException):
        error = APIError(exc.status_code, str(exc.detail), kind="http")  # type by status
    else:
        error = to_api_error(exc)
    if error.status >= 500 and error.status not in (503, 504):
        log.exception("unhandled error", path=request.url.path)
    return Response(convert.error_body(error), status_code=error.status, headers=error.headers)


def _sse(event: Event) -> bytes:
    # The SSE event name is always the payload's own type.
    return named_event(event["type"], event)


async def _structured(
    target: Target, gen: GenerationRequest, body: MessagesRequest, prompt: convert.ChatPrompt
) -> OutputParser | None:
    """Attach the output's constraint; forced tool use gets its own call reader."""
    forced = convert.forced_tools(body, prompt) if structured.enabled(target) else None
    await structured.attach(
        target, gen, convert.output_constraint(body), forced, "an output format"
    )
    return structured.output_parser(target, gen, forced, prompt.tool_specs or None)


async def _output(
    target: Target, gen: GenerationRequest, prompt: convert.ChatPrompt, parser: OutputParser | None
) -> AsyncGenerator[Output, None]:
    """Reasoning, text and tool calls as the request's parsers split them."""
    async for event in limit_calls(run_parsed(target, gen, ROUTE, parser), prompt.max_tool_calls):
        yield event  # disable_parallel_tool_use: the first call only


async def _stream(
    target: Target,
    gen: GenerationRequest,
    prompt: convert.ChatPrompt,
    builder: MessageBuilder,
    parser: OutputParser | None,
) -> AsyncIterator[bytes]:
    for event in builder.start():
        yield _sse(event)
    interval = target.settings.engine.stream_interval
    try:
        outputs = coalesced(_output(target, gen, prompt, parser), interval)
        async for output in with_keepalive(outputs, PING_EVERY_S):
            if output is None:
                yield _sse({"type": "ping"})
                continue
            if not isinstance(output, Finished):
                for event in builder.feed(output):
                    yield _sse(event)
                continue
            for event in builder.finish(output):
                yield _sse(event)
    except Exception as exc:  # headers are sent: the error travels as an `error` event
        yield _sse(dict(convert.error_body(to_api_error(exc))))


async def _complete(
    target: Target,
    gen: GenerationRequest,
    prompt: convert.ChatPrompt,
    builder: MessageBuilder,
    parser: OutputParser | None,
) -> dict[str, Any]:
    finished: Finished | None = None
    async for output in _output(target, gen, prompt, parser):
        if isinstance(output, Finished):
            finished = output
        else:
            builder.feed(output)
    if finished is None:
        raise APIError(500, "generation ended without a result", "server_error")
    return builder.message(finished)


async def _prepare(
    target: Target, body: MessagesRequest
) -> tuple[GenerationRequest, convert.ChatPrompt, MessageBuilder, OutputParser | None]:
    prompt = convert.build_prompt(body)
    tokens = await prompt_tokens(target, convert.prompt_tokens, target.engine.tokenizer, prompt)
    sampling = sampling_params(
        target, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k
    )
    gen = build_request(
        target, f"msg_{uuid.uuid4().hex[:24]}", tokens, body.max_tokens, sampling, body.stop_tuple()
    )
    parser = await _structured(target, gen, body, prompt)
    return gen, prompt, MessageBuilder(gen.request_id, body.model, len(tokens)), parser


async def _one_message(target: Target, body: MessagesRequest) -> dict[str, Any]:
    return await _complete(target, *await _prepare(target, body))


async def _round(
    target: Target, body: MessagesRequest
) -> tuple[AsyncGenerator[Output, None], MessageBuilder]:
    """One generation of a streamed MCP loop: its coalesced output and a builder."""
    gen, prompt, builder, parser = await _prepare(target, body)
    interval = target.settings.engine.stream_interval
    return coalesced(_output(target, gen, prompt, parser), interval), builder


@post("/messages", status_code=200)
async def create_message(request: Request[Any, Any, Any]) -> Response[Any]:
    body = await parse_body(request, MessagesRequest)
    state = server_state(request)
    target = await resolve_target(state, body.model)
    body, mcp_loop = mcp_messages.attach(state.mcp, target, body)  # mcp_tools (per model)
    if mcp_loop is not None and body.stream:
        first = await _round(target, body)
        rounds = mcp_loop.stream(body, lambda b: _round(target, b), first)
        return Stream(rounds, media_type="text/event-stream", headers=SSE_HEADERS)
    if mcp_loop is not None:
        return Response(await mcp_loop.complete(body, lambda b: _one_message(target, b)))
    gen, prompt, builder, parser = await _prepare(target, body)
    if body.stream:
        return Stream(
            _stream(target, gen, prompt, builder, parser),
            media_type="text/event-stream",
            headers=SSE_HEADERS,
        )
    return Response(await _complete(target, gen, prompt, builder, parser))


@post("/messages/count_tokens", status_code=200)
async def count_tokens(request: Request[Any, Any, Any]) -> dict[str, int]:
    """Exactly the prompt tokens /v1/messages would charge for the same request."""
    body = await parse_body(request, CountTokensRequest)
    state = server_state(request)
    target = await resolve_target(state, body.model)
    body, _ = mcp_messages.attach(state.mcp, target, body)
    prompt = convert.build_prompt(body)
    tokens = await prompt_tokens(target, convert.prompt_tokens, target.engine.tokenizer, prompt)
    return {"input_tokens": len(tokens)}


def make_anthropic_router() -> Router:
    return Router(
        path="/v1",
        route_handlers=[create_message, count_tokens],
        exception_handlers={Exception: anthropic_error_response},
    )

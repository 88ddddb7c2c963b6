"""The OpenAI Responses API: POST /v1/responses (streamed or not) and the stored responses.

A third protocol adapter over the same engine events and parsers as chat and
Anthropic messages; errors come back in OpenAI's shape.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from litestar import Request, Response, Router, delete, get, post
from litestar.params import FromPath
from litestar.response import Stream

from vllm_mlx.api.edge.body import parse_body, server_state
from vllm_mlx.api.errors import APIError, bad_request, to_api_error
from vllm_mlx.api.openai.routes import openai_error_response
from vllm_mlx.api.pipeline import structured
from vllm_mlx.api.pipeline.chat_template import as_token_list, render_chat
from vllm_mlx.api.pipeline.offload import prompt_tokens
from vllm_mlx.api.pipeline.turn import (
    ParsedEvent,
    Target,
    build_request,
    coalesced,
    resolve_target,
    run_parsed,
    sampling_params,
)
from vllm_mlx.api.responses import convert, tools
from vllm_mlx.api.responses.schema import CreateResponseRequest
from vllm_mlx.api.responses.stream import Event, ResponseBuilder, response_base
from vllm_mlx.api.sse import SSE_HEADERS, named_event
from vllm_mlx.api.state import ServerState
from vllm_mlx.engine.types import Finished, GenerationRequest
from vllm_mlx.parsers.pipeline import OutputParser

ROUTE = "/v1/responses"
MAX_LIST_LIMIT = 100


@dataclass
class _Turn:
    """One request, resolved: what to run and what to store afterwards."""

    target: Target
    gen: GenerationRequest
    parser: OutputParser | None
    builder: ResponseBuilder
    items: list[dict[str, Any]]  # this request's input items
    history: list[dict[str, Any]]  # the stored conversation before them
    store: bool


def _sse(event: Event) -> bytes:
    # The SSE event name is always the payload's own type.
    return named_event(event["type"], event)


def _history(state: ServerState, body: CreateResponseRequest) -> list[dict[str, Any]]:
    if body.previous_response_id is None:
        return []
    limits = state.settings.responses
    stored = state.responses.get(
        body.previous_response_id, max_entries=limits.store_max_entries, ttl=limits.store_ttl
    )
    if stored is None:
        raise convert.previous_not_found(body.previous_response_id)
    return stored.conversation


async def _prepare(state: ServerState, body: CreateResponseRequest) -> _Turn:
    target = await resolve_target(state, body.model)
    convert.check_unsupported(body)
    items = convert.input_items(body)
    history = _history(state, body)
    toolset = tools.tool_set(body)
    offered = tools.offered(toolset, body.tool_choice)
    messages = convert.chat_messages([*history, *items], body.instructions, len(history))
    tokenizer = target.engine.tokenizer
    # Agent prompts run to thousands of tokens: rendered off the event loop, time-bounded.
    tokens = await prompt_tokens(
        target,
        render_chat,
        tokenizer,
        messages,
        offered.template or None,
        convert.template_kwargs(body),
    )
    sampling = sampling_params(target, temperature=body.temperature, top_p=body.top_p)
    gen = build_request(
        target, convert.new_id("resp"), tokens, body.max_output_tokens, sampling, ()
    )
    tools.warn_left_out(toolset, gen.request_id)
    parser = await _structured(target, gen, body, toolset, offered)

    def count_tokens(text: str) -> int:
        return len(as_token_list(tokenizer.encode(text))) if text else 0

    builder = ResponseBuilder(
        response_base(body, gen.request_id, sampling),
        offered.namespaces,
        count_tokens,
        max_calls=1 if body.parallel_tool_calls is False else None,
    )
    return _Turn(target, gen, parser, builder, items, history, body.stores)


async def _structured(
    target: Target,
    gen: GenerationRequest,
    body: CreateResponseRequest,
    toolset: tools.ToolSet,
    offered: tools.ToolSet,
) -> OutputParser | None:
    """Attach text.format's constraint; a forced tool choice gets its own call reader."""
    forced = tools.forced(body, toolset, offered) if structured.enabled(target) else None
    await structured.attach(target, gen, convert.output_constraint(body), forced, "a text.format")
    return structured.output_parser(target, gen, forced, offered.specs or None)


def _keep(state: ServerState, turn: _Turn) -> None:
    if not turn.store:
        return
    limits = state.settings.responses
    state.responses.put(
        turn.builder.response,
        turn.items,
        [*turn.history, *turn.items],
        max_entries=limits.store_max_entries,
        ttl=limits.store_ttl,
    )


def _events(turn: _Turn) -> AsyncGenerator[ParsedEvent, None]:
    return run_parsed(turn.target, turn.gen, ROUTE, turn.parser)


async def _stream(state: ServerState, turn: _Turn) -> AsyncIterator[bytes]:
    builder = turn.builder
    for event in builder.start():
        yield _sse(event)
    interval = turn.target.settings.engine.stream_interval
    try:
        async with aclosing(coalesced(_events(turn), interval)) as outputs:
            async for output in outputs:
                if not isinstance(output, Finished):
                    for event in builder.feed(output):
                        yield _sse(event)
                    continue
                for event in builder.finish(output):
                    yield _sse(event)
    except Exception as exc:  # headers are sent: the error travels as response.failed
        for event in builder.fail(to_api_error(exc)):
            yield _sse(event)
    _keep(state, turn)


async def _complete(state: ServerState, turn: _Turn) -> dict[str, Any]:
    async with aclosing(_events(turn)) as outputs:
        async for output in outputs:
            if not isinstance(output, Finished):
                turn.builder.feed(output)
                continue
            turn.builder.finish(output)
            _keep(state, turn)
            return turn.builder.response
    raise APIError(500, "generation ended without a result", "server_error")


@post("/responses", status_code=200)
async def create_response(request: Request[Any, Any, Any]) -> Response[Any]:
    body = await parse_body(request, CreateResponseRequest)
    state = server_state(request)
    turn = await _prepare(state, body)
    if body.stream:
        return Stream(_stream(state, turn), media_type="text/event-stream", headers=SSE_HEADERS)
    return Response(await _complete(state, turn))


def _stored(state: ServerState, response_id: str) -> Any:
    limits = state.settings.responses
    stored = state.responses.get(
        response_id, max_entries=limits.store_max_entries, ttl=limits.store_ttl
    )
    if stored is None:
        raise convert.response_not_found(response_id)
    return stored


@get("/responses/{response_id:str}")
async def get_response(
    request: Request[Any, Any, Any], response_id: FromPath[str]
) -> dict[str, Any]:
    response: dict[str, Any] = _stored(server_state(request), response_id).response
    return response


@delete("/responses/{response_id:str}", status_code=200)
async def delete_response(
    request: Request[Any, Any, Any], response_id: FromPath[str]
) -> dict[str, Any]:
    if not server_state(request).responses.delete(response_id):
        raise convert.response_not_found(response_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True}


@get("/responses/{response_id:str}/input_items")
async def list_input_items(
    request: Request[Any, Any, Any], response_id: FromPath[str]
) -> dict[str, Any]:
    items = list(_stored(server_state(request), response_id).input_items)
    query = request.query_params
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request("order must be 'asc' or 'desc'", "order")
    try:
        limit = int(query.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise bad_request(f"limit must be an integer from 1 to {MAX_LIST_LIMIT}", "limit")
    if order == "desc":
        items.reverse()
    after = query.get("after")
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise bad_request(f"no input item with id '{after}' in this response", "after")
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "has_more": len(items) > limit,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
    }


def make_responses_router() -> Router:
    return Router(
        path="/v1",
        route_handlers=[create_response, get_response, delete_response, list_input_items],
        exception_handlers={Exception: openai_error_response},
    )

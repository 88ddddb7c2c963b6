"""Anthropic-compatible routes: /v1/messages and /v1/messages/count_tokens.

Errors on these routes come back in Anthropic's shape ({"type": "error", ...}); the
model listing (api/models.py) answers in Anthropic's shape when the request carries an
anthropic-version header.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, Router, post
from litestar.response import Stream

from vllm_mlx.api.anthropic import convert, mcp_loop
from vllm_mlx.api.anthropic.message_request import message_generation
from vllm_mlx.api.anthropic.schema import CountTokensRequest, MessagesRequest
from vllm_mlx.api.edge.body import parse_body
from vllm_mlx.api.error_shapes import anthropic_error_response
from vllm_mlx.api.pipeline import driver
from vllm_mlx.api.pipeline.turn import resolve_turn
from vllm_mlx.api.pipeline.vision import ImageParts
from vllm_mlx.api.sse import SSE_HEADERS
from vllm_mlx.api.state import server_state

ROUTE = "/v1/messages"


@post("/messages", status_code=200)
async def create_message(request: Request[Any, Any, Any]) -> Response[Any]:
    body = await parse_body(request, MessagesRequest)
    state = server_state(request)
    turn = await resolve_turn(request, body.model, ROUTE)
    body, loop = mcp_loop.attach(state.mcp, turn, body)  # mcp_tools (per model)
    if loop is not None:
        return await loop.respond(body)
    generation = await message_generation(turn, body)
    if body.stream:
        interval = turn.settings.engine.stream_interval
        frames = driver.stream([generation.run], generation.builder, interval)
        return Stream(frames, media_type="text/event-stream", headers=SSE_HEADERS)
    return Response(await driver.complete([generation.run], generation.builder))


@post("/messages/count_tokens", status_code=200)
async def count_tokens(request: Request[Any, Any, Any]) -> dict[str, int]:
    """Exactly the prompt tokens /v1/messages would charge for the same request."""
    body = await parse_body(request, CountTokensRequest)
    state = server_state(request)
    turn = await resolve_turn(request, body.model, ROUTE)
    body, _ = mcp_loop.attach(state.mcp, turn, body)
    images = ImageParts.of(turn)
    prompt = convert.build_prompt(body, turn.settings.engine.prompt_canonicalization, images)
    counted = await convert.turn_prompt(turn, images, prompt)
    return {"input_tokens": len(counted.tokens)}


def make_anthropic_router() -> Router:
    return Router(
        path="/v1",
        route_handlers=[create_message, count_tokens],
        exception_handlers={Exception: anthropic_error_response},
    )

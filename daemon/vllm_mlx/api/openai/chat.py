"""POST /v1/chat/completions: content, reasoning and tool calls, streamed or not."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, post
from litestar.response import Stream

from vllm_mlx.api.edge.body import parse_body
from vllm_mlx.api.openai import choices, convert, mcp_loop
from vllm_mlx.api.openai.chat_builder import ChatBuilder
from vllm_mlx.api.openai.chat_request import chat_generation
from vllm_mlx.api.openai.schema import ChatCompletionRequest
from vllm_mlx.api.pipeline import driver
from vllm_mlx.api.pipeline.ids import new_id
from vllm_mlx.api.pipeline.turn import resolve_turn
from vllm_mlx.api.sse import SSE_HEADERS
from vllm_mlx.api.state import server_state

ROUTE = "/v1/chat/completions"


@post("/chat/completions", status_code=200)
async def chat_completions(request: Request[Any, Any, Any]) -> Response[Any]:
    body = await parse_body(request, ChatCompletionRequest)
    state = server_state(request)
    turn = await resolve_turn(request, body.model, ROUTE)
    convert.refuse_unsupported(body)
    # mcp_tools (per model): MCP tools join the offer; `execute` runs them here.
    body, loop = mcp_loop.attach(state.mcp, turn, body)
    if loop is not None:
        return await loop.respond(body)
    count = choices.choice_count(turn, body.n)
    generation = await chat_generation(turn, body, new_id("chatcmpl-"))
    runs, logprobs = generation.runs(count, bool(body.logprobs))
    request_id = generation.base.request_id
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    builder = ChatBuilder(
        request_id, body.model, logprobs, streaming=bool(body.stream), include_usage=include_usage
    )
    if body.stream:
        interval = turn.settings.engine.stream_interval
        frames = driver.stream(runs, builder, interval)
        return Stream(frames, media_type="text/event-stream", headers=SSE_HEADERS)
    return Response(await driver.complete(runs, builder))

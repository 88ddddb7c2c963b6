"""The OpenAI Responses API: POST /v1/responses (streamed or not) and the stored responses.

A third protocol adapter over the same engine events and parsers as chat and
Anthropic messages; errors come back in OpenAI's shape.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, Router, delete, get, post
from litestar.params import FromPath
from litestar.response import Stream

from vllm_mlx.api.edge.body import parse_body
from vllm_mlx.api.error_shapes import openai_error_response
from vllm_mlx.api.errors import bad_request
from vllm_mlx.api.pipeline import driver
from vllm_mlx.api.responses import convert
from vllm_mlx.api.responses.response_request import response_generation
from vllm_mlx.api.responses.schema import CreateResponseRequest
from vllm_mlx.api.sse import SSE_HEADERS
from vllm_mlx.api.state import ServerState, request_settings, server_state

MAX_LIST_LIMIT = 100


@post("/responses", status_code=200)
async def create_response(request: Request[Any, Any, Any]) -> Response[Any]:
    body = await parse_body(request, CreateResponseRequest)
    run, builder = await response_generation(request, body)
    if body.stream:
        interval = request_settings(request).engine.stream_interval
        frames = driver.stream([run], builder, interval)
        return Stream(frames, media_type="text/event-stream", headers=SSE_HEADERS)
    return Response(await driver.complete([run], builder))


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

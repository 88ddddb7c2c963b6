"""OpenAI-compatible routes: /v1/models, /v1/chat/completions, /v1/completions.

POST /v1/embeddings lives in embeddings.py.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import structlog
from litestar import Request, Response, Router, get, post
from litestar.exceptions import HTTPException
from litestar.response import Stream

from vllm_mlx.api import structured
from vllm_mlx.api.anthropic import convert as anthropic_convert
from vllm_mlx.api.common import parse_body, server_state
from vllm_mlx.api.errors import APIError, model_not_found, to_api_error
from vllm_mlx.api.generation import (
    Target,
    build_request,
    new_request_id,
    resolve_target,
    run,
)
from vllm_mlx.api.openai import convert
from vllm_mlx.api.openai.chat import chat_completions
from vllm_mlx.api.openai.embeddings import embeddings
from vllm_mlx.api.openai.schema import CompletionRequest, ModelCard
from vllm_mlx.api.prepare import off_loop, prompt_tokens
from vllm_mlx.api.sse import DONE, SSE_HEADERS, data_event
from vllm_mlx.api.state import ServerState
from vllm_mlx.engine.types import Finished, GenerationRequest, TextDelta

log = structlog.get_logger(__name__)


def openai_error_response(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    if isinstance(exc, HTTPException):
        error = APIError(
            exc.status_code,
            str(exc.detail),
            "invalid_request" if exc.status_code < 500 else "server_error",
        )
    else:
        error = to_api_error(exc)
    if error.status >= 500 and error.status not in (503, 504):
        log.exception("unhandled error", path=request.url.path)
    return Response(convert.error_body(error), status_code=error.status, headers=error.headers)


def _model_card(model_id: str, created: int) -> ModelCard:
    return {"id": model_id, "object": "model", "created": created, "owned_by": "vllm-mlx"}


def model_cards(state: ServerState) -> list[ModelCard]:
    cards = []
    for entry in state.registry.entries():
        name = entry.settings.name
        cards.append(_model_card(name, entry.created))
        cards.extend(_model_card(a, entry.created) for a in state.registry.aliases_of(name))
    return cards


@get("/models")
async def list_models(request: Request[Any, Any, Any]) -> Any:
    state = server_state(request)
    if anthropic_convert.wants_anthropic(request.headers):  # Anthropic SDK, Claude Code
        return anthropic_convert.model_list(state)
    return {"object": "list", "data": model_cards(state)}


@get("/models/{model_id:path}")
async def get_model(request: Request[Any, Any, Any], model_id: str) -> Any:
    model_id = model_id.lstrip("/")
    state = server_state(request)
    if anthropic_convert.wants_anthropic(request.headers):
        info = anthropic_convert.find_model(state, model_id)
        if info is not None:
            return info
        body = anthropic_convert.error_body(model_not_found(model_id))
        return Response(body, status_code=404)
    for card in model_cards(state):
        if card["id"] == model_id:
            return card
    raise model_not_found(model_id)


async def _collect(target: Target, gen: GenerationRequest, route: str) -> tuple[str, Finished]:
    parts: list[str] = []
    async for event in run(target, gen, route):
        if isinstance(event, TextDelta):
            parts.append(event.text)
        else:
            return "".join(parts), event
    raise APIError(500, "generation ended without a result", "server_error")


@post("/completions", status_code=200)
async def completions(request: Request[Any, Any, Any]) -> Response[Any]:
    body = await parse_body(request, CompletionRequest)
    target = resolve_target(server_state(request), body.model)
    prompt = await prompt_tokens(
        target, convert.completion_prompt_tokens, target.engine.tokenizer, body
    )
    gen = build_request(
        target,
        new_request_id("cmpl"),
        prompt,
        body.max_tokens,
        convert.sampling_from(target, body),
        body.stop_tuple(),
        timeout=body.timeout,
    )
    constraint = convert.output_constraint(body)
    if constraint is not None:
        await structured.constrain(target, gen, constraint)
    echo = ""
    if body.echo:
        timeout = target.settings.limits.prompt_timeout
        echo = await off_loop(target.engine.tokenizer.decode, prompt, limit_s=timeout)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return Stream(
            _stream_completion(target, gen, body.model, include_usage, echo),
            media_type="text/event-stream",
            headers=SSE_HEADERS,
        )
    text, finished = await _collect(target, gen, "/v1/completions")
    payload = convert.completion_chunk(
        gen.request_id,
        body.model,
        echo + text,
        convert.finish_reason(finished.reason),
        int(time.time()),
    )
    payload["usage"] = convert.usage_dict(finished.usage)
    return Response(payload)


async def _stream_completion(
    target: Target, gen: GenerationRequest, model: str, include_usage: bool, echo: str
) -> AsyncIterator[bytes]:
    created = int(time.time())
    interval = target.settings.engine.stream_interval
    pending: list[str] = [echo] if echo else []
    try:
        async for event in run(target, gen, "/v1/completions"):
            if isinstance(event, TextDelta):
                pending.append(event.text)
                if len(pending) >= interval:
                    yield data_event(
                        convert.completion_chunk(
                            gen.request_id, model, "".join(pending), None, created
                        )
                    )
                    pending = []
                continue
            reason = convert.finish_reason(event.reason)
            yield data_event(
                convert.completion_chunk(gen.request_id, model, "".join(pending), reason, created)
            )
            if include_usage:
                usage_chunk = convert.completion_chunk(gen.request_id, model, "", None, created)
                usage_chunk["choices"] = []
                usage_chunk["usage"] = convert.usage_dict(event.usage)
                yield data_event(usage_chunk)
    except Exception as exc:
        yield data_event(convert.error_body(to_api_error(exc)))
    yield DONE


def make_openai_router() -> Router:
    return Router(
        path="/v1",
        route_handlers=[list_models, get_model, chat_completions, completions, embeddings],
        exception_handlers={Exception: openai_error_response},
    )

"""Ollama's native API: /api/chat, /api/generate, /api/embed, the model listings, `/`.

A fourth protocol adapter over the same pipeline as the others (api/pipeline/); errors
come back in Ollama's shape ({"error": "..."}). Models come from the config file, so the
registry operations (pull, push, create, copy, delete) are answered as such: `pull` of a
configured model loads it, the others say how to change the config. docs/ollama.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from litestar import Request, Response, Router, delete, get, post
from litestar.response import Stream

from vllm_mlx.api.edge.body import parse_body
from vllm_mlx.api.error_shapes import ollama_error_response
from vllm_mlx.api.errors import APIError, bad_request
from vllm_mlx.api.ollama import convert, models
from vllm_mlx.api.ollama.builder import Kind, ndjson
from vllm_mlx.api.ollama.generation import ollama_generation
from vllm_mlx.api.ollama.keep_alive import parse_keep_alive
from vllm_mlx.api.ollama.schema import (
    ChatRequest,
    EmbedRequest,
    GenerateRequest,
    LegacyEmbeddingsRequest,
    ModelRequest,
)
from vllm_mlx.api.pipeline import driver
from vllm_mlx.api.pipeline.acquire import load, manager_of, served_entry
from vllm_mlx.api.pipeline.embedding import cut, embed, output_dimensions, resolve_embedder
from vllm_mlx.api.pipeline.turn import Turn, resolve_turn
from vllm_mlx.api.principal import check_model
from vllm_mlx.api.state import request_settings, server_state
from vllm_mlx.engine.fleet.residency import ModelBusyError

NDJSON = "application/x-ndjson"
# The Ollama version whose API this adapter follows: some apps check it before use.
OLLAMA_API_VERSION = "0.12.0"
CONFIG_ONLY = (
    "models are served from this daemon's config file: add one under `models:` in "
    "vllm-mlx.yaml (see docs/ollama.md), then `vllm-mlx reload`"
)


def _not_found(name: str) -> APIError:
    # Ollama's own wording: some apps look for "not found" to offer a pull.
    return APIError(
        404, f'model "{name}" not found; {CONFIG_ONLY}', "not_found", "model", "model_not_found"
    )


async def _turn(request: Request[Any, Any, Any], name: str, route: str) -> Turn:
    try:
        return await resolve_turn(request, convert.model_id(name), route)
    except APIError as exc:
        if exc.code == "model_not_found":
            raise _not_found(name) from None
        raise


def _keep_alive_after(
    request: Request[Any, Any, Any], model_id: str, seconds: float | None
) -> None:
    """Applies once this request releases the model (it holds it now)."""
    state = server_state(request)
    manager_of(state).keep_alive_after(served_entry(state, model_id), seconds)


def _one(event: dict[str, Any], streaming: bool) -> Response[Any]:
    """A single object, as one NDJSON line when the client streams."""
    if not streaming:
        return Response(event)

    async def line() -> AsyncIterator[bytes]:
        yield ndjson(event)

    return Stream(line(), media_type=NDJSON)


async def _generate(
    request: Request[Any, Any, Any], body: ChatRequest | GenerateRequest, kind: Kind
) -> Response[Any]:
    started = time.monotonic_ns()
    keep_alive = parse_keep_alive(body.keep_alive)  # a bad one is a 400 before any load
    turn = await _turn(request, body.model, f"/api/{kind}")
    _keep_alive_after(request, turn.model_id, keep_alive)
    load_ns = time.monotonic_ns() - started
    generation = await ollama_generation(turn, body, kind, started, load_ns)
    runs, builder = [generation.run], generation.builder
    if body.stream:
        interval = turn.settings.engine.stream_interval
        return Stream(driver.stream(runs, builder, interval), media_type=NDJSON)
    return Response(await driver.complete(runs, builder))


@post("/api/chat", status_code=200)
async def chat(request: Request[Any, Any, Any]) -> Response[Any]:
    body = await parse_body(request, ChatRequest)
    if not body.messages:  # Ollama's preload idiom for chat
        return await _load_or_unload(request, body.model, body.keep_alive, body.stream, "chat")
    return await _generate(request, body, "chat")


@post("/api/generate", status_code=200)
async def generate(request: Request[Any, Any, Any]) -> Response[Any]:
    body = await parse_body(request, GenerateRequest)
    if not body.prompt and not body.images:  # preload (or unload with keep_alive 0)
        return await _load_or_unload(request, body.model, body.keep_alive, body.stream, "generate")
    return await _generate(request, body, "generate")


async def _load_or_unload(
    request: Request[Any, Any, Any],
    name: str,
    keep_alive: float | str | None,
    streaming: bool,
    kind: Kind,
) -> Response[Any]:
    state = server_state(request)
    try:
        entry = served_entry(state, convert.model_id(name))
    except APIError as exc:
        raise _not_found(name) if exc.code == "model_not_found" else exc from None
    seconds = parse_keep_alive(keep_alive)
    if seconds == 0:
        try:
            await manager_of(state).unload(entry)
        except ModelBusyError as exc:
            raise APIError(409, f"{exc}; try again when they finish", "invalid_request") from exc
        reason = "unload"
    else:
        await load(state, entry, name, hold=False)
        entry.last_used = time.monotonic()  # idle from now: keep_alive counts from here
        manager_of(state).keep_alive_after(entry, seconds)
        reason = "load"
    event: dict[str, Any] = {"model": name, "created_at": convert.timestamp()}
    event |= (
        {"message": {"role": "assistant", "content": ""}} if kind == "chat" else {"response": ""}
    )
    return _one({**event, "done": True, "done_reason": reason}, streaming)


# --- embeddings ------------------------------------------------------------------------


async def _embeddings(
    request: Request[Any, Any, Any], name: str, inputs: list[str], truncate: bool,
    dimensions: int | None, keep_alive: float | str | None, route: str,
) -> tuple[list[list[float]], int, int]:  # fmt: skip
    started = time.monotonic()
    seconds = parse_keep_alive(keep_alive)
    state = server_state(request)
    try:
        target = await resolve_embedder(state, convert.model_id(name))
    except APIError as exc:
        raise _not_found(name) if exc.code == "model_not_found" else exc from None
    _keep_alive_after(request, target.model_id, seconds)
    load_ns = int((time.monotonic() - started) * 1e9)
    cut_to = output_dimensions(target, dimensions)
    if not inputs:
        return [], 0, load_ns
    settings = request_settings(request)
    done = await embed(state, settings, target, inputs, truncate, route, started)
    vectors: list[list[float]] = [cut(v, cut_to).tolist() for v in done.vectors]
    return vectors, done.prompt_tokens, load_ns


@post("/api/embed", status_code=200)
async def embed_route(request: Request[Any, Any, Any]) -> dict[str, Any]:
    started = time.monotonic_ns()
    body = await parse_body(request, EmbedRequest)
    inputs = [body.input] if isinstance(body.input, str) else list(body.input)
    vectors, count, load_ns = await _embeddings(
        request, body.model, inputs, body.truncate, body.dimensions, body.keep_alive, "/api/embed"
    )
    return {
        "model": body.model,
        "embeddings": vectors,
        "total_duration": time.monotonic_ns() - started,
        "load_duration": load_ns,
        "prompt_eval_count": count,
    }


@post("/api/embeddings", status_code=200)
async def embeddings_route(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """The legacy endpoint: one prompt, one vector; an empty prompt, an empty vector."""
    body = await parse_body(request, LegacyEmbeddingsRequest)
    inputs = [body.prompt] if body.prompt else []
    vectors, _, _ = await _embeddings(
        request, body.model, inputs, True, None, body.keep_alive, "/api/embeddings"
    )
    return {"embedding": vectors[0] if vectors else []}


# --- models ----------------------------------------------------------------------------


@get("/api/tags")
async def tags(request: Request[Any, Any, Any]) -> dict[str, Any]:
    return await asyncio.to_thread(models.tags, server_state(request))


@get("/api/ps")
async def ps(request: Request[Any, Any, Any]) -> dict[str, Any]:
    return await asyncio.to_thread(models.ps, server_state(request))


@post("/api/show", status_code=200)
async def show(request: Request[Any, Any, Any]) -> dict[str, Any]:
    body = await parse_body(request, ModelRequest)
    name = _name(body)
    state = server_state(request)
    entry = state.registry.resolve(convert.model_id(name))
    if entry is None:
        raise _not_found(name)
    check_model(name, entry.settings.name, entry.settings.aliases)
    return await asyncio.to_thread(models.show, state, entry)


def _name(body: ModelRequest) -> str:
    try:
        return body.model_name()
    except ValueError as exc:
        raise bad_request(str(exc), "model") from None


@get("/api/version")
async def version() -> dict[str, str]:
    return {"version": OLLAMA_API_VERSION}


@post("/api/pull", status_code=200)
async def pull(request: Request[Any, Any, Any]) -> Response[Any]:
    """A configured model is 'pulled' by loading it; any other name cannot be."""
    body = await parse_body(request, ModelRequest)
    name = _name(body)
    state = server_state(request)
    entry = state.registry.resolve(convert.model_id(name))
    if entry is None:
        raise APIError(400, f'cannot pull "{name}": {CONFIG_ONLY}', "invalid_request", "model")
    check_model(name, entry.settings.name, entry.settings.aliases)
    await load(state, entry, name, hold=False)
    return _one({"status": "success"}, body.stream)


def _refuse(action: str) -> APIError:
    return APIError(400, f"{action} is not supported: {CONFIG_ONLY}", "invalid_request")


@post(["/api/push", "/api/create", "/api/copy"], status_code=200)
async def registry_write(request: Request[Any, Any, Any]) -> None:
    raise _refuse(f"POST {request.url.path}")


@delete("/api/delete", status_code=200)
async def delete_model(request: Request[Any, Any, Any]) -> None:
    raise _refuse("DELETE /api/delete")


def make_ollama_router() -> Router:
    return Router(
        path="/",
        route_handlers=[
            chat, generate, embed_route, embeddings_route, tags, ps, show, version, pull,
            registry_write, delete_model,
        ],
        exception_handlers={Exception: ollama_error_response},
    )  # fmt: skip

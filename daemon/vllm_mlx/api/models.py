"""/v1/models in every shape, and explicit control: POST /v1/models/{id}/load|unload.

OpenAI clients get model cards; the Anthropic SDKs and Claude Code (they always send
anthropic-version) get Anthropic's model objects, and its error shape for a missing one.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from litestar import Request, Response, get, post
from litestar.params import FromPath

from vllm_mlx.api.anthropic.schema import ModelInfo, ModelList
from vllm_mlx.api.error_shapes import anthropic_error_body
from vllm_mlx.api.errors import APIError, model_not_found
from vllm_mlx.api.openai.schema import ModelCard
from vllm_mlx.api.pipeline.acquire import load, manager_of
from vllm_mlx.api.principal import check_model, visible
from vllm_mlx.api.state import ServerState, server_state
from vllm_mlx.engine.fleet.footprint import footprint
from vllm_mlx.engine.fleet.registry import ModelEntry
from vllm_mlx.engine.fleet.residency import ModelBusyError

MIB = 2**20
ANTHROPIC_VERSION_HEADER = "anthropic-version"


# --- OpenAI's shape --------------------------------------------------------------------


def _model_card(model_id: str, created: int, task: str) -> ModelCard:
    # `task` (our extension, extra keys are allowed by OpenAI's schema) says which routes
    # serve the model: generate (chat, completions), embed (embeddings), rerank.
    return {
        "id": model_id,
        "object": "model",
        "created": created,
        "owned_by": "vllm-mlx",
        "task": task,
    }


def model_cards(state: ServerState) -> list[ModelCard]:
    cards = []
    for entry in visible(state.registry.entries()):
        name, task = entry.settings.name, entry.settings.task
        cards.append(_model_card(name, entry.created, task))
        cards.extend(_model_card(a, entry.created, task) for a in state.registry.aliases_of(name))
        cards.extend(
            _model_card(a, entry.created, task) for a in state.registry.adapter_ids_of(name)
        )
    return cards


# --- Anthropic's shape ---------------------------------------------------------------


def wants_anthropic(headers: Mapping[str, str]) -> bool:
    """Anthropic SDKs and Claude Code always send anthropic-version; OpenAI clients never."""
    return ANTHROPIC_VERSION_HEADER in headers


def _rfc3339(timestamp: int) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat().replace("+00:00", "Z")


def model_infos(state: ServerState) -> list[ModelInfo]:
    infos: list[ModelInfo] = []
    for entry in visible(state.registry.entries()):
        name = entry.settings.name
        context = entry.engine.context_length if entry.engine is not None else None
        ids = (*state.registry.aliases_of(name), *state.registry.adapter_ids_of(name))
        for model_id in (name, *ids):
            infos.append(
                {
                    "type": "model",
                    "id": model_id,
                    "display_name": model_id,
                    "created_at": _rfc3339(entry.created),
                    "lifecycle": "active",
                    "max_input_tokens": context,
                }
            )
    return infos


def model_list(state: ServerState) -> ModelList:
    # Every served model fits in one page, so there is never a next page.
    infos = model_infos(state)
    return {
        "data": infos,
        "has_more": False,
        "first_id": infos[0]["id"] if infos else None,
        "last_id": infos[-1]["id"] if infos else None,
    }


def find_model(state: ServerState, model_id: str) -> ModelInfo | None:
    return next((info for info in model_infos(state) if info["id"] == model_id), None)


# --- the routes ------------------------------------------------------------------------


@get("/models")
async def list_models(request: Request[Any, Any, Any]) -> Any:
    state = server_state(request)
    if wants_anthropic(request.headers):  # Anthropic SDK, Claude Code
        return model_list(state)
    return {"object": "list", "data": model_cards(state)}


@get("/models/{model_id:path}")
async def get_model(request: Request[Any, Any, Any], model_id: FromPath[str]) -> Any:
    model_id = model_id.lstrip("/")
    state = server_state(request)
    if wants_anthropic(request.headers):
        info = find_model(state, model_id)
        if info is not None:
            return info
        return Response(anthropic_error_body(model_not_found(model_id)), status_code=404)
    for card in model_cards(state):
        if card["id"] == model_id:
            return card
    raise model_not_found(model_id)


def residency_block(state: ServerState, entry: ModelEntry) -> dict[str, Any]:
    """A model's memory and idle time, for /v1/status and the load/unload answers."""
    manager = state.residency
    size = footprint(entry)
    model = manager.model_settings(entry) if manager else entry.settings
    idle = manager.idle_seconds(entry) if manager else None
    return {
        "load": "startup" if entry.startup else "on_demand",
        # What applies now: a request's own keep_alive (Ollama's) over the config's.
        "keep_alive": manager.keep_alive(entry) if manager else model.keep_alive,
        "pinned": model.pin,
        "in_flight": entry.in_flight,
        "idle_s": None if idle is None else round(idle, 3),
        "memory_mb": round(size.total / MIB, 3),
        "weights_mb": round(size.weights / MIB, 3),
        "kv_mb": round(size.kv / MIB, 3),
        "prefix_cache_bound_mb": round(size.prefix_cache_bound / MIB, 3),
    }


def _answer(state: ServerState, entry: ModelEntry, action: str, changed: bool) -> dict[str, Any]:
    return {
        "id": entry.settings.name,
        "object": "model.residency",
        "action": action,
        "changed": changed,
        "state": entry.state.value,
        **residency_block(state, entry),
    }


@post("/models/{model_id:path}", status_code=200)
async def model_action(request: Request[Any, Any, Any], model_id: FromPath[str]) -> dict[str, Any]:
    """`POST /v1/models/{id}/load` and `/unload` (ids may hold slashes: org/name)."""
    model_id, _, action = model_id.lstrip("/").rpartition("/")
    state = server_state(request)
    if action not in ("load", "unload"):
        raise APIError(404, f"POST /v1/models/{model_id}/{action} is not served by this daemon; "
                       "use /load or /unload", "not_found")  # fmt: skip
    entry = state.registry.resolve(model_id)
    if entry is None:
        raise model_not_found(model_id)
    check_model(model_id, entry.settings.name, entry.settings.aliases)
    if state.draining:
        raise APIError(503, "the server is shutting down", "unavailable", code="shutting_down")
    manager = manager_of(state)
    if action == "load":
        was_loaded = entry.runner is not None
        await load(state, entry, model_id, hold=False)
        entry.last_used = time.monotonic()  # idle from now: keep_alive counts from here
        return _answer(state, entry, action, not was_loaded)
    try:
        changed = await manager.unload(entry)
    except ModelBusyError as exc:
        raise APIError(409, f"{exc}; it unloads once they finish if keep_alive allows, or "
                       "try again", "invalid_request", code="model_busy") from exc  # fmt: skip
    return _answer(state, entry, action, changed)

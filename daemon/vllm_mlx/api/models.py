"""Loading models for requests, and explicit control: POST /v1/models/{id}/load|unload.

A request for a model that is not in memory waits here while it loads (docs/models.md);
the errors become APIErrors, which each protocol's router renders in its own shape.
"""

from __future__ import annotations

import time
from typing import Any

from litestar import Request, post
from litestar.params import FromPath

from vllm_mlx.api.errors import APIError, model_not_found
from vllm_mlx.api.state import ServerState
from vllm_mlx.engine.fleet.footprint import footprint
from vllm_mlx.engine.fleet.registry import LoadState, ModelEntry
from vllm_mlx.engine.fleet.residency import (
    ModelBusyError,
    ModelCapacityError,
    ModelLoadError,
    ModelManager,
)

MIB = 2**20


def manager_of(state: ServerState) -> ModelManager:
    if state.residency is None:
        raise APIError(503, "models are not served yet", "unavailable", code="model_not_ready")
    return state.residency


def served_entry(state: ServerState, model_id: str) -> ModelEntry:
    """The model a request names: 503 while the daemon drains, 404 for an unknown id."""
    if state.draining:
        raise APIError(503, "the server is shutting down", "unavailable", code="shutting_down")
    entry = state.registry.resolve(model_id)
    if entry is None:
        raise model_not_found(model_id)
    return entry


async def acquire(state: ServerState, entry: ModelEntry, model_id: str) -> None:
    """Hold `entry` for this request, loading it first when it is not in memory; 503
    when it still cannot serve (failed, or stopped meanwhile)."""
    await _load(state, entry, model_id, hold=True)
    if entry.state is not LoadState.RUNNING or entry.runner is None:
        raise APIError(
            503, f"model '{model_id}' is {entry.state.value}", "unavailable", code="model_not_ready"
        )


async def _load(state: ServerState, entry: ModelEntry, model_id: str, hold: bool) -> None:
    manager = manager_of(state)
    try:
        await (manager.acquire(entry) if hold else manager.load_ready(entry))
    except ModelCapacityError as exc:
        raise APIError(503, str(exc), "unavailable", code="model_memory_budget") from exc
    except ModelLoadError as exc:
        message = str(exc)
        if not message.startswith("model '"):
            message = f"model '{model_id}' failed to load: {message}"
        raise APIError(503, message, "unavailable", code="model_not_ready") from exc


def residency_block(state: ServerState, entry: ModelEntry) -> dict[str, Any]:
    """A model's memory and idle time, for /v1/status and the load/unload answers."""
    manager = state.residency
    size = footprint(entry)
    model = manager.model_settings(entry) if manager else entry.settings
    idle = manager.idle_seconds(entry) if manager else None
    return {
        "load": "startup" if entry.startup else "on_demand",
        "keep_alive": model.keep_alive,
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
    state: ServerState = request.app.state.server  # not api.common: it imports generation
    if action not in ("load", "unload"):
        raise APIError(404, f"POST /v1/models/{model_id}/{action} is not served by this daemon; "
                       "use /load or /unload", "not_found")  # fmt: skip
    entry = state.registry.resolve(model_id)
    if entry is None:
        raise model_not_found(model_id)
    if state.draining:
        raise APIError(503, "the server is shutting down", "unavailable", code="shutting_down")
    manager = manager_of(state)
    if action == "load":
        was_loaded = entry.runner is not None
        await _load(state, entry, model_id, hold=False)
        entry.last_used = time.monotonic()  # idle from now: keep_alive counts from here
        return _answer(state, entry, action, not was_loaded)
    try:
        changed = await manager.unload(entry)
    except ModelBusyError as exc:
        raise APIError(409, f"{exc}; it unloads once they finish if keep_alive allows, or "
                       "try again", "invalid_request", code="model_busy") from exc  # fmt: skip
    return _answer(state, entry, action, changed)

"""The model a request names, held for it: loaded first when it is not in memory.

A request for a model that is not in memory waits here while it loads (docs/models.md);
the errors become APIErrors, which each protocol's router renders in its own shape.
"""

from __future__ import annotations

from vllm_mlx.api.errors import APIError, model_not_found
from vllm_mlx.api.principal import check_model
from vllm_mlx.api.state import ServerState
from vllm_mlx.engine.adapters import AdapterUnavailableError
from vllm_mlx.engine.fleet.leases import current_leases
from vllm_mlx.engine.fleet.registry import LoadState, ModelEntry
from vllm_mlx.engine.fleet.residency import ModelCapacityError, ModelLoadError, ModelManager
from vllm_mlx.usage.record import note_usage_model


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
    check_model(model_id, entry.settings.name, entry.settings.aliases)
    note_usage_model(entry.settings.name)  # usage is counted under the model's own name
    return entry


async def acquire(state: ServerState, entry: ModelEntry, model_id: str) -> None:
    """Hold `entry` for this request, loading it first when it is not in memory; 503
    when it still cannot serve (failed, or stopped meanwhile)."""
    await load(state, entry, model_id, hold=True)
    if entry.state is not LoadState.RUNNING or entry.runner is None:
        raise APIError(
            503, f"model '{model_id}' is {entry.state.value}", "unavailable", code="model_not_ready"
        )


async def load(state: ServerState, entry: ModelEntry, model_id: str, hold: bool) -> None:
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


async def acquire_adapter(state: ServerState, entry: ModelEntry, model_id: str) -> str | None:
    """The tag of the LoRA adapter `model_id` names (None: the base), loaded beside the
    running base if needed and held for this request; 503 when it cannot serve."""
    name = state.registry.adapter_of(model_id)
    if name is None or entry.engine is None:
        return None
    adapters = entry.engine.adapters
    manager = manager_of(state)
    adapters.sync(manager.model_settings(entry).adapters)
    try:
        tag = await adapters.acquire(name, lambda _: manager.adapter_room(entry))
    except KeyError as exc:  # the config changed between the lookup and now
        raise APIError(
            503, f"adapter '{model_id}' is not served now", "unavailable", code="adapter_not_ready"
        ) from exc
    except AdapterUnavailableError as exc:
        raise APIError(503, str(exc), "unavailable", code="adapter_not_ready") from exc
    adapters.hold(tag, current_leases())
    return tag

"""The prefix cache's control endpoints, per loaded model, behind the API keys.

    GET    /v1/cache/stats[?model=NAME]              both tiers: entries, bytes, hit rates
    DELETE /v1/cache[?tier=memory|disk][&model=NAME] empty both tiers, or one

Clearing runs on each model's engine thread, between steps (the cache is that thread's
alone); a request already prefilled keeps the KV it took. Models not loaded have no
cache in memory and are left out; their disk tier is cleared once they load.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from litestar import Request, Router, delete, get
from litestar.params import FromQuery

from vllm_mlx.api.error_shapes import openai_error_response
from vllm_mlx.api.errors import APIError, bad_request
from vllm_mlx.api.state import server_state
from vllm_mlx.engine.engine import Engine

TIERS = ("memory", "disk")
CLEAR_TIMEOUT_S = 30.0  # the engine thread takes commands between steps


def _engines(request: Request[Any, Any, Any], model: str | None) -> list[tuple[str, Engine]]:
    state = server_state(request)
    loaded = [
        (entry.settings.name, entry.engine)
        for entry in state.registry.entries()
        if entry.engine is not None
    ]
    if model is None:
        return loaded
    chosen = [(name, engine) for name, engine in loaded if name == model]
    if not chosen:
        names = ", ".join(name for name, _ in loaded) or "none"
        message = f"model '{model}' is not a loaded generation model (loaded: {names})"
        raise APIError(404, message, "not_found", param="model", code="model_not_found")
    return chosen


def _stats(name: str, engine: Engine) -> dict[str, Any]:
    summary = dict(engine.scheduler.prefix_cache.summary())
    disk = summary.pop("disk", None)
    return {"model": name, "memory": summary, "disk": disk}


@get("/v1/cache/stats", sync_to_thread=False)
def cache_stats(
    request: Request[Any, Any, Any], model: FromQuery[str | None] = None
) -> dict[str, Any]:
    return {"object": "list", "data": [_stats(n, e) for n, e in _engines(request, model)]}


@delete("/v1/cache", status_code=200)
async def clear_cache(
    request: Request[Any, Any, Any],
    tier: FromQuery[str | None] = None,
    model: FromQuery[str | None] = None,
) -> dict[str, Any]:
    if tier is not None and tier not in TIERS:
        raise bad_request(f"'tier' must be one of {', '.join(TIERS)} (or left out: both)", "tier")
    memory, disk = tier in (None, "memory"), tier in (None, "disk")
    cleared = []
    for name, engine in _engines(request, model):
        cache = engine.scheduler.prefix_cache
        done = engine.scheduler.call(functools.partial(cache.cleared, memory, disk))
        try:
            async with asyncio.timeout(CLEAR_TIMEOUT_S):
                counts = await asyncio.wrap_future(done)
        except TimeoutError as exc:
            raise APIError(503, f"model '{name}' did not clear its cache in time",
                           "server_error") from exc  # fmt: skip
        cleared.append({"model": name, **counts})
    return {"object": "list", "data": cleared}


def make_cache_router() -> Router:
    return Router(
        path="/",
        route_handlers=[cache_stats, clear_cache],
        exception_handlers={Exception: openai_error_response},
    )

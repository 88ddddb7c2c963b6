"""Operational routes: /health, /metrics, /v1/status, and the ASGI layer that serves them.

/health and /metrics stay open (no API key) by design: load balancers and Prometheus
rarely carry secrets. `auth.metrics_require_key` closes /metrics; /v1/status is an
API route and needs a key whenever keys are configured.
"""

from __future__ import annotations

import sys
import time
from typing import Any, cast

import psutil
from litestar import Litestar, Request, Response, get

from vllm_mlx import __version__
from vllm_mlx.api.edge.middleware import ASGIApp, OpsMiddleware
from vllm_mlx.api.error_shapes import error_body
from vllm_mlx.api.errors import APIError
from vllm_mlx.api.models import residency_block
from vllm_mlx.api.state import ServerState, server_state
from vllm_mlx.engine.embedding_runner import EmbeddingEngine
from vllm_mlx.engine.fleet.kernel_pool import kernel_pool_status
from vllm_mlx.engine.fleet.memory import read_memory
from vllm_mlx.engine.fleet.registry import LoadState, ModelEntry
from vllm_mlx.metrics.cache import CacheSample, PrefixCacheCollector
from vllm_mlx.metrics.core import CONTENT_TYPE
from vllm_mlx.metrics.live import MemorySample, ModelSample
from vllm_mlx.metrics.speculative import SpeculativeCollector, SpeculativeSample

GIB = 1024**3
# The seed's `status` words (a model still loading is "not_loaded"), and "failed".
STATUS_WORDS = {
    LoadState.LOADING: "loading",  # a first request waits on it (docs/models.md)
    LoadState.RUNNING: "running",
    LoadState.STOPPED: "stopped",
    LoadState.FAILED: "failed",
    LoadState.UNLOADING: "unloading",  # until teardown ends, then not_loaded
}
NO_CACHE = {"type": "none", "entries": 0, "hit_rate": 0.0, "memory_mb": 0.0}


@get("/health", sync_to_thread=False)
def health(request: Request[Any, Any, Any]) -> Response[dict[str, Any]]:
    """200 once the startup models have loaded or failed and a model can serve (one
    running, or one that loads on demand), unless draining; else 503.

    A model that failed to load does not hold the others back: "degraded", with its
    error in `models`; `ready` says which are in memory now (a daemon where none can
    serve exits at startup).
    """
    state = server_state(request)
    registry = state.registry
    models = [
        {
            "name": e.settings.name,
            "state": e.state.value,
            "task": e.settings.task,
            "ready": e.state is LoadState.RUNNING,
            **({"error": e.error} if e.error else {}),
        }
        for e in registry.entries()
    ]
    # MCP servers are reported, never counted against health: the models still serve.
    mcp = {"mcp": _mcp_health(state)} if state.mcp.servers else {}
    group = state.distributed
    if group is not None and group.failed:  # a lost rank: this daemon is about to exit
        body = {"status": "failed", "error": group.error, "models": models, **mcp}
        return Response(body, status_code=503)
    if state.draining:
        return Response({"status": "draining", "models": models, **mcp}, status_code=503)
    if not registry.settled:
        return Response({"status": "loading", "models": models, **mcp}, status_code=503)
    if not registry.ready:
        return Response({"status": "failed", "models": models, **mcp}, status_code=503)
    word = "degraded" if registry.failed() else "ok"
    return Response({"status": word, "models": models, **mcp}, status_code=200)


def _mcp_health(state: ServerState) -> list[dict[str, Any]]:
    return [
        {"name": s["name"], "state": s["state"], **({"error": s["error"]} if s["error"] else {})}
        for s in state.mcp.status()
    ]


@get("/metrics", sync_to_thread=False)
def metrics(request: Request[Any, Any, Any]) -> Response[Any]:
    """Prometheus text format; 404 unless `metrics.enabled`."""
    state = server_state(request)
    if not state.settings.metrics.enabled:
        error = APIError(404, "metrics are disabled (metrics.enabled: false)", "not_found")
        return Response(error_body("openai", error), status_code=404)
    return Response(state.metrics.render(), media_type=CONTENT_TYPE)


@get("/v1/status", sync_to_thread=False)
def status(request: Request[Any, Any, Any]) -> dict[str, Any]:
    return status_document(server_state(request))


# --- /v1/status ------------------------------------------------------------------------


def _adapters_block(engine: Any) -> list[dict[str, Any]]:
    """Each configured LoRA adapter: loaded or not, its bytes and requests in flight."""
    loaded = {a.name: a for a in engine.adapters.loaded() if a.tag.startswith(f"{a.name}@")}
    out = []
    for name in engine.adapters.names:
        adapter = loaded.get(name)
        out.append(
            {
                "name": name,
                "loaded": adapter is not None,
                "bytes": adapter.nbytes if adapter is not None else 0,
                "in_flight": adapter.in_flight if adapter is not None else 0,
            }
        )
    return out


def _kv_block(entry: ModelEntry, tokens: int) -> dict[str, Any]:
    """The live KV cache's form and size (the budget's estimate: tokens x bytes each)."""
    kv = entry.settings.kv_cache
    return {
        "bits": entry.kv_bits,
        "quantized": kv.bits is not None,
        "group_size": kv.group_size if kv.bits is not None else None,
        "quantized_after": kv.quantized_after if kv.bits is not None else None,
        "bytes_per_token": entry.kv_token_bytes,
        "tokens": tokens,
        "bytes": tokens * entry.kv_token_bytes,
    }


def _model_block(state: ServerState, entry: ModelEntry) -> dict[str, Any]:
    block: dict[str, Any] = {
        "model": entry.settings.name,
        "task": entry.settings.task,
        "status": STATUS_WORDS.get(entry.state, "not_loaded"),
        "state": entry.state.value,
    }
    if entry.error:
        block["error"] = entry.error
    engine = entry.engine
    requests: list[dict[str, Any]] = []
    if engine is not None:
        scheduler, stats = engine.scheduler, engine.scheduler.stats
        requests = [{**r, "model": entry.settings.name} for r in scheduler.snapshot()]
        capacity = scheduler.max_batch_size * engine.context_length
        block |= {
            "steps_executed": stats.steps_executed,
            "total_requests_processed": stats.requests_finished,
            "total_prompt_tokens": stats.prompt_tokens,
            "total_completion_tokens": stats.generated_tokens,
            "kv_cache_usage": round(scheduler.kv_tokens / capacity, 6) if capacity else 0.0,
            "kv_cache": _kv_block(entry, scheduler.kv_tokens),
            "adapters": _adapters_block(engine),
        }
    else:
        block |= _worker_block(entry)
    # Counted from the same snapshot as `requests`, so the two always agree.
    block["num_running"] = sum(1 for r in requests if r["phase"] != "queued")
    block["num_waiting"] = sum(1 for r in requests if r["phase"] == "queued")
    block["cache"] = engine.scheduler.prefix_cache.summary() if engine else dict(NO_CACHE)
    block["requests"] = requests
    block["residency"] = residency_block(state, entry)
    return block


def _worker_block(entry: ModelEntry) -> dict[str, Any]:
    """The counters of a model served by a worker thread of its own (embedding, speech),
    in the generation block's keys where they mean the same."""
    block: dict[str, Any] = {
        "steps_executed": 0,
        "total_requests_processed": 0,
        "total_prompt_tokens": 0,
        "total_completion_tokens": 0,
        "kv_cache_usage": 0.0,
    }
    embedder, speech = entry.embedder, entry.transcriber
    if embedder is not None:
        block |= {
            "steps_executed": embedder.stats.batches,
            "total_requests_processed": embedder.stats.requests,
            "total_prompt_tokens": embedder.stats.tokens,
            "embedding": _embedding_block(embedder),
        }
    if speech is not None:
        block["total_requests_processed"] = speech.stats.requests
        block["speech"] = {
            "multilingual": speech.loaded.multilingual,
            "audio_seconds": round(speech.stats.audio_seconds, 3),
            "requests_queued": speech.queued,
        }
    return block


def _embedding_block(embedder: EmbeddingEngine) -> dict[str, Any]:
    loaded, stats = embedder.loaded, embedder.stats
    return {
        "dimensions": embedder.dimensions,
        "max_input_tokens": loaded.max_length,
        "pooling": loaded.pooling,
        "normalize": loaded.normalize,
        "inputs_embedded": stats.inputs,
        "inputs_queued": stats.queued,
        "batches": stats.batches,
    }


def _total_cache(caches: list[dict[str, Any]]) -> dict[str, Any]:
    """Every model's prefix cache as one block (the seed's single-model shape)."""
    if not caches:
        return dict(NO_CACHE)
    queries = sum(c.get("queries", 0) for c in caches)
    hits = sum(c.get("hits", 0) for c in caches)
    return {
        # "paged" or "prefix": the kind of the first model that has a cache.
        "type": next((c["type"] for c in caches if c["type"] != "none"), "none"),
        "entries": sum(c["entries"] for c in caches),
        "hit_rate": round(hits / queries, 4) if queries else 0.0,
        "memory_mb": round(sum(c["memory_mb"] for c in caches), 3),
    }


def _memory_block() -> dict[str, float]:
    memory = read_memory()
    return {
        "active_gb": round(memory.active_bytes / GIB, 4),
        "peak_gb": round(memory.peak_bytes / GIB, 4),
        "cache_gb": round(memory.cache_bytes / GIB, 4),
        "rss_gb": round(memory.rss_bytes / GIB, 4),
        "system_gb": round(psutil.virtual_memory().total / GIB, 4),
    }


SUMMED = (
    "steps_executed", "num_running", "num_waiting", "total_requests_processed",
    "total_prompt_tokens", "total_completion_tokens",
)  # fmt: skip


def _overall(state: ServerState, blocks: list[dict[str, Any]]) -> str:
    words = {b["status"] for b in blocks}
    if state.draining or words == {"stopped"}:
        return "stopped"
    # Models that failed to load are reported in their blocks; the rest serve.
    return "running" if state.registry.ready else "not_loaded"


def status_document(state: ServerState) -> dict[str, Any]:
    """Totals over every model at the top (the seed's fields), one block per model."""
    blocks = [_model_block(state, entry) for entry in state.registry.entries()]
    memory: dict[str, Any] = _memory_block()
    budget = state.residency.budget() if state.residency else None
    memory["budget_mb"] = None if budget is None else round(budget / 2**20, 3)
    memory["models_mb"] = round(sum(b["residency"]["memory_mb"] for b in blocks), 3)
    document: dict[str, Any] = {
        "status": _overall(state, blocks),
        "model": blocks[0]["model"] if blocks else None,
        "version": __version__,
        "uptime_s": round(time.time() - state.metrics.started_at, 3),
        **{key: sum(b[key] for b in blocks) for key in SUMMED},
        "memory": memory,
    }
    if sys.platform == "darwin":
        document["metal"] = dict(memory)  # the seed's key, kept for its clients
    document["cache"] = _total_cache([b["cache"] for b in blocks])
    document["requests"] = [r for b in blocks for r in b["requests"]]
    document["models"] = blocks
    document["config"] = state.config_status()
    document["mcp"] = {"servers": state.mcp.status()}
    document["kernel_pool"] = kernel_pool_status()
    document["activity"] = state.metrics.activity.snapshot()
    if state.distributed is not None:
        document["distributed"] = state.distributed.describe()
    return document


# --- wiring ----------------------------------------------------------------------------


def live_sample(state: ServerState) -> tuple[list[ModelSample], MemorySample]:
    """What /metrics reads at scrape time: each model's live gauges, and memory."""
    samples = []
    for entry in state.registry.entries():
        engine = entry.engine
        sample = ModelSample(entry.settings.name, entry.state.value)
        if engine is not None:
            scheduler = engine.scheduler
            capacity = scheduler.max_batch_size * engine.context_length
            sample = ModelSample(
                entry.settings.name,
                entry.state.value,
                load_seconds=engine.loaded.load_seconds,
                running=scheduler.num_running,
                waiting=scheduler.num_waiting,
                kv_usage=scheduler.kv_tokens / capacity if capacity else 0.0,
                kv_bytes=scheduler.kv_tokens * entry.kv_token_bytes,
                kv_bits=entry.kv_bits,
                adapter_bytes=engine.adapters.nbytes,
                adapters_loaded=len(engine.adapters.loaded()),
            )
        elif entry.embedder is not None:
            sample = ModelSample(
                entry.settings.name,
                entry.state.value,
                load_seconds=entry.embedder.loaded.load_seconds,
                waiting=entry.embedder.stats.queued,
            )
        elif entry.transcriber is not None:
            sample = ModelSample(
                entry.settings.name,
                entry.state.value,
                load_seconds=entry.transcriber.loaded.load_seconds,
                waiting=entry.transcriber.queued,
            )
        samples.append(sample)
    m = read_memory()
    return samples, MemorySample(m.active_bytes, m.peak_bytes, m.cache_bytes, m.rss_bytes)


def speculative_samples(state: ServerState) -> list[SpeculativeSample]:
    """Each speculating model's counters (models/engine: plain ints on the engine)."""
    samples = []
    for entry in state.registry.entries():
        method = entry.settings.speculative.method
        if method is None:
            continue
        if entry.engine is None:
            samples.append(SpeculativeSample(entry.settings.name, method))
            continue
        stats = entry.engine.scheduler.stats
        samples.append(
            SpeculativeSample(
                entry.settings.name,
                method,
                stats.drafts,
                stats.drafted_tokens,
                stats.accepted_tokens,
                tuple(stats.accepted_per_position),
            )
        )
    return samples


def cache_samples(state: ServerState) -> list[CacheSample]:
    """Each generation model's prefix cache counters, for /metrics."""
    samples = []
    for entry in state.registry.entries():
        if entry.settings.task != "generate":
            continue
        if entry.engine is None:
            samples.append(CacheSample(entry.settings.name))
            continue
        cache = entry.engine.scheduler.prefix_cache
        stats = cache.stats
        samples.append(
            CacheSample(
                entry.settings.name,
                hits=stats.hits,
                misses=stats.misses,
                evictions=stats.evictions,
                rejected=stats.rejected,
                entries=cache.entries,
                nbytes=cache.nbytes,
                max_bytes=cache.max_bytes,
            )
        )
    return samples


def install_ops(app: Litestar, state: ServerState) -> None:
    """Put the ops ASGI layer in front of the router and feed /metrics its live gauges."""
    for model in state.settings.models:
        state.metrics.add_model(model.name)
    state.metrics.watch(lambda: live_sample(state))
    state.metrics.registry.register(PrefixCacheCollector(lambda: cache_samples(state)))
    state.metrics.registry.register(SpeculativeCollector(lambda: speculative_samples(state)))
    known = {route.path for route in app.routes}
    # Litestar wraps asgi_handler the same way for its own CORS middleware; ours runs
    # before routing too, so refusals and unknown paths are counted and shaped.
    inner = cast("ASGIApp", app.asgi_handler)
    app.asgi_handler = cast("Any", OpsMiddleware(inner, state, known))

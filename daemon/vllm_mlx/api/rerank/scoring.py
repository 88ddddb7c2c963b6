"""Scoring (query, document) pairs with a `task: rerank` model, for every rerank route.

The model's engine is the embedding engine (batched, bounded padded forward passes on
the model's own thread). Cross-encoders and LLM rerankers turn each pair's token list
into one score; embedding rerankers turn each text into a vector and the score is the
cosine of the two. Tokenizing the pairs (up to `limits.max_rerank_documents` of them)
runs on a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import structlog

from vllm_mlx.api.errors import bad_request
from vllm_mlx.api.pipeline.acquire import acquire, served_entry
from vllm_mlx.api.pipeline.embedding import prepare_tokens
from vllm_mlx.api.pipeline.ids import new_id
from vllm_mlx.api.state import ServerState
from vllm_mlx.config.settings import Settings
from vllm_mlx.engine.embedding_runner import EmbeddingEngine
from vllm_mlx.models.loaded import PairEncoder
from vllm_mlx.usage.record import add_usage

log = structlog.get_logger("vllm_mlx.requests")


@dataclass(frozen=True)
class Reranker:
    model_id: str
    name: str
    engine: EmbeddingEngine
    method: str


async def resolve_reranker(state: ServerState, model_id: str) -> Reranker:
    """The `task: rerank` model a request names (key restrictions apply), loaded and held."""
    entry = served_entry(state, model_id)
    if entry.settings.task != "rerank":
        served = [e.settings.name for e in state.registry.entries() if e.settings.task == "rerank"]
        hint = f" (rerank models: {', '.join(served)})" if served else ""
        raise bad_request(
            f"model '{model_id}' is not a rerank model (task: {entry.settings.task}); "
            f"use a model with `task: rerank`{hint}",
            "model",
            "model_not_reranker",
        )
    await acquire(state, entry, model_id)
    assert entry.embedder is not None  # acquire: running, and a reranker's runner
    return Reranker(
        model_id, entry.settings.name, entry.embedder, entry.embedder.loaded.rerank_method
    )


def check_texts(texts: Sequence[str], field: str, limit: int) -> None:
    """Non-empty, no empty item, at most `limit` items (limits.max_rerank_documents)."""
    if not texts:
        raise bad_request(f"'{field}' is empty; send at least one", field)
    if len(texts) > limit:
        raise bad_request(
            f"'{field}' has {len(texts)} items; at most {limit} (limits.max_rerank_documents)",
            field,
            "too_many_documents",
        )
    empty = next((i for i, text in enumerate(texts) if not text.strip()), None)
    if empty is not None:
        raise bad_request(f"{field}[{empty}] is empty", f"{field}[{empty}]")


def check_query(query: str, field: str = "query") -> None:
    if not query.strip():
        raise bad_request(f"'{field}' is empty", field)


def pair_tokens(encoder: PairEncoder, pairs: Sequence[tuple[str, str]]) -> list[list[int]]:
    """Token lists in pair order, encoding each run of pairs sharing a query together."""
    out: list[list[int]] = []
    start = 0
    while start < len(pairs):
        end = start
        while end < len(pairs) and pairs[end][0] == pairs[start][0]:
            end += 1
        out += encoder.encode_pairs(pairs[start][0], [d for _, d in pairs[start:end]])
        start = end
    return out


def cosines(vectors: Sequence[object], pairs: Sequence[tuple[int, int]]) -> list[float]:
    matrix = np.asarray(vectors, dtype=np.float64)
    matrix = matrix / np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
    return [float(matrix[a] @ matrix[b]) for a, b in pairs]


async def _embedding_scores(
    target: Reranker, pairs: Sequence[tuple[str, str]], deadline: float
) -> tuple[list[float], int]:
    """Each distinct text embedded once (truncated to the model's maximum), then cosines."""
    texts = list(dict.fromkeys(t for pair in pairs for t in pair))
    slot = {text: i for i, text in enumerate(texts)}
    tokens = await asyncio.to_thread(prepare_tokens, target.engine, texts, True)
    vectors = await target.engine.embed(tokens, deadline)
    scores = cosines(vectors, [(slot[q], slot[d]) for q, d in pairs])
    return scores, sum(len(ids) for ids in tokens)


async def score_pairs(
    state: ServerState,
    settings: Settings,
    target: Reranker,
    pairs: Sequence[tuple[str, str]],
    route: str,
    started: float,
) -> tuple[list[float], int]:
    """One score per (query, document) pair, in order, and the input tokens they took;
    the request's metrics, usage and its one log line."""
    deadline = started + settings.server.timeout
    encoder = target.engine.loaded.pairs
    if encoder is None:  # the embedding method: no pair encoder, vectors and cosines
        scores, count = await _embedding_scores(target, pairs, deadline)
    else:
        tokens = await asyncio.to_thread(pair_tokens, encoder, pairs)
        scores = [float(s) for s in await target.engine.embed(tokens, deadline)]
        count = sum(len(ids) for ids in tokens)
    seconds = time.monotonic() - started
    state.metrics.rerank_request(target.name, len(pairs))
    add_usage(count, 0, 0, seconds)
    log.info("request", request_id=new_id("rerank-"), route=route, model=target.model_id,
             status=200, method=target.method, documents=len(pairs), prompt_tokens=count,
             duration_s=round(seconds, 4))  # fmt: skip
    return scores, count

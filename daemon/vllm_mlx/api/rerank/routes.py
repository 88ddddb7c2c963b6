"""POST /v1/rerank, /v2/rerank, /rerank (Jina, Cohere, vLLM) and /score, /v1/score (vLLM).

One response body serves the rerank clients: `results` sorted by `relevance_score`,
`usage` (Jina, vLLM) and `meta` (Cohere). `top_n` below 1 is a 400; above the number of
documents it is clamped, as Cohere, Jina and vLLM do (LangChain's compressors send a
fixed top_n whatever the number of documents).
"""

from __future__ import annotations

import time
from typing import Any

from litestar import Request, Router, post

from vllm_mlx.api.edge.body import parse_body
from vllm_mlx.api.error_shapes import openai_error_response
from vllm_mlx.api.errors import bad_request
from vllm_mlx.api.pipeline.ids import new_id
from vllm_mlx.api.rerank.schema import (
    RerankRequest,
    RerankResponse,
    RerankResult,
    ScoreItem,
    ScoreRequest,
    ScoreResponse,
)
from vllm_mlx.api.rerank.scoring import check_query, check_texts, resolve_reranker, score_pairs
from vllm_mlx.api.state import note_model, request_settings, server_state


def _texts(body: RerankRequest) -> list[str]:
    return [d if isinstance(d, str) else d.text for d in body.documents]


def ranked_results(
    scores: list[float], texts: list[str], top_n: int | None, with_documents: bool
) -> list[RerankResult]:
    order = sorted(range(len(scores)), key=lambda i: -scores[i])  # stable: ties by index
    results: list[RerankResult] = []
    for index in order[: top_n if top_n is not None else len(order)]:
        result: RerankResult = {"index": index, "relevance_score": scores[index]}
        if with_documents:
            result["document"] = {"text": texts[index]}
        results.append(result)
    return results


async def _rerank(request: Request[Any, Any, Any], route: str, documents: bool) -> RerankResponse:
    started = time.monotonic()
    body = await parse_body(request, RerankRequest)
    settings = request_settings(request)
    texts = _texts(body)
    check_query(body.query)
    check_texts(texts, "documents", settings.limits.max_rerank_documents)
    if body.top_n is not None and body.top_n < 1:
        raise bad_request(f"'top_n' is {body.top_n}; it must be at least 1", "top_n")
    state = server_state(request)
    target = await resolve_reranker(state, body.model)
    note_model(request.scope, body.model)
    pairs = [(body.query, text) for text in texts]
    scores, tokens = await score_pairs(state, settings, target, pairs, route, started)
    with_documents = documents if body.return_documents is None else body.return_documents
    return {
        "id": new_id("rerank-"),
        "model": body.model,
        "results": ranked_results(scores, texts, body.top_n, with_documents),
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "meta": {
            "api_version": {"version": "2" if route == "/v2/rerank" else "1"},
            "billed_units": {"search_units": 1},
            "tokens": {"input_tokens": tokens, "output_tokens": 0},
        },
    }


@post(["/v1/rerank", "/rerank"], status_code=200)
async def rerank_v1(request: Request[Any, Any, Any]) -> RerankResponse:
    return await _rerank(request, "/v1/rerank", documents=True)


@post("/v2/rerank", status_code=200)
async def rerank_v2(request: Request[Any, Any, Any]) -> RerankResponse:
    return await _rerank(request, "/v2/rerank", documents=False)


def score_pairs_of(body: ScoreRequest, limit: int) -> list[tuple[str, str]]:
    """vLLM's pairing: one text_1 against every text_2, or two lists pairwise."""
    first = [body.text_1] if isinstance(body.text_1, str) else body.text_1
    second = [body.text_2] if isinstance(body.text_2, str) else body.text_2
    check_texts(first, "text_1", limit)
    check_texts(second, "text_2", limit)
    if len(first) == 1:
        return [(first[0], text) for text in second]
    if len(first) != len(second):
        raise bad_request(
            f"'text_1' has {len(first)} items and 'text_2' {len(second)}: send one text_1, "
            "or lists of the same length (scored pairwise)",
            "text_2",
        )
    return list(zip(first, second, strict=True))


@post(["/score", "/v1/score"], status_code=200)
async def score(request: Request[Any, Any, Any]) -> ScoreResponse:
    started = time.monotonic()
    body = await parse_body(request, ScoreRequest)
    settings = request_settings(request)
    pairs = score_pairs_of(body, settings.limits.max_rerank_documents)
    state = server_state(request)
    target = await resolve_reranker(state, body.model)
    note_model(request.scope, body.model)
    scores, tokens = await score_pairs(state, settings, target, pairs, "/score", started)
    data: list[ScoreItem] = [
        {"index": i, "object": "score", "score": value} for i, value in enumerate(scores)
    ]
    return {
        "id": new_id("score-"),
        "object": "list",
        "created": int(time.time()),
        "model": body.model,
        "data": data,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def make_rerank_router() -> Router:
    return Router(
        path="/",
        route_handlers=[rerank_v1, rerank_v2, score],
        exception_handlers={Exception: openai_error_response},
    )

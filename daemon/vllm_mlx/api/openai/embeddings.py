"""POST /v1/embeddings: vectors from an embedding model (`task: embed`), OpenAI's shape.

Validation happens here, before the engine sees anything: the input's shape, every
token id against the vocabulary, every input's length against the model's maximum.
Tokenizing runs on a worker thread and the forward pass on the model's engine thread,
so the event loop only parses, checks and serialises.
"""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import numpy as np
import structlog
from litestar import Request, Response, post

from vllm_mlx.api.edge.body import parse_body
from vllm_mlx.api.openai.embedding_schema import (
    EmbeddingItem,
    EmbeddingRequest,
    EmbeddingResponse,
)
from vllm_mlx.api.pipeline.embedding import (
    output_dimensions,
    parse_inputs,
    prepare_tokens,
    resolve_embedder,
)
from vllm_mlx.api.pipeline.ids import new_id
from vllm_mlx.api.state import request_settings, server_state
from vllm_mlx.engine.embedding_runner import EmbeddingEngine

ROUTE = "/v1/embeddings"

log = structlog.get_logger("vllm_mlx.requests")


def _checked_tokens(engine: EmbeddingEngine, body: EmbeddingRequest) -> list[list[int]]:
    return prepare_tokens(engine, parse_inputs(body.input), body.truncate)


def _encode(vector: np.ndarray, dimensions: int | None, fmt: str) -> list[float] | str:
    vector = np.asarray(vector, dtype=np.float32)
    if dimensions is not None:
        vector = vector[:dimensions]
        vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
    if fmt == "base64":  # little-endian float32, what the OpenAI SDK decodes
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    values: list[float] = vector.tolist()
    return values


def _response(
    body: EmbeddingRequest, vectors: list[Any], dimensions: int | None, tokens: int
) -> EmbeddingResponse:
    fmt = body.encoding_format
    data: list[EmbeddingItem] = [
        {"object": "embedding", "index": i, "embedding": _encode(v, dimensions, fmt)}
        for i, v in enumerate(vectors)
    ]
    return {
        "object": "list",
        "data": data,
        "model": body.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


@post("/embeddings", status_code=200)
async def embeddings(request: Request[Any, Any, Any]) -> Response[Any]:
    started = time.monotonic()
    state = server_state(request)
    body = await parse_body(request, EmbeddingRequest)
    target = await resolve_embedder(state, body.model)
    dimensions = output_dimensions(target, body.dimensions)
    # Checking up to 2048 inputs (or a 10 MB array of token ids) and tokenizing them is
    # CPU work: off the event loop.
    tokens = await asyncio.to_thread(_checked_tokens, target.engine, body)
    deadline = started + request_settings(request).server.timeout
    vectors = await target.engine.embed(tokens, deadline)
    count = sum(len(ids) for ids in tokens)
    payload = _response(body, vectors, dimensions, count)
    seconds = time.monotonic() - started
    state.metrics.embedding_request(target.name, len(tokens), count, seconds)
    log.info(
        "request",
        request_id=new_id("embd-"),
        route=ROUTE,
        model=target.model_id,
        status=200,
        inputs=len(tokens),
        prompt_tokens=count,
        duration_s=round(seconds, 4),
    )
    return Response(payload)

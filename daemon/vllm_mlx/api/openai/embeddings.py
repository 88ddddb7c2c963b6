"""POST /v1/embeddings: vectors from an embedding model (`task: embed`), OpenAI's shape.

Validation happens here, before the engine sees anything: the input's shape, every
token id against the vocabulary, every input's length against the model's maximum.
Tokenizing runs on a worker thread and the forward pass on the model's engine thread,
so the event loop only parses, checks and serialises.
"""

from __future__ import annotations

import base64
import time
from typing import Any

from litestar import Request, Response, post

from vllm_mlx.api.edge.body import parse_body
from vllm_mlx.api.openai.embedding_schema import (
    EmbeddingItem,
    EmbeddingRequest,
    EmbeddingResponse,
)
from vllm_mlx.api.pipeline.embedding import (
    cut,
    embed,
    output_dimensions,
    resolve_embedder,
)
from vllm_mlx.api.state import request_settings, server_state

ROUTE = "/v1/embeddings"


def _encode(raw: Any, dimensions: int | None, fmt: str) -> list[float] | str:
    vector = cut(raw, dimensions)
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
    settings = request_settings(request)
    done = await embed(state, settings, target, body.input, body.truncate, ROUTE, started)
    return Response(_response(body, done.vectors, dimensions, done.prompt_tokens))

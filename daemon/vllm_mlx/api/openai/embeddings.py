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
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog
from litestar import Request, Response, post

from vllm_mlx.api.edge.body import parse_body
from vllm_mlx.api.errors import APIError, bad_request
from vllm_mlx.api.openai.embedding_schema import (
    MAX_INPUTS,
    EmbeddingItem,
    EmbeddingRequest,
    EmbeddingResponse,
)
from vllm_mlx.api.pipeline.acquire import acquire, served_entry
from vllm_mlx.api.pipeline.ids import new_id
from vllm_mlx.api.state import ServerState, request_settings, server_state
from vllm_mlx.config.model import ModelSettings
from vllm_mlx.engine.embedding_runner import EmbeddingEngine

ROUTE = "/v1/embeddings"
INPUT_SHAPES = "a string, an array of strings, an array of token ids or an array of token-id arrays"

log = structlog.get_logger("vllm_mlx.requests")


@dataclass(frozen=True)
class EmbeddingTarget:
    model_id: str
    name: str
    engine: EmbeddingEngine
    settings: ModelSettings


async def resolve_embedder(state: ServerState, model_id: str) -> EmbeddingTarget:
    entry = served_entry(state, model_id)
    if entry.settings.task != "embed":
        served = [e.settings.name for e in state.registry.entries() if e.settings.task == "embed"]
        hint = f" (embedding models: {', '.join(served)})" if served else ""
        raise bad_request(
            f"model '{model_id}' is a generation model and does not serve embeddings; "
            f"use an embedding model{hint}",
            "model",
            "model_not_embedding",
        )
    await acquire(state, entry, model_id)
    assert entry.embedder is not None  # acquire: running, and an embedding model's runner
    return EmbeddingTarget(model_id, entry.settings.name, entry.embedder, entry.settings)


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _wrong_item(index: int, expected: str) -> APIError:
    return bad_request(
        f"Invalid value for 'input[{index}]': expected {expected}, as the first item is "
        f"('input' must be {INPUT_SHAPES}, not a mix)",
        f"input[{index}]",
    )


def parse_inputs(value: Any) -> list[str] | list[list[int]]:
    """The request's inputs as a list of texts or a list of token-id lists."""
    if isinstance(value, str):
        value = [value]
    elif not isinstance(value, list):
        raise bad_request(f"'input' must be {INPUT_SHAPES}", "input")
    if not value:
        raise bad_request("'input' is an empty array; send at least one input", "input")
    if _is_token(value[0]):  # one input given as token ids
        bad = next((i for i, v in enumerate(value) if not _is_token(v)), None)
        if bad is not None:
            raise _wrong_item(bad, "a token id (an integer)")
        value = [value]
    if len(value) > MAX_INPUTS:
        raise bad_request(f"'input' has {len(value)} items; at most {MAX_INPUTS}", "input")
    if isinstance(value[0], str):
        for index, text in enumerate(value):
            if not isinstance(text, str):
                raise _wrong_item(index, "a string")
            if not text:
                raise bad_request(f"input[{index}] is an empty string", f"input[{index}]")
        return list(value)
    for index, item in enumerate(value):
        if not isinstance(item, list) or not all(_is_token(t) for t in item):
            raise _wrong_item(index, "an array of token ids")
        if not item:
            raise bad_request(f"input[{index}] is an empty array of token ids", f"input[{index}]")
    return list(value)


def prepare_tokens(
    engine: EmbeddingEngine, inputs: list[str] | list[list[int]], truncate: bool
) -> list[list[int]]:
    """Token ids per input, checked against the vocabulary and the model's maximum length.

    Blocking (tokenizes): run it off the event loop.
    """
    loaded = engine.loaded
    texts = [i for i in inputs if isinstance(i, str)]
    tokens = engine.tokenize(texts) if texts else [list(i) for i in inputs if isinstance(i, list)]
    if not texts:
        for index, ids in enumerate(tokens):
            bad = next((t for t in ids if not 0 <= t < loaded.vocab_size), None)
            if bad is not None:
                raise bad_request(
                    f"input[{index}] holds token id {bad}, outside this model's vocabulary "
                    f"(0..{loaded.vocab_size - 1})",
                    f"input[{index}]",
                )
    limit = loaded.max_length
    for index, ids in enumerate(tokens):
        if len(ids) <= limit:
            continue
        if not truncate:
            raise bad_request(
                f"input[{index}] has {len(ids)} tokens, over this model's maximum of {limit}; "
                f'shorten it or send "truncate": true to cut it',
                f"input[{index}]",
                "context_length_exceeded",
            )
        # Texts end with the separator token: keep it, as the reference tokenizer does.
        tokens[index] = ids[: limit - 1] + ids[-1:] if texts else ids[:limit]
    return tokens


def _checked_tokens(engine: EmbeddingEngine, body: EmbeddingRequest) -> list[list[int]]:
    return prepare_tokens(engine, parse_inputs(body.input), body.truncate)


def output_dimensions(target: EmbeddingTarget, wanted: int | None) -> int | None:
    """How many dimensions to keep (None: all), or a 400 when the model cannot cut."""
    native = target.engine.dimensions
    if wanted is None or wanted == native:
        return None
    if not target.settings.matryoshka:
        raise bad_request(
            f"model '{target.model_id}' does not support 'dimensions' other than its own "
            f"{native} (it is not configured as Matryoshka-trained: `matryoshka: true`)",
            "dimensions",
        )
    if wanted > native:
        raise bad_request(
            f"'dimensions' is {wanted}; model '{target.model_id}' has {native}", "dimensions"
        )
    return wanted


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

"""Embedding requests, for every protocol: the model, the inputs, their token ids.

Validation happens here, before the engine sees anything: the input's shape, every
token id against the vocabulary, every input's length against the model's maximum.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog

from vllm_mlx.api.errors import APIError, bad_request
from vllm_mlx.api.pipeline.acquire import acquire, served_entry
from vllm_mlx.api.pipeline.ids import new_id
from vllm_mlx.api.state import ServerState
from vllm_mlx.config.model import ModelSettings
from vllm_mlx.config.settings import Settings
from vllm_mlx.engine.embedding_runner import EmbeddingEngine
from vllm_mlx.usage.record import add_usage

log = structlog.get_logger("vllm_mlx.requests")

MAX_INPUTS = 2048  # OpenAI's bound on one request's inputs
INPUT_SHAPES = "a string, an array of strings, an array of token ids or an array of token-id arrays"


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
            f"model '{model_id}' is a {entry.settings.task} model and does not serve "
            "embeddings; "
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


def cut(vector: Any, dimensions: int | None) -> np.ndarray:
    """A vector as float32, cut to `dimensions` and normalised again (Matryoshka)."""
    out = np.asarray(vector, dtype=np.float32)
    if dimensions is not None:
        out = out[:dimensions]
        out = out / max(float(np.linalg.norm(out)), 1e-12)
    return out


def _checked_tokens(engine: EmbeddingEngine, inputs: Any, truncate: bool) -> list[list[int]]:
    return prepare_tokens(engine, parse_inputs(inputs), truncate)


@dataclass(frozen=True)
class Embedded:
    vectors: list[Any]
    prompt_tokens: int


async def embed(
    state: ServerState,
    settings: Settings,
    target: EmbeddingTarget,
    inputs: Any,
    truncate: bool,
    route: str,
    started: float,
) -> Embedded:
    """Every input's vector (`inputs` as the body sent them: checked here), with the
    request's metrics and its one log line.

    Checking up to 2048 inputs (or a 10 MB array of token ids) and tokenizing them is
    CPU work: off the event loop; the forward pass runs on the model's engine thread.
    """
    tokens = await asyncio.to_thread(_checked_tokens, target.engine, inputs, truncate)
    vectors = await target.engine.embed(tokens, started + settings.server.timeout)
    count = sum(len(ids) for ids in tokens)
    seconds = time.monotonic() - started
    state.metrics.embedding_request(target.name, len(tokens), count, seconds)
    add_usage(count, 0, 0, seconds)
    log.info(
        "request",
        request_id=new_id("embd-"),
        route=route,
        model=target.model_id,
        status=200,
        inputs=len(tokens),
        prompt_tokens=count,
        duration_s=round(seconds, 4),
    )
    return Embedded(list(vectors), count)

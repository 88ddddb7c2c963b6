"""Embedding requests, for every protocol: the model, the inputs, their token ids.

Validation happens here, before the engine sees anything: the input's shape, every
token id against the vocabulary, every input's length against the model's maximum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_mlx.api.errors import APIError, bad_request
from vllm_mlx.api.pipeline.acquire import acquire, served_entry
from vllm_mlx.api.state import ServerState
from vllm_mlx.config.model import ModelSettings
from vllm_mlx.engine.embedding_runner import EmbeddingEngine

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

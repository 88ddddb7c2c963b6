"""The bundled embedding model in MLX against sentence-transformers, and its engine.

Reference vectors: tests/fixtures/embeddings/reference.json (made by make_reference.py
beside it, with sentence-transformers on PyTorch CPU).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vllm_mlx.models.cpu import blas

# As the daemon does: OpenBLAS when installed (10x faster here than the wheel's BLAS).
# A no-op when another test module imported mlx first; results do not depend on it.
blas.configure("auto")

from vllm_mlx.config.model import ModelSettings  # noqa: E402
from vllm_mlx.engine.embedding_runner import EmbeddingEngine  # noqa: E402
from vllm_mlx.models.loaded import EmbeddingLimits, LoadedEmbeddingModel  # noqa: E402
from vllm_mlx.models.loader import load_model  # noqa: E402

REFERENCE = Path(__file__).resolve().parents[1] / "fixtures" / "embeddings" / "reference.json"


def cosine(a: Any, b: Any) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def reference() -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(REFERENCE.read_text())["items"]
    return items


@pytest.fixture(scope="module")
def loaded(model_cache_dir: Path) -> LoadedEmbeddingModel:
    settings = ModelSettings(name="minilm", source="builtin:all-minilm-l6-v2", task="embed")
    model = load_model(settings, model_cache_dir)
    assert isinstance(model, LoadedEmbeddingModel)
    return model


@pytest.fixture(scope="module")
def alone(loaded: LoadedEmbeddingModel, reference: list[dict[str, Any]]) -> list[Any]:
    """Each reference input's vector, embedded on its own (no padding at all)."""
    return [loaded.embedder.embed([item["token_ids"]])[0] for item in reference]


def test_tokens_match_the_reference_tokenizer(
    loaded: LoadedEmbeddingModel, reference: list[dict[str, Any]]
) -> None:
    ids = loaded.tokenizer.encode_batch([item["text"] for item in reference])
    assert ids == [item["token_ids"] for item in reference]


def test_vectors_match_sentence_transformers(
    loaded: LoadedEmbeddingModel, reference: list[dict[str, Any]]
) -> None:
    assert len(reference) >= 20
    # Batches of 4 inputs of similar length: padded inside each batch, without the cost
    # of padding every input to the longest (the CPU BLAS in-process is the slow one).
    by_length = sorted(reference, key=lambda item: len(item["token_ids"]))
    items, vectors = [], []
    for start in range(0, len(by_length), 4):
        batch = by_length[start : start + 4]
        embedded = loaded.embedder.embed([item["token_ids"] for item in batch])
        assert embedded.shape == (len(batch), 384)
        items.extend(batch)
        vectors.extend(embedded)
    assert len(vectors) == len(reference)
    for item, vector in zip(items, vectors, strict=True):
        assert cosine(vector, item["embedding"]) >= 0.9999, item["text"]
        assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-5


def test_padding_does_not_change_a_vector(
    loaded: LoadedEmbeddingModel, reference: list[dict[str, Any]], alone: list[Any]
) -> None:
    order = sorted(range(len(reference)), key=lambda i: len(reference[i]["token_ids"]))
    longest = [reference[i]["token_ids"] for i in order[-3:]]
    shortest = order[:6]
    # One batch: each short input padded to the longest one's length.
    batched = loaded.embedder.embed([*longest, *(reference[i]["token_ids"] for i in shortest)])
    for i, vector in zip(shortest, batched[len(longest) :], strict=True):
        assert len(reference[i]["token_ids"]) < len(longest[0])
        assert cosine(alone[i], vector) >= 0.99999, reference[i]["text"]


def test_pooling_and_normalize_choices(
    loaded: LoadedEmbeddingModel, reference: list[dict[str, Any]]
) -> None:
    ids = [item["token_ids"] for item in reference[:4]]
    embedder = loaded.embedder
    mean = embedder.embed(ids)
    cls = replace(embedder, pooling="cls").embed(ids)  # type: ignore[type-var]
    last = replace(embedder, pooling="last").embed(ids)  # type: ignore[type-var]
    raw = replace(embedder, normalize=False).embed(ids)  # type: ignore[type-var]
    assert cosine(cls[0], mean[0]) < 0.999 and cosine(last[0], mean[0]) < 0.999
    assert np.allclose(np.linalg.norm(cls, axis=1), 1.0, atol=1e-5)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0, atol=1e-3)
    assert cosine(raw[0], mean[0]) > 0.99999  # the same direction, another length


class Recording:
    """The real embedder, with the batches it was given written down."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.batches: list[list[int]] = []

    @property
    def dimensions(self) -> int:
        return int(self.inner.dimensions)

    def embed(self, batch: Sequence[Sequence[int]]) -> Any:
        self.batches.append([len(ids) for ids in batch])
        return self.inner.embed(batch)


def test_engine_batches_within_bounds_and_keeps_order(
    loaded: LoadedEmbeddingModel, reference: list[dict[str, Any]], alone: list[Any]
) -> None:
    recording = Recording(loaded.embedder)
    limits = EmbeddingLimits(max_batch_size=4, max_batch_tokens=120)
    engine = EmbeddingEngine(replace(loaded, embedder=recording, limits=limits))
    requests = [[item["token_ids"] for item in reference[i : i + 3]] for i in range(0, 24, 3)]

    async def main() -> list[list[Any]]:
        return await asyncio.gather(*(engine.embed(r) for r in requests))

    engine.start()
    try:
        results = asyncio.run(main())
    finally:
        engine.stop()
    for start, vectors in zip(range(0, 24, 3), results, strict=True):
        for got, want in zip(vectors, alone[start : start + 3], strict=True):
            assert cosine(got, want) >= 0.99999
    for batch in recording.batches:
        assert len(batch) <= 4
        assert len(batch) == 1 or len(batch) * max(batch) <= 120
    assert sum(len(b) for b in recording.batches) == 24
    assert engine.stats.requests == len(requests) and engine.stats.inputs == 24
    assert engine.stats.queued == 0


def test_a_stopped_engine_refuses(loaded: LoadedEmbeddingModel) -> None:
    from vllm_mlx.engine.types import EngineUnavailableError

    engine = EmbeddingEngine(loaded)
    engine.start()
    engine.stop()
    with pytest.raises(EngineUnavailableError):
        asyncio.run(engine.embed([[101, 102]]))


def test_registry_keeps_swaps_and_stops_embedding_engines(model_cache_dir: Path) -> None:
    from vllm_mlx.engine.fleet.registry import LoadState, ModelRegistry
    from vllm_mlx.engine.scheduler import SchedulerConfig

    model = ModelSettings(name="minilm", source="builtin:all-minilm-l6-v2", task="embed")
    registry = ModelRegistry([model], SchedulerConfig())

    def loader(settings: ModelSettings) -> Any:
        return load_model(settings, model_cache_dir)

    entry = registry.resolve("minilm")
    assert entry is not None
    registry.load_entry(entry, loader)
    assert entry.state is LoadState.RUNNING and entry.weights_bytes > 0
    first = entry.embedder
    assert first is not None and entry.engine is None and first.accepting
    # Aliases hot-reload: the running engine is kept.
    aliased = model.model_copy(update={"aliases": ["embedder"]})
    kept = registry.prepare([aliased], SchedulerConfig(), loader)
    assert kept["minilm"].embedder is first
    # Pooling is a model key: a new engine, and the old one is handed back to stop.
    changed = model.model_copy(update={"pooling": "cls"})
    entries = registry.prepare([changed], SchedulerConfig(), loader)
    second = entries["minilm"].embedder
    assert second is not None and second is not first
    retired = registry.swap(entries, [changed], SchedulerConfig())
    assert retired == [first]
    first.stop()
    assert not first.accepting and second.accepting
    registry.stop_all()
    assert not second.accepting


def test_a_small_request_is_not_stuck_behind_a_large_one(
    loaded: LoadedEmbeddingModel, reference: list[dict[str, Any]]
) -> None:
    engine = EmbeddingEngine(replace(loaded, limits=EmbeddingLimits(max_batch_size=4)))
    large = [item["token_ids"] for item in reference]  # 24 inputs: 6 passes of 4
    finished: list[str] = []

    async def run(name: str, inputs: list[list[int]]) -> None:
        await engine.embed(inputs)
        finished.append(name)

    async def main() -> None:
        await asyncio.gather(run("large", large), run("small", large[:1]))

    engine.start()
    try:
        asyncio.run(main())
    finally:
        engine.stop()
    assert finished == ["small", "large"]
    assert engine.stats.batches <= 7


def test_the_fast_gelu_is_the_exact_erf_gelu() -> None:
    import math

    import mlx.core as mx

    from vllm_mlx.models.bert import _fused_gelu, erf_gelu

    xs = np.linspace(-12, 12, 20001, dtype=np.float32)
    exact = np.array([0.5 * x * (1 + math.erf(x / math.sqrt(2))) for x in xs.astype(float)])
    for gelu in (erf_gelu, _fused_gelu()):
        got = np.array(gelu(mx.array(xs)), dtype=np.float64)
        # Within a few float32 rounding steps (relative; absolute below 1). The worst
        # case is far out on the negative side: |x| * 0.5 * (erf's 1e-7 error at -4).
        assert np.max(np.abs(got - exact) / np.maximum(np.abs(exact), 1.0)) < 2e-6

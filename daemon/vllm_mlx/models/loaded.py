"""What a model source resolves to, and what the engine consumes: models/ produces these
records (text generation and embedding), engine/ runs them (so the import arrow runs one
way, from engine to models)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class LoadedModel:
    """What a model source resolves to: weights in memory plus their tokenizer."""

    name: str
    model: Any  # mlx.nn.Module; kept opaque so this module needs no mlx import
    tokenizer: Any  # mlx_lm TokenizerWrapper
    context_length: int
    directory: str
    load_seconds: float = 0.0
    # A model sharded over a distributed group: the scheduler's Lockstep (rank 0).
    lockstep: Any = None
    # Bytes per cached K/V value, measured before the engine starts (None: not measured).
    kv_itemsize: int | None = None
    # A vision-language model's image tower and processor (models/vision.VisionTower).
    vision: Any = None
    # The draft model of `speculative: {method: draft}` (models/draft.py), same tokenizer.
    draft: LoadedModel | None = None


class Embedder(Protocol):
    """What the embedding engine runs: token-id lists in, a [len(batch), dims] float32 array out."""

    @property
    def dimensions(self) -> int: ...

    def embed(self, batch: Sequence[Sequence[int]]) -> Any: ...


class EmbeddingTokenizer(Protocol):
    """Text to token ids with the model's special tokens, no truncation or padding."""

    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...


class PairEncoder(Protocol):
    """A reranker's input: one token-id list per (query, document) pair, each already cut
    to the model's maximum length (blocking: called off the event loop)."""

    def encode_pairs(self, query: str, documents: list[str]) -> list[list[int]]: ...


@dataclass(frozen=True)
class EmbeddingLimits:
    max_batch_size: int = 32  # sequences in one forward pass
    max_batch_tokens: int = 8192  # padded tokens (sequences x longest) in one pass


@dataclass
class LoadedEmbeddingModel:
    """What an embedding model source resolves to (the embedding twin of LoadedModel)."""

    name: str
    embedder: Embedder
    tokenizer: EmbeddingTokenizer
    max_length: int  # longest input in tokens, special tokens included
    vocab_size: int
    directory: str
    pooling: str = "mean"
    normalize: bool = True
    limits: EmbeddingLimits = field(default_factory=EmbeddingLimits)
    load_seconds: float = 0.0
    # `task: rerank`: the method, and for cross_encoder / llm the pair encoder whose
    # token lists the embedder turns into one relevance score each (embedding: vectors).
    rerank_method: str = ""
    pairs: PairEncoder | None = None

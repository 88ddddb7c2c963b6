"""A BERT cross-encoder in MLX: our BERT encoder plus transformers' classification head.

A `BertForSequenceClassification` checkpoint (ms-marco-MiniLM and its kin) reads a
(query, document) pair as one sequence, `[CLS] query [SEP] document [SEP]`, with segment
0 up to the first [SEP] and 1 after it. The pooler (dense + tanh on the [CLS] vector) and
the classifier (one linear output) give a logit; the relevance score is its sigmoid,
which is what sentence-transformers' CrossEncoder reports for a one-label model.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import structlog
from mlx.nn.layers.base import Module
from mlx.nn.layers.linear import Linear

from vllm_mlx.config.model import ModelSettings
from vllm_mlx.config.sections import EngineSettings
from vllm_mlx.models.bert import BertConfig, BertModel, load_bert
from vllm_mlx.models.embedding import EmbeddingModelError, check_embedding_dir, max_length_of
from vllm_mlx.models.loaded import EmbeddingLimits, LoadedEmbeddingModel

log = structlog.get_logger(__name__)


class BertPooler(Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.dense = Linear(hidden, hidden)

    def __call__(self, first: mx.array) -> mx.array:
        return mx.tanh(self.dense(first))


class ClassificationHead(Module):
    """transformers' names (`bert.pooler.dense`, `classifier`), so keys load as they are."""

    def __init__(self, hidden: int, labels: int) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.pooler = BertPooler(hidden)
        self.classifier = Linear(hidden, labels)

    def __call__(self, hidden: mx.array) -> mx.array:
        out: mx.array = self.classifier(self.pooler(hidden[:, 0, :]))
        return out


def segments(ids: np.ndarray, sep_id: int) -> np.ndarray:
    """Token types: 0 through the first [SEP], 1 after it (padding too: it is masked)."""
    is_sep = (ids == sep_id).astype(np.int32)
    types: np.ndarray = ((np.cumsum(is_sep, axis=1) - is_sep) > 0).astype(np.int32)
    return types


@dataclass
class CrossEncoderScorer:
    """Pair token ids in, one relevance score (sigmoid of the logit) per pair out."""

    model: BertModel
    head: ClassificationHead
    sep_id: int
    pad_id: int = 0

    @property
    def dimensions(self) -> int:
        return 1

    def logits(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        width = max(len(ids) for ids in batch)
        ids = np.full((len(batch), width), self.pad_id, dtype=np.int32)
        mask = np.zeros((len(batch), width), dtype=np.int32)
        for row, tokens in enumerate(batch):
            ids[row, : len(tokens)] = tokens
            mask[row, : len(tokens)] = 1
        types = mx.array(segments(ids, self.sep_id))
        hidden = self.model(mx.array(ids), mx.array(mask), types)
        return np.array(self.head(hidden)[:, 0].astype(mx.float32), copy=True)

    def embed(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        logits = self.logits(batch).astype(np.float64)
        scores: np.ndarray = (1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
        return scores


class PairTokenizer:
    """Pairs encoded as the model was trained: its tokenizer's pair template, cut
    longest-first to the model's maximum (what transformers' `truncation=True` does)."""

    def __init__(self, path: Path, max_length: int) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(path))
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(max_length, strategy="longest_first")
        self.max_length = max_length

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(e.ids) for e in self._tokenizer.encode_batch(texts)]

    def encode_pairs(self, query: str, documents: list[str]) -> list[list[int]]:
        pairs = self._tokenizer.encode_batch([(query, d) for d in documents])
        return [list(e.ids) for e in pairs]

    def token_id(self, token: str) -> int | None:
        found = self._tokenizer.token_to_id(token)
        return None if found is None else int(found)

    @property
    def vocab_size(self) -> int:
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))


def _head_weights(weights: dict[str, Any]) -> list[tuple[str, Any]]:
    cleaned = {k.removeprefix("bert."): v for k, v in weights.items()}
    return [(k, v) for k, v in cleaned.items() if k.startswith(("pooler.", "classifier."))]


def load_cross_encoder(
    model: ModelSettings, model_dir: Path, engine: EngineSettings | None = None
) -> LoadedEmbeddingModel:
    started = time.monotonic()
    config = check_embedding_dir(model_dir)
    labels = len(config.get("id2label") or {}) or int(config.get("num_labels", 1))
    if labels != 1:
        raise EmbeddingModelError(
            f"{model_dir}: a cross-encoder with {labels} labels; only one-label "
            "(relevance) models are supported"
        )
    bert_config = BertConfig.from_dict(config)
    weights = mx.load(str(model_dir / "model.safetensors"))
    assert isinstance(weights, dict)
    head = ClassificationHead(bert_config.hidden_size, 1)
    head.load_weights(_head_weights(weights), strict=True)
    mx.eval(head.parameters())  # type: ignore[no-untyped-call]
    max_length = max_length_of(model_dir, config, model.context_length)
    tokenizer = PairTokenizer(model_dir / "tokenizer.json", max_length)
    sep_id, pad_id = tokenizer.token_id("[SEP]"), tokenizer.token_id("[PAD]")
    if sep_id is None:
        raise EmbeddingModelError(f"{model_dir}: the tokenizer has no [SEP] token")
    scorer = CrossEncoderScorer(load_bert(weights, bert_config), head, sep_id, pad_id or 0)
    engine = engine or EngineSettings()
    elapsed = time.monotonic() - started
    log.info("cross-encoder loaded", model=model.name, directory=str(model_dir),
             seconds=round(elapsed, 2))  # fmt: skip
    return LoadedEmbeddingModel(
        name=model.name,
        embedder=scorer,
        tokenizer=tokenizer,
        max_length=max_length,
        vocab_size=min(bert_config.vocab_size, tokenizer.vocab_size),
        directory=str(model_dir),
        limits=EmbeddingLimits(engine.embedding_batch_size, engine.embedding_batch_tokens),
        load_seconds=elapsed,
        rerank_method="cross_encoder",
        pairs=tokenizer,
    )

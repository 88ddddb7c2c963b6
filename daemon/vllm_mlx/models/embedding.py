"""Load a sentence-embedding model (a sentence-transformers folder of a BERT) into MLX.

The folder needs `config.json` (model_type bert), `model.safetensors` and
`tokenizer.json`; `1_Pooling/config.json` and `sentence_bert_config.json`, when present,
give the pooling and the longest input the model was trained for.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, cast

import structlog

from vllm_mlx.config.model import ModelSettings
from vllm_mlx.config.sections import EngineSettings
from vllm_mlx.models.loaded import EmbeddingLimits, LoadedEmbeddingModel

log = structlog.get_logger(__name__)

SUPPORTED_TYPES = ("bert",)


class EmbeddingModelError(ValueError):
    """A folder that is not a sentence-embedding model this daemon can run."""


class TextTokenizer:
    """`tokenizers` with no truncation or padding: the engine pads, the API checks lengths."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(path))
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(e.ids) for e in self._tokenizer.encode_batch(texts)]

    @property
    def vocab_size(self) -> int:
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    def pad_id(self) -> int:
        padding = self._tokenizer.token_to_id("[PAD]")
        return 0 if padding is None else int(padding)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else {}


def pooling_of(model_dir: Path, configured: str | None) -> str:
    """The configured pooling, else the sentence-transformers pooling config, else mean."""
    if configured is not None:
        return configured
    pooling = _read_json(model_dir / "1_Pooling" / "config.json")
    if pooling.get("pooling_mode_cls_token"):
        return "cls"
    if pooling.get("pooling_mode_lasttoken"):
        return "last"
    return "mean"


def max_length_of(model_dir: Path, config: dict[str, Any], override: int | None) -> int:
    positions = int(config.get("max_position_embeddings", 512))
    if override is not None:
        return min(override, positions)
    trained = _read_json(model_dir / "sentence_bert_config.json").get("max_seq_length")
    return min(int(trained), positions) if isinstance(trained, int) else positions


def check_embedding_dir(model_dir: Path) -> dict[str, Any]:
    config = _read_json(model_dir / "config.json")
    kind = config.get("model_type")
    if kind not in SUPPORTED_TYPES:
        raise EmbeddingModelError(
            f"{model_dir}: model_type {kind!r} is not a supported embedding architecture "
            f"(supported: {', '.join(SUPPORTED_TYPES)})"
        )
    for needed in ("model.safetensors", "tokenizer.json"):
        if not (model_dir / needed).is_file():
            raise EmbeddingModelError(f"{model_dir}: {needed} is missing")
    return config


def load_embedding_model(
    model: ModelSettings, model_dir: Path, engine: EngineSettings | None = None
) -> LoadedEmbeddingModel:
    import mlx.core as mx

    from vllm_mlx.models.bert import BertConfig, BertEmbedder, Pooling, load_bert

    started = time.monotonic()
    config = check_embedding_dir(model_dir)
    bert_config = BertConfig.from_dict(config)
    weights = mx.load(str(model_dir / "model.safetensors"))
    assert isinstance(weights, dict)
    tokenizer = TextTokenizer(model_dir / "tokenizer.json")
    pooling = pooling_of(model_dir, model.pooling)
    embedder = BertEmbedder(
        load_bert(weights, bert_config),
        cast("Pooling", pooling),
        model.normalize,
        tokenizer.pad_id(),
    )
    engine = engine or EngineSettings()
    elapsed = time.monotonic() - started
    log.info("embedding model loaded", model=model.name, directory=str(model_dir),
             seconds=round(elapsed, 2), pooling=pooling)  # fmt: skip
    return LoadedEmbeddingModel(
        name=model.name,
        embedder=embedder,
        tokenizer=tokenizer,
        max_length=max_length_of(model_dir, config, model.context_length),
        vocab_size=min(bert_config.vocab_size, tokenizer.vocab_size),
        directory=str(model_dir),
        pooling=pooling,
        normalize=model.normalize,
        limits=EmbeddingLimits(engine.embedding_batch_size, engine.embedding_batch_tokens),
        load_seconds=elapsed,
    )

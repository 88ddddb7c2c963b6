"""An LLM as a reranker: P("yes") when a causal LM is asked whether a document meets a query.

This is the Qwen3-Reranker method, and it works with any instruct model: the pair is
rendered in the model's chat template (a system line saying the answer can only be
"yes" or "no", a user turn with the query before the document, the assistant's turn
opened), one forward pass runs, and the score is the softmax over the "yes" and "no"
logits at the last position (each side summed over its spellings: "yes", "Yes", ...).

Pairs are right-padded: under the causal mask the last real token attends only to real
tokens before it, so padding after it needs no attention mask, and only that position's
hidden state goes through the vocabulary head.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from vllm_mlx.config.model import ModelSettings
from vllm_mlx.config.sections import EngineSettings
from vllm_mlx.models.loaded import EmbeddingLimits, LoadedEmbeddingModel, LoadedModel

# Qwen3-Reranker's system line names an <Instruct> and a <Query>; this shorter wording
# ranked the held test queries best with the bundled 135M model (9 of 10 against 5 of 10
# for Qwen's own), and a larger model reads either.
SYSTEM = 'You judge relevance. Answer only "yes" or "no".'
_QUERY, _DOCUMENT = "\x00QUERY\x00", "\x00DOCUMENT\x00"
USER = f"Question: {_QUERY}\nDocument: {_DOCUMENT}\nIs the document relevant to the question?"
# Without a chat template: the same question as plain text.
PLAIN = f"{SYSTEM}\n\n{USER}\nAnswer: "
YES, NO = ("yes", "Yes", " yes", " Yes", "YES"), ("no", "No", " no", " No", "NO")


class LlmRerankError(ValueError):
    """A model that cannot serve as an LLM reranker (no single "yes"/"no" token, ...)."""


def _template(tokenizer: Any) -> str:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except Exception:  # no chat template: a base model reads the plain form
        return PLAIN
    return text if isinstance(text, str) and _QUERY in text and _DOCUMENT in text else PLAIN


def answer_tokens(tokenizer: Any, spellings: Sequence[str]) -> list[int]:
    """The single-token spellings of an answer (multi-token ones cannot be read off one
    position)."""
    found: list[int] = []
    for word in spellings:
        ids = list(tokenizer.encode(word, add_special_tokens=False))
        if len(ids) == 1 and ids[0] not in found:
            found.append(ids[0])
    return found


class LlmPairs:
    """Pair prompts as token ids: the template's three fixed pieces tokenized once, the
    query and document between them, cut to fit `max_length` (the query to at most half
    of the room, the document to what is left)."""

    def __init__(self, tokenizer: Any, max_length: int) -> None:
        self._tokenizer = tokenizer
        head, rest = _template(tokenizer).split(_QUERY)
        middle, tail = rest.split(_DOCUMENT)
        self._head, self._middle, self._tail = (self._encode(p) for p in (head, middle, tail))
        self.room = max_length - len(self._head) - len(self._middle) - len(self._tail)
        if self.room < 2:
            raise LlmRerankError(f"context_length {max_length} leaves no room for a pair")

    def _encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self._encode(text) for text in texts]

    def encode_pairs(self, query: str, documents: list[str]) -> list[list[int]]:
        asked = self._encode(query)
        out = []
        for document in documents:
            doc = self._encode(document)
            q = asked if len(asked) + len(doc) <= self.room else asked[: self.room // 2]
            out.append([*self._head, *q, *self._middle, *doc[: self.room - len(q)], *self._tail])
        return out


def _logsumexp(values: np.ndarray) -> np.ndarray:
    top = values.max(axis=1, keepdims=True)
    return np.asarray(top[:, 0] + np.log(np.exp(values - top).sum(axis=1)))


@dataclass
class LlmScorer:
    """Pair prompts in, P(yes) per pair out (the embedding engine's batch interface)."""

    model: Any  # an mlx-lm model: `.model` (the decoder) and `lm_head` or tied embeddings
    yes: list[int]
    no: list[int]
    pad_id: int = 0

    @property
    def dimensions(self) -> int:
        return 1

    def _last_logits(self, ids: mx.array, last: mx.array) -> mx.array:
        inner = getattr(self.model, "model", None)
        if inner is None or not hasattr(inner, "embed_tokens"):
            logits = self.model(ids)  # no decoder to split off: the whole model
            return mx.take_along_axis(logits, last[:, None, None], axis=1)[:, 0, :]
        hidden = inner(ids)
        picked = mx.take_along_axis(hidden, last[:, None, None], axis=1)
        head = getattr(self.model, "lm_head", None)
        out: mx.array = head(picked) if head is not None else inner.embed_tokens.as_linear(picked)
        return out[:, 0, :]

    def embed(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        width = max(len(ids) for ids in batch)
        ids = np.full((len(batch), width), self.pad_id, dtype=np.int32)
        for row, tokens in enumerate(batch):
            ids[row, : len(tokens)] = tokens
        last = mx.array([len(tokens) - 1 for tokens in batch], dtype=mx.int32)
        logits = self._last_logits(mx.array(ids), last).astype(mx.float32)
        picked = np.array(logits[:, self.yes + self.no], dtype=np.float64)
        margin = _logsumexp(picked[:, : len(self.yes)]) - _logsumexp(picked[:, len(self.yes) :])
        scores: np.ndarray = (1.0 / (1.0 + np.exp(-margin))).astype(np.float32)
        return scores


def llm_rerank_model(
    loaded: LoadedModel, model: ModelSettings, engine: EngineSettings | None = None
) -> LoadedEmbeddingModel:
    """A loaded causal LM as a reranker run by the embedding engine."""
    tokenizer = loaded.tokenizer
    yes, no = answer_tokens(tokenizer, YES), answer_tokens(tokenizer, NO)
    if not yes or not no:
        raise LlmRerankError(f"model '{model.name}' has no single-token 'yes' / 'no'")
    pairs = LlmPairs(tokenizer, loaded.context_length)
    pad = getattr(tokenizer, "pad_token_id", None)
    pad = pad if isinstance(pad, int) else (getattr(tokenizer, "eos_token_id", 0) or 0)
    engine = engine or EngineSettings()
    vocab = getattr(tokenizer, "vocab_size", None)
    return LoadedEmbeddingModel(
        name=model.name,
        embedder=LlmScorer(loaded.model, yes, no, pad),
        tokenizer=pairs,
        max_length=loaded.context_length,
        vocab_size=vocab if isinstance(vocab, int) else len(tokenizer.get_vocab()),
        directory=loaded.directory,
        limits=EmbeddingLimits(engine.embedding_batch_size, engine.embedding_batch_tokens),
        load_seconds=loaded.load_seconds,
        rerank_method="llm",
        pairs=pairs,
    )

"""A small BERT encoder in MLX (the architecture of all-MiniLM-L6-v2 and its kin).

Weights load straight from a Hugging Face `BertModel` safetensors file: the module
names below mirror transformers' so no key renaming is needed. Only the encoder is
built here; the pooler head is unused by sentence-embedding models and dropped (a
cross-encoder adds it back: models/cross_encoder.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import mlx.core as mx
import numpy as np

# The submodules, not `mlx.nn`: its star import hides the names from type checkers.
from mlx.nn.layers.activations import gelu_approx
from mlx.nn.layers.base import Module
from mlx.nn.layers.embedding import Embedding
from mlx.nn.layers.linear import Linear
from mlx.nn.layers.normalization import LayerNorm

Pooling = Literal["mean", "cls", "last"]

# erf(z) ~= z * P(z^2) / Q(z^2) on [-4, 4] (|erf| rounds to 1 in float32 beyond): a
# rational fit of our own (numpy least squares, Sanathanan-Koerner iterations), max abs
# error 4e-7 in float32. MLX's CPU erf is scalar and costs ~10x more than the whole
# polynomial; BERT runs it on every intermediate activation (~half the forward pass).
_ERF_P = (
    1.128378819192953, 0.206113619120645, 0.05138600580240025, 0.0039656178803796766,
    0.00014822458312674196, -1.9775157132397025e-06, 1.9667930478695084e-08,
)  # fmt: skip
_ERF_Q = (
    1.0, 0.515992597283091, 0.11755333991497514, 0.014880657606912838, 0.001020473900966705,
)  # fmt: skip


def _horner(coefficients: tuple[float, ...], u: mx.array) -> mx.array:
    # No shape-dependent constants: the compiled kernel is shapeless (any batch, length).
    out = u * coefficients[-1] + coefficients[-2]
    for c in reversed(coefficients[:-2]):
        out = out * u + c
    return out


def erf_gelu(x: mx.array) -> mx.array:
    """BERT's exact GELU, 0.5 * x * (1 + erf(x / sqrt 2)), with the rational erf above."""
    z = mx.clip(x * (1.0 / math.sqrt(2.0)), -4.0, 4.0)
    u = z * z
    return 0.5 * x * (1.0 + z * _horner(_ERF_P, u) / _horner(_ERF_Q, u))


def _fused_gelu() -> Any:
    """erf_gelu compiled into one elementwise kernel when MLX can compile here, else as is."""
    compiled = mx.compile(erf_gelu, shapeless=True)
    try:
        mx.eval(compiled(mx.zeros((2, 3))))
    except Exception:  # no JIT toolchain on this machine: the plain ops still work
        return erf_gelu
    return compiled


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> BertConfig:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in raw.items() if k in names})


class BertEmbeddings(Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.word_embeddings = Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def __call__(self, ids: mx.array, types: mx.array | None = None) -> mx.array:
        positions = mx.arange(ids.shape[1])[None, :]
        # Single-segment inputs (embeddings): token type 0 everywhere, as
        # sentence-transformers sends; a cross-encoder's pairs pass their segments.
        hidden = (
            self.word_embeddings(ids)
            + self.position_embeddings(positions)
            + self.token_type_embeddings(mx.zeros_like(ids) if types is None else types)
        )
        out: mx.array = self.LayerNorm(hidden)
        return out


class BertSelfAttention(Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.heads = config.num_attention_heads
        self.query = Linear(config.hidden_size, config.hidden_size)
        self.key = Linear(config.hidden_size, config.hidden_size)
        self.value = Linear(config.hidden_size, config.hidden_size)

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        batch, length, width = x.shape

        def split(t: mx.array) -> mx.array:
            return t.reshape(batch, length, self.heads, -1).transpose(0, 2, 1, 3)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scale = 1.0 / math.sqrt(width // self.heads)
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
        return out.transpose(0, 2, 1, 3).reshape(batch, length, width)


class BertSelfOutput(Module):
    def __init__(self, config: BertConfig, inner: int) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.dense = Linear(inner, config.hidden_size)
        self.LayerNorm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def __call__(self, x: mx.array, residual: mx.array) -> mx.array:
        out: mx.array = self.LayerNorm(self.dense(x) + residual)
        return out


class BertAttention(Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        # transformers names this submodule `self`; the weight keys follow it.
        setattr(self, "self", BertSelfAttention(config))  # noqa: B010
        self.output = BertSelfOutput(config, config.hidden_size)

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        attention: BertSelfAttention = self["self"]
        return self.output(attention(x, mask), x)


class BertIntermediate(Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.dense = Linear(config.hidden_size, config.intermediate_size)
        # BERT's "gelu" is the exact (erf) form; "gelu_new" is the tanh approximation.
        self.act = gelu_approx if config.hidden_act == "gelu_new" else _fused_gelu()

    def __call__(self, x: mx.array) -> mx.array:
        out: mx.array = self.act(self.dense(x))
        return out


class BertLayer(Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertSelfOutput(config, config.intermediate_size)

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        attended = self.attention(x, mask)
        return self.output(self.intermediate(attended), attended)


class BertEncoder(Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.layer = [BertLayer(config) for _ in range(config.num_hidden_layers)]

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        for layer in self.layer:
            x = layer(x, mask)
        return x


class BertModel(Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)

    def __call__(
        self, ids: mx.array, attention: mx.array, types: mx.array | None = None
    ) -> mx.array:
        """Hidden states [batch, length, hidden]; `attention` is 1 for real tokens, 0 for
        pad; `types` the segment of each token (None: all 0)."""
        # Additive key mask, broadcast over heads and queries: padding gets no weight.
        dtype = self.embeddings.word_embeddings.weight.dtype
        mask = ((1.0 - attention.astype(dtype)) * -1e9)[:, None, None, :].astype(dtype)
        return self.encoder(self.embeddings(ids, types), mask)


def load_bert(weights: dict[str, mx.array], config: BertConfig) -> BertModel:
    model = BertModel(config)
    # Checkpoints saved from BertForX prefix every key with "bert.".
    cleaned = {k.removeprefix("bert."): v for k, v in weights.items()}
    wanted = {k: v for k, v in cleaned.items() if k.startswith(("embeddings.", "encoder."))}
    wanted.pop("embeddings.position_ids", None)
    model.load_weights(list(wanted.items()), strict=True)
    model.eval()
    mx.eval(model.parameters())  # type: ignore[no-untyped-call]
    return model


def pad_batch(batch: Sequence[Sequence[int]], pad_id: int) -> tuple[mx.array, mx.array]:
    """Right-padded ids and their attention mask."""
    width = max(len(ids) for ids in batch)
    ids = np.full((len(batch), width), pad_id, dtype=np.int32)
    mask = np.zeros((len(batch), width), dtype=np.int32)
    for row, tokens in enumerate(batch):
        ids[row, : len(tokens)] = tokens
        mask[row, : len(tokens)] = 1
    return mx.array(ids), mx.array(mask)


def pool(hidden: mx.array, mask: mx.array, pooling: Pooling) -> mx.array:
    if pooling == "cls":
        return hidden[:, 0, :]
    if pooling == "last":
        last = mask.sum(axis=1) - 1
        return mx.take_along_axis(hidden, last[:, None, None].astype(mx.int32), axis=1)[:, 0, :]
    weights = mask.astype(hidden.dtype)[:, :, None]
    total = (hidden * weights).sum(axis=1)
    return total / mx.maximum(weights.sum(axis=1), 1e-9)


def normalize(vectors: mx.array) -> mx.array:
    norms = mx.sqrt((vectors * vectors).sum(axis=-1, keepdims=True))
    return vectors / mx.maximum(norms, 1e-12)


@dataclass
class BertEmbedder:
    """A BERT encoder with its pooling: token ids in, one float32 vector per input out."""

    model: BertModel
    pooling: Pooling = "mean"
    normalize: bool = True
    pad_id: int = 0

    @property
    def dimensions(self) -> int:
        return self.model.config.hidden_size

    def embed(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        ids, mask = pad_batch(batch, self.pad_id)
        vectors = pool(self.model(ids, mask), mask, self.pooling)
        if self.normalize:
            vectors = normalize(vectors)
        out = np.array(vectors.astype(mx.float32), copy=True)
        return out

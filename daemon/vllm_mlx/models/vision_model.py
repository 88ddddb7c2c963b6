"""The mlx half of a vision-language model: loading it, the tower's features, and the
text model's placeholder-aware token embedding (models/vision.py says how they fit)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.nn.layers.base import Module
from mlx.nn.layers.quantized import quantize
from mlx.utils import tree_flatten

from vllm_mlx.models.vision import SUPPORTED, FeatureTable, VisionTower


class _ZeroEmbedding:
    """Stands in for the text model inside mlx-vlm's Model: its embedding path scatters
    the features into zeros, so what comes back is the features alone."""

    def __init__(self, hidden: int) -> None:
        self.hidden = hidden

    def embed_tokens(self, ids: mx.array) -> mx.array:
        return mx.zeros((*ids.shape, self.hidden), dtype=mx.float32)


def tower_features(encoder: Any, image_token_id: int, pixels: Any, masks: Any, tokens: int) -> Any:
    """The tower's features for these tiles, (tokens, hidden): mlx-vlm's own embedding
    path (tower, connector, scatter) over `tokens` image-token positions."""
    ids = mx.full((1, tokens), image_token_id, dtype=mx.int32)
    kwargs: dict[str, Any] = {}
    if masks is not None:
        kwargs["pixel_attention_mask"] = mx.array(masks[None])
    dtype = next(v.dtype for _, v in _arrays(encoder.vision_model.parameters()))
    values = mx.array(pixels[None]).astype(dtype)
    features = encoder.get_input_embeddings(ids, values, **kwargs).inputs_embeds
    return features[0]


def _arrays(params: Any) -> list[tuple[str, mx.array]]:
    flat: list[tuple[str, Any]] = tree_flatten(params)  # type: ignore[assignment]
    return [(name, value) for name, value in flat if isinstance(value, mx.array)]


class PlaceholderEmbedding(Module):
    """The text model's token embedding, with ids >= vocab_size read from the feature
    table: an image row prefills in the batch, in mlx-lm's chunks, like any other."""

    def __init__(self, inner: Module, vocab_size: int, table: FeatureTable) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.inner = inner
        self._vocab = vocab_size
        self._table = table

    def __call__(self, ids: mx.array) -> mx.array:
        if not self._table.rows:  # no image row prefilling: the embedding as it was
            return self.inner(ids)  # type: ignore[no-any-return]
        host = np.asarray(ids)
        where = np.flatnonzero(host >= self._vocab)
        if not len(where):
            return self.inner(ids)  # type: ignore[no-any-return]
        h = self.inner(mx.array(np.where(host >= self._vocab, 0, host).astype(np.int32)))
        flat = h.reshape(-1, h.shape[-1])
        found = [self._table.rows[int(pid)] for pid in host.reshape(-1)[where]]
        flat[mx.array(where.astype(np.uint32))] = mx.stack([f[row] for f, row in found]).astype(
            h.dtype
        )
        return flat.reshape(h.shape)  # type: ignore[no-any-return]

    def as_linear(self, x: mx.array) -> mx.array:
        return self.inner.as_linear(x)  # type: ignore[no-any-return]


def install_placeholder_embedding(text_model: Any, tower: VisionTower) -> None:
    """Swap the text model's token embedding for one that reads `tower.table` (after the
    weight format is applied: it wraps whatever embedding the model ends up with)."""
    holder = getattr(text_model, "model", text_model)
    if not hasattr(holder, "embed_tokens"):
        raise ValueError("the text model has no embed_tokens to carry image features")
    holder.embed_tokens = PlaceholderEmbedding(holder.embed_tokens, tower.vocab_size, tower.table)


def load_vision_model(model_dir: Path, config: dict[str, Any]) -> tuple[Any, VisionTower]:
    """(mlx-lm text model, tower) for a VLM directory mlx-vlm can load."""
    model_type = str(config.get("model_type", ""))
    if model_type not in SUPPORTED:
        raise ValueError(
            f"vision models of type '{model_type}' are not supported yet; supported: "
            f"{', '.join(SUPPORTED)} (set `vision: false` to serve its text model alone)"
        )
    from mlx_vlm.utils import load_model as load_vlm
    from mlx_vlm.utils import load_processor

    vlm = load_vlm(model_dir)
    processor = load_processor(model_dir, add_detokenizer=False)
    text_config = dict(config["text_config"])
    text_model = _text_model(vlm.language_model, text_config, config.get("quantization"))
    hidden = int(text_config["hidden_size"])
    vlm.language_model = _ZeroEmbedding(hidden)  # its weights now live in text_model
    image_token = getattr(vlm.config, "image_token_index", None) or config["image_token_id"]
    vocab_size = int(text_config["vocab_size"])
    tower = VisionTower(
        model_type, vlm, processor, int(image_token), hidden, vocab_size, tower_features
    )
    return text_model, tower


def _text_model(language_model: Any, text_config: dict[str, Any], quantization: Any) -> Any:
    """The mlx-lm model of the text config's architecture, holding mlx-vlm's weights."""
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(text_config)
    text_model = model_class(args_class.from_dict(text_config))
    weights: dict[str, Any] = {}
    for name, value in _arrays(language_model.parameters()):
        weights[name if name.startswith("lm_head.") else f"model.{name}"] = value
    weights = text_model.sanitize(weights)
    if quantization:
        quantize(
            text_model,
            group_size=quantization["group_size"],
            bits=quantization["bits"],
            class_predicate=lambda path, _m: f"{path}.scales" in weights,
        )
    text_model.load_weights(list(weights.items()), strict=True)
    mx.eval(text_model.parameters())
    text_model.eval()
    return text_model

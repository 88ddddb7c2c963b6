"""A tiny random BERT cross-encoder on disk, and a numpy reference that scores it.

The folder is what `BertForSequenceClassification.save_pretrained` writes for a
one-label model (config.json with its architecture and id2label, model.safetensors with
transformers' key names, `bert.` prefix included) plus the bundled all-MiniLM-L6-v2
tokenizer. torch and sentence-transformers are not installed here, so the reference is
transformers' BERT forward pass written out in float64 numpy (exact erf GELU, the pooler's
tanh, the classifier) and the sigmoid that sentence-transformers' CrossEncoder applies to
a one-label model's logit.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from vllm_mlx.models.sources import builtin_path

HIDDEN, LAYERS, HEADS, INTERMEDIATE, POSITIONS = 32, 2, 4, 64, 64


def _config(vocab: int) -> dict[str, Any]:
    return {
        "architectures": ["BertForSequenceClassification"],
        "model_type": "bert",
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "intermediate_size": INTERMEDIATE,
        "max_position_embeddings": POSITIONS,
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        "hidden_act": "gelu",
        "id2label": {"0": "LABEL_0"},
        "label2id": {"LABEL_0": 0},
    }


def _weights(config: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    out = {
        "bert.embeddings.word_embeddings.weight": w(config["vocab_size"], HIDDEN),
        "bert.embeddings.position_embeddings.weight": w(POSITIONS, HIDDEN),
        "bert.embeddings.token_type_embeddings.weight": w(2, HIDDEN),
        "bert.embeddings.LayerNorm.weight": 1 + w(HIDDEN),
        "bert.embeddings.LayerNorm.bias": w(HIDDEN),
        "bert.pooler.dense.weight": w(HIDDEN, HIDDEN),
        "bert.pooler.dense.bias": w(HIDDEN),
        "classifier.weight": w(1, HIDDEN),
        "classifier.bias": w(1),
    }
    for n in range(LAYERS):
        p = f"bert.encoder.layer.{n}."
        for name in ("query", "key", "value"):
            out[f"{p}attention.self.{name}.weight"] = w(HIDDEN, HIDDEN)
            out[f"{p}attention.self.{name}.bias"] = w(HIDDEN)
        out[f"{p}attention.output.dense.weight"] = w(HIDDEN, HIDDEN)
        out[f"{p}attention.output.dense.bias"] = w(HIDDEN)
        out[f"{p}attention.output.LayerNorm.weight"] = 1 + w(HIDDEN)
        out[f"{p}attention.output.LayerNorm.bias"] = w(HIDDEN)
        out[f"{p}intermediate.dense.weight"] = w(INTERMEDIATE, HIDDEN)
        out[f"{p}intermediate.dense.bias"] = w(INTERMEDIATE)
        out[f"{p}output.dense.weight"] = w(HIDDEN, INTERMEDIATE)
        out[f"{p}output.dense.bias"] = w(HIDDEN)
        out[f"{p}output.LayerNorm.weight"] = 1 + w(HIDDEN)
        out[f"{p}output.LayerNorm.bias"] = w(HIDDEN)
    return out


def build_cross_encoder(directory: Path, seed: int = 0) -> Path:
    """Write the tiny cross-encoder into `directory` (created) and return it."""
    directory.mkdir(parents=True, exist_ok=True)
    source = builtin_path("all-minilm-l6-v2")
    shutil.copy(source / "tokenizer.json", directory / "tokenizer.json")
    vocab = len(json.loads((source / "tokenizer.json").read_text())["model"]["vocab"])
    config = _config(vocab)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    save_file(_weights(config, seed), str(directory / "model.safetensors"))
    return directory


# --- the reference ---------------------------------------------------------------------


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-12) * weight + bias


_erf = np.vectorize(math.erf)


def _linear(w: dict[str, np.ndarray], name: str, x: np.ndarray) -> np.ndarray:
    return x @ w[f"{name}.weight"].astype(np.float64).T + w[f"{name}.bias"]


def reference_logit(directory: Path, ids: list[int], types: list[int]) -> float:
    """transformers' BertForSequenceClassification logit for one unpadded pair."""
    from safetensors.numpy import load_file

    w = {
        k: v.astype(np.float64) for k, v in load_file(str(directory / "model.safetensors")).items()
    }
    e = "bert.embeddings."
    x = (
        w[f"{e}word_embeddings.weight"][ids]
        + w[f"{e}position_embeddings.weight"][np.arange(len(ids))]
        + w[f"{e}token_type_embeddings.weight"][types]
    )
    x = _layer_norm(x, w[f"{e}LayerNorm.weight"], w[f"{e}LayerNorm.bias"])
    size = HIDDEN // HEADS
    for n in range(LAYERS):
        p = f"bert.encoder.layer.{n}."
        q, k, v = (
            _linear(w, f"{p}attention.self.{m}", x)
            .reshape(len(ids), HEADS, size)
            .transpose(1, 0, 2)
            for m in ("query", "key", "value")
        )
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(size)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        attended = (scores / scores.sum(-1, keepdims=True)) @ v
        attended = attended.transpose(1, 0, 2).reshape(len(ids), HIDDEN)
        o = f"{p}attention.output."
        x = _layer_norm(_linear(w, f"{o}dense", attended) + x, w[f"{o}LayerNorm.weight"],
                        w[f"{o}LayerNorm.bias"])  # fmt: skip
        inner = _linear(w, f"{p}intermediate.dense", x)
        inner = 0.5 * inner * (1.0 + _erf(inner / math.sqrt(2.0)))
        o = f"{p}output."
        x = _layer_norm(_linear(w, f"{o}dense", inner) + x, w[f"{o}LayerNorm.weight"],
                        w[f"{o}LayerNorm.bias"])  # fmt: skip
    pooled = np.tanh(_linear(w, "bert.pooler.dense", x[0]))
    return float(_linear(w, "classifier", pooled)[0])


def reference_score(directory: Path, ids: list[int], types: list[int]) -> float:
    """sentence-transformers' CrossEncoder score of a one-label model: the sigmoid."""
    return 1.0 / (1.0 + math.exp(-reference_logit(directory, ids, types)))

"""Tiny random-weight models in mlx-lm's format, for tests that need head counts the
bundled model lacks (SmolLM2-135M's 9 heads / 3 KV heads split over 3 ranks, not 2).

The weights are random (a fixed seed), the tokenizer is the bundled model's (copied
from its GGUF import), and the vocabulary is the tokenizer's full 49152 so every id it
can produce exists. Scaled so the text depends on the prompt and greedy is decisive:
with mlx's default init, two weak layers and tied embeddings only repeat one token; the
projections x3 make the layers matter, and a separate lm_head x10 spreads the logits
(std ~6) so the top two are far apart: over the tests' 80 greedy steps the smallest
margin is 0.015, against ~3e-5 that a float32 all_sum's other summation order moves
them, so greedy text compares exactly across processes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

# The ten prompts every distributed comparison sends (the bundled model's and the
# tiny models' groups against a single-process daemon).
PROMPTS = [
    "The capital of France is",
    "Write a haiku about rain.",
    "What is 2 + 2?",
    "Name a primary colour.",
    "Say hello in Spanish.",
    "The opposite of hot is",
    "List three fruits.",
    "Who wrote Hamlet?",
    "Water boils at",
    "Describe the sea in one word.",
]

# 6 heads and 6 KV heads, MLP 192: each divides by 2 and by 3 (tensor parallel over
# either); 2 layers (pipeline over 2 ranks: one layer each).
TINY = {
    "hidden_size": 96,
    "num_hidden_layers": 2,
    "intermediate_size": 192,
    "num_attention_heads": 6,
    "num_key_value_heads": 6,
    "rms_norm_eps": 1e-5,
    "vocab_size": 49152,
    "max_position_embeddings": 2048,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "config.json")


def bundled_tokenizer_dir(cache_dir: Path) -> Path:
    """The bundled model's GGUF import (tokenizer files included), in `cache_dir`."""
    from vllm_mlx.models.gguf import import_gguf
    from vllm_mlx.models.sources import builtin_path

    return import_gguf(builtin_path("smollm2-135m-instruct"), cache_dir)


def make_tiny_model(directory: Path, tokenizer_dir: Path, model_type: str, seed: int) -> Path:
    """Write a random `model_type` (llama or qwen2) model to `directory` and return it."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_map_with_path
    from mlx_lm.models import llama, qwen2
    from mlx_lm.utils import save_config, save_model

    module: Any = {"llama": llama, "qwen2": qwen2}[model_type]
    config = {"model_type": model_type, **TINY}
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(config))

    def scaled(path: str, value: Any) -> Any:
        factor = 3.0 if path.endswith("proj.weight") else 10.0 if path == "lm_head.weight" else 1
        # Float32 throughout (the distributed daemon serves float32; the reference too).
        return (value * factor).astype(mx.float32)

    model.update(tree_map_with_path(scaled, model.parameters()))
    mx.eval(model.parameters())
    assert tree_flatten(model.parameters())
    directory.mkdir(parents=True, exist_ok=True)
    for source in tokenizer_dir.iterdir():
        if source.is_file() and source.name not in _WEIGHTS:
            shutil.copy(source, directory / source.name)
    save_model(directory, model)
    save_config(config, directory / "config.json")
    assert json.loads((directory / "config.json").read_text())["model_type"] == model_type
    return directory


def tiny_llama(dtype: Any = None, *, rope_scaling: dict[str, Any] | None = None) -> Any:
    """An in-memory 2-layer llama (float32 unless dtype says otherwise), for unit tests of
    the fused ops' module swaps."""
    import mlx.core as mx
    from mlx_lm.models import llama

    args = llama.ModelArgs(
        model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=96,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=97,
        rope_scaling=rope_scaling,
    )  # fmt: skip
    mx.random.seed(5)
    model = llama.Model(args)
    model.set_dtype(dtype or mx.float32)
    mx.eval(model.parameters())
    return model

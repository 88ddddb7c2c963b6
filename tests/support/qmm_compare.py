"""Greedy decoding of the bundled model on two paths, for tests/engine/test_qmm_model.py.

    python -m tests.support.qmm_compare CACHE_DIR   # prints one JSON object

Its own process so that OpenBLAS is chosen before mlx is imported (vllm_mlx.models.cpu.blas), as
in the daemon: the float32 reference path is then as the daemon runs it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# Ten prompts of different kinds (questions, lists, translation, arithmetic): each runs
# unbatched on both paths, so each one costs seconds of the CI run on 2 cores.
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in one sentence.",
    "List three prime numbers.",
    "Translate 'good morning' into Spanish.",
    "What is 12 times 7?",
    "Why is the sky blue?",
    "Tell me a fun fact about cats.",
    "Summarise the plot of Cinderella.",
    "Who wrote Romeo and Juliet?",
]
NEW_TOKENS = 8


def greedy(model: Any, prompt: list[int]) -> tuple[list[int], list[float]]:
    """Greedy tokens and, per step, the gap between the two largest logits."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    logits = model(mx.array([prompt]), cache=cache)[0, -1]
    tokens, gaps = [], []
    for _ in range(NEW_TOKENS):
        top = mx.sort(logits)[-2:]
        gaps.append(float((top[1] - top[0]).item()))
        tokens.append(int(mx.argmax(logits).item()))
        logits = model(mx.array([[tokens[-1]]]), cache=cache)[0, -1]
    return tokens, gaps


def compare(cache_dir: Path) -> dict[str, Any]:
    from vllm_mlx.models.cpu import blas

    blas.configure()
    from vllm_mlx.config.model import ModelSettings
    from vllm_mlx.models.cpu import qmm
    from vllm_mlx.models.loader import load_model

    def load(dtype: str) -> Any:
        source = "builtin:smollm2-135m-instruct"
        return load_model(ModelSettings(name="smol", source=source, dtype=dtype), cache_dir)

    kernel, float32 = load("auto"), load("float32")
    rows = []
    for text in PROMPTS:
        messages = [{"role": "user", "content": text}]
        prompt = list(kernel.tokenizer.apply_chat_template(messages, add_generation_prompt=True))
        want, gaps = greedy(float32.model, prompt)
        got, _ = greedy(kernel.model, prompt)
        step = next((i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), None)
        rows.append({"prompt": text, "first_difference": step, "gaps": gaps})
    return {
        "kernel_layers": qmm.uses_kernel(kernel.model),
        "float32_layers_swapped": qmm.uses_kernel(float32.model),
        "blas": blas.active().name if blas.active() else None,
        "prompts": rows,
    }


if __name__ == "__main__":
    print(json.dumps(compare(Path(sys.argv[1]))))

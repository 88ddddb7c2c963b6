"""The bundled model with the extension's decode attention against MLX's own SDPA.

Greedy output must be identical, or differ only from a step where MLX's path's two best
logits are within 1e-3 of each other (a near tie either path may break either way): the
kernel sums in another order than BLAS, so logits agree to rounding, not bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import BatchKVCache, make_prompt_cache

from vllm_mlx.config.model import ModelSettings
from vllm_mlx.models.cpu import attention, qmm
from vllm_mlx.models.loaded import LoadedModel
from vllm_mlx.models.loader import load_model

pytestmark = pytest.mark.skipif(not attention.available(), reason=f"kernel: {qmm.status().detail}")
TIE = 1e-3
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Why is the sky blue?",
    "Who wrote Romeo and Juliet?",
]
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def loaded(model_cache_dir: Path) -> Iterator[LoadedModel]:
    settings = ModelSettings(name="smol", source="builtin:smollm2-135m-instruct")
    loaded = load_model(settings, model_cache_dir)
    assert isinstance(loaded, LoadedModel)
    assert attention.uses_kernel(loaded.model)  # apply_dtype swapped it in on the CPU
    yield loaded
    attention.swap_attention(loaded.model)  # as loaded, for the modules after this one


def prompts(loaded: LoadedModel) -> list[list[int]]:
    template = loaded.tokenizer.apply_chat_template
    return [
        list(template([{"role": "user", "content": text}], add_generation_prompt=True))
        for text in PROMPTS
    ]


def greedy(
    model: Any, prompt: list[int], chunk: int | None = None
) -> tuple[list[int], list[float]]:
    """Greedy tokens and, per step, the gap between the two largest logits; the prompt
    prefilled in chunks of `chunk` tokens (the engine's prefill_step_size), or at once."""
    cache = make_prompt_cache(model)
    step = chunk or len(prompt)
    for start in range(0, len(prompt) - step, step):
        model(mx.array([prompt[start : start + step]]), cache=cache)
    logits = model(mx.array([prompt[(len(prompt) - 1) // step * step :]]), cache=cache)[0, -1]
    tokens, gaps = [], []
    for _ in range(NEW_TOKENS):
        row = np.array(logits)
        second, first = np.sort(row)[-2:]
        gaps.append(float(first - second))
        tokens.append(int(np.argmax(row)))
        logits = model(mx.array([[tokens[-1]]]), cache=cache)[0, -1]
    return tokens, gaps


def batched(model: Any, rows: list[list[int]]) -> mx.array:
    """Left-padded prompts in one BatchKVCache (the engine's layout, a bool mask per row):
    the logits of NEW_TOKENS greedy decode steps, (steps, batch, vocab)."""
    width = max(map(len, rows))
    pads = [width - len(r) for r in rows]
    cache = [BatchKVCache(pads) for _ in model.layers]
    logits = model(mx.array([[0] * p + r for p, r in zip(pads, rows, strict=True)]), cache=cache)
    steps = []
    for _ in range(NEW_TOKENS):
        y = mx.argmax(logits[:, -1, :], axis=-1)[:, None]
        logits = model(y, cache=cache)
        steps.append(logits[:, -1, :])
    return mx.stack(steps)


def first_difference(got: list[int], want: list[int]) -> int | None:
    return next((i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), None)


def test_greedy_output_matches_mlx_attention(loaded: LoadedModel) -> None:
    model = loaded.model
    differing = []  # (prompt, first differing step, MLX's top-2 gap there)
    for i, prompt in enumerate(prompts(loaded)):
        attention.restore_attention(model)
        want, gaps = greedy(model, prompt)
        attention.swap_attention(model)
        got, _ = greedy(model, prompt)
        step = first_difference(got, want)
        if step is not None:
            differing.append((i, step, gaps[step]))
    assert all(gap < TIE for _, _, gap in differing), differing


def test_greedy_output_after_a_long_chunked_prefill_matches(loaded: LoadedModel) -> None:
    """~620 prompt tokens in 512-token chunks, as the scheduler prefills them: the fused
    prefill kernel at offset 0 and at 512 (a partial last chunk past a full one). A third
    chunk took no other path and cost ~20 s of CI on a 2-core CPU."""
    model = loaded.model
    text = " ".join(f"Note {i}: the {PROMPTS[i % len(PROMPTS)].lower()}" for i in range(45))
    template = loaded.tokenizer.apply_chat_template
    messages = [{"role": "user", "content": text + " Summarise the notes."}]
    prompt = list(template(messages, add_generation_prompt=True))
    assert 512 < len(prompt) < 1024 and len(prompt) % 512 >= attention.FUSED_MIN_QUERIES
    attention.restore_attention(model)
    want, gaps = greedy(model, prompt, chunk=512)
    attention.swap_attention(model)
    got, _ = greedy(model, prompt, chunk=512)
    step = first_difference(got, want)
    assert step is None or gaps[step] < TIE, (step, gaps)


def test_batched_decode_with_padding_masks_matches(loaded: LoadedModel) -> None:
    model = loaded.model
    rows = prompts(loaded)[:4]
    attention.restore_attention(model)
    want = batched(model, rows)
    attention.swap_attention(model)
    got = batched(model, rows)
    g, w = np.array(got), np.array(want)
    # Both paths feed their own argmax back: compare the steps before any token differs.
    same = (g.argmax(axis=-1) == w.argmax(axis=-1)).all(axis=1)
    agree = NEW_TOKENS if same.all() else int(same.argmin())
    assert agree >= 1
    err, scale = np.abs(g[:agree] - w[:agree]).max(), np.abs(w[:agree]).max()
    assert err <= 1e-4 * scale, (err, scale)

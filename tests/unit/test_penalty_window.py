"""The penalties' window (Ollama's repeat_last_n): only the latest n generated tokens
are penalised; without one, every generated token is (OpenAI's penalties)."""

from __future__ import annotations

import mlx.core as mx
import pytest

from vllm_mlx.engine.sampling import make_processors
from vllm_mlx.engine.types import SamplingParams


def _penalised(params: SamplingParams, history: list[int]) -> set[int]:
    logits = mx.ones((1, 8))
    for processor in make_processors(params, max_tokens=100):
        logits = processor(mx.array(history), logits)
    return {i for i, v in enumerate(logits[0].tolist()) if v < 1.0}


def test_the_window_keeps_the_penalty_to_the_latest_tokens() -> None:
    history = [1, 2, 3, 4, 5]
    assert _penalised(SamplingParams(repetition_penalty=2.0), history) == {1, 2, 3, 4, 5}
    narrow = SamplingParams(repetition_penalty=2.0, penalty_window=2)
    assert _penalised(narrow, history) == {4, 5}
    assert _penalised(SamplingParams(frequency_penalty=1.0, penalty_window=1), history) == {5}


@pytest.mark.parametrize("window", [0, -3])
def test_a_window_under_one_token_is_a_problem(window: int) -> None:
    problems = dict(SamplingParams(penalty_window=window).problems(vocab_size=8))
    assert "penalty_window" in problems

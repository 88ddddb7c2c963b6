"""One request's bad values or failure never reach, cut short or poison another request."""

from __future__ import annotations

import asyncio

import mlx.core as mx
import pytest

from tests.engine.test_engine import complete, request, run_all
from vllm_mlx.engine import slot_setup as scheduler_module
from vllm_mlx.engine.engine import Engine
from vllm_mlx.engine.sampling import LogitsProcessor
from vllm_mlx.engine.types import Finished, FinishReason, GenerationRequest, SamplingParams


def test_the_vocabulary_size_is_the_models_output_rows(engine: Engine) -> None:
    assert engine.vocab_size == 49152  # SmolLM2's vocabulary


@pytest.mark.parametrize(
    ("sampling", "field"),
    [
        ({"logit_bias": {49152: 100.0}}, "vocabulary"),  # once a native crash in MLX
        ({"logit_bias": {-1: 5.0}}, "vocabulary"),
        ({"logit_bias": {3: float("nan")}}, "finite"),
        ({"seed": 2**64, "temperature": 1.0}, "seed"),
        ({"seed": -(2**63) - 1, "temperature": 1.0}, "seed"),
        ({"top_k": -1, "temperature": 1.0}, "top_k"),
        ({"top_p": 0.0, "temperature": 1.0}, "top_p"),
        ({"temperature": float("inf")}, "temperature"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ],
)
def test_the_engine_refuses_bad_sampling_values_alone(
    engine: Engine, sampling: dict[str, object], field: str
) -> None:
    bad = request(engine, "bad", "Hi", max_tokens=4, **sampling)
    good = request(engine, "good", "What is the capital of France?")
    (alone,) = run_all(engine, request(engine, "alone", "What is the capital of France?"))
    refused, served = run_all(engine, bad, good)
    assert refused[1].reason is FinishReason.ERROR and refused[1].refused
    assert field in refused[1].message and refused[0] == ""
    assert served == alone  # the request beside it is untouched


def test_prompt_ids_outside_the_vocabulary_are_refused(engine: Engine) -> None:
    bad = GenerationRequest("ids", [1, 2, engine.vocab_size], 4, SamplingParams())
    (result,) = run_all(engine, bad)
    assert result[1].reason is FinishReason.ERROR and "vocabulary" in result[1].message


def test_huge_top_k_samples_normally_and_poisons_nothing(engine: Engine) -> None:
    """top_k at or past the vocabulary once failed the step and the global random state:
    every later unseeded request came back empty."""
    prompt = "Tell me about the sea."
    results = run_all(
        engine,
        request(engine, "k1", prompt, max_tokens=8, temperature=1.0, top_k=engine.vocab_size),
        request(engine, "k2", prompt, max_tokens=8, temperature=1.0, top_k=10**9),
        request(engine, "greedy", "What is the capital of France?"),
    )
    later = run_all(
        engine,
        request(engine, "u1", prompt, max_tokens=8, temperature=1.0),
        request(engine, "u2", prompt, max_tokens=8, temperature=0.8, top_k=5),
    )
    for text, finished in [*results, *later]:
        assert finished.reason in (FinishReason.STOP, FinishReason.LENGTH), finished.message
        assert text.strip()


def test_a_negative_seed_is_a_valid_reproducible_seed(engine: Engine) -> None:
    prompt = "Tell me a story about a cat."
    first, second = run_all(
        engine,
        request(engine, "n1", prompt, max_tokens=8, temperature=1.0, seed=-5),
        request(engine, "n2", prompt, max_tokens=8, temperature=1.0, seed=-5),
    )
    assert first == second and first[1].reason in (FinishReason.STOP, FinishReason.LENGTH)


def test_a_failure_inside_one_request_fails_that_request_alone(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A logits processor that raises on its third call (injected into one request of a
    running batch) ends that request with an error; the others finish as they would alone."""
    make_processors = scheduler_module.make_processors

    def failing_after(calls: int) -> LogitsProcessor:
        seen = 0

        def processor(tokens: mx.array, logits: mx.array) -> mx.array:
            nonlocal seen
            seen += 1
            if seen >= calls:
                raise RuntimeError("injected failure")
            return logits

        return processor

    def processors(params: SamplingParams, max_tokens: int) -> list[LogitsProcessor]:
        chosen = make_processors(params, max_tokens)
        if params.presence_penalty == 0.01:  # marks the victim
            chosen.append(failing_after(3))
        return chosen

    monkeypatch.setattr(scheduler_module, "make_processors", processors)
    prompts = ["What is the capital of France?", "Name three colors.", "Count to five."]
    alone = [run_all(engine, request(engine, f"a{i}", p))[0] for i, p in enumerate(prompts)]

    async def batch() -> list[tuple[str, Finished]]:
        jobs = [complete(engine, request(engine, f"b{i}", p)) for i, p in enumerate(prompts)]
        victim = request(engine, "victim", "Write a poem.", max_tokens=12, presence_penalty=0.01)
        return list(await asyncio.gather(complete(engine, victim), *jobs))

    victim, *others = asyncio.run(batch())
    assert victim[1].reason is FinishReason.ERROR and not victim[1].refused
    assert "injected failure" in victim[1].message
    assert victim[1].usage.completion_tokens <= 3
    assert others == alone
    # The engine keeps serving afterwards.
    (after,) = run_all(engine, request(engine, "after", prompts[0]))
    assert after == alone[0]

"""Log-probabilities, prompt scoring and shared prefills, against the model itself."""

from __future__ import annotations

import asyncio

import mlx.core as mx
import pytest

from vllm_mlx.engine.engine import Engine
from vllm_mlx.engine.output import generate_text
from vllm_mlx.engine.types import (
    Finished,
    FinishReason,
    GenerationRequest,
    SamplingParams,
    SharedPrefill,
    TextDelta,
    TokenLogprob,
)


def reference(engine: Engine, tokens: list[int]) -> mx.array:
    """log_softmax of the model's logits at every position of `tokens` (no cache)."""
    logits = engine.loaded.model(mx.array(tokens)[None])[0].astype(mx.float32)
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


async def collect(
    engine: Engine, request: GenerationRequest
) -> tuple[str, list[TokenLogprob], tuple[TokenLogprob | None, ...] | None, Finished]:
    text, entries, prompt = "", [], None
    async for event in generate_text(engine, request):
        if isinstance(event, TextDelta):
            text += event.text
            entries.extend(event.logprobs)
            prompt = event.prompt_logprobs if event.prompt_logprobs is not None else prompt
        else:
            return text, entries, prompt, event
    raise AssertionError("no Finished")


def test_generated_logprobs_match_the_model(engine: Engine) -> None:
    prompt = engine.tokenizer.encode("The capital of France is")
    request = GenerationRequest("lp", prompt, 4, SamplingParams(), logprobs=5)
    text, entries, _, finished = asyncio.run(collect(engine, request))
    assert len(entries) == finished.usage.completion_tokens == 4
    tokens = [e.token for e in entries]
    assert engine.tokenizer.decode(tokens) == text
    expected = reference(engine, [*prompt, *tokens[:-1]])[len(prompt) - 1 :]
    for position, entry in enumerate(entries):
        row = expected[position]
        assert entry.token == int(mx.argmax(row).item())  # greedy picked the most likely
        assert entry.logprob == pytest.approx(float(row.max().item()), abs=1e-3)
        assert len(entry.top) == 5
        assert entry.top[0] == (entry.token, pytest.approx(entry.logprob, abs=1e-6))
        values = [v for _, v in entry.top]
        assert values == sorted(values, reverse=True)


def test_temperature_reshapes_the_reported_distribution(engine: Engine) -> None:
    prompt = engine.tokenizer.encode("The capital of France is")
    request = GenerationRequest("t", prompt, 1, SamplingParams(temperature=0.5, seed=3), logprobs=3)
    _, entries, _, _ = asyncio.run(collect(engine, request))
    row = reference(engine, prompt)[-1] / 0.5
    row = row - mx.logsumexp(row)
    assert entries[0].logprob == pytest.approx(float(row[entries[0].token].item()), abs=1e-3)


def test_prompt_scoring_without_generation(engine: Engine) -> None:
    prompt = engine.tokenizer.encode("Paris is the capital of France")
    request = GenerationRequest("score", prompt, 0, SamplingParams(), prompt_logprobs=2)
    text, entries, scores, finished = asyncio.run(collect(engine, request))
    assert text == "" and entries == [] and finished.reason is FinishReason.LENGTH
    assert finished.usage.completion_tokens == 0
    assert scores is not None and len(scores) == len(prompt) and scores[0] is None
    expected = reference(engine, prompt)
    for i, entry in enumerate(scores[1:], start=1):
        assert entry is not None and entry.token == prompt[i]
        assert entry.logprob == pytest.approx(float(expected[i - 1, prompt[i]].item()), abs=1e-3)
        assert len(entry.top) == 2 and entry.top[0][1] >= entry.logprob - 1e-6


def test_scored_prompt_then_generation_matches_plain_generation(engine: Engine) -> None:
    prompt = engine.tokenizer.encode("One, two, three,")
    plain = GenerationRequest("plain", prompt, 5, SamplingParams())
    scored = GenerationRequest("scored", prompt, 5, SamplingParams(), prompt_logprobs=0)
    text, _, _, _ = asyncio.run(collect(engine, plain))
    scored_text, _, scores, _ = asyncio.run(collect(engine, scored))
    assert scored_text == text and scores is not None and len(scores) == len(prompt)


def test_n_sequences_share_one_prefill(engine: Engine) -> None:
    prompt = engine.tokenizer.encode("Once upon a time")
    shared = SharedPrefill(3)
    requests = [
        GenerationRequest(
            f"n{i}", prompt, 6, SamplingParams(temperature=1.0, seed=i), shared=shared
        )
        for i in range(3)
    ]

    async def main(batch: list[GenerationRequest]) -> list[str]:
        results = await asyncio.gather(*(collect(engine, r) for r in batch))
        return [r[0] for r in results]

    texts = asyncio.run(main(requests))
    assert shared.started == 3 and shared.cache is None  # every member took it; freed
    # The same seeds without sharing (seeded sampling ignores what shares the batch).
    alone = asyncio.run(
        main([GenerationRequest(f"a{i}", prompt, 6, r.sampling) for i, r in enumerate(requests)])
    )
    assert texts == alone  # the shared cache is the same cache a prefill builds
    assert len(set(texts)) > 1


def test_raw_logprobs_ignore_processors_and_processed_ones_do_not(engine: Engine) -> None:
    prompt = engine.tokenizer.encode("The capital of France is")
    expected = reference(engine, prompt)[-1]
    favourite = int(mx.argmax(expected).item())
    sampling = SamplingParams(logit_bias={favourite: -100.0})  # greedy must pick another
    raw = GenerationRequest("raw", prompt, 1, sampling, logprobs=2, logprobs_raw=True)
    processed = GenerationRequest("processed", prompt, 1, sampling, logprobs=2)
    _, (raw_entry,), _, _ = asyncio.run(collect(engine, raw))
    _, (entry,), _, _ = asyncio.run(collect(engine, processed))
    assert raw_entry.token == entry.token != favourite
    assert raw_entry.top[0][0] == favourite  # the model's own favourite, bias unseen
    assert raw_entry.logprob == pytest.approx(float(expected[entry.token].item()), abs=1e-3)
    assert entry.top[0][0] == entry.token  # after the bias the chosen token leads
    assert entry.logprob > raw_entry.logprob

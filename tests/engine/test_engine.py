"""The engine with the real bundled model: batching, per-request sampling, stops."""

from __future__ import annotations

import asyncio

import pytest

from vllm_mlx.engine.engine import Engine
from vllm_mlx.engine.output import generate_text
from vllm_mlx.engine.scheduler import SchedulerConfig
from vllm_mlx.engine.types import (
    ContextLengthError,
    Finished,
    FinishReason,
    GenerationRequest,
    SamplingParams,
    TextDelta,
)


def chat_tokens(engine: Engine, text: str) -> list[int]:
    messages = [{"role": "user", "content": text}]
    return list(engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True))


async def complete(engine: Engine, request: GenerationRequest) -> tuple[str, Finished]:
    parts: list[str] = []
    async for event in generate_text(engine, request):
        if isinstance(event, TextDelta):
            parts.append(event.text)
        else:
            return "".join(parts), event
    raise AssertionError("no Finished event")


def request(
    engine: Engine, rid: str, text: str, max_tokens: int = 12, **sampling: object
) -> GenerationRequest:
    stop = sampling.pop("stop", ())
    return GenerationRequest(
        rid,
        chat_tokens(engine, text),
        max_tokens,
        SamplingParams(**sampling),
        tuple(stop),  # type: ignore[arg-type]
    )


def run_all(engine: Engine, *requests: GenerationRequest) -> list[tuple[str, Finished]]:
    async def main() -> list[tuple[str, Finished]]:
        return list(await asyncio.gather(*(complete(engine, r) for r in requests)))

    return asyncio.run(main())


def test_greedy_is_deterministic_alone_and_in_a_batch(engine: Engine) -> None:
    prompt = "What is the capital of France?"
    (alone,) = run_all(engine, request(engine, "a", prompt))
    batched = run_all(
        engine,
        request(engine, "b", prompt),
        request(engine, "c", "Name a color.", temperature=1.0, seed=3),
        request(engine, "d", prompt),
    )
    assert "Paris" in alone[0]
    assert batched[0][0] == alone[0] == batched[2][0]
    assert alone[1].usage.completion_tokens > 0


def test_each_request_in_a_batch_gets_its_own_sampling(engine: Engine) -> None:
    prompt = "Write one word."
    results = run_all(
        engine,
        request(engine, "g", prompt, max_tokens=6),
        request(engine, "s1", prompt, max_tokens=6, temperature=1.5, seed=11),
        request(engine, "len", prompt, max_tokens=2),
        request(engine, "bias", prompt, max_tokens=3, logit_bias={28: 100.0}),
    )
    greedy, sampled, short, biased = results
    assert short[1].reason is FinishReason.LENGTH and short[1].usage.completion_tokens == 2
    # A +100 bias on token 28 forces it every step; greedy alone never does that.
    forced = engine.tokenizer.decode([28, 28, 28])
    assert biased[0] == forced
    assert greedy[0] != biased[0]
    assert sampled[1].usage.completion_tokens <= 6


def test_seed_reproduces_the_same_text_whatever_shares_the_batch(engine: Engine) -> None:
    prompt = "Tell me a story about a cat."
    first = run_all(engine, request(engine, "x1", prompt, temperature=1.0, seed=1234))
    second = run_all(
        engine,
        request(engine, "y", "Count to five.", temperature=0.9, seed=7),
        request(engine, "x2", prompt, temperature=1.0, seed=1234),
    )
    other_seed = run_all(engine, request(engine, "x3", prompt, temperature=1.0, seed=99))
    assert first[0][0] == second[1][0]
    assert first[0][0] != other_seed[0][0]


def test_stop_string_ends_generation_and_is_not_emitted(engine: Engine) -> None:
    prompt = "What is the capital of France?"
    (full,) = run_all(engine, request(engine, "f", prompt))
    stop_word = "Paris"
    assert stop_word in full[0]
    (stopped,) = run_all(engine, request(engine, "s", prompt, stop=[stop_word]))
    assert stopped[0] == full[0][: full[0].index(stop_word)]
    assert stopped[1].reason is FinishReason.STOP
    assert stopped[1].stop_sequence == stop_word
    # The stop spans tokens: "capital of" is two tokens or more.
    (spanning,) = run_all(engine, request(engine, "s2", prompt, stop=["capital of"]))
    assert "capital of" not in spanning[0] and spanning[1].stop_sequence == "capital of"


def test_prompt_longer_than_the_context_is_refused(engine: Engine) -> None:
    with pytest.raises(ContextLengthError):
        engine.check_fits(engine.context_length + 1, 10)
    assert engine.check_fits(engine.context_length - 5, 100) == 5


def test_special_tokens_never_reach_the_text(engine: Engine) -> None:
    im_start = engine.tokenizer.convert_tokens_to_ids("<|im_start|>")
    (result,) = run_all(
        engine, request(engine, "sp", "Hi", max_tokens=4, logit_bias={im_start: 100.0})
    )
    assert result[0] == "" and result[1].usage.completion_tokens == 4


def test_detokenizer_keeps_leading_space_and_whole_characters(engine: Engine) -> None:
    from vllm_mlx.engine.output import Detokenizer

    text = " Paris, café 日本 🐍!"
    tokens = engine.tokenizer.encode(text, add_special_tokens=False)
    detokenizer = Detokenizer(engine.tokenizer)
    pieces = [detokenizer.add([token]) for token in tokens]
    pieces.append(detokenizer.finish())
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces)  # no split multi-byte characters


def test_prefix_cache_reuses_a_shared_prefix_with_identical_output(engine: Engine) -> None:
    from vllm_mlx.engine.types import PromptProcessed

    system = "You are a geography teacher who answers in one short sentence. " * 6
    prompts = [
        [{"role": "system", "content": system}, {"role": "user", "content": q}]
        for q in ("What is the capital of France?", "What is the capital of Italy?")
    ]
    token_lists = [
        list(engine.tokenizer.apply_chat_template(p, add_generation_prompt=True)) for p in prompts
    ]

    async def cached_tokens_and_text(
        target: Engine, tokens: list[int], rid: str
    ) -> tuple[int, str]:
        cached, parts = 0, []
        request = GenerationRequest(rid, tokens, 8, SamplingParams())
        async for event in target.events(request):
            if isinstance(event, PromptProcessed):
                cached = event.cached_tokens
            elif hasattr(event, "tokens"):
                parts.append(target.tokenizer.decode(event.tokens))
        return cached, "".join(parts)

    uncached = Engine(engine.loaded, SchedulerConfig(prefix_cache_bytes=0))
    uncached.start()
    try:
        cold = [
            asyncio.run(cached_tokens_and_text(uncached, t, f"u{i}"))
            for i, t in enumerate(token_lists)
        ]
    finally:
        uncached.stop()
    cache_engine = Engine(engine.loaded, SchedulerConfig(prefix_cache_bytes=64 * 2**20))
    cache_engine.start()
    try:
        first = asyncio.run(cached_tokens_and_text(cache_engine, token_lists[0], "c0"))
        second = asyncio.run(cached_tokens_and_text(cache_engine, token_lists[1], "c1"))
        again = asyncio.run(cached_tokens_and_text(cache_engine, token_lists[1], "c2"))
        summary = cache_engine.scheduler.prefix_cache.summary()
    finally:
        cache_engine.stop()
    shared = next(i for i, (a, b) in enumerate(zip(*token_lists, strict=False)) if a != b)
    assert first[0] == 0 and cold[0][0] == 0
    assert shared - 2 <= second[0] <= shared  # the system prompt and template were reused
    assert again[0] == len(token_lists[1]) - 1  # an exact repeat re-feeds only its last token
    assert [first[1], second[1], again[1]] == [cold[0][1], cold[1][1], cold[1][1]]
    assert summary["entries"] >= 1 and summary["hits"] == 2 and summary["memory_mb"] > 0

"""The prefix caches through the real engine: the byte bound holds after every store,
paged blocks are shared and reused up to the block-aligned common prefix, and output
with a hit is the output without one."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from vllm_mlx.engine.cache.paged import BLOCK_TOKENS, PagedPrefixCache, block_keys
from vllm_mlx.engine.cache.prefix import PrefixCache
from vllm_mlx.engine.engine import Engine
from vllm_mlx.engine.scheduler import SchedulerConfig
from vllm_mlx.engine.types import (
    GenerationRequest,
    PromptProcessed,
    SamplingParams,
    SequenceFinished,
)

SENTENCE = "You are a geography teacher who answers in one short sentence, then stops. "
SYSTEM = SENTENCE * 5


def tokens(engine: Engine, question: str, system: str = SYSTEM) -> list[int]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return list(engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True))


async def run(
    target: Engine, prompt: list[int], rid: str, max_tokens: int = 6
) -> tuple[int, list[int], int]:
    """(prompt tokens reused from the cache, generated token ids, prompt tokens newly
    stored in the cache), greedy."""
    cached, out, stored = 0, list[int](), -1
    async for event in target.events(GenerationRequest(rid, prompt, max_tokens, SamplingParams())):
        if isinstance(event, PromptProcessed):
            cached = event.cached_tokens
        elif isinstance(event, SequenceFinished):
            stored = event.cache_stored
        elif hasattr(event, "tokens"):
            out.extend(event.tokens)
    return cached, out, stored


def started(engine: Engine, **config: Any) -> Engine:
    fresh = Engine(engine.loaded, SchedulerConfig(max_batch_size=8, **config))
    fresh.start()
    return fresh


@pytest.fixture(scope="module")
def uncached(engine: Engine) -> Iterator[Engine]:
    fresh = started(engine, prefix_cache_bytes=0)
    yield fresh
    fresh.stop()


def test_paged_blocks_are_shared_and_reused_to_the_divergence(
    engine: Engine, uncached: Engine
) -> None:
    first = tokens(engine, "What is the capital of France?")
    second = tokens(engine, "Which river flows through Rome?")
    common = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    assert common % BLOCK_TOKENS, "the test wants a divergence inside a block"
    paged = started(engine, prefix_cache_bytes=64 * 2**20, paged_cache=True)
    try:
        cache = paged.scheduler.prefix_cache
        assert isinstance(cache, PagedPrefixCache)
        cold = asyncio.run(run(paged, first, "p0"))
        warm = asyncio.run(run(paged, second, "p1"))
        again = asyncio.run(run(paged, second, "p2"))
        stats = cache.stats
        blocks = set(block_keys(first, len(first) // BLOCK_TOKENS))
        blocks |= set(block_keys(second, len(second) // BLOCK_TOKENS))
        entries, nbytes, held = cache.entries, cache.nbytes, cache.held_bytes()
    finally:
        paged.stop()
    assert cold[0] == 0
    # Reused to the token: the shared whole blocks plus the shared head of the next one.
    assert warm[0] == common
    assert again[0] == len(second) - 1  # an exact repeat re-feeds only its last token
    # What each request newly stored of its prompt (the usage's cache writes): whole
    # blocks only, and none of what it read.
    whole = BLOCK_TOKENS
    assert cold[2] == len(first) // whole * whole
    assert warm[2] == len(second) // whole * whole - common
    assert again[2] == 0
    reference = [asyncio.run(run(uncached, p, f"u{i}"))[1] for i, p in enumerate((first, second))]
    assert [cold[1], warm[1], again[1]] == [reference[0], reference[1], reference[1]]
    # One copy of the shared blocks: the cache holds the union of both prompts' blocks
    # (plus at most one block of generated tokens each), not their sum.
    assert len(blocks) <= entries <= len(blocks) + 2
    assert nbytes == held > 0
    assert (stats.queries, stats.hits, stats.misses) == (3, 2, 1)


@pytest.mark.parametrize("paged", [False, True], ids=["whole-prompt", "paged"])
def test_a_soak_of_distinct_long_prompts_never_exceeds_the_bound(
    engine: Engine, paged: bool
) -> None:
    # This model's KV is 46 KB a token (30 layers, 3 KV heads of 64, float32): the bound
    # holds two (whole prompts of ~46 tokens) or three (paged: whole blocks only) of the
    # first five prompts, so they evict 3 / 9 times, and the last one (~128 tokens)
    # alone is larger than it. Short prompts: prefill on this path costs ~15 ms a token.
    bound = 5 * 2**20
    target = started(engine, prefix_cache_bytes=bound, paged_cache=paged)
    cache = target.scheduler.prefix_cache
    seen: list[tuple[int, int]] = []
    store = cache.store

    def checked_store(stored: Any, kv: Any) -> range:
        written = store(stored, kv)
        seen.append((cache.nbytes, cache.held_bytes()))  # counted, and recounted from arrays
        return written

    cache.store = checked_store  # type: ignore[method-assign,assignment]
    prompts = [
        tokens(
            engine, f"Question {i}: name {i % 7 + 2} rivers of country number {i}.", SENTENCE[i:]
        )
        for i in range(5)
    ] + [tokens(engine, "Summarise the above.", SENTENCE * 7)]

    async def wave(start: int) -> None:
        await asyncio.gather(
            *(run(target, prompts[i], f"s{i}", 2) for i in range(start, start + 3))
        )

    try:
        for start in range(0, len(prompts), 3):
            asyncio.run(wave(start))
    finally:
        target.stop()
    assert len(seen) == len(prompts)
    assert all(counted == held <= bound for counted, held in seen), seen
    assert cache.stats.evictions >= 3 and cache.stats.rejected > 0  # overflowed again and again
    _assert_bounded(cache, bound)


def _assert_bounded(cache: PrefixCache, bound: int) -> None:
    summary = cache.summary()
    assert summary["max_memory_mb"] == round(bound / 2**20, 3)
    assert summary["memory_mb"] <= summary["max_memory_mb"]
    assert summary["evictions"] == cache.stats.evictions

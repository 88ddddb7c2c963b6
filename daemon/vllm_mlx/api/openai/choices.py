"""OpenAI `n`: one request's choices as engine sequences that share one prefill.

Each choice is its own GenerationRequest (own sampler, detokenizer, stop strings,
parsers), tied to the others by a SharedPrefill so the prompt is processed once. With a
`seed`, choice i samples with a seed derived from it: reproducible, and distinct per
choice (choice 0 keeps the request's seed, so n=1 and choice 0 of n agree).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import replace
from typing import TypeVar, cast

from vllm_mlx.api.errors import bad_request
from vllm_mlx.api.pipeline.turn import Target
from vllm_mlx.engine.types import GenerationRequest, SharedPrefill, Usage

T = TypeVar("T")

_SEED_STEP = 0x9E3779B97F4A7C15  # odd, so i -> seed + i*step never repeats mod 2**64


def seed_for(seed: int | None, index: int) -> int | None:
    """Choice `index`'s seed: the request's for choice 0, else derived, wrapped into
    the signed 64-bit range the API accepts."""
    if seed is None or index == 0:
        return seed
    return (seed + index * _SEED_STEP + 2**63) % 2**64 - 2**63


def choice_count(target: Target, n: int | None, best_of: int | None = None) -> int:
    count = 1 if n is None else n
    limit = target.settings.limits.max_n
    if count > limit:
        raise bad_request(f"n must be at most {limit} (limits.max_n)", "n")
    if best_of not in (None, 0, 1, count):
        raise bad_request(
            "best_of is not supported (only best_of equal to n); "
            "request n choices and rank them with logprobs instead",
            "best_of",
        )
    return count


def fan_out(base: GenerationRequest, count: int) -> list[GenerationRequest]:
    """`count` member requests of `base` (ids suffixed when more than one)."""
    seed = base.sampling.seed
    if count == 1:
        return [replace(base, sampling=replace(base.sampling, seed=seed_for(seed, 0)))]
    shared = SharedPrefill(count)
    return [
        replace(
            base,
            request_id=f"{base.request_id}-{index}",
            sampling=replace(base.sampling, seed=seed_for(seed, index)),
            shared=shared,
        )
        for index in range(count)
    ]


def total_usage(usages: Sequence[Usage]) -> Usage:
    """The prompt once (it was processed once), every choice's completion tokens."""
    return Usage(usages[0].prompt_tokens, sum(u.completion_tokens for u in usages))


async def merge(streams: Sequence[AsyncIterator[T]]) -> AsyncGenerator[tuple[int, T], None]:
    """Items of every stream as they come, tagged with the stream's index.

    The first failure is raised here and the other streams are closed (which aborts
    their sequences); leaving early closes them all.
    """
    if len(streams) == 1:
        async for only in streams[0]:
            yield 0, only
        return
    queue: asyncio.Queue[tuple[int, T | None, BaseException | None, bool]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[T]) -> None:
        try:
            async for item in stream:
                queue.put_nowait((index, item, None, False))
            queue.put_nowait((index, None, None, True))
        except Exception as exc:
            queue.put_nowait((index, None, exc, True))
        finally:
            close = getattr(stream, "aclose", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    await close()

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            index, item, error, done = await queue.get()
            if error is not None:
                raise error
            if done:
                running -= 1
                continue
            yield index, cast(T, item)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

"""OpenAI `n`: one request's choices as engine sequences that share one prefill.

Each choice is its own GenerationRequest (own sampler, detokenizer, stop strings,
parsers), tied to the others by a SharedPrefill so the prompt is processed once. With a
`seed`, choice i samples with a seed derived from it: reproducible, and distinct per
choice (choice 0 keeps the request's seed, so n=1 and choice 0 of n agree).
"""

from __future__ import annotations

from dataclasses import replace

from vllm_mlx.api.errors import bad_request
from vllm_mlx.api.pipeline.turn import Turn
from vllm_mlx.engine.types import GenerationRequest, SharedPrefill

_SEED_STEP = 0x9E3779B97F4A7C15  # odd, so i -> seed + i*step never repeats mod 2**64


def seed_for(seed: int | None, index: int) -> int | None:
    """Choice `index`'s seed: the request's for choice 0, else derived, wrapped into
    the signed 64-bit range the API accepts."""
    if seed is None or index == 0:
        return seed
    return (seed + index * _SEED_STEP + 2**63) % 2**64 - 2**63


def choice_count(turn: Turn, n: int | None, best_of: int | None = None) -> int:
    count = 1 if n is None else n
    limit = turn.settings.limits.max_n
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

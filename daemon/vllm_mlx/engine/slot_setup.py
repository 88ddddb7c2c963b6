"""The sampler and logits processors one request brings into the batch."""

from __future__ import annotations

from mlx_lm.sample_utils import greedy_sampler

from vllm_mlx.engine.logprobs import RawCapture
from vllm_mlx.engine.sampling import (
    Fault,
    LogitsProcessor,
    Sampler,
    guard_processor,
    guard_sampler,
    make_processors,
    make_sampler,
)
from vllm_mlx.engine.scheduler_state import Lockstep
from vllm_mlx.engine.types import GenerationRequest


def slot_sampler(
    request: GenerationRequest, fault: Fault, vocab_size: int, lockstep: Lockstep | None
) -> Sampler:
    sampler = make_sampler(request.sampling, vocab_size)
    # Greedy requests keep the one shared sampler so they sample in one batched call.
    shared = sampler is greedy_sampler
    chosen = sampler if shared else guard_sampler(sampler, fault)
    return chosen if lockstep is None else lockstep.wrap_sampler(chosen, shared)


def slot_processors(request: GenerationRequest, fault: Fault) -> list[LogitsProcessor]:
    processors = make_processors(request.sampling, request.max_tokens)
    if request.constraint is not None:  # last: nothing may re-enable a masked token
        processors.append(request.constraint.make_processor())
    guarded: list[LogitsProcessor] = [guard_processor(p, fault) for p in processors]
    if request.logprobs is not None and request.logprobs_raw and guarded:
        guarded.insert(0, RawCapture())  # first, so it sees the logits unchanged
    return guarded

"""What one request brings into the batch (its cached prefix, sampler and logits
processors), and the engine's own check that it may join at all."""

from __future__ import annotations

from typing import Any

from mlx_lm.sample_utils import greedy_sampler

from vllm_mlx.engine.adapter_prefix import keyed_cache
from vllm_mlx.engine.logprobs import RawCapture, shared_prefill
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
from vllm_mlx.engine.vision_stage import VisionStage
from vllm_mlx.models.lora import adapter_refusal, routing


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


def slot_refusal(
    request: GenerationRequest, model: Any, vocab_size: int, vision: VisionStage | None
) -> str | None:
    """Why the engine will not run this request (the API checks first; this is the
    engine's own guard, so no caller can put a bad value into a shared step)."""
    for _, message in request.sampling.problems(vocab_size):
        return message
    if request.adapter is not None and (refused := adapter_refusal(model, request.adapter)):
        return refused
    if request.max_tokens < 1 and request.prompt_logprobs is None:  # 0: score only
        return "max_tokens must be at least 1"
    if request.vision is not None:
        if vision is None:
            return "this model does not accept images"
        return vision.refusal(request, vocab_size)
    tokens = request.prompt_tokens
    if tokens and (min(tokens) < 0 or max(tokens) >= vocab_size):
        return f"the prompt has token ids outside the vocabulary (0 to {vocab_size - 1})"
    return None


def read_prefix(
    model: Any, prefix_cache: Any, request: GenerationRequest, vision: VisionStage | None
) -> tuple[Any, int, Any]:
    """(the prefix cache's hit, tokens reused, prompt logprobs): a lookup, or for n
    sequences from one prefill or a prompt to score, that prefill run here. An image
    request's features are encoded for the part the hit does not cover."""
    keyed = keyed_cache(prefix_cache, request.adapter)
    if request.shared is None and request.prompt_logprobs is None:
        hit = keyed.lookup(request.prompt_tokens)
        if request.vision is not None and vision is not None:
            vision.encode(request, hit.cached)
        return hit, hit.cached, None
    if request.vision is not None and vision is not None:
        vision.encode(request, 0)
    with routing(model, request.adapter):  # its prefill runs the adapter
        hit, reused, scores = shared_prefill(model, keyed, request)
    return hit, reused, scores

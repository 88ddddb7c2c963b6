"""What one request brings into the batch (its cached prefix, sampler and logits
processors), the engine's own check that it may join at all, and what its row hands
back (a step's logprobs, its finished prompt for the prefix cache)."""

from __future__ import annotations

from typing import Any

from mlx_lm.generate import StopSequences
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import greedy_sampler

from vllm_mlx.engine.adapter_prefix import keyed_cache
from vllm_mlx.engine.cache.rows import KVQuantization, row_caches
from vllm_mlx.engine.logprobs import RawCapture, make_row, shared_prefill, step_logprobs
from vllm_mlx.engine.sampling import (
    Fault,
    LogitsProcessor,
    Sampler,
    guard_processor,
    guard_sampler,
    make_processors,
    make_sampler,
)
from vllm_mlx.engine.scheduler_state import Lockstep, Slot
from vllm_mlx.engine.types import GenerationRequest, TokenLogprob
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


def slot_logprobs(scored: list[tuple[Slot, Any]]) -> list[TokenLogprob]:
    """One step's logprobs entries for the rows that asked (`(slot, generation
    response)` pairs), in order; raises when they cannot be computed."""
    return step_logprobs([make_row(g.logprobs, g.token, s.request, s.raw) for s, g in scored])


def store_finished(prefix_cache: Any, slot: Slot, response: Any) -> int:
    """Store a finished row's prompt and reply in the prefix cache (under its adapter);
    the prompt tokens newly stored."""
    if response.prompt_cache is None or not response.all_tokens:
        return 0
    prompt = (len(slot.request.prompt_tokens), slot.cached_tokens)
    cache = keyed_cache(prefix_cache, slot.request.adapter)
    stored: int = cache.store_prompt(response.all_tokens, response.prompt_cache, *prompt)
    return stored


NO_STOP = StopSequences(None)  # an ignore_eos row: no token ends it


def insert_row(
    generator: Any,
    model: Any,
    request: GenerationRequest,
    hit: Any,
    sampler: Sampler,
    processors: list[LogitsProcessor],
    quant: KVQuantization | None,
) -> int:
    """Put a request into the batch generator after its cached prefix (`hit`, from
    read_prefix); its row's uid."""
    layers = hit.cache if hit.cache is not None else make_prompt_cache(model)
    (uid,) = generator.insert(
        [hit.rest],
        max_tokens=[request.max_tokens],
        # The cached prefix's tokens go in all_tokens so the sequence's token record
        # (the key its cache is stored under when it ends) stays whole.
        caches=[row_caches(layers, request.adapter, quant, len(request.prompt_tokens))],
        all_tokens=[list(request.prompt_tokens[: hit.cached])],
        samplers=[sampler],
        logits_processors=[processors],
        # None: the generator's own (the model's end-of-sequence tokens).
        stop_sequences=[NO_STOP] if request.ignore_eos else None,
    )
    return int(uid)

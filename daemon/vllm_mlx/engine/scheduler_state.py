"""What the engine thread keeps per request and takes in as commands: the scheduler's
data, apart from the loop that drives it (scheduler.py). The distributed follower
(distributed/follower.py) feeds a scheduler the same commands rank 0's received."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import psutil

from vllm_mlx.engine.cache.rows import KVQuantization
from vllm_mlx.engine.fleet.sizes import kv_shape
from vllm_mlx.engine.logprobs import RawCapture
from vllm_mlx.engine.sampling import Fault, Sampler
from vllm_mlx.engine.speculative.config import SpeculativeConfig

if TYPE_CHECKING:
    from vllm_mlx.config.kv_cache import KVCacheSettings
    from vllm_mlx.config.sections import EngineSettings
    from vllm_mlx.config.speculative import SpeculativeSettings

from vllm_mlx.engine.types import (
    EngineEvent,
    FinishReason,
    GenerationRequest,
    PromptProcessed,
    TokenLogprob,
)

EventSink = Callable[[EngineEvent], None]
# Called on the engine thread after each step with (prompt tokens, generated tokens).
StepHook = Callable[[int, int], None]


class Lockstep(Protocol):
    """The narrow face of a distributed group (vllm_mlx.distributed.lockstep).

    Rank 0's scheduler journals every change to the batch, exchanges it with the
    other ranks before each step (and on idle ticks, the group's heartbeat), and
    wraps each sampler so every rank uses the token rank 0 sampled.
    """

    idle_interval: float | None
    # Set while the group re-shards for a new model: new requests end at once with it.
    closed: str | None

    def added(self, request: GenerationRequest) -> None: ...
    def removed(self, request_id: str) -> None: ...
    def exchange(self, step: bool) -> None: ...
    def wrap_sampler(self, sampler: Sampler, shared: bool) -> Sampler: ...
    def bind(self, fail_in_flight: Callable[[str], None]) -> None: ...
    def failed(self, message: str) -> None: ...
    def stopped(self) -> None: ...


@dataclass
class Slot:
    request: GenerationRequest
    sink: EventSink
    uid: int
    phase: str = "queued"  # queued -> prefill -> generation
    generated: int = 0
    pending: list[int] = field(default_factory=list)
    prompt_done: int = 0  # prompt tokens processed so far
    cached_tokens: int = 0  # prompt tokens reused from the prefix cache
    prefill_started_at: float | None = None
    first_token_at: float | None = None
    fault: Fault = field(default_factory=Fault)
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None
    raw: RawCapture | None = None  # raw-logprobs requests with logits processors
    # A request with a prediction: reads its (proposed, accepted) tokens so far.
    predicted: Callable[[], tuple[int, int] | None] | None = None

    def read_prompt(self, progress: Any, started: float) -> int:
        """A prefill step's progress (mlx-lm's (done, total) of the uncached part): the
        prompt tokens it newly processed."""
        if self.phase == "queued":
            self.phase, self.prefill_started_at = "prefill", started
        done = progress[0] if isinstance(progress, tuple) else 0
        done += self.cached_tokens
        new = max(0, done - self.prompt_done)
        self.prompt_done = max(self.prompt_done, done)
        return new

    def prompt_read(self, now: float) -> PromptProcessed:
        """The whole prompt is in the KV cache: generation starts; the event to post."""
        self.phase = "generation"
        return PromptProcessed(
            now,
            cached_tokens=self.cached_tokens,
            started_at=self.prefill_started_at,
            prompt_logprobs=self.prompt_logprobs,
        )


@dataclass(frozen=True)
class AddCommand:
    request: GenerationRequest
    sink: EventSink


@dataclass(frozen=True)
class AbortCommand:
    request_id: str
    reason: FinishReason
    message: str


@dataclass(frozen=True)
class StopCommand:
    pass


@dataclass(frozen=True)
class CallCommand:
    """Run `fn` on the engine thread (the prefix cache is that thread's alone)."""

    fn: Callable[[], Any]
    done: Future[Any]

    def run(self) -> None:
        try:
            self.done.set_result(self.fn())
        except Exception as exc:
            self.done.set_exception(exc)


Command = AddCommand | AbortCommand | StopCommand | CallCommand


@dataclass(frozen=True)
class SchedulerConfig:
    # Defaults chosen by measurement (docs/benchmarks.md): a 16-request burst is
    # prefilled in one pass, and 32 streams decode together before any queue.
    max_batch_size: int = 32
    prefill_batch_size: int = 16
    prefill_step_size: int = 512
    # A prefill chunk beside decoding takes about this many decode steps (None: the
    # whole prefill_step_size; engine/prefill_pacing.py).
    max_prefill_stall: float | None = 3.0
    prefix_cache_bytes: int = 0  # 0 = no prefix cache
    paged_cache: bool = False  # token-block prefix cache (engine/cache/paged.py)
    disk_cache_bytes: int = 0  # the paged cache's disk tier, per model (0 = off)
    disk_cache_dir: Path | None = None  # where each model's tier gets its own directory
    kv_quantization: KVQuantization | None = None  # the model's kv_cache.bits (None: off)
    speculative: SpeculativeConfig | None = None  # the model's speculative section (None: off)


@dataclass
class SchedulerStats:
    steps_executed: int = 0
    requests_finished: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    # Speculative decoding (engine/speculative): tokens proposed, and of them accepted
    # (emitted without a step of their own); steps that checked proposals.
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    speculative_steps: int = 0
    drafts: int = 0  # proposals checked: one per speculating row per pass
    accepted_per_position: list[int] = field(default_factory=list)  # [k]: k-th accepted


def describe(slot: Slot, now: float, speculated: tuple[int, int] | None = None) -> dict[str, Any]:
    """One live request for /v1/status: phase, progress and speed so far, and for a
    speculating request its (proposed, accepted) tokens."""
    request = slot.request
    prompt_len = len(request.prompt_tokens)
    ttft = None if slot.first_token_at is None else slot.first_token_at - request.arrived_at
    speed = 0.0
    if slot.first_token_at is not None and slot.generated > 1 and now > slot.first_token_at:
        speed = (slot.generated - 1) / (now - slot.first_token_at)
    if slot.phase == "generation":
        progress = slot.generated / max(1, request.max_tokens)
    elif slot.phase == "prefill":
        progress = slot.prompt_done / max(1, prompt_len)
    else:
        progress = 0.0
    return {
        "request_id": request.request_id,
        "phase": slot.phase,
        "generated_tokens": slot.generated,
        "max_tokens": request.max_tokens,
        "prompt_tokens": prompt_len,
        "prompt_tokens_processed": slot.prompt_done,
        "cached_tokens": slot.cached_tokens,
        "cache_hit_type": "prefix" if slot.cached_tokens else "none",
        "tokens_per_second": round(speed, 3),
        "ttft_s": None if ttft is None else round(ttft, 4),
        "progress": round(min(1.0, progress), 4),
        "elapsed_s": round(now - request.arrived_at, 3),
    } | _speculation(speculated)


def _speculation(counts: tuple[int, int] | None) -> dict[str, Any]:
    if counts is None:
        return {}
    drafted, accepted = counts
    rate = round(accepted / drafted, 4) if drafted else None
    block = {"drafted_tokens": drafted, "accepted_tokens": accepted, "acceptance_rate": rate}
    return {"speculative": block}


def scheduler_config(engine: EngineSettings, cache_dir: Path | None = None) -> SchedulerConfig:
    """The engine section as the scheduler takes it (the cache bound resolved in bytes);
    `cache_dir`: paths.cache_dir, under which the disk tier lives (None: no disk tier)."""
    cache_bytes = engine.prefix_cache_bytes(psutil.virtual_memory().total)
    paged = engine.use_paged_cache
    disk_bytes = engine.disk_cache_mb * 2**20 if cache_dir is not None else 0
    disk_dir = cache_dir / "prefix-cache" if cache_dir is not None else None
    if not engine.continuous_batching:
        # Simple mode: one sequence at a time; the rest wait in the generator's queue.
        return SchedulerConfig(
            1, 1, engine.prefill_step_size, None, cache_bytes, paged, disk_bytes, disk_dir
        )
    return SchedulerConfig(
        engine.max_batch_size,
        engine.prefill_batch_size,
        engine.prefill_step_size,
        engine.max_prefill_stall,
        cache_bytes,
        paged,
        disk_bytes,
        disk_dir,
    )


def with_kv_cache(config: SchedulerConfig, kv: KVCacheSettings, model: Any) -> SchedulerConfig:
    """`config` with a model's kv_cache section (its load fails on a group size that
    does not divide the model's head dimension: MLX quantizes along it)."""
    if kv.bits is None:
        return config
    _, _, head_dim = kv_shape(model)
    if head_dim and head_dim % kv.group_size:
        raise ValueError(
            f"kv_cache.group_size {kv.group_size} does not divide the model's head "
            f"dimension ({head_dim}); choose a group size that does"
        )
    quantization = KVQuantization(kv.bits, kv.group_size, kv.quantized_after)
    return replace(config, kv_quantization=quantization)


def with_speculative(config: SchedulerConfig, spec: SpeculativeSettings) -> SchedulerConfig:
    """`config` with a model's speculative section (unset method: unchanged, off)."""
    if spec.method is None:
        return config
    chosen = SpeculativeConfig(spec.num_tokens, spec.ngram_min, spec.ngram_max, spec.method)
    return replace(config, speculative=chosen)


def vocab_size_of(model: Any) -> int:
    """Rows of the output layer: the token ids a logit exists for."""
    args = getattr(model, "args", None)
    size = getattr(args, "vocab_size", None)
    if isinstance(size, int) and size > 0:
        return size
    raise ValueError("cannot tell the model's vocabulary size (model.args.vocab_size)")

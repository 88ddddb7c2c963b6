"""The asyncio face of one loaded model: submit a request, iterate its events."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

from vllm_mlx.engine.adapters import EngineAdapters
from vllm_mlx.engine.cache.disk import DiskBlockStore, model_identity
from vllm_mlx.engine.constraints import ConstraintCompiler
from vllm_mlx.engine.scheduler import Scheduler, SchedulerConfig
from vllm_mlx.engine.types import (
    ContextLengthError,
    EngineEvent,
    EngineUnavailableError,
    FinishReason,
    GenerationRequest,
    SequenceFinished,
)
from vllm_mlx.models.loaded import LoadedModel


class Engine:
    def __init__(self, loaded: LoadedModel, config: SchedulerConfig) -> None:
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        self.context_length = loaded.context_length
        self.eos_token_ids: set[int] = set(loaded.tokenizer.eos_token_ids)
        self.scheduler = Scheduler(
            loaded.model,
            self.eos_token_ids,
            config,
            name=f"engine-{loaded.name}",
            lockstep=loaded.lockstep,
            disk=_disk_tier(loaded, config),
            vision=loaded.vision,
            draft=loaded.draft.model if loaded.draft is not None else None,
        )
        # The Hugging Face tokenizer inside mlx-lm's wrapper; llguidance reads its table.
        hf_tokenizer = getattr(loaded.tokenizer, "_tokenizer", loaded.tokenizer)
        self.constraints = ConstraintCompiler(hf_tokenizer, sorted(self.eos_token_ids))
        # LoRA adapters beside the base, loaded on first use (docs/adapters.md).
        self.adapters = EngineAdapters(self.scheduler, loaded.model)
        self._accepting = False

    def start(self) -> None:
        self.scheduler.start()
        self._accepting = True

    def stop(self, timeout: float | None = 10.0) -> None:
        self._accepting = False
        self.scheduler.stop(timeout)

    @property
    def vocab_size(self) -> int:
        """Token ids run from 0 to vocab_size - 1 (logit_bias keys, prompt ids)."""
        return self.scheduler.vocab_size

    @property
    def accepting(self) -> bool:
        return self._accepting

    def check_fits(self, prompt_tokens: int, max_tokens: int) -> int:
        """Raise when the prompt cannot fit; return max_tokens lowered to the room left."""
        room = self.context_length - prompt_tokens
        if room <= 0:
            raise ContextLengthError(
                f"This model's maximum context length is {self.context_length} tokens, "
                f"but the prompt has {prompt_tokens} tokens."
            )
        return min(max_tokens, room)

    async def events(self, request: GenerationRequest) -> AsyncIterator[EngineEvent]:
        """The engine's events for one request; leaving early aborts it at once."""
        if not self._accepting:
            raise EngineUnavailableError("the engine is not accepting requests")
        if not request.prompt_tokens:
            raise ContextLengthError("the prompt is empty")
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[EngineEvent] = asyncio.Queue()

        def sink(event: EngineEvent) -> None:
            # Events can trail an abort; by then the consumer (or its loop) may be gone.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(events.put_nowait, event)

        self.scheduler.submit(request, sink)
        finished = False
        try:
            while True:
                if request.deadline is None:
                    event = await events.get()
                else:
                    remaining = request.deadline - time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError(request.request_id)
                    # Not asyncio.wait_for: on Python 3.11 it drops a cancellation that
                    # lands as the event arrives (CPython gh-86296), and a client that
                    # hung up just as a token came would keep its generation running.
                    async with asyncio.timeout(remaining):
                        event = await events.get()
                if isinstance(event, SequenceFinished):
                    finished = True
                yield event
                if finished:
                    return
        finally:
            if not finished:
                # Consumer left (disconnect, stop string, timeout): free the slot now.
                with contextlib.suppress(Exception):
                    self.scheduler.abort(request.request_id, FinishReason.ABORT)


def _disk_tier(loaded: LoadedModel, config: SchedulerConfig) -> Callable[[], DiskBlockStore] | None:
    """Opens the model's disk tier, in a directory of its own identity; none for a
    distributed group (every rank would need the same blocks) or when it is off."""
    directory = config.disk_cache_dir
    if not config.disk_cache_bytes or directory is None or loaded.lockstep is not None:
        return None

    def open_store() -> DiskBlockStore:
        identity = model_identity(loaded.directory, loaded.model)
        return DiskBlockStore(directory / identity, config.disk_cache_bytes)

    return open_store

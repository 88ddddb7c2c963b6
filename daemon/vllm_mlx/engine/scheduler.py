"""The engine thread: the only code that touches a loaded model's mlx arrays.

It owns an mlx-lm BatchGenerator (continuous batching) and talks to the asyncio side
through a command queue in and one callback per request out. Each loop iteration it
takes new commands, runs one generation step, and posts each request's new token ids
in one event, so per-step work on this thread stays small.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import structlog
from mlx_lm.generate import BatchGenerator

from vllm_mlx.engine.batch_generator import make_generator
from vllm_mlx.engine.cache.disk import DiskBlockStore
from vllm_mlx.engine.cache.factory import make_prefix_cache
from vllm_mlx.engine.fleet.heap import release_free_memory
from vllm_mlx.engine.logprobs import RawCapture
from vllm_mlx.engine.sampling import Fault
from vllm_mlx.engine.scheduler_state import (
    AbortCommand,
    AddCommand,
    CallCommand,
    Command,
    EventSink,
    Lockstep,
    SchedulerStats,
    Slot,
    StepHook,
    StopCommand,
    describe,
    vocab_size_of,
)

# Re-exported: the engine's users import the config from here.
from vllm_mlx.engine.scheduler_state import SchedulerConfig as SchedulerConfig
from vllm_mlx.engine.slot_setup import (
    insert_row,
    read_prefix,
    slot_logprobs,
    slot_processors,
    slot_refusal,
    slot_sampler,
    store_finished,
)
from vllm_mlx.engine.speculative.setup import can_speculate, make_speculator, register_row
from vllm_mlx.engine.speculative.verify import Speculator
from vllm_mlx.engine.types import (
    EngineEvent,
    FinishReason,
    GenerationRequest,
    PromptProcessed,
    SequenceFinished,
    TokensGenerated,
)
from vllm_mlx.engine.vision_stage import VisionStage
from vllm_mlx.models.vision import VisionTower

log = structlog.get_logger(__name__)


class Scheduler:
    def __init__(
        self,
        model: Any,
        eos_token_ids: set[int],
        config: SchedulerConfig,
        name: str = "engine",
        vocab_size: int | None = None,
        lockstep: Lockstep | None = None,
        disk: Callable[[], DiskBlockStore] | None = None,
        vision: VisionTower | None = None,
        draft: Any = None,
    ) -> None:
        self._model = model
        self._draft = draft  # a draft model for `speculative: {method: draft}`
        # A vision-language model: image requests encode here before they prefill.
        self.vision = VisionStage(vision) if vision is not None else None
        self.lockstep = lockstep
        if lockstep is not None:
            lockstep.bind(self.fail_in_flight)
        self.vocab_size = vocab_size if vocab_size is not None else vocab_size_of(model)
        # Each request's logits processors (a seam: the replay fake adds its own).
        self.slot_processors = slot_processors
        # Blocks slice full-precision K/V by position: a quantized cache keeps whole rows.
        paged = config.paged_cache and config.kv_quantization is None
        self.prefix_cache = make_prefix_cache(model, config.prefix_cache_bytes, paged, disk)
        self._eos = eos_token_ids
        self._config = config
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._slots: dict[int, Slot] = {}
        self._by_request: dict[str, Slot] = {}
        self._generator: BatchGenerator | None = None
        self.stats = SchedulerStats()
        # Not across a group of ranks yet: each rank would have to draft alike.
        self._speculates = lockstep is None and can_speculate(config.speculative, model, draft)
        self._speculator: Speculator | None = None
        self.on_step: StepHook | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    # --- asyncio side (any thread) ---------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, request: GenerationRequest, sink: EventSink) -> None:
        self._commands.put(AddCommand(request, sink))

    def abort(
        self, request_id: str, reason: FinishReason = FinishReason.ABORT, message: str = ""
    ) -> None:
        self._commands.put(AbortCommand(request_id, reason, message))

    def call(self, fn: Callable[[], Any]) -> Future[Any]:
        """`fn()` on the engine thread, between steps (for the prefix cache)."""
        done: Future[Any] = Future()
        self._commands.put(CallCommand(fn, done))
        return done

    def stop(self, timeout: float | None = None) -> None:
        self._commands.put(StopCommand())
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def snapshot(self) -> list[dict[str, Any]]:
        """A racy but safe view of the live requests, for /v1/status."""
        now = time.monotonic()
        spec = self._speculator
        return [
            describe(slot, now, spec.acceptance(slot.uid) if spec is not None else None)
            for slot in list(self._slots.values())
        ]

    @property
    def kv_tokens(self) -> int:
        """Tokens held in the KV cache by sequences past the queue."""
        return sum(
            len(s.request.prompt_tokens) + s.generated
            for s in list(self._slots.values())
            if s.phase != "queued"
        )

    @property
    def max_batch_size(self) -> int:
        return self._config.max_batch_size

    @property
    def num_running(self) -> int:
        return sum(1 for s in list(self._slots.values()) if s.phase != "queued")

    @property
    def num_waiting(self) -> int:
        encoding = len(self.vision.waiting) if self.vision is not None else 0
        return encoding + sum(1 for s in list(self._slots.values()) if s.phase == "queued")

    # --- engine thread -------------------------------------------------------------

    def _make_generator(self) -> BatchGenerator:
        spec, on = self._config.speculative, self._speculates
        self._speculator = make_speculator(on, spec, self.stats, self._model, self._draft)
        # Every rank of a distributed group must cut prompts alike: no pacing by time there.
        paced = self.lockstep is None
        return make_generator(self._model, self._config, self._eos, self._speculator, paced)

    def _run(self) -> None:
        self._generator = self._make_generator()
        sync = self.lockstep
        while True:
            idle = not self._slots and not (self.vision and self.vision.waiting)
            if idle:
                release_free_memory()  # going idle: hand freed KV memory back to the OS
            if not self._take_commands(block=idle):
                break
            try:
                if sync is not None:  # every rank must see each change before the step
                    sync.exchange(step=bool(self._slots))
                if self.vision is not None and (command := self.vision.take()):
                    self._start(command)  # one image request's encode per step
                if self._slots:
                    self._step()
            except Exception as exc:  # an mlx failure must not kill the thread
                log.exception("engine step failed", error=str(exc))
                if sync is not None:  # the ranks cannot agree any more: fatal, said first
                    sync.failed(str(exc))
                self._fail_all(f"engine error: {exc}")
        self._fail_all("the engine stopped", FinishReason.ABORT)
        self.prefix_cache.close()  # the disk tier's queued writes land first
        if sync is not None:
            sync.stopped()

    def fail_in_flight(self, message: str) -> None:
        """From another thread, when the engine thread is stuck (a dead rank): end
        every request's stream with this error; the process exits right after."""
        for slot in list(self._slots.values()):
            self._post(slot, SequenceFinished(FinishReason.ERROR, message))

    def _take_commands(self, block: bool) -> bool:
        """Apply queued commands; False once asked to stop."""
        # A distributed group wakes up idle to exchange a heartbeat with its ranks.
        timeout = None if self.lockstep is None else self.lockstep.idle_interval
        try:
            command = self._commands.get(timeout=timeout) if block else self._commands.get_nowait()
        except queue.Empty:
            return True
        while True:
            if isinstance(command, StopCommand):
                return False
            if isinstance(command, AddCommand):
                self._add(command)
            elif isinstance(command, AbortCommand):
                self._abort(command)
            else:
                command.run()
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _add(self, command: AddCommand) -> None:
        request = command.request
        assert self._generator is not None
        refusal = slot_refusal(request, self._model, self.vocab_size, self.vision)
        if refusal is not None:
            command.sink(SequenceFinished(FinishReason.ERROR, refusal, refused=True))
            return
        if self.lockstep is not None and self.lockstep.closed is not None:
            # The group is moving to a new model: an abort is the API's 503.
            command.sink(SequenceFinished(FinishReason.ABORT, self.lockstep.closed))
            return
        if request.vision is not None and self.vision is not None:
            self.vision.defer(command)  # encoded and started between steps (_run)
            return
        self._start(command)

    def _start(self, command: AddCommand) -> None:
        request = command.request
        assert self._generator is not None
        fault = Fault()
        try:
            if self.lockstep is not None:  # before its prefill: other ranks join that too
                self.lockstep.added(request)
            hit, reused, scores = read_prefix(self._model, self.prefix_cache, request, self.vision)
            if request.max_tokens == 0:  # scored, nothing to generate
                command.sink(PromptProcessed(time.monotonic(), reused, prompt_logprobs=scores))
                command.sink(SequenceFinished(FinishReason.LENGTH))
                return
            processors = self.slot_processors(request, fault)
            raw = next((p for p in processors if isinstance(p, RawCapture)), None)
            if request.vision is not None and self.vision is not None:
                processors = self.vision.processors(processors, self.vocab_size)
            sampler = slot_sampler(request, fault, self.vocab_size, self.lockstep)
            quant = self._config.kv_quantization
            uid = insert_row(self._generator, self._model, request, hit, sampler, processors, quant)
            predicted = register_row(self._speculator, uid, request, sampler, processors)
        except Exception as exc:
            if self.vision is not None:
                self.vision.release(request.request_id)
            command.sink(SequenceFinished(FinishReason.ERROR, f"cannot schedule: {exc}"))
            return
        slot = Slot(request, command.sink, uid, prompt_done=hit.cached, fault=fault)
        slot.cached_tokens = reused
        slot.prompt_logprobs = scores
        slot.raw, slot.predicted = raw, predicted
        self._slots[uid] = slot
        self._by_request[request.request_id] = slot

    def _abort(self, command: AbortCommand) -> None:
        slot = self._by_request.get(command.request_id)
        waiting = self.vision.withdraw(command.request_id) if self.vision else None
        if waiting is not None:  # not encoded yet
            waiting.sink(SequenceFinished(command.reason, command.message))
            return
        if slot is None:
            return  # already finished
        self._remove(slot)
        self._finish(slot, SequenceFinished(command.reason, command.message))

    def _remove(self, slot: Slot) -> None:
        assert self._generator is not None
        self._generator.remove([slot.uid])
        if self.lockstep is not None:
            self.lockstep.removed(slot.request.request_id)

    @staticmethod
    def _post(slot: Slot, event: EngineEvent) -> None:
        # A consumer's failure must never fail the shared step for everyone else.
        try:
            slot.sink(event)
        except Exception:
            log.exception("event sink failed", request_id=slot.request.request_id)

    def _flush(self, slot: Slot) -> None:
        if slot.pending:
            counts = slot.predicted() if slot.predicted is not None else None
            self._post(slot, TokensGenerated(slot.pending, tuple(slot.pending_logprobs), counts))
            slot.pending, slot.pending_logprobs = [], []

    def _finish(self, slot: Slot, event: SequenceFinished) -> None:
        self._flush(slot)
        self._post(slot, event)
        if self.vision is not None:
            self.vision.release(slot.request.request_id)
        self._slots.pop(slot.uid, None)
        self._by_request.pop(slot.request.request_id, None)
        if self._speculator is not None:
            self._speculator.forget(slot.uid)
        self.stats.requests_finished += 1

    def _step(self) -> None:
        assert self._generator is not None
        started = time.monotonic()
        prompt_responses, generation_responses = self._generator.next()
        self.stats.steps_executed += 1
        now = time.monotonic()
        prompt_tokens = 0
        for response in prompt_responses:
            slot = self._slots.get(response.uid)
            if slot is None:
                continue
            prompt_tokens += slot.read_prompt(response.progress, started)
            if response.end_of_prompt:
                if self.vision is not None:  # its features are in the KV cache now
                    self.vision.release(slot.request.request_id)
                self.stats.prompt_tokens += len(slot.request.prompt_tokens)
                self._post(slot, slot.prompt_read(now))
        finished: list[tuple[Slot, str, int]] = []  # with the prompt tokens newly cached
        scored: list[tuple[Slot, Any]] = []
        for gen in generation_responses:
            slot = self._slots.get(gen.uid)
            if slot is None or slot.fault.message is not None:
                continue
            slot.generated += 1
            if slot.generated == 1:
                slot.first_token_at = now
            self.stats.generated_tokens += 1
            # A reply's final end-of-sequence token is not part of it (ignore_eos: counted).
            if not (gen.finish_reason == "stop" and gen.token in self._eos):
                slot.pending.append(gen.token)
                if slot.request.logprobs is not None:
                    scored.append((slot, gen))
            if gen.finish_reason is not None:
                stored = store_finished(self.prefix_cache, slot, gen)
                finished.append((slot, gen.finish_reason, stored))
        if scored:
            self._add_logprobs(scored)
        for slot in self._slots.values():
            self._flush(slot)
        for slot, reason, stored in finished:
            if slot.uid in self._slots:  # not failed above
                self._finish(slot, SequenceFinished(FinishReason(reason), cache_stored=stored))
        self._fail_faulted()
        if self.on_step is not None:
            self._report_step(prompt_tokens, len(generation_responses))

    def _add_logprobs(self, scored: list[tuple[Slot, Any]]) -> None:
        try:
            entries = slot_logprobs(scored)
        except Exception as exc:  # fail the requests that asked, not the batch
            log.exception("logprobs failed")
            for slot, _ in scored:
                message = f"logprobs failed: {exc}"
                self._abort(AbortCommand(slot.request.request_id, FinishReason.ERROR, message))
            return
        for (slot, _), entry in zip(scored, entries, strict=True):
            slot.pending_logprobs.append(entry)

    def _report_step(self, prompt_tokens: int, generated_tokens: int) -> None:
        assert self.on_step is not None
        try:
            self.on_step(prompt_tokens, generated_tokens)
        except Exception:  # a metrics bug must not fail the batch
            log.exception("step hook failed")

    def _fail_faulted(self) -> None:
        """Requests whose own sampling or processing failed leave the batch, alone."""
        assert self._generator is not None
        for slot in [s for s in self._slots.values() if s.fault.message is not None]:
            log.error(
                "request failed", request_id=slot.request.request_id, error=slot.fault.message
            )
            self._remove(slot)
            self._finish(slot, SequenceFinished(FinishReason.ERROR, slot.fault.message or ""))

    def _fail_all(self, message: str, reason: FinishReason = FinishReason.ERROR) -> None:
        for slot in list(self._slots.values()):
            self._finish(slot, SequenceFinished(reason, message))
        while self.vision is not None and (command := self.vision.take()):
            command.sink(SequenceFinished(reason, message))
        if self.vision is not None:
            self.vision.clear()
        if reason is FinishReason.ERROR:
            # Start from a clean generator: the failed step may have left it inconsistent.
            self._generator = self._make_generator()

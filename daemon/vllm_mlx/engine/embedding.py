"""The embedding engine: one thread per embedding model, batched padded forward passes.

Requests queue their token lists; the engine thread takes everything queued at that
moment, sorts it by length (so padding stays small), cuts it into batches bounded by
a sequence count and a padded-token count, and runs each batch as one forward pass.
Requests that arrive while a pass runs are batched together in the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from vllm_mlx.engine.types import EngineUnavailableError

log = structlog.get_logger(__name__)


class Embedder(Protocol):
    """What the engine runs: token-id lists in, a [len(batch), dims] float32 array out."""

    @property
    def dimensions(self) -> int: ...

    def embed(self, batch: Sequence[Sequence[int]]) -> Any: ...


class Tokenizer(Protocol):
    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...


@dataclass(frozen=True)
class EmbeddingLimits:
    max_batch_size: int = 32  # sequences in one forward pass
    max_batch_tokens: int = 8192  # padded tokens (sequences x longest) in one pass


@dataclass
class LoadedEmbeddingModel:
    """What an embedding model source resolves to (the embedding twin of LoadedModel)."""

    name: str
    embedder: Embedder
    tokenizer: Tokenizer
    max_length: int  # longest input in tokens, special tokens included
    vocab_size: int
    directory: str
    pooling: str = "mean"
    normalize: bool = True
    limits: EmbeddingLimits = field(default_factory=EmbeddingLimits)
    load_seconds: float = 0.0


@dataclass
class EmbeddingStats:
    requests: int = 0
    inputs: int = 0
    tokens: int = 0
    batches: int = 0
    queued: int = 0


@dataclass
class _Job:
    inputs: list[list[int]]
    done: Callable[[list[Any] | BaseException], None]
    results: list[Any] = field(default_factory=list)
    remaining: int = 0
    cancelled: bool = False


_STOP = object()


class EmbeddingEngine:
    def __init__(self, loaded: LoadedEmbeddingModel) -> None:
        self.loaded = loaded
        self.limits = loaded.limits
        self.stats = EmbeddingStats()
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=f"embed-{loaded.name}", daemon=True)
        self._accepting = False

    # --- the asyncio side ---------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()
        self._accepting = True

    def stop(self, timeout: float | None = 10.0) -> None:
        self._accepting = False
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout)

    @property
    def accepting(self) -> bool:
        return self._accepting

    @property
    def dimensions(self) -> int:
        return self.loaded.embedder.dimensions

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Token ids with the model's special tokens (blocking: call it off the event loop)."""
        return self.loaded.tokenizer.encode_batch(texts)

    async def embed(self, inputs: list[list[int]], deadline: float | None = None) -> list[Any]:
        """One vector per input, in order; leaving early (timeout, disconnect) drops the rest."""
        if not self._accepting:
            raise EngineUnavailableError("the embedding engine is not accepting requests")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Any]] = loop.create_future()

        def settle(outcome: list[Any] | BaseException) -> None:
            if future.done():
                return
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

        def done(outcome: list[Any] | BaseException) -> None:
            with contextlib.suppress(RuntimeError):  # the loop may be gone at shutdown
                loop.call_soon_threadsafe(settle, outcome)

        job = _Job(inputs, done, [None] * len(inputs), len(inputs))
        self.stats.queued += len(inputs)
        self._queue.put(job)
        try:
            if deadline is None:
                return await future
            return await asyncio.wait_for(future, max(deadline - time.monotonic(), 0.0))
        finally:
            job.cancelled = True  # a no-op when finished; otherwise its batches are skipped

    # --- the engine thread --------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            jobs = [first]
            while True:  # everything that arrived together runs together
                try:
                    jobs.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = any(job is _STOP for job in jobs)
            live = [job for job in jobs if isinstance(job, _Job)]
            if stop:
                for job in live:
                    job.done(EngineUnavailableError("the embedding engine stopped"))
                return
            self._run(live)

    def _run(self, jobs: list[_Job]) -> None:
        items = [(job, index) for job in jobs for index in range(len(job.inputs))]
        items.sort(key=lambda item: len(item[0].inputs[item[1]]))
        for planned in self._batches(items):
            batch = [(job, index) for job, index in planned if not job.cancelled]
            self.stats.queued -= len(planned) - len(batch)
            if not batch:
                continue
            try:
                vectors = self.loaded.embedder.embed([job.inputs[i] for job, i in batch])
            except Exception as exc:
                log.exception("embedding batch failed", model=self.loaded.name)
                self.stats.queued -= len(batch)
                for job in {id(job): job for job, _ in batch}.values():
                    job.cancelled = True
                    job.done(exc)
                continue
            self._deliver(batch, vectors)

    def _batches(self, items: list[tuple[_Job, int]]) -> list[list[tuple[_Job, int]]]:
        """Sorted items cut so each batch stays under both the size and token bounds."""
        batches: list[list[tuple[_Job, int]]] = []
        current: list[tuple[_Job, int]] = []
        for job, index in items:
            length = len(job.inputs[index])  # sorted, so the longest in `current` so far
            too_many = len(current) >= self.limits.max_batch_size
            too_wide = current and (len(current) + 1) * length > self.limits.max_batch_tokens
            if too_many or too_wide:
                batches.append(current)
                current = []
            current.append((job, index))
        if current:
            batches.append(current)
        return batches

    def _deliver(self, batch: list[tuple[_Job, int]], vectors: Any) -> None:
        self.stats.batches += 1
        for row, (job, index) in enumerate(batch):
            job.results[index] = vectors[row]
            job.remaining -= 1
            self.stats.queued -= 1
            self.stats.tokens += len(job.inputs[index])
            self.stats.inputs += 1
            if job.remaining == 0:
                self.stats.requests += 1
                job.done(job.results)

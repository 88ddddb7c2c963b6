"""The embedding engine: one thread per embedding model, batched padded forward passes.

Requests queue their token lists. Before every forward pass the engine thread takes
whatever has arrived, then fills one batch, bounded by an input count and a padded-token
count, from the requests with the fewest inputs left first: requests that arrive
together share a pass, and a small request is not stuck behind a 2048-input one. Each
request's inputs run shortest first, so a batch holds similar lengths and pads little.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from vllm_mlx.engine.worker_thread import STOP, WorkerThread
from vllm_mlx.models.loaded import LoadedEmbeddingModel

log = structlog.get_logger(__name__)


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
    # Indices not yet run, longest first: pop() yields the shortest.
    todo: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.todo = sorted(range(len(self.inputs)), key=lambda i: -len(self.inputs[i]))


class EmbeddingEngine(WorkerThread[list[Any]]):
    def __init__(self, loaded: LoadedEmbeddingModel) -> None:
        super().__init__(f"embed-{loaded.name}", "embedding")
        self.loaded = loaded
        self.limits = loaded.limits
        self.stats = EmbeddingStats()

    # --- the asyncio side ---------------------------------------------------------------

    @property
    def dimensions(self) -> int:
        return self.loaded.embedder.dimensions

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Token ids with the model's special tokens (blocking: call it off the event loop)."""
        return self.loaded.tokenizer.encode_batch(texts)

    async def embed(self, inputs: list[list[int]], deadline: float | None = None) -> list[Any]:
        """One vector per input, in order; leaving early (timeout, disconnect) drops the rest."""
        return await self._submit(
            lambda done: _Job(inputs, done, [None] * len(inputs), len(inputs)), deadline
        )

    # --- the engine thread --------------------------------------------------------------

    def _loop(self) -> None:
        jobs: list[_Job] = []
        while True:
            arrived = self._take(block=not jobs)
            if any(item is STOP for item in arrived):
                for job in [*jobs, *(a for a in arrived if isinstance(a, _Job))]:
                    job.done(self.stopped())
                return
            jobs.extend(arrived)
            # Stats are written by this thread only (read anywhere: plain ints).
            self.stats.queued += sum(len(job.todo) for job in arrived)
            for job in jobs:
                if job.cancelled:  # timed out or the client left: skip what is left
                    self.stats.queued -= len(job.todo)
                    job.todo.clear()
            jobs = [job for job in jobs if job.todo]
            if jobs:
                self._run_batch(self._next_batch(jobs))

    def _take(self, block: bool) -> list[Any]:
        """Everything queued now (waiting for the first item when `block`)."""
        items = [self._queue.get()] if block else []
        while True:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                return items

    def _next_batch(self, jobs: list[_Job]) -> list[tuple[_Job, int]]:
        """One pass: inputs of the requests with the fewest left first, within both bounds."""
        batch: list[tuple[_Job, int]] = []
        widest = 0
        for job in sorted(jobs, key=lambda j: len(j.todo)):
            while job.todo:
                width = max(widest, len(job.inputs[job.todo[-1]]))
                full = len(batch) >= self.limits.max_batch_size
                if batch and (full or (len(batch) + 1) * width > self.limits.max_batch_tokens):
                    return batch
                batch.append((job, job.todo.pop()))
                widest = width
        return batch

    def _run_batch(self, batch: list[tuple[_Job, int]]) -> None:
        try:
            vectors = self.loaded.embedder.embed([job.inputs[i] for job, i in batch])
        except Exception as exc:
            log.exception("embedding batch failed", model=self.loaded.name)
            self.stats.queued -= len(batch)
            for job in {id(job): job for job, _ in batch}.values():
                job.cancelled = True
                job.done(exc)
            return
        self._deliver(batch, vectors)

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

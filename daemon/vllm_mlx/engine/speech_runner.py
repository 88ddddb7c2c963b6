"""The speech engine: one thread per Whisper model, one transcription at a time.

Whisper decodes a request window by window (30 s each) with its own prompt carried from
window to window, so requests do not share a forward pass here; they queue, in arrival
order, on the model's own thread. The event loop only waits on a future; generation
engines keep their own threads. A request whose client left (or whose deadline passed)
before its turn is skipped.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from vllm_mlx.engine.worker_thread import STOP, WorkerThread
from vllm_mlx.models.speech import LoadedSpeechModel, SpeechOptions, transcribe

log = structlog.get_logger(__name__)


@dataclass
class SpeechStats:
    requests: int = 0
    audio_seconds: float = 0.0


@dataclass
class _Job:
    audio: Any
    options: SpeechOptions
    done: Callable[[dict[str, Any] | BaseException], None]
    cancelled: bool = False


class SpeechEngine(WorkerThread[dict[str, Any]]):
    def __init__(self, loaded: LoadedSpeechModel) -> None:
        super().__init__(f"speech-{loaded.name}", "speech")
        self.loaded = loaded
        self.stats = SpeechStats()

    async def transcribe(
        self, audio: Any, options: SpeechOptions, deadline: float | None = None
    ) -> dict[str, Any]:
        """mlx-whisper's result for `audio` (mono float32, 16 kHz)."""
        return await self._submit(lambda done: _Job(audio, options, done), deadline)

    @property
    def queued(self) -> int:
        """Requests waiting for the thread (the one it runs is not counted)."""
        return self._queue.qsize()

    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is STOP:
                while True:  # fail whatever is still queued
                    try:
                        left = self._queue.get_nowait()
                    except queue.Empty:
                        return
                    if isinstance(left, _Job):
                        left.done(self.stopped())
            if job.cancelled:
                continue
            try:
                result = transcribe(self.loaded, job.audio, job.options)
            except Exception as exc:
                log.exception("transcription failed", model=self.loaded.name)
                job.done(exc)
                continue
            self.stats.requests += 1
            self.stats.audio_seconds += len(job.audio) / 16_000
            job.done(result)

"""The speech engine: one thread per Whisper model, one transcription at a time.

Whisper decodes a request window by window (30 s each) with its own prompt carried from
window to window, so requests do not share a forward pass here; they queue, in arrival
order, on the model's own thread. The event loop only waits on a future; generation
engines keep their own threads. A request whose client left (or whose deadline passed)
before its turn is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from vllm_mlx.engine.types import EngineUnavailableError
from vllm_mlx.models.speech import LoadedSpeechModel, SpeechOptions, transcribe

log = structlog.get_logger(__name__)


@dataclass
class SpeechStats:
    requests: int = 0
    audio_seconds: float = 0.0
    queued: int = 0


@dataclass
class _Job:
    audio: Any
    options: SpeechOptions
    done: Callable[[dict[str, Any] | BaseException], None]
    cancelled: bool = False


_STOP = object()


class SpeechEngine:
    def __init__(self, loaded: LoadedSpeechModel) -> None:
        self.loaded = loaded
        self.stats = SpeechStats()
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._loop, name=f"speech-{loaded.name}", daemon=True
        )
        self._accepting = False

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

    async def transcribe(
        self, audio: Any, options: SpeechOptions, deadline: float | None = None
    ) -> dict[str, Any]:
        """mlx-whisper's result for `audio` (mono float32, 16 kHz)."""
        if not self._accepting:
            raise EngineUnavailableError("the speech engine is not accepting requests")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[str, Any]] = loop.create_future()

        def settle(outcome: dict[str, Any] | BaseException) -> None:
            if future.done():
                return
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

        def done(outcome: dict[str, Any] | BaseException) -> None:
            with contextlib.suppress(RuntimeError):  # the loop may be gone at shutdown
                loop.call_soon_threadsafe(settle, outcome)

        job = _Job(audio, options, done)
        self.stats.queued += 1
        self._queue.put(job)
        try:
            if deadline is None:
                return await future
            async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
                return await future
        finally:
            job.cancelled = True  # a no-op once it ran; otherwise it is skipped

    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is _STOP:
                while True:  # fail whatever is still queued
                    try:
                        left = self._queue.get_nowait()
                    except queue.Empty:
                        return
                    if isinstance(left, _Job):
                        left.done(EngineUnavailableError("the speech engine stopped"))
            self.stats.queued -= 1
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

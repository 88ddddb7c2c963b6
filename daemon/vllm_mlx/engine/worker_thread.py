"""A model served by one thread of its own, fed through a queue: the frame the embedding
and speech engines share (engine/embedding_runner.py, engine/speech_runner.py).

The event loop never runs the model: a request puts a job on the queue and awaits a
future that the thread settles through `call_soon_threadsafe`. A request that leaves
first (its deadline passed, or its client disconnected and the task was cancelled) marks
its job cancelled, and the thread skips whatever of it has not run.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from vllm_mlx.engine.types import EngineUnavailableError

Result = TypeVar("Result")
Done = Callable[[Any], None]  # a result, or the exception to raise in the request
STOP = object()  # put on the queue by stop(): the thread fails what is left and ends


class Job(Protocol):
    cancelled: bool


class WorkerThread(Generic[Result]):
    def __init__(self, name: str, kind: str) -> None:
        self.kind = kind  # "embedding", "speech": said in the errors
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._accepting = False

    def start(self) -> None:
        self._thread.start()
        self._accepting = True

    def stop(self, timeout: float | None = 10.0) -> None:
        self._accepting = False
        if self._thread.is_alive():
            self._queue.put(STOP)
            self._thread.join(timeout)

    @property
    def accepting(self) -> bool:
        return self._accepting

    def stopped(self) -> EngineUnavailableError:
        return EngineUnavailableError(f"the {self.kind} engine stopped")

    def _loop(self) -> None:  # the thread: each engine's own
        raise NotImplementedError

    async def _submit(self, make_job: Callable[[Done], Job], deadline: float | None) -> Result:
        """Queue the job `make_job` builds around its completion callback; await its result."""
        if not self._accepting:
            raise EngineUnavailableError(f"the {self.kind} engine is not accepting requests")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()

        def settle(outcome: Any) -> None:
            if future.done():
                return
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

        def done(outcome: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop may be gone at shutdown
                loop.call_soon_threadsafe(settle, outcome)

        job = make_job(done)
        self._queue.put(job)
        try:
            if deadline is None:
                return await future
            # asyncio.timeout, not wait_for: wait_for on 3.11 can swallow a cancellation.
            async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
                return await future
        finally:
            job.cancelled = True  # a no-op once it ran; otherwise what is left is skipped

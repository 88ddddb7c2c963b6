"""A fixed pool of daemon threads for request work that must leave the event loop.

Not concurrent.futures.ThreadPoolExecutor: its threads are joined at interpreter exit,
so one runaway job (a client's chat template looping for hours) would keep the daemon
from ever exiting. These threads are daemon threads; a job whose caller stopped
waiting before it started is skipped. A job that overruns keeps its thread until it
ends: the pool's size bounds how much CPU such jobs can hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any

Job = tuple[Callable[[], Any], asyncio.AbstractEventLoop, "asyncio.Future[Any]"]


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the caller gave up (timeout, disconnect)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class Workers:
    def __init__(self, size: int, name: str) -> None:
        self._size = size
        self._name = name
        self._jobs: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self._started = False
        self._lock = threading.Lock()

    def _start(self) -> None:
        with self._lock:
            if self._started:
                return
            for index in range(self._size):
                name = f"{self._name}-{index}"
                threading.Thread(target=self._work, name=name, daemon=True).start()
            self._started = True

    def _work(self) -> None:
        while True:
            fn, loop, future = self._jobs.get()
            if future.done():
                continue  # nobody waits for it any more
            result, error = None, None
            try:
                result = fn()
            except BaseException as exc:  # handed to the waiting coroutine, raised there
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(_settle, future, result, error)

    def submit(self, fn: Callable[[], Any]) -> asyncio.Future[Any]:
        """Run fn() in a worker; the returned future belongs to the running loop."""
        self._start()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._jobs.put((fn, loop, future))
        return future

"""Model loads on daemon threads: awaitable, and never waited for at interpreter exit."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable

LOADER_THREAD = "model-loader"  # an aborted sequence still finishing delays an idle unload


def in_daemon_thread(function: Callable[..., object], *args: object) -> asyncio.Future[object]:
    """`function(*args)` on a daemon thread, awaitable.

    Not asyncio.to_thread: a load can take minutes, and the daemon may exit meanwhile
    (e.g. its port is taken); an executor thread would be waited for at exit and start
    an engine thread while the interpreter shuts down, which aborts the process.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[object] = loop.create_future()

    def settle(result: object, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        try:
            result, error = function(*args), None
        except BaseException as exc:  # handed to the awaiting coroutine
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name=LOADER_THREAD, daemon=True).start()
    return future


def loads_running() -> bool:
    """Whether a model is still loading on a daemon thread (see `exit_now_if_loading`)."""
    return any(t.name == LOADER_THREAD and t.is_alive() for t in threading.enumerate())

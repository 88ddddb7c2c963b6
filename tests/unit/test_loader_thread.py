"""The daemon-thread model loads: awaitable, and visible to the exit path while they run
(daemon.run leaves with os._exit rather than finalize the interpreter around one)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from vllm_mlx.engine.fleet.loader_thread import in_daemon_thread, loads_running


def test_a_running_load_is_seen_until_it_ends() -> None:
    release = threading.Event()
    started = threading.Event()

    def slow_load() -> str:
        started.set()
        release.wait()
        return "loaded"

    async def scenario() -> str:
        future = in_daemon_thread(slow_load)
        await asyncio.to_thread(started.wait)
        assert loads_running()
        release.set()
        return str(await future)

    assert asyncio.run(scenario()) == "loaded"
    for thread in threading.enumerate():
        if thread.name == "model-loader":
            thread.join()
    assert not loads_running()


def test_a_failed_load_raises_in_the_awaiting_coroutine() -> None:
    def broken() -> None:
        raise ValueError("no such model")

    async def scenario() -> None:
        await in_daemon_thread(broken)

    with pytest.raises(ValueError, match="no such model"):
        asyncio.run(scenario())

"""An unload reads `unloading` until its teardown ends, then `not_loaded` together with
its counted unload; a request arriving meanwhile waits and loads the model again.

The runner's stop blocks on an Event, so the test looks at the entry mid-teardown
deterministically (no sleeps, no timing)."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.fleet import BlockingRunner, Fleet
from vllm_mlx.engine.fleet.registry import Loader, LoadState, ModelEntry


def test_an_unload_reads_unloading_until_teardown_ends() -> None:
    fleet = Fleet()

    async def scenario() -> None:
        unload = asyncio.ensure_future(fleet.manager.unload(fleet.entry))
        await fleet.mid_teardown()
        try:  # not yet `not_loaded`, not yet counted, still loadable on demand
            assert fleet.entry.state is LoadState.UNLOADING
            assert fleet.unloads("explicit") == 0
            assert fleet.registry.ready
        finally:
            fleet.runner.finish.set()  # a failed check must not leave the stop blocked
        assert await unload is True
        assert fleet.entry.state is LoadState.NOT_LOADED
        assert fleet.unloads("explicit") == 1

    asyncio.run(scenario())


def test_an_idle_unload_counts_with_its_state_change() -> None:
    fleet = Fleet(keep_alive=0)

    async def scenario() -> None:
        fleet.manager.release(fleet.entry)  # its last request ended: the idle timer starts
        await fleet.mid_teardown()
        try:
            assert fleet.entry.state is LoadState.UNLOADING and fleet.unloads("idle") == 0
        finally:
            fleet.runner.finish.set()
        # Waits for the lock the idle unload holds; nothing is left to unload then.
        assert await fleet.manager.unload(fleet.entry) is False
        assert fleet.entry.state is LoadState.NOT_LOADED and fleet.unloads("idle") == 1

    asyncio.run(scenario())


def test_a_request_during_an_unload_waits_and_loads_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fleet = Fleet()
    seen: list[tuple[LoadState, float]] = []

    def load_entry(entry: ModelEntry, loader: Loader) -> None:
        # What the load found: the teardown over, its unload counted.
        seen.append((entry.state, fleet.unloads("explicit")))
        entry.embedder, entry.state = BlockingRunner(), LoadState.RUNNING  # type: ignore[assignment]

    monkeypatch.setattr(fleet.registry, "load_entry", load_entry)

    async def scenario() -> None:
        unload = asyncio.ensure_future(fleet.manager.unload(fleet.entry))
        await fleet.mid_teardown()
        request = asyncio.ensure_future(fleet.manager.load_ready(fleet.entry))
        fleet.runner.finish.set()
        await unload
        await request
        assert fleet.entry.state is LoadState.RUNNING and fleet.entry.runner is not None

    asyncio.run(scenario())
    assert seen == [(LoadState.LOADING, 1.0)]

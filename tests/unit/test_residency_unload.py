"""An unload reads `unloading` until its teardown ends, then `not_loaded` together with
its counted unload; a request arriving meanwhile waits and loads the model again.

The runner's stop blocks on an Event, so the test looks at the entry mid-teardown
deterministically (no sleeps, no timing)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from vllm_mlx.config.model import ModelSettings
from vllm_mlx.config.settings import Settings
from vllm_mlx.engine.fleet.registry import Loader, LoadState, ModelEntry, ModelRegistry
from vllm_mlx.engine.fleet.residency import ModelManager
from vllm_mlx.engine.scheduler import SchedulerConfig
from vllm_mlx.metrics.models import ModelMetrics

MODEL = ModelSettings(name="m", source="builtin:smollm2-135m-instruct")


class BlockingRunner:
    """A runner whose stop waits until the test lets it finish."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.finish = threading.Event()

    def stop(self, timeout: float | None = 10.0) -> None:
        self.stopping.set()
        self.finish.wait()


class Fleet:
    def __init__(self, keep_alive: float = -1) -> None:
        model = MODEL.model_copy(update={"keep_alive": keep_alive})
        settings = Settings(models=[model])
        self.prometheus = CollectorRegistry()
        self.registry = ModelRegistry([model], SchedulerConfig())
        self.registry.started = True
        self.manager = ModelManager(
            self.registry,
            lambda: settings,
            self.no_loader,
            lambda _: None,
            ModelMetrics(self.prometheus),
        )
        self.entry = self.registry.entries()[0]
        self.runner = BlockingRunner()
        # An embedding slot: footprint and is_busy read no scheduler from it.
        self.entry.embedder, self.entry.state = self.runner, LoadState.RUNNING  # type: ignore[assignment]

    @staticmethod
    def no_loader(settings: Settings) -> Loader:
        def load(model: ModelSettings) -> Any:
            raise AssertionError("the test replaces registry.load_entry")

        return load

    async def mid_teardown(self) -> None:
        """Returns once the unload is inside its runner's stop (a bound, not a timing:
        it fails the test instead of hanging it)."""
        assert await asyncio.to_thread(self.runner.stopping.wait, 60), "stop was never called"

    def unloads(self, reason: str) -> float:
        labels = {"model_name": MODEL.name, "reason": reason}
        value = self.prometheus.get_sample_value("vllm_mlx_model_unloads_total", labels)
        return value or 0.0


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

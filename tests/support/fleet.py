"""A model manager over one registry entry whose runner's stop blocks until the test lets
it finish: unload, keep-alive and collector tests look at an entry mid-teardown
deterministically (no sleeps, no timing)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from prometheus_client import CollectorRegistry

from vllm_mlx.config.model import ModelSettings
from vllm_mlx.config.settings import Settings
from vllm_mlx.engine.fleet.registry import Loader, LoadState, ModelRegistry
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

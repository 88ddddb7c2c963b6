"""run(config): engines + Litestar app + Granian (embedded, in this event loop) + signals.

Granian runs embedded rather than as worker processes: the engine thread that owns
the model must live in the same process as the request handlers.
"""

from __future__ import annotations

import asyncio
import signal

import structlog
from granian.constants import Interfaces
from granian.server.embed import Server

from vllm_mlx.api.state import ServerState
from vllm_mlx.app import create_app
from vllm_mlx.config import EngineSettings, Settings
from vllm_mlx.configfile import LoadedConfig
from vllm_mlx.engine.registry import ModelRegistry
from vllm_mlx.engine.scheduler import SchedulerConfig
from vllm_mlx.logging import configure_logging
from vllm_mlx.models.loader import load_model

log = structlog.get_logger(__name__)


def scheduler_config(engine: EngineSettings) -> SchedulerConfig:
    if not engine.continuous_batching:
        # Simple mode: one sequence at a time; the rest wait in the generator's queue.
        return SchedulerConfig(
            max_batch_size=1, prefill_batch_size=1, prefill_step_size=engine.prefill_step_size
        )
    return SchedulerConfig(
        engine.max_batch_size, engine.prefill_batch_size, engine.prefill_step_size
    )


class Daemon:
    def __init__(self, loaded: LoadedConfig) -> None:
        self.config_path = loaded.path
        settings = loaded.settings
        self.registry = ModelRegistry(settings.models, scheduler_config(settings.engine))
        self.state = ServerState(settings, self.registry, config_path=loaded.path)
        self.server = Server(
            create_app(self.state),
            address=settings.server.host,
            port=settings.server.port,
            interface=Interfaces.ASGINL,
            log_enabled=False,
            backlog=1024,
        )
        self._stopping = False

    @property
    def settings(self) -> Settings:
        return self.state.settings

    def _on_stop_signal(self, signum: int) -> None:
        if self._stopping:
            log.warning("second stop signal: exiting now", signal=signal.Signals(signum).name)
            raise SystemExit(1)
        self._stopping = True
        log.info("stopping", signal=signal.Signals(signum).name)
        self.state.draining = True
        self.server.stop()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_stop_signal, signum)
        cache_dir = self.settings.resolved_cache_dir()
        self.registry.load_in_background(lambda model: load_model(model, cache_dir))
        log.info(
            "listening",
            url=f"http://{self.settings.server.host}:{self.settings.server.port}",
            config=str(self.config_path) if self.config_path else "built-in defaults",
            models=[m.name for m in self.settings.models],
        )
        try:
            await self.server.serve()
        finally:
            self.registry.stop_all()
            log.info("stopped")


def run(loaded: LoadedConfig) -> None:
    configure_logging(loaded.settings.logging)
    asyncio.run(Daemon(loaded).run())

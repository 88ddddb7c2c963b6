"""The served models: engines by name, aliases, and their load state."""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog

from vllm_mlx.config import ModelSettings
from vllm_mlx.engine.engine import Engine, LoadedModel
from vllm_mlx.engine.scheduler import SchedulerConfig

log = structlog.get_logger(__name__)

Loader = Callable[[ModelSettings], LoadedModel]


class LoadState(enum.StrEnum):
    NOT_LOADED = "not_loaded"
    LOADING = "loading"
    RUNNING = "running"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass
class ModelEntry:
    settings: ModelSettings
    state: LoadState = LoadState.NOT_LOADED
    engine: Engine | None = None
    error: str = ""
    created: int = field(default_factory=lambda: int(time.time()))


class ModelRegistry:
    def __init__(self, models: Sequence[ModelSettings], scheduler_config: SchedulerConfig) -> None:
        self._entries = {m.name: ModelEntry(m) for m in models}
        self._aliases: dict[str, str] = {}
        self.set_aliases(models)
        self.scheduler_config = scheduler_config
        self.started_at = time.time()

    def set_aliases(self, models: Sequence[ModelSettings]) -> None:
        """Aliases hot-reload: swap the whole map at once."""
        self._aliases = {alias: m.name for m in models for alias in m.aliases}

    def load_all(self, loader: Loader) -> None:
        """Load every model in turn (blocking; run it off the event loop)."""
        for entry in self._entries.values():
            entry.state = LoadState.LOADING
            try:
                loaded = loader(entry.settings)
                engine = Engine(loaded, self.scheduler_config)
                engine.start()
            except Exception as exc:
                entry.state, entry.error = LoadState.FAILED, str(exc)
                log.exception("model failed to load", model=entry.settings.name)
                continue
            entry.engine, entry.state = engine, LoadState.RUNNING

    def load_in_background(self, loader: Loader) -> threading.Thread:
        thread = threading.Thread(target=self.load_all, args=(loader,), name="model-loader")
        thread.daemon = True
        thread.start()
        return thread

    def stop_all(self) -> None:
        for entry in self._entries.values():
            if entry.engine is not None:
                entry.engine.stop()
                entry.state = LoadState.STOPPED

    def resolve(self, model_id: str) -> ModelEntry | None:
        name = model_id if model_id in self._entries else self._aliases.get(model_id)
        return self._entries.get(name) if name else None

    def entries(self) -> list[ModelEntry]:
        return list(self._entries.values())

    def aliases_of(self, name: str) -> list[str]:
        return [alias for alias, target in self._aliases.items() if target == name]

    @property
    def ready(self) -> bool:
        return all(e.state is LoadState.RUNNING for e in self._entries.values())

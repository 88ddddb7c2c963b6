"""The served models: engines by name, aliases, and their load state."""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from vllm_mlx.config import ModelSettings, Reload
from vllm_mlx.engine.embedding import EmbeddingEngine, LoadedEmbeddingModel
from vllm_mlx.engine.engine import Engine, LoadedModel
from vllm_mlx.engine.scheduler import SchedulerConfig

log = structlog.get_logger(__name__)

Loader = Callable[[ModelSettings], LoadedModel | LoadedEmbeddingModel]


class Stoppable(Protocol):
    def stop(self, timeout: float | None = 10.0) -> None: ...


class LoadState(enum.StrEnum):
    NOT_LOADED = "not_loaded"
    LOADING = "loading"
    RUNNING = "running"
    FAILED = "failed"
    STOPPED = "stopped"


UNSETTLED = (LoadState.NOT_LOADED, LoadState.LOADING)


@dataclass
class ModelEntry:
    settings: ModelSettings
    state: LoadState = LoadState.NOT_LOADED
    engine: Engine | None = None
    error: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    # `task: embed` models have an embedding engine instead of a generation engine.
    embedder: EmbeddingEngine | None = None

    @property
    def runner(self) -> Stoppable | None:
        """Whichever engine serves this entry."""
        return self.engine if self.engine is not None else self.embedder


def start_engine(
    loaded: LoadedModel | LoadedEmbeddingModel, scheduler_config: SchedulerConfig
) -> tuple[Engine | None, EmbeddingEngine | None]:
    """The running engine for a loaded model: (generation, None) or (None, embedding)."""
    if isinstance(loaded, LoadedEmbeddingModel):
        embedder = EmbeddingEngine(loaded)
        embedder.start()
        return None, embedder
    engine = Engine(loaded, scheduler_config)
    engine.start()
    return engine, None


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
                engine, embedder = start_engine(loader(entry.settings), self.scheduler_config)
            except Exception as exc:
                entry.state, entry.error = LoadState.FAILED, str(exc) or type(exc).__name__
                log.exception("model failed to load", model=entry.settings.name)
                continue
            entry.engine, entry.embedder, entry.state = engine, embedder, LoadState.RUNNING

    def load_in_background(
        self, loader: Loader, on_done: Callable[[], None] | None = None
    ) -> threading.Thread:
        """Load every model on a thread; `on_done` runs on that thread once all settled."""

        def load() -> None:
            self.load_all(loader)
            if on_done is not None:
                on_done()

        thread = threading.Thread(target=load, name="model-loader")
        thread.daemon = True
        thread.start()
        return thread

    def prepare(
        self,
        models: Sequence[ModelSettings],
        scheduler_config: SchedulerConfig,
        loader: Loader,
        reuse: bool = True,
    ) -> dict[str, ModelEntry]:
        """Running entries for `models`, loading only what changed (blocking).

        A served model whose settings differ only in aliases keeps its engine (when
        `reuse`); the others get a new engine while the current ones keep serving.
        If any load fails, the engines started here are stopped and the error raised.
        """
        current = {e.settings.name: e for e in self._entries.values()}
        entries: dict[str, ModelEntry] = {}
        try:
            for model in models:
                old = current.get(model.name)
                if reuse and old is not None and old.runner is not None and _same_model(old, model):
                    entries[model.name] = ModelEntry(
                        model, old.state, old.engine, "", old.created, old.embedder
                    )
                    continue
                engine, embedder = start_engine(loader(model), scheduler_config)
                entries[model.name] = ModelEntry(
                    model, LoadState.RUNNING, engine, embedder=embedder
                )
        except Exception:
            for name, entry in entries.items():
                runner = entry.runner
                if runner is not None and runner is not _engine_of(current, name):
                    runner.stop()
            raise
        return entries

    def swap(
        self,
        entries: dict[str, ModelEntry],
        models: Sequence[ModelSettings],
        scheduler_config: SchedulerConfig,
    ) -> list[Stoppable]:
        """Serve `entries` from now on; returns the engines no longer served.

        Call it on the event loop: the two assignments happen between two requests.
        The caller stops the returned engines once their in-flight requests are done.
        """
        kept = {id(e.runner) for e in entries.values() if e.runner is not None}
        retired = [
            runner
            for e in self._entries.values()
            if (runner := e.runner) is not None and id(runner) not in kept
        ]
        self._entries = entries
        self.set_aliases(models)
        self.scheduler_config = scheduler_config
        return retired

    def stop_all(self) -> None:
        for entry in self._entries.values():
            if entry.runner is not None:
                entry.runner.stop()
                entry.state = LoadState.STOPPED

    def resolve(self, model_id: str) -> ModelEntry | None:
        name = model_id if model_id in self._entries else self._aliases.get(model_id)
        return self._entries.get(name) if name else None

    def entries(self) -> list[ModelEntry]:
        return list(self._entries.values())

    def aliases_of(self, name: str) -> list[str]:
        return [alias for alias, target in self._aliases.items() if target == name]

    @property
    def settled(self) -> bool:
        """No model is still waiting to load or loading."""
        return all(e.state not in UNSETTLED for e in self._entries.values())

    @property
    def ready(self) -> bool:
        """Every model loaded or failed, and at least one serving."""
        states = [e.state for e in self._entries.values()]
        return self.settled and LoadState.RUNNING in states

    def failed(self) -> list[ModelEntry]:
        return [e for e in self._entries.values() if e.state is LoadState.FAILED]


def _same_model(entry: ModelEntry, model: ModelSettings) -> bool:
    """Same weights and limits: only hot fields (aliases, parsers) may differ.

    Hot fields are read per request from the settings, never baked into the engine.
    """
    for name, info in ModelSettings.model_fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        if extra.get("x-reload") != Reload.HOT.value and getattr(entry.settings, name) != getattr(
            model, name
        ):
            return False
    return True


def _engine_of(entries: dict[str, ModelEntry], name: str) -> Stoppable | None:
    entry = entries.get(name)
    return entry.runner if entry is not None else None

"""The served models: engines by name, aliases, and their load state."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from vllm_mlx.config.adapters import adapter_ids
from vllm_mlx.config.fields import Reload
from vllm_mlx.config.model import ModelSettings, loads_at_startup, warm_texts
from vllm_mlx.engine.embedding_runner import EmbeddingEngine
from vllm_mlx.engine.engine import Engine
from vllm_mlx.engine.fleet.sizes import (
    activation_itemsize,
    kv_bytes_per_token,
    module_bytes,
    probe_kv_itemsize,
)
from vllm_mlx.engine.scheduler import SchedulerConfig
from vllm_mlx.engine.scheduler_state import with_kv_cache, with_speculative
from vllm_mlx.engine.speech_runner import SpeechEngine
from vllm_mlx.engine.warm import warm
from vllm_mlx.models.loaded import LoadedEmbeddingModel, LoadedModel
from vllm_mlx.models.speech import LoadedSpeechModel

log = structlog.get_logger(__name__)

Loaded = LoadedModel | LoadedEmbeddingModel | LoadedSpeechModel
Loader = Callable[[ModelSettings], Loaded]


class Stoppable(Protocol):
    def stop(self, timeout: float | None = 10.0) -> None: ...


class LoadState(enum.StrEnum):
    NOT_LOADED = "not_loaded"
    LOADING = "loading"
    RUNNING = "running"
    # Detached from requests, its runner stopping and its memory being freed: it reads
    # `not_loaded` (and its unload is counted) only once that teardown is over.
    UNLOADING = "unloading"
    FAILED = "failed"
    STOPPED = "stopped"


# On the way in or out of memory: a request for it waits and loads it (again).
UNSETTLED = (LoadState.NOT_LOADED, LoadState.LOADING, LoadState.UNLOADING)


@dataclass
class ModelEntry:
    settings: ModelSettings
    state: LoadState = LoadState.NOT_LOADED
    engine: Engine | None = None
    error: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    # `task: embed` models have an embedding engine instead of a generation engine.
    embedder: EmbeddingEngine | None = None
    # `task: transcribe` models have a speech engine (engine/speech_runner.py).
    transcriber: SpeechEngine | None = None
    startup: bool = True  # loaded as the daemon starts (`load: startup`)
    # Residency (engine/fleet/residency.py): requests holding the model, when it last served,
    # and what its weights and each KV token take once loaded.
    in_flight: int = 0
    last_used: float = field(default_factory=time.monotonic)
    # A request's own keep_alive (Ollama's field), in place of the configured one until
    # another request sets its own or the model unloads; None: the config's.
    keep_alive_override: float | None = None
    weights_bytes: int = 0
    kv_token_bytes: int = 0
    kv_bits: int = 0  # bits per cached K/V value: kv_cache.bits, or the float width

    @property
    def runner(self) -> Stoppable | None:
        """Whichever engine serves this entry."""
        if self.transcriber is not None:
            return self.transcriber
        return self.engine if self.engine is not None else self.embedder


def start_engine(
    loaded: LoadedModel | LoadedEmbeddingModel,
    scheduler_config: SchedulerConfig,
    model: ModelSettings | None = None,
) -> tuple[Engine | None, EmbeddingEngine | None]:
    """The running engine for a loaded model: (generation, None) or (None, embedding);
    a generation model's warm prompts are in its prefix cache before it is returned."""
    if isinstance(loaded, LoadedEmbeddingModel):
        embedder = EmbeddingEngine(loaded)
        embedder.start()
        return None, embedder
    if model is not None:
        scheduler_config = with_kv_cache(scheduler_config, model.kv_cache, loaded.model)
        scheduler_config = with_speculative(scheduler_config, model.speculative)
    if loaded.lockstep is None:  # before the engine thread runs it (a shard needs its group)
        loaded.kv_itemsize = probe_kv_itemsize(loaded.model)
    engine = Engine(loaded, scheduler_config)
    engine.start()
    if model is not None:
        engine.adapters.configure(model.adapters)
    if model is not None and model.warm_prompts:
        warm(engine, model.name, warm_texts(model))
    return engine, None


class ModelRegistry:
    def __init__(self, models: Sequence[ModelSettings], scheduler_config: SchedulerConfig) -> None:
        self._entries = {
            m.name: ModelEntry(m, startup=loads_at_startup(list(models), i))
            for i, m in enumerate(models)
        }
        # Set once the startup models have loaded or failed (ModelManager.load_startup).
        self.started = False
        self._aliases: dict[str, str] = {}
        self._adapter_ids: dict[str, tuple[str, str]] = {}  # id -> (model, adapter)
        self.set_aliases(models)
        self.scheduler_config = scheduler_config
        self.started_at = time.time()

    def set_aliases(self, models: Sequence[ModelSettings]) -> None:
        """Aliases and adapters hot-reload: swap the id maps at once, and hand each
        running engine its adapter list (docs/adapters.md)."""
        self._aliases = {alias: m.name for m in models for alias in m.aliases}
        self._adapter_ids = {
            model_id: (m.name, adapter.name)
            for m in models
            for adapter in m.adapters
            for model_id in adapter_ids(m.name, adapter)
        }
        for m in models:
            entry = self._entries.get(m.name)
            if entry is not None and entry.engine is not None:
                entry.engine.adapters.configure(m.adapters)

    def load_entry(self, entry: ModelEntry, loader: Loader) -> None:
        """Load and start one model (blocking: run it off the event loop).

        On failure the entry is FAILED with the error, which is raised again.
        """
        try:
            loaded = loader(entry.settings)
            if isinstance(loaded, LoadedSpeechModel):
                entry.transcriber, entry.state = start_speech(loaded, entry), LoadState.RUNNING
                return
            engine, embedder = start_engine(loaded, self.scheduler_config, entry.settings)
            measure(entry, loaded)
        except Exception as exc:
            entry.state, entry.error = LoadState.FAILED, str(exc) or type(exc).__name__
            log.exception("model failed to load", model=entry.settings.name)
            raise
        entry.engine, entry.embedder, entry.state = engine, embedder, LoadState.RUNNING

    def to_load(self, models: Sequence[ModelSettings], reuse: bool = True) -> list[ModelSettings]:
        """The models `prepare` would load now (the memory a full reload adds)."""
        return [m for i, m in enumerate(models) if self._plan(models, i, reuse) == "load"]

    def _plan(self, models: Sequence[ModelSettings], index: int, reuse: bool) -> str:
        """keep (same engine), defer (stays out of memory until asked for) or load."""
        model = models[index]
        old = self._entries.get(model.name)
        if reuse and old is not None and old.runner is not None and _same_model(old, model):
            return "keep"
        startup = loads_at_startup(list(models), index)
        if (old is None and not startup) or (old is not None and old.runner is None):
            return "defer"  # not in memory now: an on-demand model stays out until asked for
        return "load"

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
            for index, model in enumerate(models):
                plan = self._plan(models, index, reuse)
                startup = loads_at_startup(list(models), index)
                if plan == "keep":
                    # The same entry, so its in-flight count holds; only hot fields differ.
                    old = current[model.name]
                    old.settings = model
                    entries[model.name] = old
                elif plan == "defer":
                    entries[model.name] = ModelEntry(model, startup=startup)
                else:
                    loaded = loader(model)
                    if isinstance(loaded, LoadedSpeechModel):
                        entries[model.name] = ModelEntry(model, LoadState.RUNNING, startup=startup)
                        entries[model.name].transcriber = start_speech(loaded, entries[model.name])
                        continue
                    engine, embedder = start_engine(loaded, scheduler_config, model)
                    entries[model.name] = ModelEntry(
                        model, LoadState.RUNNING, engine, embedder=embedder, startup=startup
                    )
                    measure(entries[model.name], loaded)
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
        """The entry serving `model_id`: a model's name or alias, or one of its adapters'
        ids (the base's entry; `adapter_of` names the adapter)."""
        name = model_id if model_id in self._entries else self._aliases.get(model_id)
        if name is None and model_id in self._adapter_ids:
            name = self._adapter_ids[model_id][0]
        return self._entries.get(name) if name else None

    def adapter_of(self, model_id: str) -> str | None:
        """The adapter an id names (None: a model's name or alias)."""
        if model_id in self._entries or model_id in self._aliases:
            return None
        found = self._adapter_ids.get(model_id)
        return found[1] if found else None

    def adapter_ids_of(self, name: str) -> list[str]:
        """The ids of model `name`'s adapters, for the model lists."""
        return [model_id for model_id, (base, _) in self._adapter_ids.items() if base == name]

    def entries(self) -> list[ModelEntry]:
        return list(self._entries.values())

    def aliases_of(self, name: str) -> list[str]:
        return [alias for alias, target in self._aliases.items() if target == name]

    @property
    def settled(self) -> bool:
        """The startup models have loaded or failed (on-demand ones load when asked)."""
        return self.started

    @property
    def ready(self) -> bool:
        """Settled, and at least one model serving or able to load on demand."""
        return self.settled and any(can_serve(e) for e in self._entries.values())

    def failed(self) -> list[ModelEntry]:
        return [e for e in self._entries.values() if e.state is LoadState.FAILED]


def can_serve(entry: ModelEntry) -> bool:
    """Running, or loadable on demand (a failed on-demand load is retried when asked)."""
    return entry.state is LoadState.RUNNING or (
        entry.state in UNSETTLED or (entry.state is LoadState.FAILED and not entry.startup)
    )


def start_speech(loaded: LoadedSpeechModel, entry: ModelEntry) -> SpeechEngine:
    """A Whisper model's engine, its weights counted for the budget."""
    engine = SpeechEngine(loaded)
    engine.start()
    entry.weights_bytes, entry.kv_token_bytes = module_bytes(loaded.model), 0
    return engine


def measure(entry: ModelEntry, loaded: LoadedModel | LoadedEmbeddingModel) -> None:
    """Record what the loaded weights take (the budget counts it)."""
    if isinstance(loaded, LoadedEmbeddingModel):
        # The BERT encoder inside the embedder holds the weights.
        entry.weights_bytes = module_bytes(getattr(loaded.embedder, "model", None))
        entry.kv_token_bytes = 0
    else:  # a vision model's tower (and connector) beside its text model
        tower = module_bytes(getattr(loaded.vision, "encoder", None))
        draft = module_bytes(loaded.draft.model) if loaded.draft is not None else 0
        entry.weights_bytes = module_bytes(loaded.model) + tower + draft
        kv = entry.settings.kv_cache
        itemsize = loaded.kv_itemsize or activation_itemsize(loaded.model)
        entry.kv_token_bytes = kv_bytes_per_token(loaded.model, kv.bits, kv.group_size, itemsize)
        if loaded.draft is not None:
            # The draft's own cache (full precision) holds the rows that draft: counted
            # for every running token, an upper bound, so the budget is never short.
            entry.kv_token_bytes += kv_bytes_per_token(loaded.draft.model)
        entry.kv_bits = kv.bits or 8 * itemsize


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

"""Which models are in memory: on-demand loads, idle unloads, the budget and eviction.

Everything here runs on the event loop except the loads, stops and frees themselves,
which go to worker threads. One lock orders every load and unload, so the budget is
checked against a settled picture and two loads never overcommit it; a model already
running is used without touching the lock.

A request holds its model from `acquire` until its HTTP response is over (the lease
list of engine/fleet/leases.py, released by the API's ASGI layer), so a model is never
unloaded under a running request.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import psutil
import structlog

from vllm_mlx.config.model import ModelSettings
from vllm_mlx.config.settings import Settings
from vllm_mlx.engine.fleet.collector import settle
from vllm_mlx.engine.fleet.footprint import (
    footprint,
    free_memory,
    is_busy,
    planned_prefix_cache_bound,
)
from vllm_mlx.engine.fleet.leases import current_leases
from vllm_mlx.engine.fleet.loader_thread import in_daemon_thread
from vllm_mlx.engine.fleet.registry import Loader, LoadState, ModelEntry, ModelRegistry
from vllm_mlx.engine.scheduler_state import SchedulerConfig
from vllm_mlx.metrics.models import ModelMetrics

log = structlog.get_logger(__name__)

MIB = 2**20
LOAD_ATTEMPTS = 3  # a model evicted again before its waiter resumed is loaded again
BUSY_RECHECK_S = 1.0


class ModelCapacityError(Exception):
    """The budget cannot hold the model even after evicting every idle unpinned one."""

    def __init__(self, model: str, need: int, budget: int, holders: list[tuple[str, int]]):
        self.model, self.need, self.budget, self.holders = model, need, budget, holders
        held = ", ".join(f"{name} ({size / MIB:.0f} MiB)" for name, size in holders) or "none"
        what = f"models '{model}' need" if ", " in model else f"model '{model}' needs"
        super().__init__(
            f"{what} about {need / MIB:.0f} MiB but the memory budget is "
            f"{budget / MIB:.0f} MiB and the models holding it are busy or pinned: {held}"
        )


class ModelLoadError(Exception):
    """The model failed to load (its error is in the message)."""


class ModelBusyError(Exception):
    """An explicit unload of a model with requests running."""


Estimator = Callable[[ModelSettings], int | None]


class ModelManager:
    def __init__(
        self,
        registry: ModelRegistry,
        settings: Callable[[], Settings],
        loader: Callable[[Settings], Loader],
        estimate: Estimator,
        metrics: ModelMetrics | None = None,
    ) -> None:
        self.registry = registry
        self._settings = settings
        self._loader = loader
        self._estimate = estimate
        self.metrics = metrics
        self._lock = asyncio.Lock()
        self._loads: dict[int, asyncio.Task[None]] = {}
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        if metrics is not None:
            for entry in registry.entries():
                metrics.add_model(entry.settings.name)
            metrics.watch(self.memory_sample)

    def add_model(self, name: str) -> None:
        if self.metrics is not None:
            self.metrics.add_model(name)

    # --- what is held ------------------------------------------------------------------

    def budget(self) -> int | None:
        return self._settings().memory.budget_bytes(psutil.virtual_memory().total)

    def model_settings(self, entry: ModelEntry) -> ModelSettings:
        """The entry's settings as hot-reloaded (keep_alive, pin change without a reload)."""
        for model in self._settings().models:
            if model.name == entry.settings.name:
                return model
        return entry.settings

    def adapter_room(self, entry: ModelEntry) -> int | None:
        """The bytes `entry`'s adapters may take under the budget beside everything else
        loaded (None: no budget); its idle adapters are what it evicts to stay inside."""
        budget = self.budget()
        if budget is None or entry.engine is None:
            return None
        others = sum(footprint(e).total for e in self.registry.entries())
        return budget - others + entry.engine.adapters.nbytes

    def memory_sample(self) -> tuple[list[tuple[str, int]], int | None]:
        sizes = [(e.settings.name, footprint(e).total) for e in self.registry.entries()]
        return sizes, self.budget()

    def keep_alive(self, entry: ModelEntry) -> float:
        """Seconds the model may sit idle: the last request's own keep_alive, else the
        config's; negative: never unloaded for idleness."""
        if entry.keep_alive_override is not None:
            return entry.keep_alive_override
        return self.model_settings(entry).keep_alive

    def keep_alive_after(self, entry: ModelEntry, seconds: float | None) -> None:
        """A request's keep_alive (None: the config's) for the time after it ends; as in
        Ollama the latest request decides. A distributed group's model never unloads
        (its ranks would be left without one), so there it is ignored."""
        if self._settings().distributed.enabled:
            return
        entry.keep_alive_override = seconds
        if not entry.in_flight:  # no release is coming to start the clock again
            self._schedule_idle(entry)

    def idle_seconds(self, entry: ModelEntry) -> float | None:
        if entry.runner is None or is_busy(entry):
            return None
        return max(0.0, time.monotonic() - entry.last_used)

    # --- requests ----------------------------------------------------------------------

    async def acquire(self, entry: ModelEntry, hold: bool = True) -> None:
        """Load the model if needed (waiting for a load under way) and hold it for the
        current request. Raises ModelCapacityError, ModelLoadError."""
        for _ in range(LOAD_ATTEMPTS):
            if entry.state is LoadState.RUNNING and entry.runner is not None:
                if hold:
                    self._hold(entry)
                return
            # A startup model that failed is retried by an explicit load only.
            if entry.state is LoadState.STOPPED or (
                entry.state is LoadState.FAILED and entry.startup and hold
            ):
                raise ModelLoadError(entry.error or f"model '{entry.settings.name}' is stopped")
            await self.load(entry)
        raise ModelLoadError(f"model '{entry.settings.name}' was unloaded again while loading")

    async def load_ready(self, entry: ModelEntry) -> None:
        """Load without holding it (explicit load): same errors as acquire."""
        await self.acquire(entry, hold=False)

    def _hold(self, entry: ModelEntry) -> None:
        held = current_leases()
        if held is None:
            return  # outside a request (nothing would release it): not counted
        entry.in_flight += 1
        entry.last_used = time.monotonic()
        self._cancel_timer(entry)
        held.append((self, entry))

    def release(self, entry: ModelEntry) -> None:
        entry.in_flight = max(0, entry.in_flight - 1)
        entry.last_used = time.monotonic()
        if entry.in_flight == 0:
            self._schedule_idle(entry)

    # --- loading -----------------------------------------------------------------------

    async def load(self, entry: ModelEntry) -> None:
        """Load `entry` (one load per model: concurrent callers share it)."""
        task = self._loads.get(id(entry))
        if task is None:
            task = asyncio.ensure_future(self._load(entry))
            self._loads[id(entry)] = task
            task.add_done_callback(lambda _: self._loads.pop(id(entry), None))
        await asyncio.shield(task)

    async def load_startup(self) -> None:
        """Load the `load: startup` models in order; failures are recorded, not raised."""
        for entry in self.registry.entries():
            if not entry.startup:
                continue
            try:
                await self.load(entry)
            except ModelCapacityError as exc:
                entry.state, entry.error = LoadState.FAILED, str(exc)
            except ModelLoadError:
                pass  # recorded in the entry
        self.registry.started = True

    async def _load(self, entry: ModelEntry) -> None:
        async with self._lock:
            if entry.runner is not None or not self._current(entry):
                return
            previous, entry.state, entry.error = entry.state, LoadState.LOADING, ""
            try:
                await self._make_room(entry)
            except ModelCapacityError as exc:
                unsettled = previous is LoadState.LOADING
                entry.state = LoadState.NOT_LOADED if unsettled else previous
                log.warning("model does not fit the memory budget", model=entry.settings.name,
                            error=str(exc))  # fmt: skip
                raise
            await self._start(entry)
        self._schedule_idle(entry)

    async def _start(self, entry: ModelEntry) -> None:
        started = time.monotonic()
        name = entry.settings.name
        try:
            await in_daemon_thread(self.registry.load_entry, entry, self._loader(self._settings()))
        except Exception as exc:
            if self.metrics is not None:
                self.metrics.loaded(name, time.monotonic() - started, ok=False)
            raise ModelLoadError(f"model '{name}' failed to load: {entry.error}") from exc
        # Its objects live as long as it: out of every later full collection's walk.
        await asyncio.to_thread(settle)
        entry.last_used = time.monotonic()
        seconds = time.monotonic() - started
        if self.metrics is not None:
            self.metrics.loaded(name, seconds, ok=True)
        log.info("model ready", model=name, seconds=round(seconds, 2),
                 weights_mb=round(entry.weights_bytes / MIB, 1))  # fmt: skip

    def _current(self, entry: ModelEntry) -> bool:
        """Still served (a full reload may have replaced it)."""
        return any(e is entry for e in self.registry.entries())

    # --- the budget --------------------------------------------------------------------

    async def _make_room(self, entry: ModelEntry) -> None:
        budget = self.budget()
        if budget is None:
            return
        # Measured at its last load if it had one (cheaper and exact), else from its files.
        estimate: int | None = entry.weights_bytes
        if not estimate:
            estimate = await asyncio.to_thread(self._estimate, entry.settings)
        planned = planned_prefix_cache_bound(entry.settings, self.registry.scheduler_config)
        others = [e for e in self.registry.entries() if e is not entry and e.runner is not None]
        await self._evict_for(entry.settings.name, (estimate or 0) + planned, budget, others)

    async def _evict_for(self, name: str, need: int, budget: int, loaded: list[ModelEntry]) -> None:
        """Unload idle unpinned models (least recently used first) until `need` more
        bytes fit beside `loaded`; ModelCapacityError, unloading nothing, when they
        cannot."""
        used = sum(footprint(e).total for e in loaded)
        if used + need <= budget:
            return
        victims = self._victims(loaded)
        freeable = sum(footprint(e).total for e in victims)
        if need > budget or used - freeable + need > budget:
            holders = [(e.settings.name, footprint(e).total) for e in loaded if e not in victims]
            raise ModelCapacityError(name, need, budget, holders)
        for victim in victims:
            if used + need <= budget:
                break
            used -= footprint(victim).total
            await self._unload(victim, "evicted")

    @contextlib.asynccontextmanager
    async def reload_room(
        self, new: Settings, models: list[ModelSettings], config: SchedulerConfig
    ) -> AsyncIterator[None]:
        """Room under `new`'s budget for a full reload to load `models` beside the
        engines serving now (both stay in memory until the swap), evicting idle models
        if needed. No other load runs until the block ends; ModelCapacityError when
        the reload cannot fit, so the daemon keeps its current config."""
        async with self._lock:
            budget = new.memory.budget_bytes(psutil.virtual_memory().total)
            if budget is not None and models:
                need = 0
                for model in models:
                    estimate = await asyncio.to_thread(self._estimate, model)
                    need += (estimate or 0) + planned_prefix_cache_bound(model, config)
                loaded = [e for e in self.registry.entries() if e.runner is not None]
                names = ", ".join(m.name for m in models)
                await self._evict_for(names, need, budget, loaded)
            yield

    def _victims(self, loaded: list[ModelEntry]) -> list[ModelEntry]:
        idle = [e for e in loaded if not is_busy(e) and not self.model_settings(e).pin]
        return sorted(idle, key=lambda e: e.last_used)

    async def enforce_budget(self) -> None:
        """After the budget shrank (hot reload): evict idle unpinned models to fit it."""
        async with self._lock:
            budget = self.budget()
            if budget is None:
                return
            loaded = [e for e in self.registry.entries() if e.runner is not None]
            used = sum(footprint(e).total for e in loaded)
            for victim in self._victims(loaded):
                if used <= budget:
                    break
                used -= footprint(victim).total
                await self._unload(victim, "evicted")

    # --- unloading ---------------------------------------------------------------------

    async def unload(self, entry: ModelEntry) -> bool:
        """Explicit unload; False when it was not loaded. Raises ModelBusyError."""
        async with self._lock:
            if entry.runner is None:
                return False
            if is_busy(entry):
                raise ModelBusyError(
                    f"model '{entry.settings.name}' has {entry.in_flight} request(s) running"
                )
            await self._unload(entry, "explicit")
            return True

    async def _unload(self, entry: ModelEntry, reason: str) -> None:
        """Stop and free (lock held, entry idle). Detached first and `unloading`, so a
        request arriving meanwhile waits for the lock and loads it again; `not_loaded`
        and counted in one step once the teardown ends (failed or not: it is detached
        either way), so /v1/status and /metrics never disagree about it."""
        runner, size = entry.runner, footprint(entry).total
        self._cancel_timer(entry)
        entry.keep_alive_override = None  # a request's keep_alive lasts one residency
        # weights_bytes stays: the next load's budget check uses it as the estimate.
        entry.engine, entry.embedder, entry.state = None, None, LoadState.UNLOADING
        entry.transcriber = None
        try:
            if runner is not None:
                await asyncio.to_thread(runner.stop)
            del runner
            await asyncio.to_thread(free_memory)
        finally:
            entry.state = LoadState.NOT_LOADED
            if self.metrics is not None:
                self.metrics.unloaded(entry.settings.name, reason)
        log.info("model unloaded", model=entry.settings.name, reason=reason,
                 freed_mb=round(size / MIB, 1))  # fmt: skip

    # --- idle timers -------------------------------------------------------------------

    def _cancel_timer(self, entry: ModelEntry) -> None:
        timer = self._timers.pop(id(entry), None)
        if timer is not None:
            timer.cancel()

    def _schedule_idle(self, entry: ModelEntry, delay: float | None = None) -> None:
        self._cancel_timer(entry)
        keep_alive = self.keep_alive(entry)
        if keep_alive < 0 or entry.runner is None or entry.in_flight:
            return
        if delay is None:
            delay = max(0.0, keep_alive - (time.monotonic() - entry.last_used))
        loop = asyncio.get_running_loop()
        self._timers[id(entry)] = loop.call_later(delay, self._idle_expired, entry)

    def reschedule_all(self) -> None:
        """keep_alive changed (hot reload): every idle model's timer from its last use."""
        for entry in self.registry.entries():
            self._schedule_idle(entry)

    def _idle_expired(self, entry: ModelEntry) -> None:
        self._timers.pop(id(entry), None)
        task = asyncio.ensure_future(self._unload_if_idle(entry))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _unload_if_idle(self, entry: ModelEntry) -> None:
        async with self._lock:
            keep_alive = self.keep_alive(entry)
            if entry.runner is None or keep_alive < 0 or not self._current(entry):
                return
            if is_busy(entry):
                if not entry.in_flight:  # no release will reschedule: look again soon
                    self._schedule_idle(entry, BUSY_RECHECK_S)
                return
            if time.monotonic() - entry.last_used < keep_alive:
                self._schedule_idle(entry)
                return
            await self._unload(entry, "idle")

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

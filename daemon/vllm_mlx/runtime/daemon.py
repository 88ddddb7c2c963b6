"""run(config): engines + Litestar app + Granian (embedded, in this event loop) + signals.

Granian runs embedded rather than as worker processes: the engine thread that owns
the model must live in the same process as the request handlers.

Lifecycle (docs/operations.md): the config file is watched and hot settings applied as
it changes (reload.py); SIGHUP reloads everything, loading new engines and a new
listener beside the old ones and retiring those once their requests are done; SIGTERM
or SIGINT drains (503 for new requests, in-flight ones get `server.drain_timeout`),
then exits 0; a second one exits at once.
"""

from __future__ import annotations

import asyncio
import faulthandler
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import structlog

from vllm_mlx.api.state import ServerState
from vllm_mlx.app import create_app
from vllm_mlx.config.fields import Reload
from vllm_mlx.config.file import LoadedConfig
from vllm_mlx.config.settings import Settings
from vllm_mlx.distributed.launcher import group_reload
from vllm_mlx.distributed.status import current as group_status
from vllm_mlx.engine.fleet.heap import keep_large_allocations_returnable
from vllm_mlx.engine.fleet.loader_thread import loads_running
from vllm_mlx.engine.fleet.registry import ModelEntry, ModelRegistry, Stoppable
from vllm_mlx.engine.fleet.residency import ModelManager
from vllm_mlx.engine.scheduler_state import scheduler_config
from vllm_mlx.logging import configure_logging
from vllm_mlx.metrics.models import ModelMetrics
from vllm_mlx.models.estimate import estimated_bytes
from vllm_mlx.runtime.lifecycle import (
    RequestTracker,
    exit_now,
    open_ledger,
    remove_pid_file,
    write_pid_file,
)
from vllm_mlx.runtime.listener import Listener, ListenerFailedError, model_loader, start_listener
from vllm_mlx.runtime.reload import Change, Reloader, watch_config
from vllm_mlx.telemetry.setup import start_tracing

log = structlog.get_logger(__name__)

# After the drain timeout the remaining generations are aborted; this is how long their
# responses get to send that ending before the listener closes.
ABORT_GRACE_S = 5.0


class Daemon:
    def __init__(
        self,
        loaded: LoadedConfig,
        reload_config: Callable[[], Settings] | None = None,
        watch_path: Path | None = None,
    ) -> None:
        self.config_path = loaded.path
        self.watch_path = watch_path or loaded.path
        settings = loaded.settings
        self.registry = ModelRegistry(
            settings.models, scheduler_config(settings.engine, settings.resolved_cache_dir())
        )
        self.state = ServerState(settings, self.registry, config_path=loaded.path)
        self.residency = ModelManager(
            self.registry,
            lambda: self.state.settings,
            model_loader,
            lambda model: estimated_bytes(model, self.settings.resolved_cache_dir()),
            ModelMetrics(self.state.metrics.registry),
        )
        self.state.residency = self.residency
        self.state.distributed = group_status()
        if self.state.distributed is not None:
            self.state.metrics.watch_group(self.state.distributed.metric_rows)
        self.app = create_app(self.state)
        self.tracker = RequestTracker()
        self.reloader = Reloader(
            self.state,
            reload_config or (lambda: settings),
            self._apply_full,
            on_result=self.state.metrics.config_reloaded,  # vllm_mlx_config_reloads_total
        )
        self.config_warnings = loaded.warnings
        self.exit_code = 0
        self.reloader.add_listener(self._apply_mcp)
        self.reloader.add_listener(self._apply_residency)
        self.reloader.add_listener(self._apply_usage)
        self.listeners: list[Listener] = []
        self.pid_file: Path | None = None
        self._stopping = False
        self._startup_loads: asyncio.Task[Any] | None = None
        self._retired: list[Stoppable] = []  # engines swapped out, stopped once idle
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def settings(self) -> Settings:
        return self.state.settings

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        # Keep a reference: the loop holds tasks only weakly.
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task failed", error=repr(task.exception()))

    def _listen(self, settings: Settings) -> Listener:
        return self._listen_at(settings.server.host, settings.server.port, main=True)

    def _listen_at(self, host: str, port: int, main: bool) -> Listener:
        listener = start_listener(self.tracker, self.app, host, port, main)
        self.listeners.append(listener)
        return listener

    def _apply_mcp(self, previous: Settings, current: Settings) -> None:
        if previous.mcp != current.mcp:
            self.state.mcp.apply(current.mcp)

    def _apply_usage(self, previous: Settings, current: Settings) -> None:
        if current.usage.enabled and self.state.usage is None:
            self.state.usage = open_ledger(current)  # turned on by a reload

    def _apply_residency(self, previous: Settings, current: Settings) -> None:
        """keep_alive, pin and the budget apply to the running daemon at once."""

        def residency(s: Settings) -> list[tuple[str, float, bool]]:
            return [(m.name, m.keep_alive, m.pin) for m in s.models]

        if residency(previous) != residency(current):
            self.residency.reschedule_all()
        if previous.memory != current.memory or residency(previous) != residency(current):
            self._spawn(self.residency.enforce_budget())

    # --- signals ---------------------------------------------------------------------

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_stop_signal, signum)
        loop.add_signal_handler(signal.SIGHUP, self._on_reload_signal)
        # `kill -USR1 PID`: every thread's Python stack into the log, the daemon going on.
        # Where a request that never answers waits (the engine thread, a worker, a lock),
        # even with the event loop or the engine stuck: the dump runs in the signal
        # handler, not in Python code (docs/operations.md).
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True, chain=False)

    def _on_stop_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self._stopping:
            log.warning("second stop signal: exiting now", signal=name)
            sys.stdout.flush()
            os._exit(1)  # at once: no drain, no cleanup that could hang
        self._stopping = True
        self.state.draining = True
        log.info(
            "draining",
            signal=name,
            in_flight=self.tracker.in_flight(),
            timeout_s=self.settings.server.drain_timeout,
        )
        self._spawn(self._drain())

    def _on_reload_signal(self) -> None:
        if self._stopping:
            log.info("reload ignored: shutting down")
            return
        log.info("reload requested", signal="SIGHUP")
        self._spawn(self._full_reload())

    # --- shutdown --------------------------------------------------------------------

    async def _drain(self) -> None:
        """Let in-flight requests finish (bounded), abort the rest, then stop listening.

        Granian's stop may close busy connections, so it comes only once the tracker
        says nothing is left to send.
        """
        timeout = self.settings.server.drain_timeout
        if not await self.tracker.wait_idle(timeout):
            log.warning("drain timeout: aborting requests", in_flight=self.tracker.in_flight())
            await asyncio.to_thread(self._stop_engines)
            await self.tracker.wait_idle(ABORT_GRACE_S)
        log.info("drained", in_flight=self.tracker.in_flight())
        for listener in self.listeners:
            listener.server.stop()

    def _stop_engines(self) -> None:
        """End every generation (aborted) and free the models."""
        self.residency.close()
        self.registry.stop_all()
        for engine in self._retired:
            engine.stop()
        self._retired.clear()

    # --- full reload (SIGHUP) --------------------------------------------------------

    async def _full_reload(self) -> None:
        if self._startup_loads is not None:
            # Engines still loading at startup would be written into replaced entries.
            await asyncio.wait({self._startup_loads})
        await self.reloader.reload_all()

    async def _apply_full(self, new: Settings, changes: list[Change]) -> None:
        """Load what changed beside what serves, then switch; raise to change nothing."""
        kinds = {c.kind for c in changes}
        if Reload.MODEL not in kinds:
            if Reload.RESTART in kinds:
                await self._rebind(new)
            return
        # A model-level key outside `models` (engine, paths) changes every engine.
        reuse = all(c.key.startswith("models") for c in changes if c.kind is Reload.MODEL)
        config = scheduler_config(new.engine, new.resolved_cache_dir())
        planned = self.registry.to_load(new.models, reuse)
        # The new engines load beside the serving ones: the budget must hold both. (A
        # distributed group re-shards in prepare: group_reload fails it if a later step does.)
        async with group_reload(), self.residency.reload_room(new, planned, config):
            log.info("loading models for reload", models=[m.name for m in planned])
            entries = await asyncio.to_thread(
                self.registry.prepare, new.models, config, model_loader(new), reuse
            )
            try:
                if Reload.RESTART in kinds:
                    await self._rebind(new)
            except Exception:
                self._discard(entries)
                raise
            self._swap_engines(entries, new)

    def _discard(self, entries: dict[str, ModelEntry]) -> None:
        serving = {id(e.runner) for e in self.registry.entries()}
        for entry in entries.values():
            runner = entry.runner
            if runner is not None and id(runner) not in serving:
                runner.stop()

    def _swap_engines(self, entries: dict[str, ModelEntry], new: Settings) -> None:
        mark = self.tracker.mark()
        retired = self.registry.swap(
            entries, new.models, scheduler_config(new.engine, new.resolved_cache_dir())
        )
        for entry in entries.values():
            self.residency.add_model(entry.settings.name)
        self.residency.reschedule_all()
        self._retired.extend(retired)
        log.info("models switched", models=list(entries), retiring=len(retired))
        if retired:
            self._spawn(self._retire_engines(retired, mark))

    async def _retire_engines(self, engines: list[Stoppable], mark: int) -> None:
        # Every request that could have picked an old engine arrived before the switch.
        await self.tracker.wait_started_before(mark)
        for engine in engines:
            if engine in self._retired:
                self._retired.remove(engine)
                await asyncio.to_thread(engine.stop)
        log.info("old model engines stopped", count=len(engines))

    async def _rebind(self, new: Settings) -> None:
        """Listen on the new address beside the old one; retire the old once idle."""
        old = [item for item in self.listeners if item.main and not item.retiring]
        listener = self._listen(new)
        await asyncio.sleep(0)  # the server binds in its task's first step
        if listener.task.done():
            self.listeners.remove(listener)
            error = listener.task.exception()
            raise RuntimeError(f"cannot listen on {listener.tag}: {error}")
        log.info("listening", url=f"http://{listener.tag}")
        for previous in old:
            previous.retiring = True
            self._spawn(self._retire_listener(previous, new.server.drain_timeout))
        self._move_pid_file(new)

    async def _retire_listener(self, listener: Listener, limit_s: float) -> None:
        await self.tracker.wait_idle(limit_s, tag=listener.tag)
        log.info("stopped listening", url=f"http://{listener.tag}")
        listener.server.stop()

    def _move_pid_file(self, new: Settings) -> None:
        remove_pid_file(self.pid_file)
        self.pid_file = write_pid_file(new.resolved_cache_dir(), new.server.port)

    # --- startup ---------------------------------------------------------------------

    async def _load_startup(self) -> None:
        await self.residency.load_startup()
        self._models_settled()

    def _models_settled(self) -> None:
        """Once startup loading is over: exit 1 when no model can serve, else serve the rest."""
        failed = {e.settings.name: e.error for e in self.registry.failed()}
        if not failed or self._stopping:
            return
        if not self.registry.ready:
            log.error("startup failed: no model could be loaded; exiting", failed=failed)
            self.exit_code = 1
            self._stopping = True
            for listener in self.listeners:
                listener.server.stop()
            return
        log.warning("serving without the models that failed to load", failed=failed)

    # --- main ------------------------------------------------------------------------

    async def run(self) -> int:
        self._install_signal_handlers()
        settings = self.settings
        for warning in self.config_warnings:
            log.warning("config file readable by others", detail=warning)
        if settings.engine.prefix_cache_mb is not None:
            log.warning("engine.prefix_cache_mb is deprecated: rename it engine.cache_memory_mb")
        if settings.usage.enabled:
            self.state.usage = open_ledger(settings)
            if self.state.usage is None and any(k.quota.limited for k in settings.auth.keys):
                log.error("exiting: key quotas are set and usage cannot be counted")
                return 1  # serving would hand every key an unlimited quota
        self.state.tracing = start_tracing(settings.telemetry, os.environ)  # None: off
        self._startup_loads = self._spawn(self._load_startup())
        self._listen(settings)
        second = settings.ollama.address()
        if second is not None:  # a bind failure ends the daemon as the main one's does
            listener = self._listen_at(*second, main=False)
            log.info("listening for Ollama clients", url=f"http://{listener.tag}")
        self.state.mcp.apply(settings.mcp)  # servers connect in the background
        self.pid_file = write_pid_file(settings.resolved_cache_dir(), settings.server.port)
        stop_watching = asyncio.Event()
        if self.watch_path is not None:
            self._spawn(watch_config(self.watch_path, self.reloader.reload_file, stop_watching))
        log.info(
            "listening",
            url=f"http://{settings.server.host}:{settings.server.port}",
            config=str(self.config_path) if self.config_path else "built-in defaults",
            models=[m.name for m in settings.models],
            pid=os.getpid(),
            pid_file=str(self.pid_file) if self.pid_file else None,
        )
        try:
            await self._serve()
        except ListenerFailedError as exc:
            log.error("exiting: a listener failed", error=str(exc))
            self.exit_code = 1
        finally:
            stop_watching.set()
            await self.state.mcp.close()
            self._stop_engines()
            if self.state.tracing is not None:
                self.state.tracing.shutdown()  # the last spans, waited for a few seconds
            if self.state.usage is not None:
                self.state.usage.close()  # writes what the last quarter second counted
            remove_pid_file(self.pid_file)
            log.info("stopped", exit_code=self.exit_code)
        return self.exit_code

    async def _serve(self) -> None:
        """Until every listener has stopped; one that stops unasked ends the daemon."""
        while self.listeners:
            tasks = [listener.task for listener in self.listeners]
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for listener in [item for item in self.listeners if item.task in done]:
                self.listeners.remove(listener)
                error = None if listener.task.cancelled() else listener.task.exception()
                if error is not None:  # e.g. the port is taken: that takes the daemon down
                    # One line, not Granian's Python traceback and Rust backtrace.
                    reason = (str(error).splitlines() or [type(error).__name__])[0]
                    raise ListenerFailedError(f"cannot listen on {listener.tag}: {reason}")
                if not (self._stopping or listener.retiring):
                    raise RuntimeError(f"the listener on {listener.tag} stopped unexpectedly")


def run(
    loaded: LoadedConfig,
    reload_config: Callable[[], Settings] | None = None,
    watch_path: Path | None = None,
) -> int:
    """Serve until stopped; the exit status (1: no model could be loaded, or the
    address could not be bound).

    `reload_config` rebuilds Settings as `serve` did (same file, environment and
    flags); `watch_path` is the file as named, before symlinks."""
    configure_logging(loaded.settings.logging)
    keep_large_allocations_returnable()  # before any model memory is allocated
    code = asyncio.run(Daemon(loaded, reload_config, watch_path).run())
    if loads_running():  # exiting early (e.g. a taken port) while a model still loads
        exit_now(code)
    return code

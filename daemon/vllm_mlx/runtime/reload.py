"""Hot reload: watch the config file, diff new Settings by `x-reload`, apply what can be.

A change is sorted by the marker on the field it touches (config/fields.py): `hot` changes are
applied at once by swapping `ServerState.settings` (one reference assignment, so a
request sees either the old or the new object, never a mix); `model` and `restart`
changes are logged and listed in `ServerState.pending_changes` until a full reload
(SIGHUP / `vllm-mlx reload`) applies them. A file that fails to load leaves the last
good settings in place and sets `ServerState.config_error`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import structlog
import watchfiles
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from vllm_mlx.api.state import ServerState
from vllm_mlx.config.errors import ConfigError
from vllm_mlx.config.fields import Reload
from vllm_mlx.config.settings import Settings
from vllm_mlx.logging import configure_logging

log = structlog.get_logger(__name__)

M = TypeVar("M", bound=BaseModel)

# watchfiles groups events until none arrived for STEP_MS, at most DEBOUNCE_MS: an
# editor's write-temp-then-rename burst becomes one reload, and a save applies in ~0.1 s.
STEP_MS = 100
# The restart keys a full reload applies (by opening a new listener beside the old).
LISTENER_KEYS = frozenset({"server.host", "server.port"})
DEBOUNCE_MS = 300
WATCH_RETRY_S = 1.0  # after the watcher itself failed (a watched directory vanished)
# The file is also re-read this often without an event: a write between one watch's end
# and the next one's inotify setup (a directory recreated, a link re-pointed) has no
# event of its own, and would otherwise wait for the next edit. One small read a second.
RECHECK_MS = 1000


@dataclass(frozen=True)
class Change:
    """One changed setting: its key path (`models[0].name`) and how it is applied."""

    key: str
    kind: Reload

    def __str__(self) -> str:
        return f"{self.key} ({self.kind.value})"


def field_kind(info: FieldInfo) -> Reload:
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    marker = extra.get("x-reload")
    # A field without a marker is treated as needing a restart: never applied by surprise.
    return Reload(marker) if isinstance(marker, str) else Reload.RESTART


Take = Callable[["Change"], bool]  # whether a change is applied now


def _hot(change: Change) -> bool:
    return change.kind is Reload.HOT


def merge_hot(running: M, new: M) -> tuple[M, list[Change]]:
    """`running` with the hot changes from `new` applied, and every change found."""
    return merge(running, new, _hot)


def merge(running: M, new: M, take: Take, prefix: str = "") -> tuple[M, list[Change]]:
    """`running` with the changes from `new` that `take` accepts, and every change found.

    Sections and lists of sections are compared item by item, so a hot key inside a
    model entry (its aliases) applies even though the entry as a whole is `model`.
    """
    updates: dict[str, Any] = {}
    changes: list[Change] = []
    for name, info in type(running).model_fields.items():
        old, new_value = getattr(running, name), getattr(new, name)
        if old == new_value:
            continue
        key = f"{prefix}.{name}" if prefix else name
        merged, found = _merge_value(old, new_value, field_kind(info), key, take)
        changes.extend(found)
        if merged is not old:
            updates[name] = merged
    if not updates:
        return running, changes
    if all(take(change) for change in changes):
        # Every change applies: the new, validated object itself, so what its validators
        # derived (a named key's digest) is never left behind by a copy.
        return new, changes
    return running.model_copy(update=updates), changes


def _merge_value(
    old: Any, new: Any, kind: Reload, key: str, take: Take
) -> tuple[Any, list[Change]]:
    if isinstance(old, BaseModel) and type(old) is type(new):
        return merge(old, new, take, key)
    if _same_shape_model_lists(old, new):
        items: list[Any] = []
        changes: list[Change] = []
        for index, (old_item, new_item) in enumerate(zip(old, new, strict=True)):
            merged, found = _merge_value(old_item, new_item, kind, f"{key}[{index}]", take)
            items.append(merged)
            changes.extend(found)
        return items, changes
    change = Change(key, kind)
    return (new if take(change) else old), [change]


def _same_shape_model_lists(old: Any, new: Any) -> bool:
    return (
        isinstance(old, list)
        and isinstance(new, list)
        and len(old) == len(new)
        and all(
            isinstance(a, BaseModel) and type(a) is type(b) for a, b in zip(old, new, strict=True)
        )
    )


SettingsListener = Callable[[Settings, Settings], None]
FullApply = Callable[[Settings, list[Change]], Awaitable[None]]
ResultHook = Callable[[bool], None]


class Reloader:
    """Applies a freshly loaded config to a running daemon's state.

    `load` builds Settings exactly as `serve` did (file, environment, the same CLI
    flags). `apply_full` is the daemon's part of a full reload (new engines, a new
    listener); it raises to reject the reload. `on_result(success)` counts reloads for
    metrics (`Metrics.config_reloaded`).
    """

    def __init__(
        self,
        state: ServerState,
        load: Callable[[], Settings],
        apply_full: FullApply,
        on_result: ResultHook | None = None,
        reloadable_restart_keys: frozenset[str] = LISTENER_KEYS,
    ) -> None:
        self.state = state
        self._load = load
        self._apply_full = apply_full
        self._reloadable = reloadable_restart_keys
        self._on_result = on_result
        self._listeners: list[SettingsListener] = []
        self._lock = asyncio.Lock()
        self._changed_during_full = False

    def add_listener(self, listener: SettingsListener) -> None:
        """Called with (previous, current) after every applied change, for state built
        from settings that a per-request read of `state.settings` does not cover."""
        self._listeners.append(listener)

    def reload_file(self) -> list[Change] | None:
        """Hot reload: apply hot changes, list the rest as pending. None when rejected."""
        if self._lock.locked():
            # A full reload is loading models; it re-reads the file when it is done.
            self._changed_during_full = True
            return None
        new = self._try_load()
        if new is None:
            return None
        merged, changes = merge_hot(self.state.settings, new)
        self._install(merged, [c for c in changes if c.kind is Reload.HOT])
        self._set_pending([c for c in changes if c.kind is not Reload.HOT])
        self._count(True)
        return changes

    async def reload_all(self) -> list[Change] | None:
        """Full reload (SIGHUP): every change, models and listener included."""
        async with self._lock:
            changes = await self._reload_all_locked()
        if self._changed_during_full:
            self._changed_during_full = False
            self.reload_file()
        return changes

    async def _reload_all_locked(self) -> list[Change] | None:
        new = self._try_load()
        if new is None:
            return None
        # Restart keys other than the listener's (engine.blas: chosen before mlx loads)
        # need a new process: they stay pending, at their running values.
        merged, changes = merge(self.state.settings, new, self._reloadable_now)
        applied = [c for c in changes if self._reloadable_now(c)]
        heavy = [c for c in applied if c.kind is not Reload.HOT]
        if heavy:
            try:
                await self._apply_full(merged, heavy)
            except Exception as exc:
                self._reject(f"reload failed: {exc}", [str(exc)])
                return None
        self._install(merged, applied)
        self._set_pending([c for c in changes if not self._reloadable_now(c)])
        self._count(True)
        return changes

    def _reloadable_now(self, change: Change) -> bool:
        return change.kind is not Reload.RESTART or change.key in self._reloadable

    def _set_pending(self, pending: Sequence[Change]) -> None:
        self.state.pending_changes = [str(c) for c in pending]
        if not pending:
            return
        needs_restart = [c.key for c in pending if not self._reloadable_now(c)]
        log.warning(
            "config changes pending",
            keys=self.state.pending_changes,
            hint="SIGHUP or `vllm-mlx reload` applies model and listener changes"
            + (f"; {', '.join(needs_restart)} need a daemon restart" if needs_restart else ""),
        )

    def _try_load(self) -> Settings | None:
        try:
            return self._load()
        except ConfigError as exc:
            self._reject(str(exc), [str(issue) for issue in exc.issues])
        except Exception as exc:  # an unreadable file must never take the daemon down
            self._reject(f"cannot load the config: {exc}", [str(exc)])
        return None

    def _reject(self, message: str, issues: Sequence[str]) -> None:
        self.state.config_error = message
        log.error("config rejected; still serving the last good config", issues=list(issues))
        self._count(False)

    def _install(self, settings: Settings, changes: Sequence[Change]) -> None:
        previous = self.state.settings
        self.state.settings = settings  # the atomic swap every request reads once
        self.state.config_error = None
        self.state.config_loaded_at = time.time()
        if settings.logging != previous.logging:
            configure_logging(settings.logging)
        if [(m.aliases, m.adapters) for m in settings.models] != [
            (m.aliases, m.adapters) for m in previous.models
        ]:
            self.state.registry.set_aliases(settings.models)
        for listener in self._listeners:
            listener(previous, settings)
        if changes:
            log.info("config applied", keys=[c.key for c in changes])

    def _count(self, success: bool) -> None:
        if self._on_result is not None:
            self._on_result(success)


def watched_dirs(path: Path) -> set[Path]:
    """The directories whose entries decide what `path` reads: its own, and for each
    symlink on the way to the real file, that link's (a re-pointed link, e.g. a
    Kubernetes ConfigMap's `..data`, shows up there and nowhere else)."""
    dirs: set[Path] = set()
    current = Path(os.path.abspath(path))
    for _ in range(40):  # the kernel's own symlink hop limit
        dirs.add(current.parent)
        for parent in current.parents:
            if parent.is_symlink():
                dirs.add(parent.parent)
        if not current.is_symlink():
            break
        current = Path(os.path.normpath(current.parent / os.readlink(current)))
    dirs.add(Path(os.path.realpath(path)).parent)
    # inotify watches what a path resolves to; a symlinked directory is covered by its
    # target (watched) and its own parent (where re-pointing it shows).
    return {Path(os.path.realpath(d)) for d in dirs if d.is_dir()}


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def worth_reloading(current: bytes | None, last: bytes | None) -> bool:
    """Whether the file's bytes (None: unreadable) call for a reload.

    An empty file is an editor between truncating and writing: as a config it would
    mean all defaults (API keys off), so it waits for the write's own event.
    """
    return current != last and (current is None or bool(current.strip()))


async def watch_config(path: Path, on_change: Callable[[], object], stop: asyncio.Event) -> None:
    """Call `on_change` whenever the bytes behind `path` change, until `stop` is set.

    Whole directories are watched, not the file: an editor that saves by writing a new
    file and renaming it over the old one replaces the inode a file watch would follow.
    Events for other files in those directories cost one read and a compare. A missing
    file is reported (the reload then says so); an empty one is not (worth_reloading).
    """
    last: list[bytes | None] = [_read(path)]
    failing = False
    while not stop.is_set():
        try:
            await _watch_once(path, on_change, stop, last)
            failing = False
        except Exception as exc:  # e.g. the directory is gone: watch again when it is back
            if not failing:
                log.error("config watcher failed; retrying", error=str(exc))
            failing = True
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(WATCH_RETRY_S):
                    await stop.wait()


def _dir_ids(dirs: set[Path]) -> set[tuple[Path, int]]:
    return {(d, d.stat().st_ino) for d in dirs if d.is_dir()}


def _changed(path: Path, on_change: Callable[[], object], last: list[bytes | None]) -> None:
    current = _read(path)
    if worth_reloading(current, last[0]):
        last[0] = current
        try:
            on_change()
        except Exception:
            log.exception("config reload failed")


async def _watch_once(
    path: Path, on_change: Callable[[], object], stop: asyncio.Event, last: list[bytes | None]
) -> None:
    """Watch the current directories until stopped, or until they are not the ones that
    decide the file any more (a link re-pointed, a directory replaced)."""
    dirs = watched_dirs(path)
    if not dirs:
        raise FileNotFoundError(f"no directory of {path} exists")
    ids = _dir_ids(dirs)
    _changed(path, on_change, last)  # whatever happened while nothing was watched
    async for _ in watchfiles.awatch(
        *dirs,
        watch_filter=None,
        step=STEP_MS,
        debounce=DEBOUNCE_MS,
        stop_event=stop,
        recursive=False,
        rust_timeout=RECHECK_MS,
        yield_on_timeout=True,  # an empty batch: re-read anyway (RECHECK_MS)
    ):
        _changed(path, on_change, last)
        if watched_dirs(path) != dirs or _dir_ids(dirs) != ids:
            return

"""The LoRA adapters one generation engine serves beside its base (docs/adapters.md).

An adapter loads on its first request, on the engine thread between two steps (the
thread that owns the model's arrays), and stays until it is evicted for room under the
memory budget (least recently used first, never while a request holds it), removed or
changed in the config. The base is never loaded twice: an adapter is a bank of low-rank
pairs on the base's own layers (models/lora.py).

Each loaded adapter is known to the engine by a tag: its name and a digest of its files.
The tag routes a request's batch row and keys its prefix-cache entries, so a changed
adapter (same name, new files) is a new tag: new requests run it while requests still
running finish on the old one, whose pairs go once the last of them ends, and no prefix
computed under the old weights is ever reused for the new.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from vllm_mlx.config.adapters import AdapterSettings
from vllm_mlx.models import lora
from vllm_mlx.models.adapters import CONFIG, WEIGHTS, AdapterError, adapter_pairs

if TYPE_CHECKING:
    from vllm_mlx.engine.scheduler import Scheduler

log = structlog.get_logger(__name__)

MIB = 2**20


class AdapterUnavailableError(Exception):
    """The adapter cannot serve (it failed to load, or does not fit the budget): a 503."""


@dataclass
class LoadedAdapter:
    name: str
    tag: str
    nbytes: int
    in_flight: int = 0
    last_used: float = field(default_factory=time.monotonic)


def adapter_tag(name: str, path: Path) -> str:
    """`name@digest` of the adapter's two files (blocking: reads them)."""
    digest = hashlib.blake2b(digest_size=8)
    for part in (CONFIG, WEIGHTS):
        try:
            digest.update((path / part).read_bytes())
        except OSError as exc:
            raise AdapterUnavailableError(f"adapter '{name}': {exc}") from exc
    return f"{name}@{digest.hexdigest()}"


class EngineAdapters:
    """Loads, holds and frees one engine's adapters (event loop side; the loads run on
    the engine thread through `Scheduler.call`)."""

    def __init__(self, scheduler: Scheduler, model: Any) -> None:
        self._scheduler = scheduler
        self._model = model
        self._configured: dict[str, AdapterSettings] = {}
        self._current: dict[str, str] = {}  # name -> the tag its files have now
        self._loaded: dict[str, LoadedAdapter] = {}  # tag -> adapter
        self._lock = asyncio.Lock()
        # (name, path) -> (the files' sizes and mtimes, their tag): hashed again only
        # when the files change, not on every request.
        self._tags: dict[tuple[str, Path], tuple[tuple[int, ...], str]] = {}

    # --- what is served --------------------------------------------------------------

    def configure(self, adapters: Sequence[AdapterSettings]) -> None:
        """The config's adapters (at load and on every hot reload): a removed or changed
        adapter stops taking requests now and is freed once idle."""
        self._configured = {a.name: a for a in adapters}
        # Each name's tag is computed again by its next acquire (its files may have
        # changed under the same path); a tag no name reaches then is freed once idle.
        self._current.clear()
        self._drop_stale()

    def sync(self, adapters: Sequence[AdapterSettings]) -> None:
        """`configure`, only when the list differs from the one served (an engine that
        loaded after a hot reload may have started from an older list)."""
        if list(self._configured.values()) != list(adapters):
            self.configure(adapters)

    @property
    def names(self) -> list[str]:
        return list(self._configured)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._loaded.values())

    def loaded(self) -> list[LoadedAdapter]:
        return list(self._loaded.values())

    # --- requests --------------------------------------------------------------------

    async def acquire(self, name: str, budget: Callable[[int], int | None] | None = None) -> str:
        """The tag of adapter `name`, loaded if needed, held for the current request.

        `budget(extra)`: how many bytes this engine's adapters may take beside the rest
        of the daemon, given `extra` more (None: no budget). KeyError for a name not
        configured; AdapterUnavailableError when it cannot be served."""
        spec = self._configured[name]
        tag = await self._tag(name, spec.path)
        async with self._lock:
            if self._configured.get(name) is not spec:  # a reload meanwhile
                raise AdapterUnavailableError(f"adapter '{name}' was removed or changed")
            self._current[name] = tag
            if tag not in self._loaded:
                await self._load(name, spec.path, tag, budget)
            adapter = self._loaded[tag]
            adapter.in_flight += 1
            adapter.last_used = time.monotonic()
            self._drop_stale()
        return tag

    def hold(self, tag: str, leases: list[Any] | None) -> None:
        """Release `tag` when the request's response is over (or now, outside one).

        `leases`: the request's lease list (fleet/leases.py's LeaseList), typed loosely
        so this module, which the engine imports, does not reach back into the fleet."""
        if leases is None:
            self.release(tag)
        else:
            leases.append((_Lease(self, tag), None))

    def release(self, tag: str) -> None:
        adapter = self._loaded.get(tag)
        if adapter is None:
            return
        adapter.in_flight = max(0, adapter.in_flight - 1)
        adapter.last_used = time.monotonic()
        self._drop_stale()

    async def _tag(self, name: str, path: Path) -> str:
        try:
            stamp = tuple(n for part in (CONFIG, WEIGHTS) for n in _stamp((path / part).stat()))
        except OSError as exc:
            raise AdapterUnavailableError(f"adapter '{name}': {exc}") from exc
        known = self._tags.get((name, path))
        if known is not None and known[0] == stamp:
            return known[1]
        tag = await asyncio.to_thread(adapter_tag, name, path)
        self._tags[(name, path)] = (stamp, tag)
        return tag

    # --- loading and freeing ---------------------------------------------------------

    async def _load(
        self, name: str, path: Path, tag: str, budget: Callable[[int], int | None] | None
    ) -> None:
        def install() -> int:
            return lora.install(self._model, tag, adapter_pairs(self._model, path))

        estimate = _file_bytes(path)
        if budget is not None:
            self._make_room(name, estimate, budget)
        started = time.monotonic()
        try:
            nbytes = await asyncio.wrap_future(self._scheduler.call(install))
        except AdapterError as exc:
            raise AdapterUnavailableError(f"adapter '{name}' cannot load: {exc}") from exc
        except Exception as exc:
            raise AdapterUnavailableError(
                f"adapter '{name}' failed to load: {type(exc).__name__}: {exc}"
            ) from exc
        self._loaded[tag] = LoadedAdapter(name, tag, nbytes)
        log.info("adapter loaded", adapter=name, tag=tag, memory_mb=round(nbytes / MIB, 3),
                 seconds=round(time.monotonic() - started, 3))  # fmt: skip

    def _make_room(self, name: str, need: int, budget: Callable[[int], int | None]) -> None:
        """Evict idle adapters, least recently used first, until `need` more bytes fit."""
        room = budget(need)
        if room is None:
            return
        idle = sorted(
            (a for a in self._loaded.values() if a.in_flight == 0), key=lambda a: a.last_used
        )
        used = self.nbytes
        for victim in idle:
            if used + need <= room:
                break
            used -= victim.nbytes
            self._free(victim, "evicted")
        if used + need > room:
            raise AdapterUnavailableError(
                f"adapter '{name}' needs about {need / MIB:.1f} MiB but the memory budget "
                f"leaves {max(0, room - used) / MIB:.1f} MiB and the adapters holding it "
                "are in use"
            )

    def _drop_stale(self) -> None:
        """Free idle adapters that no configured name reaches any more."""
        live = set(self._current.values())
        for adapter in list(self._loaded.values()):
            stale = adapter.name not in self._configured or (
                adapter.name in self._current and adapter.tag not in live
            )
            if stale and adapter.in_flight == 0:
                self._free(adapter, "removed")

    def _free(self, adapter: LoadedAdapter, reason: str) -> None:
        self._loaded.pop(adapter.tag, None)
        self._scheduler.call(lambda: lora.uninstall(self._model, adapter.tag))
        log.info("adapter unloaded", adapter=adapter.name, tag=adapter.tag, reason=reason)


@dataclass
class _Lease:
    """One request's hold on an adapter (released by the API's ASGI layer)."""

    adapters: EngineAdapters
    tag: str

    def release(self, entry: Any) -> None:
        self.adapters.release(self.tag)


def _stamp(stat: os.stat_result) -> tuple[int, int]:
    return stat.st_size, stat.st_mtime_ns


def _file_bytes(path: Path) -> int:
    try:
        return (path / WEIGHTS).stat().st_size
    except OSError:
        return 0

"""What shutdown and reload wait on: in-flight HTTP requests, and the daemon's pid file;
how the process leaves when a model load is still running; the usage database it opens.

The tracker sits between Granian and the app, so a request counts from its first byte
until the app has handed over its last response byte: drain and model swaps wait on
that instead of on Granian, whose stop may close connections that are still busy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any, NoReturn

import structlog

from vllm_mlx.config.settings import Settings
from vllm_mlx.usage.ledger import UsageLedger
from vllm_mlx.usage.store import DATABASE_NAME

# Loose on purpose: Litestar's own ASGI types are narrower unions of typed dicts.
Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]

PID_FILE_TEMPLATE = "vllm-mlx-{port}.pid"
log = structlog.get_logger(__name__)
SYSTEM_RUN_DIR = Path("/var/run/vllm-mlx" if sys.platform == "darwin" else "/run/vllm-mlx")


class RequestTracker:
    """Numbers every HTTP request and knows which are still running, per listener."""

    def __init__(self) -> None:
        self._next = 0
        self._active: dict[int, str] = {}  # request number -> listener tag
        self._changed = asyncio.Event()

    def wrap(self, app: ASGIApp, tag: str) -> ASGIApp:
        """`app` with its HTTP requests counted under `tag` (one tag per listener)."""

        async def tracked(scope: Scope, receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            number = self._next
            self._next += 1
            self._active[number] = tag
            try:
                await app(scope, receive, send)
            finally:
                del self._active[number]
                self._notify()

        return tracked

    def _notify(self) -> None:
        # A fresh event per change: a waiter holds the one current when it last checked.
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def in_flight(self, tag: str | None = None) -> int:
        return sum(1 for t in self._active.values() if tag is None or t == tag)

    def mark(self) -> int:
        """A point in time: requests numbered below it arrived before it."""
        return self._next

    async def wait_idle(self, limit_s: float | None, tag: str | None = None) -> bool:
        """Wait until no request (on `tag`'s listener) runs; False after `limit_s`."""
        return await self._wait(lambda: self.in_flight(tag) == 0, limit_s)

    async def wait_started_before(self, mark: int, limit_s: float | None = None) -> bool:
        """Wait until every request that arrived before `mark` has finished."""
        return await self._wait(lambda: all(n >= mark for n in self._active), limit_s)

    async def _wait(self, done: Callable[[], bool], limit_s: float | None) -> bool:
        deadline = None if limit_s is None else time.monotonic() + limit_s
        while not done():
            changed = self._changed
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await changed.wait()
        return True


def pid_dirs(cache_dir: Path) -> list[Path]:
    """Where a daemon writes its pid file, first choice first (see docs/operations.md).

    systemd's RuntimeDirectory= sets $RUNTIME_DIRECTORY; a login session has
    $XDG_RUNTIME_DIR; root uses the system run directory; anyone else the cache dir.
    """
    dirs: list[Path] = []
    if runtime := os.environ.get("RUNTIME_DIRECTORY"):
        dirs.append(Path(runtime.split(":")[0]))
    if xdg := os.environ.get("XDG_RUNTIME_DIR"):
        dirs.append(Path(xdg) / "vllm-mlx")
    if os.geteuid() == 0:
        dirs.append(SYSTEM_RUN_DIR)
    dirs.append(cache_dir / "run")
    if SYSTEM_RUN_DIR not in dirs:
        dirs.append(SYSTEM_RUN_DIR)  # searched by `reload` for a system service's daemon
    return dirs


def write_pid_file(cache_dir: Path, port: int) -> Path | None:
    """Write this process's pid for `port` in the first writable pid dir."""
    for directory in pid_dirs(cache_dir):
        path = directory / PID_FILE_TEMPLATE.format(port=port)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{os.getpid()}\n")
        except OSError:
            continue
        return path
    return None


def remove_pid_file(path: Path | None) -> None:
    """Remove the pid file if it is still ours (a newer daemon may have replaced it)."""
    if path is None:
        return
    with contextlib.suppress(OSError, ValueError):
        if int(path.read_text().strip()) == os.getpid():
            path.unlink()


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, owned by someone else
    return True


def _read_pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if process_alive(pid) else None


def find_daemon_pid(cache_dir: Path, port: int) -> int:
    """The pid of the running daemon on `port`; LookupError saying where it looked.

    When no daemon runs on `port` (the file names a new port that only a reload would
    apply) but exactly one daemon is running, that one is meant.
    """
    dirs = pid_dirs(cache_dir)
    name = PID_FILE_TEMPLATE.format(port=port)
    for directory in dirs:
        if (pid := _read_pid(directory / name)) is not None:
            return pid
    running = {
        pid
        for directory in dirs
        for path in sorted(directory.glob(PID_FILE_TEMPLATE.format(port="*")))
        if (pid := _read_pid(path)) is not None
    }
    if len(running) == 1:
        return running.pop()
    found = f"; daemons running: pids {sorted(running)}" if running else ""
    looked = ", ".join(str(d / name) for d in dirs)
    raise LookupError(f"no running daemon for port {port} (looked for {looked}){found}")


def exit_now(code: int) -> NoReturn:
    """Leave without finalizing the interpreter, after the daemon's orderly shutdown.

    For when a model is still loading on its daemon thread: that thread runs MLX's C++
    code, and finalizing the interpreter and the libraries' static objects around it can
    end in std::terminate (SIGABRT instead of `code`). Logs are flushed first."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def open_ledger(settings: Settings) -> UsageLedger | None:
    """The usage database under `paths.state_dir`, or None (logged) when it cannot be
    opened: a read-only or full disk, or a file from a newer version."""
    path = settings.resolved_state_dir() / DATABASE_NAME
    try:
        return UsageLedger(path, lambda: settings.usage.retention_days)
    except (OSError, sqlite3.Error, RuntimeError) as exc:
        log.error("cannot open the usage database", path=str(path), error=str(exc))
        return None

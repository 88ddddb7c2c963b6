"""One MCP server kept connected: connect, list tools, watch, reconnect with backoff.

Each server is one asyncio task in the daemon's loop. The SDK's `Client` is entered and
left inside that task (its anyio scopes must not cross tasks); request handlers share
the connected client for calls. A server that fails is retried with exponential
backoff and never affects the daemon or the other servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from typing import Any

import structlog

from vllm_mlx.config.mcp import McpServerSettings
from vllm_mlx.mcp.tools import McpTool, ToolResult, error_result, from_call_result, make_tool

log = structlog.get_logger(__name__)

BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0
# A live connection is checked this often (a tools/list, which also picks up new tools);
# a call that finds the connection closed triggers a reconnect at once.
PROBE_EVERY_S = 15.0
STOP_GRACE_S = 5.0
# Starting a server (a Python or npx process on a busy machine) can take far longer
# than a short per-call timeout allows.
CONNECT_MIN_S = 30.0


class ServerState(enum.StrEnum):
    CONNECTING = "connecting"
    READY = "ready"
    ERROR = "error"  # waiting to reconnect
    STOPPED = "stopped"
    DISABLED = "disabled"


class ServerUnavailableError(RuntimeError):
    """The server is not connected right now."""


def _target(settings: McpServerSettings) -> Any:
    """What the SDK's Client connects to (imported here: only a daemon with MCP pays)."""
    if settings.transport == "stdio":
        from mcp.client.stdio import StdioServerParameters

        assert settings.command is not None  # checked by McpServerSettings
        return StdioServerParameters(
            command=settings.command,
            args=list(settings.args),
            env=dict(settings.env) or None,
            cwd=settings.cwd,
        )
    from mcp.shared._httpx_utils import create_mcp_http_client

    assert settings.url is not None
    headers = dict(settings.headers) or None
    if settings.transport == "sse":
        from mcp.client.sse import sse_client

        return sse_client(settings.url, headers=headers, timeout=settings.timeout)
    from mcp.client.streamable_http import streamable_http_client

    http = create_mcp_http_client(headers=headers)
    return streamable_http_client(settings.url, http_client=http)


def _is_connection_lost(exc: BaseException) -> bool:
    from mcp.shared.exceptions import MCPError
    from mcp_types import CONNECTION_CLOSED

    return isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED


def _is_timeout(exc: BaseException) -> bool:
    from mcp.shared.exceptions import MCPError
    from mcp_types import REQUEST_TIMEOUT

    return isinstance(exc, TimeoutError) or (
        isinstance(exc, MCPError) and exc.code == REQUEST_TIMEOUT
    )


class ServerSupervisor:
    def __init__(self, name: str, settings: McpServerSettings) -> None:
        self.name = name
        self.settings = settings
        self.state = ServerState.CONNECTING if settings.enabled else ServerState.DISABLED
        self.error: str | None = None
        self.tools: list[McpTool] = []
        self.connects = 0  # successful connections so far (1 + reconnects)
        self.connected_at: float | None = None
        self._client: Any = None
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()  # ends the current session (stop or connection lost)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.settings.enabled and self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"mcp:{self.name}")

    async def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._task is not None:
            # A ready session closes cleanly (the SDK ends the server); one still
            # connecting or waiting to retry has nothing to close: cancel it at once.
            grace = STOP_GRACE_S if self.state is ServerState.READY else 0
            try:
                async with asyncio.timeout(grace):
                    await asyncio.shield(self._task)
            except (TimeoutError, Exception):
                self._task.cancel()
                with contextlib.suppress(BaseException):
                    await self._task
        self._set(ServerState.STOPPED if self.settings.enabled else ServerState.DISABLED)

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "transport": self.settings.transport,
            "state": self.state.value,
            "tools": len(self.allowed_tools()),
            "error": self.error,
            "connects": self.connects,
            "connected_at": self.connected_at,
        }

    def allowed_tools(self) -> list[McpTool]:
        return [tool for tool in self.tools if self.settings.allows(tool.name)]

    def _set(self, state: ServerState, error: str | None = None) -> None:
        self.state = state
        self.error = error
        if state is not ServerState.READY:
            self._client = None

    # --- the connection loop --------------------------------------------------------

    async def _run(self) -> None:
        delay = BACKOFF_START_S
        while not self._stop.is_set():
            self._set(ServerState.CONNECTING, self.error)
            started = time.monotonic()
            try:
                await self._session()
                if self._stop.is_set():
                    break
                raise ConnectionError("the connection was lost")
            except Exception as exc:  # OSError, MCPError, anyio's exception groups, ...
                if self._stop.is_set():
                    break
                message = _describe(exc)
                log.warning("mcp server failed", server=self.name, error=message, retry_s=delay)
                self._set(ServerState.ERROR, message)
            if time.monotonic() - started > BACKOFF_MAX_S:
                delay = BACKOFF_START_S  # it served for a while: a fresh failure
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._stop.wait()
            delay = min(delay * 2, BACKOFF_MAX_S)

    async def _session(self) -> None:
        """Connect and serve until woken; returns normally only on stop or a lost link."""
        from mcp import Client

        self._wake.clear()
        ready = asyncio.Event()
        client = Client(
            _target(self.settings), read_timeout_seconds=self.settings.timeout, cache=None
        )

        async def hold() -> None:
            async with client:
                await self._list_tools(client)
                ready.set()
                while not self._wake.is_set():
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(PROBE_EVERY_S):
                            await self._wake.wait()
                    if not self._wake.is_set():
                        await self._list_tools(client)  # raises when the server is gone

        task = asyncio.create_task(hold())
        try:
            await self._until_ready(task, ready, client)
            await task
        finally:
            # Cancelled (daemon stop) or timed out: the session task goes too, and with
            # it the server process; never an orphan.
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def _until_ready(
        self, task: asyncio.Task[None], ready: asyncio.Event, client: Any
    ) -> None:
        waiter = asyncio.create_task(ready.wait())
        limit = max(self.settings.timeout, CONNECT_MIN_S)
        try:
            done, _ = await asyncio.wait(
                {task, waiter}, timeout=limit, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            waiter.cancel()
        if not done:
            raise TimeoutError(f"no answer within {limit:g}s")
        if ready.is_set():
            self.connects += 1
            self.connected_at = time.time()
            self._client = client
            self._set(ServerState.READY)
            log.info("mcp server ready", server=self.name, tools=len(self.tools))

    async def _list_tools(self, client: Any) -> None:
        tools: list[McpTool] = []
        cursor: str | None = None
        for _ in range(100):  # pages; a server that never ends its listing is cut off
            page = await client.list_tools(cursor=cursor)
            tools.extend(make_tool(self.name, tool) for tool in page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        self.tools = tools

    # --- calls ----------------------------------------------------------------------

    async def call(self, tool: McpTool, arguments: dict[str, Any]) -> tuple[ToolResult, str]:
        """The result and its outcome (ok, tool_error, timeout, unavailable)."""
        client = self._client
        if client is None or self.state is not ServerState.READY:
            raise ServerUnavailableError(f"MCP server '{self.name}' is {self.state.value}")
        timeout = self.settings.timeout
        try:
            result = await client.call_tool(tool.name, arguments, read_timeout_seconds=timeout)
        except Exception as exc:
            if _is_timeout(exc):
                return error_result(tool.full_name, f"the tool timed out after {timeout:g}s"), (
                    "timeout"
                )
            if _is_connection_lost(exc):
                self._wake.set()  # reconnect now, not at the next probe
                raise ServerUnavailableError(
                    f"MCP server '{self.name}' closed the connection"
                ) from exc
            return error_result(
                tool.full_name, f"the tool call failed: {_describe(exc)}"
            ), "tool_error"
        converted = from_call_result(tool.full_name, result)
        return converted, "tool_error" if converted.is_error else "ok"


def _describe(exc: BaseException) -> str:
    """One line for status and logs; anyio wraps failures in exception groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:500]

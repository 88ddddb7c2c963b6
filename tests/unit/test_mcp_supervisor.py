"""The MCP manager in-process against the real test server: connect, call, hot apply,
and stopping never leaving a server process behind."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable

import psutil

from tests.support.mcp_helpers import SERVER_SCRIPT
from vllm_mlx.config.mcp import McpServerSettings, McpSettings
from vllm_mlx.mcp.manager import McpManager
from vllm_mlx.mcp.supervisor import ServerState
from vllm_mlx.metrics.core import Metrics

DEADLINE_S = 60.0


def _server(**extra: object) -> McpServerSettings:
    return McpServerSettings.model_validate(
        {"command": sys.executable, "args": [str(SERVER_SCRIPT)], **extra}
    )


async def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.05)


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.is_running()}


def test_apply_call_change_and_remove() -> None:
    async def scenario() -> None:
        metrics = Metrics()
        manager = McpManager(metrics)
        before = _children()
        manager.apply(McpSettings(servers={"a": _server(denied_tools=["crash"])}))
        await _until(lambda: manager.servers["a"].state is ServerState.READY, "a ready")
        assert "a__crash" not in {t.full_name for t in manager.tools()}
        result = await manager.execute("a__add", {"a": 1, "b": 2})
        assert (result.text, result.is_error) == ("3", False)
        # A changed server restarts; an unchanged one is left alone.
        first = manager.servers["a"]
        manager.apply(McpSettings(servers={"a": _server(allowed_tools=["echo"])}))
        assert manager.servers["a"] is not first
        await _until(lambda: manager.servers["a"].state is ServerState.READY, "a again")
        assert [t.full_name for t in manager.tools()] == ["a__echo"]
        manager.apply(McpSettings(servers={}))
        await manager.close()
        await _until(lambda: _children() <= before, "server processes gone")

    asyncio.run(scenario())


def test_a_server_that_never_answers_is_stopped_without_leftovers() -> None:
    async def scenario() -> None:
        manager = McpManager()
        before = _children()
        silent = McpServerSettings(
            command=sys.executable, args=["-c", "import time; time.sleep(600)"]
        )
        manager.apply(McpSettings(servers={"silent": silent}))
        await _until(lambda: _children() - before != set(), "the process started")
        assert manager.servers["silent"].state is ServerState.CONNECTING
        await manager.close()
        await _until(lambda: _children() <= before, "the silent process gone")

    asyncio.run(scenario())


def test_a_missing_command_is_an_error_state_and_retried() -> None:
    async def scenario() -> None:
        manager = McpManager()
        manager.apply(McpSettings(servers={"gone": McpServerSettings(command="/nonexistent/x")}))
        await _until(lambda: manager.servers["gone"].state is ServerState.ERROR, "error state")
        assert "nonexistent" in (manager.servers["gone"].error or "")
        await manager.close()

    asyncio.run(scenario())

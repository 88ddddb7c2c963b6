"""Every configured MCP server: started, stopped and restarted as the config changes."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog

from vllm_mlx.config.mcp import McpSettings
from vllm_mlx.mcp.supervisor import ServerState, ServerSupervisor, ServerUnavailableError
from vllm_mlx.mcp.tools import McpTool, ToolResult, error_result
from vllm_mlx.metrics.core import Metrics
from vllm_mlx.telemetry import hooks as tracing

log = structlog.get_logger(__name__)


class ToolNotFoundError(LookupError):
    """No allowed tool of a configured server has this name."""


class McpManager:
    """Owns one ServerSupervisor per configured server; all methods run in the daemon loop."""

    def __init__(self, metrics: Metrics | None = None) -> None:
        self.metrics = metrics
        self.settings = McpSettings()
        self.servers: dict[str, ServerSupervisor] = {}
        self._stopping: set[asyncio.Task[None]] = set()

    def apply(self, settings: McpSettings) -> None:
        """Start added servers, stop removed ones, restart changed ones (models untouched)."""
        self.settings = settings
        for name in [n for n in self.servers if n not in settings.servers]:
            self._retire(self.servers.pop(name))
            log.info("mcp server removed", server=name)
        for name, server_settings in settings.servers.items():
            current = self.servers.get(name)
            if current is not None and current.settings == server_settings:
                continue
            if current is not None:
                self._retire(current)
                log.info("mcp server changed; restarting", server=name)
            supervisor = ServerSupervisor(name, server_settings)
            self.servers[name] = supervisor
            supervisor.start()

    def _retire(self, supervisor: ServerSupervisor) -> None:
        task = asyncio.create_task(supervisor.stop())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def close(self) -> None:
        """Stop every server (daemon shutdown)."""
        servers, self.servers = list(self.servers.values()), {}
        await asyncio.gather(*(s.stop() for s in servers), *self._stopping, return_exceptions=True)

    # --- what the API reads ---------------------------------------------------------

    def status(self) -> list[dict[str, Any]]:
        return [server.status() for server in self.servers.values()]

    def tools(self) -> list[McpTool]:
        """Allowed tools of ready servers; a name two tools share goes to the first."""
        seen: dict[str, McpTool] = {}
        for server in self.servers.values():
            if server.state is ServerState.READY:
                for tool in server.allowed_tools():
                    seen.setdefault(tool.full_name, tool)
        return list(seen.values())

    def find(self, full_name: str) -> McpTool | None:
        return next((t for t in self.tools() if t.full_name == full_name), None)

    def is_mcp_tool(self, full_name: str) -> bool:
        return self.find(full_name) is not None

    async def execute(self, full_name: str, arguments: dict[str, Any]) -> ToolResult:
        """Run one allowed tool. Raises ToolNotFoundError / ServerUnavailableError; a tool
        failure or timeout is a result with `is_error`, never an exception."""
        tool = self.find(full_name)
        if tool is None:
            if self._known_but_down(full_name):
                raise ServerUnavailableError(f"the MCP server of '{full_name}' is not connected")
            raise ToolNotFoundError(
                f"no MCP tool named '{full_name}' (GET /v1/mcp/tools lists them)"
            )
        supervisor = self.servers[tool.server]
        started = time.monotonic()
        log.debug("mcp call", tool=full_name, arguments=arguments)
        try:
            result, outcome = await supervisor.call(tool, arguments)
        except ServerUnavailableError:
            self._observe(tool, "unavailable", started)
            raise
        self._observe(tool, outcome, started)
        log.debug("mcp result", tool=full_name, is_error=result.is_error, content=result.content)
        return result

    async def execute_or_error(self, full_name: str, arguments: dict[str, Any]) -> ToolResult:
        """execute(), with every failure as an error result (what a model reads back)."""
        try:
            return await self.execute(full_name, arguments)
        except (ToolNotFoundError, ServerUnavailableError) as exc:
            return error_result(full_name, str(exc))

    def _known_but_down(self, full_name: str) -> bool:
        server = full_name.split("__", 1)[0]
        supervisor = self.servers.get(server)
        return supervisor is not None and supervisor.state is not ServerState.READY

    def _observe(self, tool: McpTool, outcome: str, started: float) -> None:
        tracing.tool_call(tool.full_name, outcome, started)
        if self.metrics is not None:
            self.metrics.mcp_call(tool.server, tool.name, outcome, time.monotonic() - started)

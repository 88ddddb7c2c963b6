"""The `mcp` section of vllm-mlx.yaml: named MCP servers and how tools are used.

Built on config_base's Section, setting and Reload, like every section.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import field_validator, model_validator

from vllm_mlx.config.fields import Reload, Section, setting

# `server__tool` is how a tool is named to the model, so a server name may not hold `__`.
SERVER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]*(_[A-Za-z0-9-]+)*$")
TOOL_SEPARATOR = "__"


class McpServerSettings(Section):
    transport: Literal["stdio", "streamable_http", "sse"] = setting(
        "stdio",
        Reload.HOT,
        "`stdio` (run `command` and talk over its stdin/stdout), `streamable_http` or "
        "`sse` (connect to `url`).",
    )
    command: str | None = setting(
        None, Reload.HOT, "stdio: the program to run (looked up on PATH).", min_length=1
    )
    args: list[str] = setting([], Reload.HOT, "stdio: its arguments.")
    env: dict[str, str] = setting(
        {},
        Reload.HOT,
        "stdio: environment variables for it, over a minimal safe set (PATH, HOME, ...); "
        "the daemon's own environment is not passed on.",
    )
    cwd: Path | None = setting(None, Reload.HOT, "stdio: its working directory.")
    url: str | None = setting(
        None, Reload.HOT, "streamable_http / sse: the server's endpoint (http or https)."
    )
    headers: dict[str, str] = setting(
        {}, Reload.HOT, "streamable_http / sse: HTTP headers sent with every request."
    )
    enabled: bool = setting(True, Reload.HOT, "False keeps the entry but runs nothing.")
    timeout: float = setting(
        30.0,
        Reload.HOT,
        "Seconds one tool call may take (connecting gets at least 30); a call past it "
        "ends as a tool error (`is_error`).",
        gt=0,
        le=3600,
    )
    allowed_tools: list[str] | None = setting(
        None,
        Reload.HOT,
        "Tool names (the server's own, unprefixed) offered and runnable; null: all.",
    )
    denied_tools: list[str] = setting(
        [], Reload.HOT, "Tool names never offered nor run (wins over allowed_tools)."
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("url must start with http:// or https://")
        return value

    @model_validator(mode="after")
    def _transport_fields(self) -> McpServerSettings:
        if self.transport == "stdio":
            if self.command is None:
                raise ValueError("transport stdio needs `command`")
            if self.url is not None or self.headers:
                raise ValueError("transport stdio takes `command`, not `url` / `headers`")
        else:
            if self.url is None:
                raise ValueError(f"transport {self.transport} needs `url`")
            if self.command is not None or self.args or self.env or self.cwd is not None:
                raise ValueError(
                    f"transport {self.transport} takes `url`, not `command` / `args` / `env` / "
                    "`cwd`"
                )
        return self

    def allows(self, tool: str) -> bool:
        if tool in self.denied_tools:
            return False
        return self.allowed_tools is None or tool in self.allowed_tools


class McpSettings(Section):
    servers: dict[str, McpServerSettings] = setting(
        {},
        Reload.HOT,
        "MCP servers by name; their tools are named `NAME__TOOL`. Added, removed and "
        "changed servers are started, stopped and restarted on reload; models are untouched.",
    )
    config_file: Path | None = setting(
        None,
        Reload.HOT,
        "A JSON file of more servers (`--mcp-config`), in the seed's shape "
        '(`{"servers": {...}}`) or the `{"mcpServers": {...}}` shape of Claude Desktop and '
        "Cursor; relative to the YAML file. A name in both is an error.",
    )
    max_tool_rounds: int = setting(
        5,
        Reload.HOT,
        "For models with `mcp_tools: execute`: most rounds of running the model's MCP tool "
        "calls and generating again before the reply goes back as it is.",
        ge=1,
        le=50,
    )

    @field_validator("servers")
    @classmethod
    def _server_names(cls, value: dict[str, McpServerSettings]) -> dict[str, McpServerSettings]:
        for name in value:
            if not SERVER_NAME.match(name) or len(name) > 32:
                raise ValueError(
                    f"server name {name!r}: use letters, digits, `-` and single `_` (at most "
                    "32 characters); `__` separates server and tool names"
                )
        return value

"""The seed's `--mcp-config FILE`: JSON in the seed's shape or the `mcpServers` shape.

Seed: ``{"servers": {NAME: {"transport", "command", "args", "env", "url", "enabled",
"timeout"}}, "max_tool_calls": N, "default_timeout": S}``. Claude Desktop / Cursor:
``{"mcpServers": {NAME: {"command", "args", "env", "cwd"} | {"url", "type", "headers"}}}``.
Both become `McpServerSettings`; errors name the JSON file, line and key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from vllm_mlx.config.errors import ConfigError, ConfigIssue, KeyPath, KeyPositions, format_key_path
from vllm_mlx.config.mcp import McpServerSettings, McpSettings
from vllm_mlx.config.settings import Settings

SEED_KEYS = {"transport", "command", "args", "env", "url", "enabled", "timeout", "cwd", "headers"}
SEED_IGNORED = {"skip_security_validation", "name"}  # the seed's own checks; no meaning here
# Keys other clients (Cline, Cursor, Claude Desktop) put beside a server; harmless here.
CLIENT_IGNORED = {"autoApprove", "alwaysAllow", "description", "disabled", "type", "transportType"}
CLIENT_KEYS = {"command": "command", "args": "args", "env": "env", "cwd": "cwd", "url": "url"}
CLIENT_KEYS |= {"headers": "headers", "timeout": "timeout"}
HTTP_TYPES = {"http": "streamable_http", "streamable-http": "streamable_http"}
HTTP_TYPES |= {"streamable_http": "streamable_http", "streamableHttp": "streamable_http"}
HTTP_TYPES |= {"sse": "sse"}


class _File:
    """One JSON file being read: its path and the line of every key."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.positions = KeyPositions()

    def issue(self, key: KeyPath, message: str) -> ConfigIssue:
        where = self.positions.locate(key) or ((1, 1) if not key else None)
        line, column = where if where else (None, None)
        return ConfigIssue(format_key_path(key), message, str(self.path), line, column)


def _parse(file: _File) -> dict[str, Any]:
    try:
        text = file.path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            [ConfigIssue("", f"cannot read: {exc.strerror}", str(file.path))]
        ) from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        issue = ConfigIssue(
            "", f"JSON syntax error: {exc.msg}", str(file.path), exc.lineno, exc.colno
        )
        raise ConfigError([issue]) from exc
    if not isinstance(data, dict):
        raise ConfigError([ConfigIssue("", "the file must be a JSON object", str(file.path), 1, 1)])
    try:  # JSON is YAML, and YAML's parser keeps the lines
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is not None:
            file.positions.walk(node, ())
    except yaml.YAMLError:
        pass  # a JSON oddity YAML rejects: errors then name the file only
    return data


def _seed_server(
    raw: dict[str, Any], default_timeout: Any
) -> tuple[dict[str, Any], dict[str, str]]:
    fields = {k: v for k, v in raw.items() if k not in SEED_IGNORED}
    if default_timeout is not None and "timeout" not in fields:
        fields["timeout"] = default_timeout
    return fields, {k: k for k in fields}


def _client_server(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    fields: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for key, value in raw.items():
        if key in CLIENT_KEYS:
            fields[CLIENT_KEYS[key]] = value
            origin[CLIENT_KEYS[key]] = key
        elif key not in CLIENT_IGNORED:
            fields[key] = value  # reported as an unknown key, at its own line
            origin[key] = key
    kind = raw.get("type") or raw.get("transportType")
    if "url" in raw:
        default = "sse" if str(raw["url"]).rstrip("/").endswith("/sse") else "streamable_http"
        fields["transport"] = HTTP_TYPES.get(str(kind), default) if kind else default
        origin["transport"] = "type" if kind else "url"
    if raw.get("disabled") is True:
        fields["enabled"] = False
        origin["enabled"] = "disabled"
    return fields, origin


def _servers(file: _File, data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    if "mcpServers" in data:
        return "mcpServers", data["mcpServers"]
    if "servers" in data:
        unknown = set(data) - {"servers", "max_tool_calls", "default_timeout"}
        if unknown:
            key = sorted(unknown)[0]
            raise ConfigError(
                [
                    file.issue(
                        (key,), "unknown key (seed shape: servers, max_tool_calls, default_timeout)"
                    )
                ]
            )
        return "servers", data["servers"]
    raise ConfigError([file.issue((), 'expected a "servers" or an "mcpServers" object')])


def read_mcp_file(path: Path) -> tuple[dict[str, McpServerSettings], int | None]:
    """The servers in the file and the seed's `max_tool_calls` (None if absent)."""
    file = _File(path)
    data = _parse(file)
    top, raw_servers = _servers(file, data)
    if not isinstance(raw_servers, dict):
        raise ConfigError([file.issue((top,), "must be an object of servers by name")])
    issues: list[ConfigIssue] = []
    servers: dict[str, McpServerSettings] = {}
    for name, raw in raw_servers.items():
        if not isinstance(raw, dict):
            issues.append(file.issue((top, name), "a server must be an object"))
            continue
        if top == "servers":
            fields, origin = _seed_server(raw, data.get("default_timeout"))
        else:
            fields, origin = _client_server(raw)
        try:
            servers[name] = McpServerSettings.model_validate(fields)
        except ValidationError as exc:
            for error in exc.errors(include_url=False):
                loc = (
                    [origin.get(str(error["loc"][0]), error["loc"][0]), *error["loc"][1:]]
                    if error["loc"]
                    else []
                )
                message = error["msg"].removeprefix("Value error, ")
                if error["type"] == "extra_forbidden":
                    message = "unknown key (see docs/mcp.md)"
                issues.append(file.issue((top, name, *loc), message))
    try:
        McpSettings(servers=servers)  # the names
    except ValidationError as exc:
        issues.extend(
            file.issue((top,), e["msg"].removeprefix("Value error, ")) for e in exc.errors()
        )
    if issues:
        raise ConfigError(issues)
    rounds = data.get("max_tool_calls") if top == "servers" else None
    if rounds is not None and (not isinstance(rounds, int) or isinstance(rounds, bool)):
        raise ConfigError([file.issue(("max_tool_calls",), "must be an integer")])
    return servers, rounds


def with_mcp_file(settings: Settings, base_dir: Path) -> Settings:
    """Settings with the servers of `mcp.config_file` (if set) added."""
    mcp = settings.mcp
    if mcp.config_file is None:
        return settings
    path = mcp.config_file.expanduser()
    path = path if path.is_absolute() else base_dir / path
    if not path.is_file():
        raise ConfigError(
            [ConfigIssue("mcp.config_file", f"{path} does not exist", "configuration")]
        )
    servers, rounds = read_mcp_file(path)
    clashes = sorted(set(servers) & set(mcp.servers))
    if clashes:
        raise ConfigError(
            [
                ConfigIssue(
                    "mcp.servers",
                    f"server {clashes[0]!r} is defined in both the YAML and {path}",
                    str(path),
                )
            ]
        )
    update: dict[str, Any] = {"servers": {**mcp.servers, **servers}}
    if rounds is not None and "max_tool_rounds" not in mcp.model_fields_set:
        update["max_tool_rounds"] = rounds
    try:
        merged = McpSettings.model_validate({**mcp.model_dump(), **update})
    except ValidationError as exc:
        message = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise ConfigError([ConfigIssue("max_tool_calls", message, str(path))]) from exc
    return settings.model_copy(update={"mcp": merged})

"""The `mcp` section and the seed's `--mcp-config` JSON (both shapes), with file:line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_mlx.cli.main import main
from vllm_mlx.config.errors import ConfigError
from vllm_mlx.config.file import load_config
from vllm_mlx.config.mcp import McpServerSettings
from vllm_mlx.config.mcp_file import read_mcp_file
from vllm_mlx.mcp.tools import full_name


def _yaml(tmp_path: Path, mcp: dict[str, Any]) -> Path:
    path = tmp_path / "vllm-mlx.yaml"
    path.write_text(yaml.safe_dump({"mcp": mcp}, sort_keys=False))
    return path


def _issues(exc: pytest.ExceptionInfo[ConfigError]) -> list[str]:
    return [str(issue) for issue in exc.value.issues]


def test_yaml_servers_of_each_transport(tmp_path: Path) -> None:
    path = _yaml(tmp_path, {"servers": {
        "files": {"command": "python3", "args": ["fs.py", "/srv"], "env": {"A": "1"}},
        "remote": {"transport": "streamable_http", "url": "https://mcp.example/mcp",
                   "headers": {"Authorization": "Bearer t"}, "allowed_tools": ["search"]},
        "legacy": {"transport": "sse", "url": "http://127.0.0.1:9/sse", "enabled": False},
    }, "max_tool_rounds": 3})  # fmt: skip
    mcp = load_config(path).settings.mcp
    assert mcp.servers["files"].transport == "stdio"
    assert mcp.servers["remote"].allows("search") and not mcp.servers["remote"].allows("other")
    assert mcp.servers["legacy"].enabled is False
    assert mcp.max_tool_rounds == 3


@pytest.mark.parametrize(("server", "message"), [
    ({"transport": "stdio"}, "transport stdio needs `command`"),
    ({"transport": "sse"}, "transport sse needs `url`"),
    ({"transport": "streamable_http", "url": "file:///etc/passwd"}, "url must start with http"),
    ({"transport": "streamable_http", "url": "http://x/mcp", "command": "sh"}, "takes `url`"),
    ({"command": "x", "timeout": 0}, "greater than 0"),
    ({"command": "x", "comand": "y"}, "unknown key"),
])  # fmt: skip
def test_bad_servers_are_located(tmp_path: Path, server: dict[str, Any], message: str) -> None:
    path = _yaml(tmp_path, {"servers": {"one": server}})
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    issues = _issues(exc)
    assert any(message in issue for issue in issues), issues
    # mcp: / servers: / one: on lines 1-3; each issue at the server or its key.
    assert all(int(issue.removeprefix(f"{path}:").split(":")[0]) >= 3 for issue in issues)


@pytest.mark.parametrize("name", ["a__b", "_x", "has space", "x" * 33])
def test_server_names_cannot_break_tool_names(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(_yaml(tmp_path, {"servers": {name: {"command": "x"}}}))
    assert "server name" in _issues(exc)[0]


def test_tool_names_are_prefixed_and_made_safe() -> None:
    assert full_name("files", "read_file") == "files__read_file"
    assert full_name("files", "fs.read/v2") == "files__fs_read_v2"
    assert len(full_name("s", "x" * 100)) == 64


def test_seed_json_shape(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({
        "servers": {
            "filesystem": {"transport": "stdio", "command": "npx",
                           "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"],
                           "enabled": True, "timeout": 30, "skip_security_validation": False},
            "web": {"transport": "sse", "url": "http://localhost:3001/sse"},
        },
        "max_tool_calls": 7,
        "default_timeout": 12,
    }))  # fmt: skip
    servers, rounds = read_mcp_file(path)
    assert servers["filesystem"].args[-1] == "/tmp"
    assert servers["web"] == McpServerSettings(
        transport="sse", url="http://localhost:3001/sse", timeout=12
    )
    assert rounds == 7


def test_mcp_servers_shape(tmp_path: Path) -> None:
    path = tmp_path / "claude_desktop_config.json"
    path.write_text(json.dumps({
        "mcpServers": {
            "files": {"command": "npx", "args": ["x"], "env": {"K": "v"}, "autoApprove": []},
            "remote": {"type": "http", "url": "https://m.example/mcp",
                       "headers": {"Authorization": "Bearer t"}},
            "events": {"url": "http://127.0.0.1:9/sse"},
            "off": {"command": "x", "disabled": True},
        },
        "globalShortcut": "Ctrl+Space",
    }))  # fmt: skip
    servers, rounds = read_mcp_file(path)
    assert servers["files"].env == {"K": "v"}
    assert servers["remote"].transport == "streamable_http"
    assert servers["events"].transport == "sse"
    assert servers["off"].enabled is False
    assert rounds is None


def test_json_errors_name_the_file_line_and_key(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(
        '{\n  "mcpServers": {\n    "ok": {"command": "x"},\n'
        '    "bad": {"url": "ftp://x"},\n    "worse": {"comand": "x"}\n  }\n}\n'
    )
    with pytest.raises(ConfigError) as exc:
        read_mcp_file(path)
    issues = _issues(exc)
    assert any(i.startswith(f"{path}:4:") and "mcpServers.bad" in i for i in issues), issues
    assert any(i.startswith(f"{path}:5:") and "unknown key" in i for i in issues), issues


@pytest.mark.parametrize(("text", "where", "message"), [
    ('{"servers": {\n  "x": {"command": "a",}\n}}', ":2:", "JSON syntax error"),
    ('{"tools": {}}', ":1:", '"servers" or an "mcpServers"'),
    ('{"servers": {}, "extra": 1}', ":1:", "unknown key"),
    ('[1]', ":1:", "must be a JSON object"),
])  # fmt: skip
def test_malformed_json_files(tmp_path: Path, text: str, where: str, message: str) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        read_mcp_file(path)
    issue = _issues(exc)[0]
    assert issue.startswith(f"{path}{where}") and message in issue, issue


def test_config_file_merges_and_clashes(tmp_path: Path) -> None:
    (tmp_path / "mcp.json").write_text(json.dumps({"mcpServers": {"b": {"command": "y"}}}))
    path = _yaml(tmp_path, {"servers": {"a": {"command": "x"}}, "config_file": "mcp.json"})
    assert set(load_config(path).settings.mcp.servers) == {"a", "b"}  # relative to the YAML
    path = _yaml(tmp_path, {"servers": {"b": {"command": "x"}}, "config_file": "mcp.json"})
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert "defined in both" in _issues(exc)[0]


def test_check_config_validates_the_mcp_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "mcp.json"
    path.write_text('{"servers": {\n  "web": {"transport": "sse"}\n}}')
    with pytest.raises(SystemExit):
        main(["check-config", "--mcp-config", str(path)])
    assert f"{path}:2:" in capsys.readouterr().err
    path.write_text('{"servers": {"web": {"transport": "sse", "url": "http://h/sse"}},'
                    ' "max_tool_calls": 2}')  # fmt: skip
    assert main(["check-config", "--print", "--mcp-config", str(path)]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["mcp"]["servers"]["web"]["url"] == "http://h/sse"
    assert printed["mcp"]["max_tool_rounds"] == 2


def test_mcp_tools_needs_parsed_tool_calls(tmp_path: Path) -> None:
    path = tmp_path / "vllm-mlx.yaml"
    model = {"name": "m", "source": "builtin:smollm2-135m-instruct", "mcp_tools": "execute"}
    path.write_text(yaml.safe_dump({"models": [model]}))
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert "needs enable_auto_tool_choice" in _issues(exc)[0]
    model |= {"enable_auto_tool_choice": True, "tool_call_parser": "hermes"}
    path.write_text(yaml.safe_dump({"models": [model]}))
    assert load_config(path).settings.models[0].mcp_tools == "execute"

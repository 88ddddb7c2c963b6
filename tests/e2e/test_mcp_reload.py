"""MCP servers from the seed's `--mcp-config` JSON, and the `mcp` section hot-reloading:
servers added, removed and changed while the model keeps serving."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import httpx
import yaml

from tests.conftest import StartDaemon
from tests.support.mcp_helpers import SERVER_SCRIPT, all_ready, stdio_server, wait_for

FS_EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "mcp_fs_server.py"


def _save_mcp(config_path: Path, mcp: dict[str, object]) -> None:
    """Rewrite the `mcp` section the way editors save: a new file renamed over the old."""
    settings = yaml.safe_load(config_path.read_text())
    settings["mcp"] = mcp
    scratch = config_path.with_suffix(".tmp")
    scratch.write_text(yaml.safe_dump(settings, sort_keys=False))
    os.replace(scratch, config_path)


def test_seed_json_servers_and_hot_reload(start_daemon: StartDaemon, tmp_path: Path) -> None:
    seed = tmp_path / "mcp.json"
    seed.write_text(json.dumps({
        "servers": {
            "seeded": {"transport": "stdio", "command": sys.executable,
                       "args": [str(SERVER_SCRIPT)], "enabled": True, "timeout": 20,
                       "skip_security_validation": False},
        },
        "max_tool_calls": 3,
    }))  # fmt: skip
    served = tmp_path / "served"
    (served / "notes").mkdir(parents=True)
    (served / "notes" / "todo.md").write_text("- write the MCP docs\n")
    # docs/mcp.md's filesystem example, as the docs configure it.
    files = {"command": sys.executable, "args": [str(FS_EXAMPLE), str(served)]}
    daemon = start_daemon({"mcp": {"servers": {"first": files}}},
                          args=["--mcp-config", str(seed)])  # fmt: skip
    url = daemon.base_url
    seen = wait_for(url, all_ready({"first", "seeded"}), "first and seeded ready")
    assert seen["seeded"]["tools"] == 6
    assert seen["first"]["tools"] == 3
    read = {"tool_name": "first__read_file", "arguments": {"path": "notes/todo.md"}}
    body = httpx.post(f"{url}/v1/mcp/execute", json=read, timeout=30).json()
    assert body["content"][0]["text"] == "- write the MCP docs\n"
    escape = {"tool_name": "first__read_file", "arguments": {"path": "../mcp.json"}}
    body = httpx.post(f"{url}/v1/mcp/execute", json=escape, timeout=30).json()
    assert body["is_error"] is True and "outside" in body["content"][0]["text"]
    response = httpx.post(f"{url}/v1/mcp/execute", json={"tool_name": "seeded__echo",
                          "arguments": {"text": "from the seed's file"}}, timeout=30)  # fmt: skip
    assert response.json()["content"][0]["text"] == "from the seed's file"
    status = httpx.get(f"{url}/v1/status", timeout=10).json()
    model_loaded = status["models"][0]["state"]

    # Add one, remove one (the seed's file stays: it is named by the flag).
    _save_mcp(daemon.config_path, {"servers": {"second": stdio_server(allowed_tools=["echo"])}})
    seen = wait_for(
        url,
        lambda s: "first" not in s and all_ready({"second", "seeded"})(s),
        "first removed, second added",
    )
    assert seen["second"]["tools"] == 1
    tools = httpx.get(f"{url}/v1/mcp/tools", timeout=10).json()["tools"]
    assert {t["function"]["name"] for t in tools} >= {"second__echo", "seeded__add"}
    assert not any(t["function"]["name"].startswith("first__") for t in tools)

    # Change one: it restarts with the new settings.
    _save_mcp(daemon.config_path, {"servers": {"second": stdio_server(allowed_tools=["add"])}})
    wait_for(url, lambda s: s.get("second", {}).get("tools") == 1 and all_ready({"second"})(s)
             and any(t["function"]["name"] == "second__add" for t in
                     httpx.get(f"{url}/v1/mcp/tools", timeout=10).json()["tools"]),
             "second restarted with add")  # fmt: skip

    # A server that cannot start is an error state, never a daemon failure.
    _save_mcp(daemon.config_path, {"servers": {"broken": {"command": str(tmp_path / "nope")}}})
    seen = wait_for(url, lambda s: s.get("broken", {}).get("state") == "error", "broken fails")
    assert seen["broken"]["error"]
    assert seen["seeded"]["state"] == "ready"
    health = httpx.get(f"{url}/health", timeout=10)
    assert health.status_code == 200  # the models still serve
    broken = next(s for s in health.json()["mcp"] if s["name"] == "broken")
    assert broken["state"] == "error" and broken["error"]
    status = httpx.get(f"{url}/v1/status", timeout=10).json()
    assert status["models"][0]["state"] == model_loaded == "running"
    assert status["config"]["last_error"] is None
    assert daemon.log_text().count('"model loaded"') == 1  # no model was touched

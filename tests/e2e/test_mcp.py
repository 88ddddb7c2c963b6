"""MCP servers through the real daemon: real MCP servers (the `mcp` SDK) over stdio and
streamable HTTP on loopback, the /v1/mcp endpoints, and MCP tools in generation.

Generation uses the test-only `replay:` source, forced to call `demo__add` (2 + 3), so
`offer` and `execute` are driven by a real tool call through the real parsers.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import DaemonProcess, free_port, running
from tests.support.anthropic import prompt_tokens
from tests.support.mcp_helpers import (
    REPLAY_MCP_CALL,
    SERVER_SCRIPT,
    all_ready,
    http_server,
    stdio_server,
    wait_for,
)

KEY = "mcp-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
REPLAY = {
    "source": f"replay:{REPLAY_MCP_CALL}",
    "enable_auto_tool_choice": True,
    "tool_call_parser": "hermes",
}
CLIENT_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
}
ASK = [{"role": "user", "content": "What is 2 + 3?"}]
SERVERS = {"demo", "crashy", "web", "legacy", "files", "seeded"}
FS_EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "mcp_fs_server.py"
TODO = "- write the MCP docs\n"


def _seed_file(directory: Path) -> Path:
    """A `--mcp-config` file in the seed's own JSON shape."""
    path = directory / "mcp.json"
    path.write_text(json.dumps({
        "servers": {
            "seeded": {"transport": "stdio", "command": sys.executable,
                       "args": [str(SERVER_SCRIPT)], "enabled": True, "timeout": 20,
                       "skip_security_validation": False},
        },
        "max_tool_calls": 9,  # the YAML's max_tool_rounds wins
    }))  # fmt: skip
    return path


def _served_dir(directory: Path) -> Path:
    served = directory / "served"
    (served / "notes").mkdir(parents=True)
    (served / "notes" / "todo.md").write_text(TODO)
    return served


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path
) -> Iterator[DaemonProcess]:
    directory = tmp_path_factory.mktemp("mcp")
    # docs/mcp.md's filesystem example, as the docs configure it.
    files = {"command": sys.executable, "args": [str(FS_EXAMPLE), str(_served_dir(directory))]}
    args = ["--mcp-config", str(_seed_file(directory))]
    with http_server(free_port()) as url, http_server(free_port(), "sse") as sse_url:
        config = {
            "models": [
                {"name": "offer", **REPLAY, "mcp_tools": "offer"},
                {"name": "exec", **REPLAY, "mcp_tools": "execute", "load": "startup"},
            ],
            "auth": {"api_keys": [KEY]},
            "metrics": {"enabled": True},
            "mcp": {
                "max_tool_rounds": 2,
                "servers": {
                    "demo": stdio_server(timeout=2, denied_tools=["crash"]),
                    "crashy": stdio_server(allowed_tools=["crash", "calls"]),
                    "web": {
                        "transport": "streamable_http",
                        "url": url,
                        "allowed_tools": ["echo", "add"],
                        "denied_tools": ["add"],
                    },
                    "legacy": {"transport": "sse", "url": sse_url, "allowed_tools": ["echo"]},
                    "files": files,
                },
            },
        }
        with running(directory, model_cache_dir, config, args) as process:
            wait_for(process.base_url, all_ready(SERVERS), "all ready", AUTH)
            yield process


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key=KEY, max_retries=0)


def execute(daemon: DaemonProcess, payload: Any) -> httpx.Response:
    return httpx.post(f"{daemon.base_url}/v1/mcp/execute", json=payload, headers=AUTH, timeout=30)


def tool_names(daemon: DaemonProcess) -> dict[str, Any]:
    body = httpx.get(f"{daemon.base_url}/v1/mcp/tools", headers=AUTH, timeout=10).json()
    assert body["count"] == len(body["tools"])
    return {tool["function"]["name"]: tool for tool in body["tools"]}


# --- the endpoints ---------------------------------------------------------------------


def test_servers_listed_with_state_and_tool_count(daemon: DaemonProcess) -> None:
    seen = wait_for(daemon.base_url, all_ready(SERVERS), "all ready", AUTH)
    assert {name: s["tools"] for name, s in seen.items()} == {
        "demo": 5, "crashy": 2, "web": 1, "legacy": 1, "files": 3, "seeded": 6,
    }  # fmt: skip
    assert seen["web"]["transport"] == "streamable_http"
    assert all(s["error"] is None for s in seen.values())


def test_endpoints_need_the_api_key(daemon: DaemonProcess) -> None:
    for path in ("/v1/mcp/servers", "/v1/mcp/tools"):
        assert httpx.get(f"{daemon.base_url}{path}", timeout=10).status_code == 401
    response = httpx.post(f"{daemon.base_url}/v1/mcp/execute", json={"tool_name": "demo__add"})
    assert response.status_code == 401


def test_tools_in_openai_format_with_allow_and_deny_lists(daemon: DaemonProcess) -> None:
    tools = {
        n: t
        for n, t in tool_names(daemon).items()
        if n.split("__")[0] in ("demo", "crashy", "web", "legacy")
    }
    assert set(tools) == {
        "demo__add", "demo__echo", "demo__fail", "demo__sleep", "demo__calls",
        "crashy__crash", "crashy__calls", "web__echo", "legacy__echo",
    }  # fmt: skip
    add = tools["demo__add"]
    assert add["type"] == "function"
    assert add["function"]["description"] == "Add two numbers."
    schema = add["function"]["parameters"]  # passed through as the server wrote it
    assert schema["required"] == ["a", "b"]
    assert schema["properties"]["a"]["type"] == "number"


@pytest.mark.parametrize(("tool", "arguments", "text"), [
    ("demo__add", {"a": 2, "b": 3}, "5"),
    ("demo__echo", '{"text": "over stdio"}', "over stdio"),  # OpenAI-style JSON text
    ("web__echo", {"text": "over http"}, "over http"),
    ("legacy__echo", {"text": "over sse"}, "over sse"),
])  # fmt: skip
def test_execute(daemon: DaemonProcess, tool: str, arguments: Any, text: str) -> None:
    response = execute(daemon, {"tool_name": tool, "arguments": arguments})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["tool_name"] == tool
    assert body["is_error"] is False
    assert body["content"] == [{"type": "text", "text": text}]


def test_a_tool_error_is_a_result_not_a_500(daemon: DaemonProcess) -> None:
    response = execute(daemon, {"tool_name": "demo__fail", "arguments": {"message": "no way"}})
    assert response.status_code == 200
    body = response.json()
    assert body["is_error"] is True
    assert "no way" in body["content"][0]["text"]


def test_a_call_past_its_timeout_is_an_error_result(daemon: DaemonProcess) -> None:
    response = execute(daemon, {"tool_name": "demo__sleep", "arguments": {"seconds": 60}})
    assert response.status_code == 200
    body = response.json()
    assert body["is_error"] is True
    assert "timed out after 2s" in body["content"][0]["text"]
    # The server is still there for the next call.
    assert execute(daemon, {"tool_name": "demo__calls"}).json()["is_error"] is False


@pytest.mark.parametrize(("payload", "status", "param"), [
    ({"tool_name": "nope__add"}, 404, "tool_name"),
    ({"tool_name": "demo__crash"}, 404, "tool_name"),  # denied: not runnable either
    ({"tool_name": "web__add", "arguments": {"a": 1, "b": 2}}, 404, "tool_name"),
    ({"tool_name": "demo__add", "arguments": [1, 2]}, 400, "arguments"),
    ({"tool_name": "demo__add", "arguments": "{not json"}, 400, "arguments"),
    ({"arguments": {}}, 400, "tool_name"),
    ([1, 2], 400, None),
])  # fmt: skip
def test_bad_execute_requests(
    daemon: DaemonProcess, payload: Any, status: int, param: str | None
) -> None:
    response = execute(daemon, payload)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param


def test_status_health_and_metrics_show_mcp(daemon: DaemonProcess) -> None:
    execute(daemon, {"tool_name": "demo__add", "arguments": {"a": 1, "b": 1}})
    execute(daemon, {"tool_name": "demo__fail"})
    status = httpx.get(f"{daemon.base_url}/v1/status", headers=AUTH, timeout=10).json()
    assert {s["name"]: s["state"] for s in status["mcp"]["servers"]}["demo"] == "ready"
    health = httpx.get(f"{daemon.base_url}/health", timeout=10).json()
    assert {"name": "web", "state": "ready"} in health["mcp"]
    text = httpx.get(f"{daemon.base_url}/metrics", timeout=10).text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    calls = "vllm_mlx_mcp_tool_calls_total"
    ok = (calls, (("outcome", "ok"), ("server", "demo"), ("tool", "add")))
    failed = (calls, (("outcome", "tool_error"), ("server", "demo"), ("tool", "fail")))
    assert samples[ok] >= 1
    assert samples[failed] >= 1
    assert samples[("vllm_mlx_mcp_tool_call_duration_seconds_count", (("server", "demo"),))] >= 2


def test_seed_json_file_servers(daemon: DaemonProcess) -> None:
    response = execute(daemon, {"tool_name": "seeded__echo", "arguments": {"text": "seed"}})
    assert response.json()["content"][0]["text"] == "seed"


def test_the_filesystem_example_from_the_docs(daemon: DaemonProcess) -> None:
    read = execute(
        daemon, {"tool_name": "files__read_file", "arguments": {"path": "notes/todo.md"}}
    )
    assert read.json()["content"] == [{"type": "text", "text": TODO}]
    found = execute(daemon, {"tool_name": "files__search_files", "arguments": {"pattern": "*.md"}})
    assert found.json()["content"][0]["text"] == "notes/todo.md"
    escape = execute(
        daemon, {"tool_name": "files__read_file", "arguments": {"path": "../mcp.json"}}
    )
    assert escape.json()["is_error"] is True
    assert "outside the served directory" in escape.json()["content"][0]["text"]


# --- generation ------------------------------------------------------------------------


def test_offer_adds_mcp_tools_to_a_chat_request(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model="offer", messages=ASK, tools=[CLIENT_TOOL], max_tokens=60
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("demo__add", {"a": 2, "b": 3})
    ]
    assert "mcp_tool_calls" not in response.model_dump()  # offer never runs anything


def test_offer_adds_mcp_tools_to_a_messages_request(daemon: DaemonProcess) -> None:
    client = anthropic.Anthropic(base_url=daemon.base_url, api_key=KEY, max_retries=0)
    message = client.messages.create(
        model="offer", max_tokens=60, messages=[{"role": "user", "content": "What is 2 + 3?"}]
    )
    uses = [block for block in message.content if block.type == "tool_use"]
    assert [(u.name, u.input) for u in uses] == [("demo__add", {"a": 2, "b": 3})]
    assert message.stop_reason == "tool_use"


def test_execute_on_messages_runs_the_loop_too(daemon: DaemonProcess) -> None:
    client = anthropic.Anthropic(base_url=daemon.base_url, api_key=KEY, max_retries=0)
    raw = client.messages.with_raw_response.create(
        model="exec", max_tokens=60, messages=[{"role": "user", "content": "What is 2 + 3?"}]
    )
    body = json.loads(raw.http_response.text)
    ran = [(r["round"], r["name"], r["input"], r["content"]) for r in body["mcp_tool_calls"]]
    assert ran == [(n, "demo__add", {"a": 2, "b": 3}, "5") for n in (1, 2)]
    assert body["stop_reason"] == "tool_use"  # max_tool_rounds: the third call comes back
    message = raw.parse()  # still a valid Anthropic message for the SDK
    assert [b.type for b in message.content] == ["text", "tool_use"]


def test_execute_on_a_messages_stream(daemon: DaemonProcess) -> None:
    client = anthropic.Anthropic(base_url=daemon.base_url, api_key=KEY, max_retries=0)
    ask = [{"role": "user", "content": "What is 2 + 3?"}]
    starts = []
    with client.messages.stream(model="exec", max_tokens=60, messages=ask) as stream:  # type: ignore[arg-type]
        for event in stream:
            if event.type == "content_block_start":
                starts.append(event.content_block.model_dump())
        message = stream.get_final_message()
    kinds = [block.type for block in message.content]
    assert kinds == ["text", "tool_use", "mcp_tool_result"] * 2 + ["text", "tool_use"]
    assert [s.get("mcp") for s in starts if s["type"] == "tool_use"] == [{"server": "demo"}] * 3
    results = [s for s in starts if s["type"] == "mcp_tool_result"]
    uses = [s for s in starts if s["type"] == "tool_use"]
    assert [(r["tool_use_id"], r["content"], r["is_error"]) for r in results] == [
        (uses[0]["id"], [{"type": "text", "text": "5"}], False),
        (uses[1]["id"], [{"type": "text", "text": "5"}], False),
    ]
    assert message.stop_reason == "tool_use"
    assert message.usage.output_tokens > 0
    # The client sends the reply back as the SDK kept it (executed calls and their
    # results included) with its own result for the last call: the next turn runs.
    last = message.content[-1]
    assert last.type == "tool_use"
    history = [
        *ask,
        {"role": "assistant", "content": message.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": last.id,
                                      "content": "5"}]},
    ]  # fmt: skip
    follow = client.messages.create(model="exec", max_tokens=8, messages=history)  # type: ignore[arg-type]
    assert follow.role == "assistant" and prompt_tokens(follow.usage) > 0


def test_execute_runs_mcp_calls_until_max_tool_rounds(client: openai.OpenAI) -> None:
    # The replay calls demo__add every time: two rounds run, the third call comes back.
    raw = client.chat.completions.with_raw_response.create(
        model="exec", messages=ASK, max_tokens=60
    )
    body = json.loads(raw.text)
    ran = body["mcp_tool_calls"]
    assert [(r["round"], r["name"], r["content"], r["is_error"]) for r in ran] == [
        (1, "demo__add", "5", False),
        (2, "demo__add", "5", False),
    ]
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "demo__add"
    single = client.chat.completions.create(model="offer", messages=ASK, max_tokens=60)
    assert single.usage is not None
    assert body["usage"]["prompt_tokens"] > 3 * single.usage.prompt_tokens  # three prompts


def test_execute_streams_calls_and_results_with_a_marker(daemon: DaemonProcess) -> None:
    payload = {"model": "exec", "messages": ASK, "max_tokens": 60, "stream": True,
               "stream_options": {"include_usage": True}}  # fmt: skip
    deltas, reasons, usage = [], [], None
    with httpx.stream("POST", f"{daemon.base_url}/v1/chat/completions", json=payload,
                      headers=AUTH, timeout=120) as response:  # fmt: skip
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            usage = chunk.get("usage") or usage
            for choice in chunk["choices"]:
                deltas.append(choice["delta"])
                reasons.append(choice["finish_reason"])
    starts = [c for d in deltas for c in d.get("tool_calls", []) if "id" in c]
    assert [(c["index"], c["function"]["name"], c["mcp"]) for c in starts] == [
        (i, "demo__add", {"server": "demo"}) for i in range(3)
    ]
    results = [r for d in deltas for r in d.get("mcp_tool_results", [])]
    assert [(r["round"], r["content"], r["id"]) for r in results] == [
        (1, "5", starts[0]["id"]),
        (2, "5", starts[1]["id"]),
    ]
    assert [r for r in reasons if r] == ["tool_calls"]  # one finish, at the very end
    assert usage is not None and usage["completion_tokens"] > 0


def test_execute_stream_reads_with_the_openai_sdk(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model="exec", messages=ASK, max_tokens=60, stream=True)
    names = [
        call.function.name
        for chunk in stream
        for choice in chunk.choices
        for call in choice.delta.tool_calls or []
        if call.function and call.function.name
    ]
    assert names == ["demo__add"] * 3


def test_client_tools_win_a_name_clash_and_are_never_executed(client: openai.OpenAI) -> None:
    own = {"type": "function", "function": {"name": "demo__add", "parameters": {}}}
    raw = client.chat.completions.with_raw_response.create(
        model="exec",
        messages=ASK,
        tools=[own],
        max_tokens=60,  # type: ignore[list-item]
    )
    body = json.loads(raw.text)
    assert "mcp_tool_calls" not in body
    assert body["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "demo__add"


# --- supervision (last: it kills a server) ---------------------------------------------


def test_a_crashed_server_is_reconnected(daemon: DaemonProcess) -> None:
    before = wait_for(daemon.base_url, all_ready({"crashy"}), "crashy ready", AUTH)
    response = execute(daemon, {"tool_name": "crashy__crash"})
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "mcp_server_unavailable"
    seen = wait_for(
        daemon.base_url,
        lambda s: (
            s["crashy"]["state"] == "ready"
            and s["crashy"]["connects"] > before["crashy"]["connects"]
        ),
        "crashy reconnected",
        AUTH,
    )
    assert seen["demo"]["state"] == "ready"  # the others never noticed
    fresh = execute(daemon, {"tool_name": "crashy__calls"}).json()
    assert fresh["content"][0]["text"] == "0"  # a new process


# --- hot reload (last: it replaces the servers) ----------------------------------------


def _save_servers(daemon: DaemonProcess, servers: dict[str, Any]) -> None:
    """Rewrite mcp.servers the way editors save: a new file renamed over the old."""
    settings = yaml.safe_load(daemon.config_path.read_text())
    settings["mcp"]["servers"] = servers
    scratch = daemon.config_path.with_suffix(".tmp")
    scratch.write_text(yaml.safe_dump(settings, sort_keys=False))
    os.replace(scratch, daemon.config_path)


def test_hot_reload_adds_changes_and_removes_servers(daemon: DaemonProcess, tmp_path: Path) -> None:
    url = daemon.base_url
    _save_servers(daemon, {"second": stdio_server(allowed_tools=["echo"])})
    gone = {"demo", "crashy", "web", "legacy", "files"}
    seen = wait_for(url, lambda s: not gone & set(s) and all_ready({"second", "seeded"})(s),
                    "the old servers removed, second added", AUTH)  # fmt: skip
    assert seen["second"]["tools"] == 1  # the seed's file still counts
    names = set(tool_names(daemon))
    assert "second__echo" in names and not any(n.startswith("demo__") for n in names)

    # A changed server restarts with its new settings.
    _save_servers(daemon, {"second": stdio_server(allowed_tools=["add"])})
    wait_for(url, lambda s: all_ready({"second"})(s) and "second__add" in tool_names(daemon),
             "second restarted with add", AUTH)  # fmt: skip

    # One that cannot start is an error state, never a daemon failure.
    _save_servers(daemon, {"broken": {"command": str(tmp_path / "nope")}})
    seen = wait_for(url, lambda s: s.get("broken", {}).get("state") == "error", "broken", AUTH)
    assert seen["broken"]["error"]
    assert seen["seeded"]["state"] == "ready"
    health = httpx.get(f"{url}/health", timeout=10)
    assert health.status_code == 200  # the models still serve
    broken = next(s for s in health.json()["mcp"] if s["name"] == "broken")
    assert broken["state"] == "error" and broken["error"]
    status = httpx.get(f"{url}/v1/status", headers=AUTH, timeout=10).json()
    assert [m["state"] for m in status["models"]] == ["running", "running"]
    assert status["config"]["last_error"] is None
    assert daemon.log_text().count('"model loaded"') == 2  # no model was touched

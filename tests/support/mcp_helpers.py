"""Helpers for MCP tests: the test server's command lines, and waiting on server states."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

SERVER_SCRIPT = Path(__file__).with_name("mcp_server.py")
REPLAY_MCP_CALL = Path(__file__).resolve().parents[1] / "fixtures" / "replay" / "mcp_call.json"
DEADLINE_S = 60.0


def stdio_server(**extra: Any) -> dict[str, Any]:
    """A `mcp.servers` entry running the test server over stdio."""
    return {"command": sys.executable, "args": [str(SERVER_SCRIPT)], **extra}


@contextlib.contextmanager
def http_server(port: int, transport: str = "http") -> Iterator[str]:
    """The test server on streamable HTTP (or `sse`) at 127.0.0.1:port; yields its URL."""
    process = subprocess.Popen(
        [sys.executable, str(SERVER_SCRIPT), f"--{transport}", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + DEADLINE_S
        while True:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the MCP HTTP test server did not start")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/{'sse' if transport == 'sse' else 'mcp'}"
    finally:
        process.terminate()
        process.wait(10)


def servers(base_url: str, headers: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    response = httpx.get(f"{base_url}/v1/mcp/servers", headers=headers, timeout=10)
    response.raise_for_status()
    return {s["name"]: s for s in response.json()["servers"]}


def wait_for(
    base_url: str,
    condition: Callable[[dict[str, dict[str, Any]]], bool],
    what: str,
    headers: dict[str, str] | None = None,
    timeout: float = DEADLINE_S,
) -> dict[str, dict[str, Any]]:
    """Poll /v1/mcp/servers until `condition` holds (a deadline, not a fixed sleep)."""
    deadline = time.monotonic() + timeout
    seen: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        seen = servers(base_url, headers)
        if condition(seen):
            return seen
        time.sleep(0.1)
    raise TimeoutError(f"MCP servers never reached: {what}; last seen {seen}")


def all_ready(names: set[str]) -> Callable[[dict[str, dict[str, Any]]], bool]:
    return lambda seen: names <= set(seen) and all(seen[n]["state"] == "ready" for n in names)

"""Helpers for the ops e2e tests: scraping /metrics, polling /v1/status, raw streams."""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import DaemonProcess

# SmolLM2's end-of-sequence token; biasing it away makes a generation run to max_tokens.
NO_EOS = {"2": -100}
MODEL = "smollm2-135m-instruct"

T = TypeVar("T")

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def wait_for(check: Callable[[], T | None], timeout: float = 120.0, what: str = "") -> T:
    """Poll check() until it returns something truthy (a condition, not a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what or check}")
        time.sleep(0.05)


def scrape(daemon: DaemonProcess, headers: dict[str, str] | None = None) -> Samples:
    response = httpx.get(f"{daemon.base_url}/metrics", headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    out: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def status(daemon: DaemonProcess, headers: dict[str, str] | None = None) -> dict[str, Any]:
    response = httpx.get(f"{daemon.base_url}/v1/status", headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    document: dict[str, Any] = response.json()
    return document


def chat_body(content: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": "default",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }


def open_raw_request(
    daemon: DaemonProcess, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> socket.socket:
    """Send a POST on a bare socket, so the test can hang up whenever it likes."""
    payload = json.dumps(body).encode()
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: 127.0.0.1:{daemon.port}",
        "Content-Type: application/json",
        f"Content-Length: {len(payload)}",
        *(f"{k}: {v}" for k, v in (headers or {}).items()),
    ]
    sock = socket.create_connection(("127.0.0.1", daemon.port), timeout=120)
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + payload)
    return sock


def read_stream_id(sock: socket.socket) -> str:
    """The request id from the first SSE chunk of a raw streaming response."""
    received = b""
    while (match := re.search(rb'"id":"([A-Za-z0-9_-]+)"', received)) is None:
        chunk = sock.recv(4096)
        assert chunk, f"connection closed before the first chunk: {received!r}"
        received += chunk
    return match.group(1).decode()


def live_ids(document: dict[str, Any], phase: str | None = None) -> set[str]:
    return {r["request_id"] for r in document["requests"] if phase is None or r["phase"] == phase}


def logged_statuses(daemon: DaemonProcess) -> dict[str, int]:
    """request_id -> HTTP status from the daemon's JSON request log lines."""
    out = {}
    for line in daemon.log_text().splitlines():
        if '"request_id"' not in line:
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("event") == "request":
            out[record["request_id"]] = record["status"]
    return out

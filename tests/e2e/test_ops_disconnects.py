"""Timeouts and disconnects free their batch slot at once (a real daemon, real sockets)."""

from __future__ import annotations

import json
import socket
import threading
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import DaemonProcess
from tests.e2e.ops_support import (
    NO_EOS,
    chat_body,
    live_ids,
    logged_statuses,
    open_raw_request,
    read_stream_id,
    status,
    wait_for,
)

CHAT = "/v1/chat/completions"


def _idle(daemon: DaemonProcess) -> dict[str, Any]:
    return wait_for(
        lambda: (d := status(daemon))["num_running"] == 0 and d["num_waiting"] == 0 and d,
        120,
        "every batch slot to be free",
    )


def test_non_streaming_timeout_is_a_504_and_frees_the_slot(shared_daemon: DaemonProcess) -> None:
    client = openai.OpenAI(base_url=f"{shared_daemon.base_url}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(
            **chat_body("Write a long essay.", 4000, logit_bias=NO_EOS),
            extra_body={"timeout": 1.0},
        )
    assert caught.value.status_code == 504
    error = caught.value.body
    assert isinstance(error, dict) and error["code"] == "timeout"
    assert _idle(shared_daemon)["requests"] == []


def test_streaming_timeout_sends_an_error_event_and_closes(shared_daemon: DaemonProcess) -> None:
    body = chat_body("Write a long essay.", 4000, logit_bias=NO_EOS, stream=True, timeout=1.0)
    with httpx.stream("POST", f"{shared_daemon.base_url}{CHAT}", json=body, timeout=120) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["type"] == "timeout_error"
    assert _idle(shared_daemon)["requests"] == []


def test_request_timeout_must_be_positive(shared_daemon: DaemonProcess) -> None:
    body = chat_body("Hi", 2, timeout=0)
    response = httpx.post(f"{shared_daemon.base_url}{CHAT}", json=body, timeout=60)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "timeout"


def test_non_streaming_disconnect_aborts_generation(shared_daemon: DaemonProcess) -> None:
    body = chat_body("Write a long essay.", 4000, logit_bias=NO_EOS)
    sock = open_raw_request(shared_daemon, CHAT, body)
    try:
        running = wait_for(
            lambda: live_ids(status(shared_daemon), "generation"), 120, "the request to run"
        )
    finally:
        sock.close()
    [request_id] = running
    _idle(shared_daemon)  # long before 2000 tokens could have been generated
    statuses = wait_for(
        lambda: (s := logged_statuses(shared_daemon)).get(request_id) and s, 30, "the log line"
    )
    assert statuses[request_id] == 499


def _stream_to_end(daemon: DaemonProcess, body: dict[str, Any], out: list[dict[str, Any]]) -> None:
    chunks = []
    with httpx.stream("POST", f"{daemon.base_url}{CHAT}", json=body, timeout=600) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:]))
    out.append({"chunks": chunks})


def test_disconnecting_four_of_eight_streams_frees_their_slots(
    shared_daemon: DaemonProcess,
) -> None:
    victims: list[socket.socket] = []
    survivors: list[threading.Thread] = []
    results: list[dict[str, Any]] = []
    try:
        # Victims would run for 4000 tokens (minutes here); only a disconnect ends them soon.
        long_body = chat_body("Write a long essay.", 4000, logit_bias=NO_EOS, stream=True)
        victims = [open_raw_request(shared_daemon, CHAT, long_body) for _ in range(4)]
        victim_ids = {read_stream_id(sock) for sock in victims}
        short_body = chat_body("Write a poem.", 24, logit_bias=NO_EOS, stream=True)
        for _ in range(4):
            worker = threading.Thread(target=_stream_to_end, args=(shared_daemon, short_body,
                                                                   results))  # fmt: skip
            worker.start()
            survivors.append(worker)
        full = wait_for(
            lambda: (d := status(shared_daemon))["num_running"] == 8 and d, 120, "8 running"
        )
        assert victim_ids <= live_ids(full)
        for sock in victims:
            sock.close()
        after = wait_for(
            lambda: (
                (d := status(shared_daemon))["num_running"] <= 4
                and not victim_ids & live_ids(d)
                and d
            ),
            120,
            "the disconnected streams to leave the batch",
        )
        assert after["num_running"] <= 4
    finally:
        for sock in victims:
            sock.close()
        for worker in survivors:
            worker.join(600)
    assert len(results) == 4
    for result in results:
        reasons = [c["choices"][0]["finish_reason"] for c in result["chunks"] if c["choices"]]
        assert reasons[-1] == "length"
    statuses = wait_for(
        lambda: (s := logged_statuses(shared_daemon)).keys() >= victim_ids and s, 30, "the logs"
    )
    assert {statuses[v] for v in victim_ids} == {499}
    _idle(shared_daemon)

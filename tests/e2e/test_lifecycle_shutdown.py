"""SIGTERM drain, the drain timeout, and the second signal, against the real daemon."""

from __future__ import annotations

import signal

import anthropic
import httpx
import openai
import pytest

from tests.conftest import StartDaemon
from tests.e2e.lifecycle_helpers import DEADLINE_S, Stream, client, get, poll


def test_sigterm_lets_four_streams_finish_then_exits_zero(start_daemon: StartDaemon) -> None:
    daemon = start_daemon({"server": {"drain_timeout": 120}})
    streams = [Stream(client(daemon), max_tokens=24) for _ in range(4)]
    for stream in streams:
        stream.wait_started()
    daemon.process.send_signal(signal.SIGTERM)

    poll(lambda: get(daemon, "/health") == 503, "health to turn 503")
    assert not all(s.done for s in streams), "the streams ended before the drain was seen"
    health = httpx.get(f"{daemon.base_url}/health", timeout=10).json()
    assert health["status"] == "draining"
    with pytest.raises(openai.APIStatusError) as refused:
        client(daemon).chat.completions.create(
            model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
    assert refused.value.status_code == 503
    body = refused.value.body
    assert isinstance(body, dict) and body.get("code") == "shutting_down", body
    with pytest.raises(anthropic.APIStatusError) as refused_anthropic:
        anthropic.Anthropic(
            base_url=daemon.base_url, api_key="unused", max_retries=0
        ).messages.create(
            model="default", max_tokens=2, messages=[{"role": "user", "content": "Hi"}]
        )
    assert refused_anthropic.value.status_code == 503
    assert refused_anthropic.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]

    for stream in streams:
        stream.wait()
        assert stream.error is None, stream.error
        assert (stream.finish_reason, stream.completion_tokens) == ("length", 24)
    assert daemon.process.wait(DEADLINE_S) == 0
    assert '"event": "drained"' in daemon.log_text()


def test_drain_timeout_aborts_what_is_left_and_exits_zero(start_daemon: StartDaemon) -> None:
    daemon = start_daemon({"server": {"drain_timeout": 1}})
    stream = Stream(client(daemon), max_tokens=2000)
    stream.wait_started()
    daemon.process.send_signal(signal.SIGTERM)
    assert daemon.process.wait(DEADLINE_S) == 0
    stream.wait()
    assert "drain timeout: aborting requests" in daemon.log_text()
    # Cut short: it ended (with an ending, or a closed connection) well before 2000 tokens.
    assert stream.completion_tokens is None or stream.completion_tokens < 2000


def test_second_signal_exits_at_once(start_daemon: StartDaemon) -> None:
    daemon = start_daemon({"server": {"drain_timeout": 600}})
    stream = Stream(client(daemon), max_tokens=2000)
    stream.wait_started()
    daemon.process.send_signal(signal.SIGTERM)
    poll(lambda: get(daemon, "/health") == 503, "the drain to start")
    daemon.process.send_signal(signal.SIGINT)
    # Without the second signal this would wait out a 600 s drain.
    assert daemon.process.wait(DEADLINE_S) == 1
    stream.wait()
    assert stream.error is not None or (stream.completion_tokens or 0) < 2000
    assert "second stop signal: exiting now" in daemon.log_text()

"""The recorded agent sessions bench/agent_sessions.py replays: complete, as the clients
sent them (the volatile lines intact), and replayed with only the answer's length,
streaming and sampling changed."""

from __future__ import annotations

from typing import Any

import pytest
from bench.agent_sessions import (
    CLIENTS,
    NEW_TOKENS,
    is_model_call,
    recorded,
    replay_body,
    sessions_of,
)


@pytest.mark.parametrize("client", CLIENTS)
def test_each_client_has_five_sessions_of_four_turns_each_with_a_model_call(client: str) -> None:
    sessions = sessions_of(recorded(client))
    assert sorted(sessions) == [0, 1, 2, 3, 4]
    for turns in sessions.values():
        assert sorted(turns) == [0, 1, 2, 3]
        for requests in turns.values():
            assert any(is_model_call(r) for r in requests)


def first_system_text(body: dict[str, Any]) -> str:
    system = body["system"]
    return system if isinstance(system, str) else system[0]["text"]


def test_claude_code_billing_lines_differ_between_sessions_and_hold_within_one() -> None:
    sessions = sessions_of(recorded("claude-code"))
    lines = {
        index: {
            first_system_text(r["body"]) for rs in turns.values() for r in rs if is_model_call(r)
        }
        for index, turns in sessions.items()
    }
    for index, seen in lines.items():
        assert len(seen) == 1, (index, seen)  # one line per session
        assert next(iter(seen)).startswith("x-anthropic-billing-header: cc_version=2.1.197.")
    assert len({next(iter(seen)) for seen in lines.values()}) > 1


def test_later_turns_carry_the_history() -> None:
    for client in CLIENTS:
        for turns in sessions_of(recorded(client)).values():
            calls = [r for t in sorted(turns) for r in turns[t] if is_model_call(r)]
            history = "messages" if client == "claude-code" else "input"
            assert len(calls[-1]["body"][history]) > len(calls[0]["body"][history])


@pytest.mark.parametrize("client", CLIENTS)
def test_a_replayed_body_changes_only_length_stream_and_sampling(client: str) -> None:
    record = next(r for r in recorded(client) if is_model_call(r))
    body = replay_body(record)
    length = "max_tokens" if client == "claude-code" else "max_output_tokens"
    assert body[length] == NEW_TOKENS and body["stream"] is True and body["temperature"] == 0
    pinned = {length, "stream", "temperature", "top_p"}
    assert {k: v for k, v in body.items() if k not in pinned} == {
        k: v for k, v in record["body"].items() if k not in pinned
    }

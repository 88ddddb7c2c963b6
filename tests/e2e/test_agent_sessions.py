"""Two Claude Code sessions, each opening `system` with its own billing line, share the
cached prefix after it (engine.prompt_canonicalization's default); with the default
turned off, the second session pays its prefill again. Read from /metrics."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from tests.conftest import DaemonProcess, running
from tests.e2e.ops_support import scrape, value, wait_for

MODEL = "smollm2-135m-instruct"
HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"
# Byte for byte Claude Code 2.1.197's first system block, from two sessions.
SESSIONS = [
    "x-anthropic-billing-header: cc_version=2.1.197.a3f; cc_entrypoint=sdk-cli;",
    "x-anthropic-billing-header: cc_version=2.1.197.07c; cc_entrypoint=sdk-cli;",
]
AGENT = "You are a coding agent. Read files before editing them. Keep changes small. " * 12


def daemon_with(tmp: Path, cache_dir: Path, patterns: list[str] | None) -> Any:
    engine = {} if patterns is None else {"prompt_canonicalization": patterns}
    config = {
        "models": [{"name": MODEL, "source": "builtin:smollm2-135m-instruct"}],
        "metrics": {"enabled": True},
        "engine": engine,
    }
    return running(tmp, cache_dir, config)


@pytest.fixture(scope="module")
def default_daemon(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path
) -> Iterator[DaemonProcess]:
    with daemon_with(tmp_path_factory.mktemp("agent"), model_cache_dir, None) as daemon:
        yield daemon


def session_turn(daemon: DaemonProcess, header: str, question: str) -> tuple[int, int]:
    """One first turn of a session: (its prompt tokens, how many came from the cache)."""
    before = scrape(daemon)
    client = anthropic.Anthropic(base_url=daemon.base_url, api_key="unused")
    reply = client.messages.create(
        model=MODEL,
        max_tokens=2,
        system=[{"type": "text", "text": header}, {"type": "text", "text": AGENT}],
        messages=[{"role": "user", "content": question}],
    )
    prompt = reply.usage.input_tokens
    assert prompt > 150  # the agent's prefix is the bulk of it

    def counted() -> float | None:
        # Queries and hits are counted together, at the end of the request's prefill.
        now = scrape(daemon)
        queried = value(now, QUERIES, model_name=MODEL) - value(before, QUERIES, model_name=MODEL)
        return value(now, HITS, model_name=MODEL) + 1 if queried >= prompt else None

    hits = wait_for(counted, 30, "the request's prefix cache counters") - 1
    return prompt, int(hits - value(before, HITS, model_name=MODEL))


def test_a_new_session_reuses_the_last_sessions_prefix(default_daemon: DaemonProcess) -> None:
    session_turn(default_daemon, SESSIONS[0], "What does this repo do?")
    prompt, reused = session_turn(default_daemon, SESSIONS[1], "Where is main?")
    assert reused > 0.9 * prompt, (reused, prompt)


def test_with_the_default_off_a_new_session_misses(tmp_path: Path, model_cache_dir: Path) -> None:
    with daemon_with(tmp_path, model_cache_dir, []) as daemon:
        session_turn(daemon, SESSIONS[0], "What does this repo do?")
        prompt, reused = session_turn(daemon, SESSIONS[1], "Where is main?")
        # The billing line differs within its first tokens: almost nothing is reused.
        assert reused < 0.2 * prompt, (reused, prompt)

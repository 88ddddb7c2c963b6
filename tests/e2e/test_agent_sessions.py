"""Two Claude Code sessions, each opening `system` with its own billing line, share the
cached prefix after it (engine.prompt_canonicalization's default); with the default
turned off, the second session pays its prefill again. Read from `usage`
(cache_read_input_tokens) and /metrics, which must agree."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.conftest import DaemonProcess, running
from tests.e2e.ops_support import scrape, status, value, wait_for
from tests.support.anthropic import prompt_tokens

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
    """One first turn of a session: (its prompt tokens, how many came from the cache),
    as its `usage` says; /metrics must say the same."""
    before = scrape(daemon)
    client = anthropic.Anthropic(base_url=daemon.base_url, api_key="unused")
    reply = client.messages.create(
        model=MODEL,
        max_tokens=2,
        system=[{"type": "text", "text": header}, {"type": "text", "text": AGENT}],
        messages=[{"role": "user", "content": question}],
    )
    usage = reply.usage
    prompt = prompt_tokens(usage)
    assert prompt > 150  # the agent's prefix is the bulk of it
    read = usage.cache_read_input_tokens or 0

    def counted() -> float | None:
        # Queries and hits are counted together, at the end of the request's prefill.
        now = scrape(daemon)
        queried = value(now, QUERIES, model_name=MODEL) - value(before, QUERIES, model_name=MODEL)
        return value(now, HITS, model_name=MODEL) + 1 if queried >= prompt else None

    hits = wait_for(counted, 30, "the request's prefix cache counters") - 1
    assert int(hits - value(before, HITS, model_name=MODEL)) == read
    return prompt, read


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


def test_openai_chat_and_responses_drop_the_line_and_report_cached_tokens(
    default_daemon: DaemonProcess,
) -> None:
    """The same billing line in OpenAI system text (a proxy forwarding Claude Code) is
    left out too; each API says in its usage how much of the prompt the cache gave."""
    before = scrape(default_daemon)
    client = openai.OpenAI(base_url=f"{default_daemon.base_url}/v1", api_key="unused")
    system = "Chat API. " + AGENT
    chats = [
        client.chat.completions.create(
            model=MODEL,
            max_tokens=2,
            messages=[
                {"role": "system", "content": f"{header}\n{system}"},
                {"role": "user", "content": question},
            ],
        )
        for header, question in zip(SESSIONS, ["What does this do?", "Where is main?"], strict=True)
    ]
    usage = chats[1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens > 0.9 * usage.prompt_tokens
    responses = [
        client.responses.create(
            model=MODEL,
            max_output_tokens=16,
            instructions=f"{header}\nResponses API. {AGENT}",
            input=question,
        )
        for header, question in zip(SESSIONS, ["List the files.", "Run the tests."], strict=True)
    ]
    second = responses[1].usage
    assert second is not None
    assert second.input_tokens_details.cached_tokens > 0.9 * second.input_tokens
    prompt = "def add(a, b):\n    return a + b\n" * 20
    completions = [
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=2) for _ in range(2)
    ]
    repeat = completions[1].usage
    assert repeat is not None and repeat.prompt_tokens_details is not None
    assert repeat.prompt_tokens_details.cached_tokens > 0.9 * repeat.prompt_tokens
    # The cached share histogram saw the three repeats in its top buckets.
    after = scrape(default_daemon)
    share = "vllm_mlx_prompt_cached_fraction_bucket"

    def high(samples: Any) -> float:
        every = value(samples, share, model_name=MODEL, le="+Inf")
        return every - value(samples, share, model_name=MODEL, le="0.9")

    assert high(after) - high(before) >= 3


def test_a_restart_with_the_disk_tier_serves_the_prefix_from_disk(
    tmp_path: Path, model_cache_dir: Path
) -> None:
    """A new session after a daemon restart: the prefix comes from the disk tier
    (engine.disk_cache_mb, under its own paths.cache_dir), and greedy output is what a
    cold run gives."""
    config = {
        "models": [{"name": MODEL, "source": "builtin:smollm2-135m-instruct"}],
        "metrics": {"enabled": True},
        "engine": {"disk_cache_mb": 64},
    }
    # The tier's own cache directory, so the shared one stays cold for other tests; the
    # imported bundled model is linked in rather than imported again.
    cache = tmp_path / "cache"
    cache.mkdir()
    for item in model_cache_dir.iterdir():
        (cache / item.name).symlink_to(item)
    for run_dir in ("first", "second"):
        (tmp_path / run_dir).mkdir()

    def greedy_turn(daemon: DaemonProcess, header: str) -> tuple[int, int, str]:
        client = anthropic.Anthropic(base_url=daemon.base_url, api_key="unused")
        reply = client.messages.create(
            model=MODEL,
            max_tokens=8,
            extra_body={"temperature": 0},
            system=[{"type": "text", "text": header}, {"type": "text", "text": AGENT}],
            messages=[{"role": "user", "content": "What does this repo do?"}],
        )
        text = "".join(block.text for block in reply.content if block.type == "text")
        return prompt_tokens(reply.usage), reply.usage.cache_read_input_tokens or 0, text

    with running(tmp_path / "first", cache, config) as daemon:
        prompt, read, cold_text = greedy_turn(daemon, SESSIONS[0])
        assert read == 0
    assert list((cache / "prefix-cache").rglob("*.kv"))
    with running(tmp_path / "second", cache, config) as daemon:
        prompt, read, text = greedy_turn(daemon, SESSIONS[1])
        disk = status(daemon)["models"][0]["cache"]["disk"]
        check_the_cache_endpoints(daemon, cache)
    assert read > 0.9 * prompt, (read, prompt)
    assert text == cold_text
    assert disk["reads"] > 0 and disk["corrupt"] == 0


def check_the_cache_endpoints(daemon: DaemonProcess, cache: Path) -> None:
    """GET /v1/cache/stats and DELETE /v1/cache, one tier then both."""
    url = f"{daemon.base_url}/v1/cache"

    def stats() -> dict[str, Any]:
        response = httpx.get(f"{url}/stats", params={"model": MODEL}, timeout=30)
        assert response.status_code == 200, response.text
        (block,) = response.json()["data"]
        assert block["model"] == MODEL
        return dict(block)

    before = stats()
    assert before["memory"]["entries"] > 0 and before["disk"]["entries"] > 0
    assert before["memory"]["type"] == "paged" and before["disk"]["reads"] > 0
    bad = httpx.delete(url, params={"tier": "gpu"}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tier"
    missing = httpx.get(f"{url}/stats", params={"model": "nope"}, timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"
    cleared = httpx.delete(url, params={"tier": "memory"}, timeout=30).json()["data"]
    assert cleared == [{"model": MODEL, "memory_entries": before["memory"]["entries"]}]
    after = stats()
    assert after["memory"]["entries"] == 0 and after["disk"]["entries"] == before["disk"]["entries"]
    cleared = httpx.delete(url, timeout=30).json()["data"]
    assert cleared[0]["disk_entries"] == before["disk"]["entries"]
    assert stats()["disk"]["entries"] == 0
    assert not list((cache / "prefix-cache").rglob("*.kv"))


def test_warm_prompts_are_cached_before_the_model_is_ready(
    tmp_path: Path, model_cache_dir: Path
) -> None:
    """models[].warm_prompts: the first request that opens with one (text or a file)
    finds it in the cache, though nothing was asked before."""
    from_file = "You are a release agent. Tag, build, publish, announce. " * 10
    (tmp_path / "release.md").write_text(from_file, encoding="utf-8")
    model = {
        "name": MODEL,
        "source": "builtin:smollm2-135m-instruct",
        "warm_prompts": [AGENT, {"file": str(tmp_path / "release.md")}],
    }
    with running(tmp_path, model_cache_dir, {"models": [model]}) as daemon:
        client = openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="unused")
        for system in (AGENT, from_file):
            reply = client.chat.completions.create(
                model=MODEL,
                max_tokens=2,
                messages=[
                    {"role": "system", "content": system},
                    {"role": "user", "content": "Start."},
                ],
            )
            usage = reply.usage
            assert usage is not None and usage.prompt_tokens_details is not None
            # All of the system turn but the block it ends in: the user's turn follows.
            assert usage.prompt_tokens_details.cached_tokens > 0.8 * usage.prompt_tokens
        assert daemon.log_text().count('"warm prompt cached"') == 2

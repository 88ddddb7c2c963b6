"""Agent sessions against the prefix cache: new sessions, later turns, restarts, replayed
from recordings of the real clients.

    python bench/agent_sessions.py                    # both clients, ~40 minutes on 2 cores
    python bench/agent_sessions.py --quick            # 3 sessions of 3 turns
    python bench/agent_sessions.py --clients codex

The requests are the ones Claude Code 2.1.197 and Codex CLI 0.171.0 sent, recorded by
bench/record_agents.py into bench/fixtures/agent-sessions/ (5 sessions of 4 turns each,
every session opening with a different question): Claude Code's billing line with its
per-session suffix, its system prompt and 20-odd tool definitions; Codex's instructions,
environment block and tools; the history as each client sent it. Each recorded request
is sent again, in order, unchanged but for the answer length (max_tokens /
max_output_tokens set to NEW_TOKENS), the stream flag and greedy sampling; the answers
the replay gets are not fed back (the next turn's recorded history already holds the
recorded ones), so every mode sees byte-identical prompts.

Three modes, each on its own daemon (the bundled model):
  (a) engine.prompt_canonicalization: [] and no disk tier (the behaviour before it);
  (b) the default canonicalization, no disk tier;
  (c) the default canonicalization and the disk tier, the daemon restarted before every
      session (its memory cache empty each time).
Per model request: prompt tokens, cached tokens (as the protocol reports them), TTFT.
Then the decode rate at concurrency 16 with the disk tier on and off, side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.loadgen import Scenario, run_scenario, warm_up
from bench.peers import model_directory, running, vllm_mlx_spec
from bench.prompts import PROMPT_SETS
from bench.stats import summarize

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "agent-sessions"
CLIENTS = ("claude-code", "codex")
NEW_TOKENS = 12
MODES = (
    ("(a) no canonicalization", {"prompt_canonicalization": [], "disk_cache_mb": 0}),
    ("(b) canonicalization", {"disk_cache_mb": 0}),
    ("(c) + restart, disk tier", {"disk_cache_mb": 512}),
)


@dataclass
class Turn:
    client: str
    mode: str
    session: int
    turn: int
    prompt: int
    cached: int
    ttft: float


def recorded(client: str, fixtures: Path = FIXTURES) -> list[dict[str, Any]]:
    """The client's recorded requests, in the order it sent them."""
    with gzip.open(fixtures / f"{client}.jsonl.gz", "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines]


def sessions_of(records: list[dict[str, Any]]) -> dict[int, dict[int, list[dict[str, Any]]]]:
    """session -> turn -> that turn's requests, in order."""
    out: dict[int, dict[int, list[dict[str, Any]]]] = {}
    for record in records:
        out.setdefault(record["session"], {}).setdefault(record["turn"], []).append(record)
    return out


def is_model_call(record: dict[str, Any]) -> bool:
    path = record["path"].split("?")[0]
    return record["method"] == "POST" and path in ("/v1/messages", "/v1/responses")


def replay_body(record: dict[str, Any]) -> dict[str, Any]:
    """The recorded body, with only the answer's length, streaming and sampling pinned."""
    body = dict(record["body"])
    length = "max_tokens" if record["path"].startswith("/v1/messages") else "max_output_tokens"
    body.update({length: NEW_TOKENS, "stream": True, "temperature": 0})
    body.pop("top_p", None)
    return body


def events(reply: httpx.Response) -> Iterator[dict[str, Any]]:
    for line in reply.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])


def usage_of(event: dict[str, Any]) -> tuple[int, int] | None:
    """(prompt tokens, cached tokens) when this stream event carries the final usage."""
    if event.get("type") == "message_delta":  # Anthropic: the three parts add up
        usage = event["usage"]
        read = usage.get("cache_read_input_tokens") or 0
        created = usage.get("cache_creation_input_tokens") or 0
        return usage["input_tokens"] + read + created, read
    # Responses: a capped answer (NEW_TOKENS) ends in response.incomplete.
    if event.get("type") in ("response.completed", "response.incomplete"):
        usage = event["response"]["usage"]
        return usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"]
    return None


def send(base_url: str, record: dict[str, Any]) -> tuple[int, int, float] | None:
    """Replay one recorded request; (prompt, cached, TTFT s) when it was a model call."""
    headers = {**record["headers"], "authorization": "Bearer unused"}
    if not is_model_call(record):
        httpx.request(record["method"], base_url + record["path"], headers=headers, timeout=60)
        return None
    started = time.monotonic()
    ttft, usage = None, None
    url = base_url + record["path"]
    with httpx.stream("POST", url, json=replay_body(record), headers=headers, timeout=900) as reply:
        reply.raise_for_status()
        for event in events(reply):
            # The first text delta: Anthropic's content_block_delta, Responses' *.delta.
            if ttft is None and event.get("type", "").endswith(("content_block_delta", ".delta")):
                ttft = time.monotonic() - started
            usage = usage_of(event) or usage
    if usage is None:
        raise RuntimeError(f"no usage in the reply to {record['path']}")
    return usage[0], usage[1], ttft if ttft is not None else time.monotonic() - started


def replay_session(
    client: str, mode: str, base_url: str, index: int, turns: dict[int, list[dict[str, Any]]]
) -> list[Turn]:
    out = []
    for turn, requests in sorted(turns.items()):
        for record in requests:
            measured = send(base_url, record)
            if measured:
                out.append(Turn(client, mode, index, turn, *measured))
                print(f"{client} {mode} session {index} turn {turn}: {out[-1]}",
                      file=sys.stderr, flush=True)  # fmt: skip
    return out


def run_mode(
    client: str, mode: str, engine: dict[str, Any],
    work: Path, model_dir: Path, sessions: dict[int, dict[int, list[dict[str, Any]]]],
) -> list[Turn]:  # fmt: skip
    tag = f"{client}-{mode[1]}"
    cache_dir = work / f"cache-{tag}"
    cache_dir.mkdir()

    def spec() -> Any:
        return vllm_mlx_spec(work, model_dir, mode, engine, paths={"cache_dir": str(cache_dir)})

    results: list[Turn] = []
    if mode.startswith("(c)"):
        for index, turns in sorted(sessions.items()):
            with running(spec(), work / f"{tag}-{index}.log") as server:
                results += replay_session(client, mode, server.base_url, index, turns)
        return results
    with running(spec(), work / f"{tag}.log") as server:
        for index, turns in sorted(sessions.items()):
            results += replay_session(client, mode, server.base_url, index, turns)
    return results


def decode_rate(work: Path, model_dir: Path, disk_mb: int) -> float:
    cache_dir = work / f"decode-{disk_mb}"
    cache_dir.mkdir()
    engine = {"disk_cache_mb": disk_mb}
    label = f"disk {disk_mb} MB"
    spec = vllm_mlx_spec(work, model_dir, label, engine, paths={"cache_dir": str(cache_dir)})
    scenario = Scenario(PROMPT_SETS["unique"], 16, 2, 64, 900.0)
    with running(spec, work / f"decode-{disk_mb}.log") as server:
        asyncio.run(warm_up(server.base_url, server.model_id, scenario))
        summary = summarize(asyncio.run(run_scenario(server.base_url, server.model_id, scenario)))
    return summary.aggregate_tok_s


def decode_rounds(model_dir: Path, rounds: int) -> None:
    """The decode check alone, disk tier off and on alternating (drift hits both)."""
    with tempfile.TemporaryDirectory(prefix="bench-decode-") as tmp:
        ratios = []
        for index in range(rounds):
            work = Path(tmp) / str(index)
            work.mkdir()
            off, on = decode_rate(work, model_dir, 0), decode_rate(work, model_dir, 512)
            ratios.append(on / off)
            print(f"round {index}: disk off {off:.1f} tok/s, on {on:.1f} tok/s: {on / off:.3f}x")
        print(f"mean on/off: {mean(ratios):.3f}x over {rounds} rounds")


def mean(values: list[float]) -> float:
    return statistics.mean(values) if values else 0.0


def report(turns: list[Turn]) -> None:
    print("| client | mode | session | turn | prompt tokens | cached | cached share | TTFT s |")
    print("|---|---|---|---|---|---|---|---|")
    for t in turns:
        share = t.cached / t.prompt if t.prompt else 0.0
        print(f"| {t.client} | {t.mode} | {t.session} | {t.turn} | {t.prompt} | {t.cached} "
              f"| {share:.2f} | {t.ttft:.2f} |")  # fmt: skip
    print()
    print("| client | mode | first turns of sessions 2+: cached share | TTFT s (mean) "
          "| later turns: cached share | TTFT s (mean) |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for client, mode in dict.fromkeys((t.client, t.mode) for t in turns):
        mine = [t for t in turns if t.client == client and t.mode == mode]
        first = [t for t in mine if t.turn == 0 and t.session > 0]
        later = [t for t in mine if t.turn > 0]
        print(f"| {client} | {mode} | {mean([t.cached / t.prompt for t in first]):.2f} "
              f"| {mean([t.ttft for t in first]):.2f} "
              f"| {mean([t.cached / t.prompt for t in later]):.2f} "
              f"| {mean([t.ttft for t in later]):.2f} |")  # fmt: skip
    for client in dict.fromkeys(t.client for t in turns):
        # Cold: (a)'s first turns that found (almost) nothing cached.
        cold = [
            t.ttft for t in turns
            if t.client == client and t.mode[1] == "a" and t.turn == 0 and t.cached < t.prompt / 2
        ]  # fmt: skip
        restarted = [
            t.ttft for t in turns
            if t.client == client and t.mode[1] == "c" and t.turn == 0 and t.session
        ]  # fmt: skip
        if cold and restarted:
            print(f"\n{client}: (c) first-turn TTFT after a restart / (a) cold first turn: "
                  f"{mean(restarted) / mean(cold):.2f}x")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 sessions of 3 turns")
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--no-decode", action="store_true", help="skip the c=16 decode check")
    parser.add_argument(
        "--decode-only", type=int, metavar="ROUNDS", help="only the decode check, ROUNDS times"
    )
    args = parser.parse_args()
    if args.decode_only:
        decode_rounds(model_directory(), args.decode_only)
        return
    limit = 3 if args.quick else None
    model_dir = model_directory()
    with tempfile.TemporaryDirectory(prefix="bench-agents-") as tmp:
        work = Path(tmp)
        results: list[Turn] = []
        for client in [name for name in args.clients.split(",") if name]:
            sessions = sessions_of(recorded(client))
            if limit:
                sessions = {
                    s: {t: r for t, r in turns.items() if t < limit}
                    for s, turns in sessions.items() if s < limit
                }  # fmt: skip
            for mode, engine in MODES:
                results += run_mode(client, mode, engine, work, model_dir, sessions)
        report(results)
        if not args.no_decode:
            off, on = decode_rate(work, model_dir, 0), decode_rate(work, model_dir, 512)
            print(f"\ndecode at c=16: disk off {off:.1f} tok/s, on {on:.1f} tok/s: "
                  f"{on / off:.3f}x")  # fmt: skip


if __name__ == "__main__":
    main()

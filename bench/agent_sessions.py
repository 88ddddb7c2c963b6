"""Agent sessions against the prefix cache: new sessions, later turns, restarts.

    python bench/agent_sessions.py            # ~15 minutes on 2 cores
    python bench/agent_sessions.py --quick    # 3 sessions of 3 turns

Claude Code-shaped Anthropic requests (streamed /v1/messages): `system` opens with
Claude Code's billing block, whose suffix differs per session, then a long agent system
prompt and tool definitions; each turn adds the last answer and a new question. NOT a
recording of the real clients (the recorder is still to be written): the bodies are
built here from the shapes of tests/e2e/test_anthropic_api.py's Claude Code request.

Three modes, each on its own daemon (the bundled model, greedy):
  (a) engine.prompt_canonicalization: [] and no disk tier (the behaviour before it);
  (b) the default canonicalization, no disk tier;
  (c) the default canonicalization and the disk tier, the daemon restarted before every
      session (its memory cache empty each time).
Per turn: prompt tokens, cached tokens (cache_read_input_tokens), TTFT. Then the decode
rate at concurrency 16 with the disk tier on and off, side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.loadgen import Scenario, run_scenario, warm_up
from bench.peers import model_directory, running, vllm_mlx_spec
from bench.prompts import PROMPT_SETS
from bench.stats import summarize

HEADER = "x-anthropic-billing-header: cc_version=2.1.197.{:03x}; cc_entrypoint=sdk-cli;"
AGENT = (
    "You are an interactive CLI agent that helps users with software engineering tasks. "
    "Read files before editing them, keep changes small, run the tests after each change, "
    "and explain what you did in one short paragraph. Never invent file contents. "
) * 24
TOOLS = [
    {
        "name": name,
        "description": f"{name}: {purpose}",
        "input_schema": {
            "type": "object",
            "properties": {arg: {"type": "string", "description": f"The {arg}."}},
            "required": [arg],
        },
    }
    for name, purpose, arg in (
        ("Bash", "Executes a bash command in a persistent shell.", "command"),
        ("Read", "Reads a file from the local filesystem.", "file_path"),
        ("Edit", "Performs exact string replacements in a file.", "file_path"),
        ("Grep", "Searches file contents with a regular expression.", "pattern"),
    )
]
QUESTIONS = [
    "What does this repository do?",
    "Where is the entry point?",
    "Add a --verbose flag to it.",
    "Now run the tests.",
]
NEW_TOKENS = 12


@dataclass
class Turn:
    mode: str
    session: int
    turn: int
    prompt: int
    cached: int
    ttft: float


def body(session: int, history: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "model": "default",
        "max_tokens": NEW_TOKENS,
        "temperature": 0,
        "stream": True,
        "system": [
            {"type": "text", "text": HEADER.format(session * 0x1F3 % 0xFFF)},
            {"type": "text", "text": AGENT, "cache_control": {"type": "ephemeral"}},
        ],
        "tools": TOOLS,
        "messages": history,
    }


def one_turn(base_url: str, request: dict[str, Any]) -> tuple[int, int, float, str]:
    """(prompt tokens, cached, TTFT s, answer text) of one streamed Messages request."""
    started = time.monotonic()
    ttft, text, usage = None, [], {}
    with httpx.stream("POST", f"{base_url}/v1/messages", json=request, timeout=900) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "content_block_delta":
                ttft = ttft if ttft is not None else time.monotonic() - started
                text.append(event["delta"].get("text", ""))
            elif event["type"] == "message_delta":
                usage = event["usage"]
    read = usage.get("cache_read_input_tokens", 0)
    prompt = usage["input_tokens"] + read + usage.get("cache_creation_input_tokens", 0)
    return prompt, read, ttft if ttft is not None else time.monotonic() - started, "".join(text)


def session(mode: str, base_url: str, index: int, turns: int) -> list[Turn]:
    history: list[dict[str, Any]] = []
    out = []
    for turn in range(turns):
        history.append({"role": "user", "content": QUESTIONS[turn % len(QUESTIONS)]})
        prompt, cached, ttft, text = one_turn(base_url, body(index, history))
        history.append({"role": "assistant", "content": text or "OK."})
        out.append(Turn(mode, index, turn, prompt, cached, ttft))
    return out


def run_mode(
    mode: str, work: Path, model_dir: Path, engine: dict[str, Any], sessions: int, turns: int
) -> list[Turn]:
    cache_dir = work / f"cache-{mode}"
    cache_dir.mkdir()
    results: list[Turn] = []
    restart = mode.startswith("(c)")

    def spec() -> Any:
        return vllm_mlx_spec(work, model_dir, mode, engine, paths={"cache_dir": str(cache_dir)})

    if restart:
        for index in range(sessions):
            with running(spec(), work / f"{mode[:3]}-{index}.log") as server:
                results += session(mode, server.base_url, index, turns)
        return results
    with running(spec(), work / f"{mode[:3]}.log") as server:
        for index in range(sessions):
            results += session(mode, server.base_url, index, turns)
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


def report(turns: list[Turn]) -> None:
    print("| mode | session | turn | prompt tokens | cached | cached share | TTFT s |")
    print("|---|---|---|---|---|---|---|")
    for t in turns:
        share = t.cached / t.prompt if t.prompt else 0.0
        print(f"| {t.mode} | {t.session} | {t.turn} | {t.prompt} | {t.cached} "
              f"| {share:.2f} | {t.ttft:.2f} |")  # fmt: skip
    print()
    print("| mode | first turns of sessions 2+: cached share | TTFT s (mean) "
          "| later turns: cached share | TTFT s (mean) |")  # fmt: skip
    print("|---|---|---|---|---|")
    for mode in dict.fromkeys(t.mode for t in turns):
        mine = [t for t in turns if t.mode == mode]
        first = [t for t in mine if t.turn == 0 and t.session > 0]
        later = [t for t in mine if t.turn > 0]

        def share(rows: list[Turn]) -> float:
            return statistics.mean(t.cached / t.prompt for t in rows) if rows else 0.0

        def ttft(rows: list[Turn]) -> float:
            return statistics.mean(t.ttft for t in rows) if rows else 0.0

        print(f"| {mode} | {share(first):.2f} | {ttft(first):.2f} | {share(later):.2f} "
              f"| {ttft(later):.2f} |")  # fmt: skip
    cold = [t.ttft for t in turns if t.mode.startswith("(a)") and t.turn == 0]
    restarted = [t.ttft for t in turns if t.mode.startswith("(c)") and t.turn == 0 and t.session]
    if cold and restarted:
        ratio = statistics.mean(restarted) / statistics.mean(cold)
        print(f"\n(c) first-turn TTFT after a restart / (a) cold first turn: {ratio:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 sessions of 3 turns")
    parser.add_argument("--no-decode", action="store_true", help="skip the c=16 decode check")
    args = parser.parse_args()
    sessions, turns = (3, 3) if args.quick else (5, 4)
    model_dir = model_directory()
    modes = (
        ("(a) no canonicalization", {"prompt_canonicalization": [], "disk_cache_mb": 0}),
        ("(b) canonicalization", {"disk_cache_mb": 0}),
        ("(c) + restart, disk tier", {"disk_cache_mb": 512}),
    )
    with tempfile.TemporaryDirectory(prefix="bench-agents-") as tmp:
        work = Path(tmp)
        results: list[Turn] = []
        for mode, engine in modes:
            results += run_mode(mode, work, model_dir, engine, sessions, turns)
        report(results)
        if not args.no_decode:
            off, on = decode_rate(work, model_dir, 0), decode_rate(work, model_dir, 512)
            print(f"\ndecode at c=16: disk off {off:.1f} tok/s, on {on:.1f} tok/s: "
                  f"{on / off:.3f}x")  # fmt: skip


if __name__ == "__main__":
    main()

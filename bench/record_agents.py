"""Record real agent sessions: Claude Code and Codex CLI against the daemon, every request
they send written down as a fixture, for bench/agent_sessions.py to replay.

    python bench/record_agents.py                      # both clients, 5 sessions x 4 turns
    python bench/record_agents.py --clients codex --sessions 2 --turns 2

Each client runs as a user would: `claude -p QUESTION` (then `claude -p --continue`) and
`codex exec QUESTION` (then `codex exec resume --last`), in one small project directory,
one session after another, each session opening with a different first question. Between
them and the daemon sits
bench/recording_proxy.py, which keeps each request body exactly as the client sent it:
Claude Code's per-session billing line, Codex's environment block, the date, the
history with the model's answers. Nothing is cleaned: the volatile parts are what the
replay measures.

The daemon is the bundled model reading every prompt for real, with its answers forced
to one short reply that ends with the end token (tests/support/replay_daemon.py, a FAKE
for the answers only): the 135M model rarely stops on its own, and Claude Code treats a
capped answer as an error and asks again, which is not the session a user has.

Written: bench/fixtures/agent-sessions/<client>.jsonl.gz, one request per line:
{"client", "version", "session", "turn", "method", "path", "headers", "body"}.
The clients come from npm, pinned (the versions below), into the tests' npm cache.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.npm import npm_prefix

from bench.peers import model_directory, running, vllm_mlx_spec
from bench.recording_proxy import Recording, recording_proxy

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "agent-sessions"
CLAUDE_CODE = ("@anthropic-ai/claude-code", "2.1.197", "claude")
CODEX = ("@openai/codex", "0.171.0", "codex")
ANSWER = "I read greet.py: it prints a greeting for the name given, or for the world."
TURN_TIMEOUT_S = 900
# Per session: a different opening question (Claude Code derives its billing line's
# suffix from it), then follow-ups as a user types them.
OPENINGS = [
    "What does this project do?",
    "Where is the entry point of this program?",
    "Is there anything wrong with greet.py?",
    "Summarize the README in one sentence.",
    "Which files are in this project?",
]
FOLLOW_UPS = [
    "Add a --name flag to it.",
    "Now show me how to run it.",
    "Thanks. Anything else I should change?",
]
PROJECT = {
    "README.md": "# greet\n\nA tiny command-line program that greets the user.\n",
    "greet.py": (
        "import sys\n\n\ndef main() -> None:\n"
        "    print(f\"Hello, {sys.argv[1] if len(sys.argv) > 1 else 'world'}!\")\n\n\n"
        'if __name__ == "__main__":\n    main()\n'
    ),
}
CODEX_CONFIG = """\
model = "default"
model_provider = "vllm-mlx"

[model_providers.vllm-mlx]
name = "vllm-mlx"
base_url = "{base_url}/v1"
wire_api = "responses"
env_key = "VLLM_MLX_API_KEY"
"""


@dataclass(frozen=True)
class AgentCli:
    """How to run one turn of a client: its argv for (question, is a follow-up), its env."""

    argv: Callable[[str, bool], list[str]]
    env: dict[str, str]


def installed(package: tuple[str, str, str]) -> Path:
    """The client's binary, npm-installed once into the tests' cache."""
    name, version, binary = package
    prefix = npm_prefix(f"{binary}-{version}" if binary == "codex" else f"claude-code-{version}")
    path = prefix / "node_modules" / ".bin" / binary
    if not path.exists():
        prefix.mkdir(parents=True, exist_ok=True)
        command = ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(prefix)]
        subprocess.run([*command, f"{name}@{version}"], check=True, timeout=600)
    return path


def questions(session: int, turns: int) -> list[str]:
    return [OPENINGS[session % len(OPENINGS)], *FOLLOW_UPS][:turns]


def claude_code(binary: Path, home: Path, base_url: str) -> AgentCli:
    env = {
        **os.environ,
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_AUTH_TOKEN": "unused",
        "ANTHROPIC_MODEL": "default",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": "default",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "64",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
    }

    def command(question: str, follow_up: bool) -> list[str]:
        resume = ["--continue"] if follow_up else []
        return [str(binary), "-p", *resume, "--output-format", "json", question]

    return AgentCli(command, env)


def codex(binary: Path, home: Path, base_url: str) -> AgentCli:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(CODEX_CONFIG.format(base_url=base_url))
    env = {**os.environ, "CODEX_HOME": str(home), "VLLM_MLX_API_KEY": "unused"}

    def command(question: str, follow_up: bool) -> list[str]:
        resume = ["resume", "--last"] if follow_up else []
        return [str(binary), "exec", *resume, "--skip-git-repo-check", question]

    return AgentCli(command, env)


def record_client(
    client: str, cli: AgentCli, project: Path,
    recording: Recording, sessions: int, turns: int,
) -> None:  # fmt: skip
    for session in range(sessions):
        for turn, question in enumerate(questions(session, turns)):
            recording.tag = {"client": client, "session": session, "turn": turn}
            result = subprocess.run(
                cli.argv(question, turn > 0), cwd=project, env=cli.env,
                capture_output=True, text=True, timeout=TURN_TIMEOUT_S, stdin=subprocess.DEVNULL,
            )  # fmt: skip
            seen = sum(1 for r in recording.records if r.get("client") == client)
            print(f"{client} session {session} turn {turn}: exit {result.returncode}, "
                  f"{seen} requests so far", flush=True)  # fmt: skip
            if result.returncode != 0:
                raise RuntimeError(
                    f"{client} failed: {result.stdout[-2000:]}\n{result.stderr[-2000:]}"
                )


def write(client: str, version: str, records: list[dict[str, Any]], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{client}.jsonl.gz"
    # mtime=0: the same recording gives the same bytes.
    with gzip.GzipFile(path, "wb", mtime=0) as sink:
        for record in records:
            line = {"client": client, "version": version, **record}
            sink.write(json.dumps(line, ensure_ascii=False).encode() + b"\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", default="claude-code,codex")
    parser.add_argument("--sessions", type=int, default=5)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--out", type=Path, default=FIXTURES)
    args = parser.parse_args()
    clients = {"claude-code": (CLAUDE_CODE, claude_code), "codex": (CODEX, codex)}
    chosen = [name for name in args.clients.split(",") if name]
    model_dir = model_directory()
    with tempfile.TemporaryDirectory(prefix="record-agents-") as tmp:
        work = Path(tmp)
        project = work / "greet"
        project.mkdir()
        for name, text in PROJECT.items():
            (project / name).write_text(text)
        answer = work / "answer.json"
        answer.write_text(json.dumps({"text": ANSWER}))
        spec = vllm_mlx_spec(work, model_dir, "recorder", sections={"defaults": {"max_tokens": 64}})
        # The real daemon, its model's answers forced to ANSWER (see the docstring).
        forced = ("-m", "tests.support.replay_daemon", "--replay", f"bench={answer}")
        spec = replace(spec, command=(spec.command[0], *forced, *spec.command[3:]))
        with running(spec, work / "daemon.log") as server:
            for name in chosen:
                package, make = clients[name]
                with recording_proxy(server.base_url) as (base_url, recording):
                    cli = make(installed(package), work / f"home-{name}", base_url)
                    record_client(name, cli, project, recording, args.sessions, args.turns)
                path = write(name, package[1], recording.records, args.out)
                print(f"wrote {len(recording.records)} requests to {path}")


if __name__ == "__main__":
    main()

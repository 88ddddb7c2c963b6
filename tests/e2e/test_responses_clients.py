"""Real Responses API clients against the daemon: the OpenAI Agents SDK and Codex CLI.

Codex CLI comes from npm (`@openai/codex`, pinned), installed once into a cache
directory; only its test is skipped, with the reason, where npm cannot be reached.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import openai
import pytest
from agents import Agent, ModelSettings, RunConfig, Runner, function_tool
from agents.models.openai_provider import OpenAIProvider

from tests.conftest import DaemonProcess
from tests.e2e.conftest import RESPONSES_KEY as KEY
from tests.e2e.ops_support import wait_for
from tests.support.npm import npm_install, npm_prefix
from tests.support.replay import FIXTURES, QUESTION

ANSWER = json.loads((FIXTURES / "anthropic_answer.json").read_text())["text"]
CODEX_VERSION = "0.171.0"


@pytest.fixture(scope="module")
def daemon(responses_daemon: DaemonProcess) -> DaemonProcess:
    return responses_daemon


# --- the OpenAI Agents SDK ---------------------------------------------------------------

calls: list[tuple[str, str]] = []


@function_tool
def get_weather(city: str, unit: str = "celsius") -> str:
    """The current weather in a city."""
    calls.append(("get_weather", city))
    return f"Sunny, 21 degrees {unit} in {city}."


@function_tool
def get_time(zone: str) -> str:
    """The current time in a time zone."""
    calls.append(("get_time", zone))
    return f"It is noon in {zone}."


def test_agents_sdk_runs_an_agent_with_function_tools(daemon: DaemonProcess) -> None:
    client = openai.AsyncOpenAI(base_url=f"{daemon.base_url}/v1", api_key=KEY, max_retries=0)
    # The SDK's default model API is the Responses API; no traces leave the machine.
    run_config = RunConfig(
        model_provider=OpenAIProvider(openai_client=client), tracing_disabled=True
    )
    caller = Agent(
        name="weather",
        model="replay",  # forced to call get_weather and get_time
        tools=[get_weather, get_time],
        tool_use_behavior="stop_on_first_tool",
    )

    async def both_turns() -> tuple[Any, Any]:
        first = await Runner.run(caller, QUESTION, run_config=run_config)
        # The next turn carries the whole history back: reasoning, calls, tool outputs.
        answerer = caller.clone(model="replay-answer", tool_use_behavior="run_llm_again")
        second = await Runner.run(answerer, first.to_input_list(), run_config=run_config)
        return first, second

    calls.clear()
    first, second = asyncio.run(both_turns())
    assert ("get_weather", "Paris") in calls and ("get_time", "Europe/Paris") in calls
    assert first.final_output == "Sunny, 21 degrees celsius in Paris."
    sent = [item.get("type") for item in first.to_input_list()]
    assert "function_call" in sent and "function_call_output" in sent and "reasoning" in sent
    assert second.final_output == ANSWER


def test_agents_sdk_plain_agent_on_the_bundled_model(daemon: DaemonProcess) -> None:
    client = openai.AsyncOpenAI(base_url=f"{daemon.base_url}/v1", api_key=KEY, max_retries=0)
    run_config = RunConfig(
        model_provider=OpenAIProvider(openai_client=client), tracing_disabled=True
    )
    agent = Agent(
        name="geo",
        instructions="Answer in one short sentence.",
        model="default",
        # Greedy: a 135M model sampled at the default temperature sometimes names a
        # wrong capital, and this test is about the client, not the model's knowledge.
        model_settings=ModelSettings(temperature=0),
    )
    result = Runner.run_sync(agent, "What is the capital of France?", run_config=run_config)
    assert "Paris" in result.final_output


# --- Codex CLI -------------------------------------------------------------------------


@pytest.fixture(scope="session")
def codex_bin() -> Path:
    """The codex binary from npm, installed once per machine into a cache directory."""
    prefix = npm_prefix(f"codex-{CODEX_VERSION}")
    binary = prefix / "node_modules" / ".bin" / "codex"
    npm_install(f"@openai/codex@{CODEX_VERSION}", prefix, binary, "Codex CLI")
    return binary


CODEX_CONFIG = """\
model = "default"
model_provider = "vllm-mlx"
# Codex's own instructions are ~4,500 tokens: a lot of prefill for a 135M model on a CPU.
model_instructions_file = "{instructions}"

[skills]
include_instructions = false

[model_providers.vllm-mlx]
name = "vllm-mlx"
base_url = "{base_url}/v1"
wire_api = "responses"
env_key = "VLLM_MLX_API_KEY"
"""


def test_codex_exec_completes_a_turn(
    daemon: DaemonProcess, codex_bin: Path, tmp_path: Path
) -> None:
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    instructions = home / "instructions.md"
    instructions.write_text("You are a helpful assistant. Answer briefly.\n")
    config = CODEX_CONFIG.format(instructions=instructions, base_url=daemon.base_url)
    (home / "config.toml").write_text(config)
    last = tmp_path / "last-message.txt"
    env = {**os.environ, "CODEX_HOME": str(home), "VLLM_MLX_API_KEY": KEY}
    seen = len(daemon.log_text().splitlines())  # the daemon is shared: earlier lines are not ours
    result = subprocess.run(
        [
            str(codex_bin),
            "exec",
            "--skip-git-repo-check",
            "--ephemeral",
            "-o",
            str(last),
            "What is the capital of France?",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert last.read_text().strip(), result.stdout[-3000:]

    def served() -> list[dict[str, Any]] | None:
        # A request's log line follows its last event, so it may trail Codex's exit.
        logged = daemon.log_text().splitlines()[seen:]
        lines = [json.loads(line) for line in logged if line.startswith("{")]
        done = [
            line
            for line in lines
            if line.get("event") == "request" and line.get("route") == "/v1/responses"
        ]
        return lines if done else None

    lines = wait_for(served, 30, "Codex's requests in the daemon log")
    requests = [line for line in lines if line.get("event") == "request"]
    assert all(line["status"] == 200 for line in requests)
    # Codex offers hosted tools (web_search) too: left out, with a warning, never an error.
    assert any("web_search" in line.get("tool_types", []) for line in lines)

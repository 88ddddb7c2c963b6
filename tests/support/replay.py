"""Replayed models for tests, and the recorded Hermes/Qwen-style reply they force.

A test config may give a model the source `replay:FILE.json`, FILE holding
{"base": <a real source>, "text": <a recorded output>}. The daemon has no such source:
`split_replays` (called by tests/conftest.py) writes the base source into the YAML, with
structured outputs off (a forced output cannot follow a grammar), and the daemon is
started through the fake in tests/support/replay_daemon.py, which forces that model's
every reply to the text. The recorded reply below is shared by the OpenAI and Anthropic
tool-calling tests, so both check the same output.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

PREFIX = "replay:"
LAUNCHER = "tests.support.replay_daemon"
ROOT = Path(__file__).resolve().parents[2]  # where `tests` is importable from
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "replay"
HERMES_CALL = FIXTURES / "hermes_call.json"
THOUGHT = "The user wants the weather, so I call the tool."
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("get_weather", {"city": "Paris", "unit": "celsius"}),
    ("get_time", {"zone": "Europe/Paris"}),
]
TOOL_ARGS = (("get_weather", "city"), ("get_time", "zone"))
QUESTION = "What's the weather and time in Paris?"
PARSERS = {
    "enable_auto_tool_choice": True,
    "tool_call_parser": "hermes",
    "reasoning_parser": "qwen3",
}


def tool_schema(arg: str) -> dict[str, Any]:
    return {"type": "object", "properties": {arg: {"type": "string"}}}


def split_replays(settings: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Path]]:
    """The settings with every `replay:` model on its base source, and the replayed
    models' script files by model name."""
    scripts: dict[str, Path] = {}
    models = []
    for model in settings.get("models") or []:
        source = model.get("source")
        if isinstance(source, str) and source.startswith(PREFIX):
            path = Path(source[len(PREFIX) :]).expanduser().resolve()
            base = str(json.loads(path.read_text())["base"])
            model = {**model, "source": base, "structured_outputs": "off"}
            scripts[model["name"]] = path
        models.append(model)
    if not scripts:
        return settings, scripts
    return {**settings, "models": models}, scripts


def launcher(scripts: dict[str, Path], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The command before `serve ...` that runs the daemon with these models replayed,
    and its environment (`tests` importable wherever pytest was started)."""
    pairs = [f"--replay={name}={path}" for name, path in scripts.items()]
    path = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return [sys.executable, "-m", LAUNCHER, *pairs], {**env, "PYTHONPATH": path}

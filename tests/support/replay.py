"""The recorded Hermes/Qwen-style reply the test-only `replay:` model sources force.

Shared by the OpenAI and Anthropic tool-calling tests, so both check the same output.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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

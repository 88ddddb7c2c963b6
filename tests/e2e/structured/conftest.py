"""One daemon for the structured-output tests of both protocols.

`smol` (structured outputs on, metrics on), `smol-off` (structured_outputs: off) and
`smol-think` (a reasoning parser configured), all the bundled SmolLM2.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DaemonProcess, running

# Sampled hot (so the grammar, not the model's greedy habit, keeps the output valid) but
# seeded: an unseeded 135M model now and then rambles past max_tokens inside a free string.
HOT: dict[str, Any] = {"temperature": 1.0, "seed": 1234}
ASK = [{"role": "user", "content": "Answer in JSON."}]
SMOL = "builtin:smollm2-135m-instruct"
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 16},
        "unit": {"enum": ["c", "f"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"tz": {"type": "string", "pattern": "^[A-Z]{3}$"}},
    "required": ["tz"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
TOOL_SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}


@pytest.fixture(scope="package")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path
) -> Iterator[DaemonProcess]:
    config = {
        "models": [
            {"name": "smol", "source": SMOL},
            {"name": "smol-off", "source": SMOL, "structured_outputs": "off"},
            {"name": "smol-think", "source": SMOL, "reasoning_parser": "qwen3"},
        ],
        "metrics": {"enabled": True},
    }
    with running(tmp_path_factory.mktemp("structured"), model_cache_dir, config) as process:
        yield process

"""Fixtures shared by several e2e modules."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DaemonProcess, running
from tests.support.replay import FIXTURES, HERMES_CALL, PARSERS

RESPONSES_KEY = "sk-responses-test"
OLLAMA_EMBED = "all-minilm-l6-v2"


@pytest.fixture(scope="package")
def responses_daemon(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path
) -> Iterator[DaemonProcess]:
    """One daemon for the Responses API modules (the SDK, the Agents SDK, Codex CLI):
    the bundled model, a replayed tool-calling reply and a replayed answer."""
    config = {
        "models": [
            {
                "name": "smollm2-135m-instruct",
                "source": "builtin:smollm2-135m-instruct",
                "aliases": ["default"],
            },
            {"name": "replay", "source": f"replay:{HERMES_CALL}", **PARSERS},
            {"name": "replay-answer", "source": f"replay:{FIXTURES / 'anthropic_answer.json'}"},
        ],
        "auth": {"api_keys": [RESPONSES_KEY]},
        "metrics": {"enabled": True},
    }
    with running(tmp_path_factory.mktemp("responses"), model_cache_dir, config) as process:
        yield process


@pytest.fixture(scope="package")
def ollama_daemon(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path
) -> Iterator[DaemonProcess]:
    """One daemon for the Ollama API modules (the ollama Python client, ollama-js,
    LangChain): the bundled model (also as `default`), the bundled embedding model, a
    replayed tool-calling and thinking reply, and `spare`, a copy of the bundled model
    that only the keep_alive tests load and unload."""
    config = {
        "models": [
            {
                "name": "smollm2-135m-instruct",
                "source": "builtin:smollm2-135m-instruct",
                "aliases": ["default"],
            },
            {"name": OLLAMA_EMBED, "source": f"builtin:{OLLAMA_EMBED}", "task": "embed"},
            {"name": "replay", "source": f"replay:{HERMES_CALL}", **PARSERS},
            {"name": "spare", "source": "builtin:smollm2-135m-instruct"},
        ],
        "metrics": {"enabled": True},
    }
    with running(tmp_path_factory.mktemp("ollama"), model_cache_dir, config) as process:
        yield process

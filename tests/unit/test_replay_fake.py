"""The replay fake (tests/support/replay_daemon.py) stays outside the daemon.

The e2e tool-calling tests check what it forces; these check its wiring: the daemon has
no `replay:` source, a test config's replay model is written with its base source, and
the fake imports no mlx before the daemon has picked MLX's BLAS.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.replay import FIXTURES, HERMES_CALL, ROOT, split_replays
from vllm_mlx.models.sources import classify_source


def test_the_daemon_has_no_replay_source() -> None:
    with pytest.raises(ValueError):
        classify_source(f"replay:{HERMES_CALL}")


def test_replay_models_are_written_with_their_base_source() -> None:
    plain = {"name": "smol", "source": "builtin:smollm2-135m-instruct"}
    answer = FIXTURES / "anthropic_answer.json"
    settings = {
        "server": {"port": 1},
        "models": [
            {"name": "replay", "source": f"replay:{HERMES_CALL}", "tool_call_parser": "hermes"},
            plain,
            {"name": "answer", "source": f"replay:{answer}", "structured_outputs": "llguidance"},
        ],
    }
    written, scripts = split_replays(settings)
    assert scripts == {"replay": HERMES_CALL, "answer": answer}
    assert written["server"] == {"port": 1}
    assert written["models"] == [
        {
            "name": "replay",
            "source": "builtin:smollm2-135m-instruct",
            "tool_call_parser": "hermes",
            "structured_outputs": "off",
        },
        plain,
        {"name": "answer", "source": "builtin:smollm2-135m-instruct", "structured_outputs": "off"},
    ]
    assert split_replays({"models": [plain]}) == ({"models": [plain]}, {})


def test_the_fake_imports_no_mlx_before_the_daemon_does() -> None:
    code = (
        "import sys, tests.support.replay_daemon as fake; fake.install({'m': 'x'}); "
        "assert not [m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm')]; "
        "import vllm_mlx.engine.engine as e; "
        "assert e.Engine.__init__.__module__ == fake.__name__"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)

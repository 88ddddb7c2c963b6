"""The residency keys: per-model load / keep_alive / pin, the `memory` budget, and
check-config's size check (docs/models.md)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vllm_mlx.config.errors import ConfigError, ConfigIssue
from vllm_mlx.config.file import load_settings
from vllm_mlx.config.memory import MemorySettings
from vllm_mlx.config.model import loads_at_startup
from vllm_mlx.config.settings import Settings

REPO = Path(__file__).resolve().parents[2]
BUILTIN = "builtin:smollm2-135m-instruct"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.upper().startswith("VLLM_MLX_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def issues(path: Path) -> list[ConfigIssue]:
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    return caught.value.issues


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "vllm-mlx.yaml"
    path.write_text(text)
    return path


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    # A subprocess: the size check picks the BLAS before mlx is imported, as serve does.
    command = [sys.executable, "-m", "vllm_mlx.cli", "check-config", str(path)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_the_first_model_loads_at_startup_and_the_others_on_demand() -> None:
    models = Settings().models
    assert [loads_at_startup(models, i) for i in range(len(models))] == [True, False, False]
    first, second, _ = models
    explicit = [first.model_copy(update={"load": "on_demand"}), second.model_copy(
        update={"load": "startup"})]  # fmt: skip
    assert [loads_at_startup(explicit, i) for i in range(2)] == [False, True]
    assert first.keep_alive == -1 and first.pin is False


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('"5m"', "valid number"),
        ("true", "valid number"),
        ("-5", "keep_alive must be -1"),
        ("[1]", "valid number"),
    ],
)
def test_a_wrong_keep_alive_is_located(tmp_path: Path, value: str, expected: str) -> None:
    path = write(
        tmp_path, f"models:\n  - name: a\n    source: {BUILTIN}\n    keep_alive: {value}\n"
    )
    (issue,) = issues(path)
    assert issue.key_path == "models[0].keep_alive" and expected in issue.message
    assert (issue.origin, issue.line) == (str(path), 4)


def test_pin_and_load_take_only_their_values(tmp_path: Path) -> None:
    path = write(tmp_path, f"models:\n  - name: a\n    source: {BUILTIN}\n    pin: 1\n")
    assert issues(path)[0].key_path == "models[0].pin"
    path = write(tmp_path, f"models:\n  - name: a\n    source: {BUILTIN}\n    load: lazy\n")
    assert issues(path)[0].key_path == "models[0].load"


def test_the_budget_is_megabytes_or_a_fraction_of_ram(tmp_path: Path) -> None:
    assert MemorySettings(budget_mb=1024).budget_bytes(2**40) == 2**30
    assert MemorySettings(budget_percent=0.25).budget_bytes(2**34) == 2**32
    assert MemorySettings().budget_bytes(2**34) is None
    for text, key in [
        ("memory:\n  budget_mb: 10\n  budget_percent: 0.5\n", "memory"),
        ("memory:\n  budget_percent: 50\n", "memory.budget_percent"),
        ("memory:\n  budget_mb: 0\n", "memory.budget_mb"),
        ("memory:\n  budget_mb: 1.5\n", "memory.budget_mb"),
    ]:
        (issue,) = issues(write(tmp_path, text))
        assert issue.key_path == key, (text, issue)


def test_check_config_refuses_a_budget_below_the_smallest_model(
    tmp_path: Path, model_cache_dir: Path
) -> None:
    text = (
        f"paths:\n  cache_dir: {model_cache_dir}\nmemory:\n  budget_mb: 50\n"
        f"models:\n  - name: chat\n    source: {BUILTIN}\n"
        "  - name: vectors\n    source: builtin:all-minilm-l6-v2\n    task: embed\n"
    )
    done = check_config(write(tmp_path, text))
    assert done.returncode == 1
    assert "memory.budget_mb" in done.stderr and "(50 MiB)" in done.stderr
    assert "'vectors'" in done.stderr  # the smaller of the two, with its size
    assert re.search(r"\(8\d MiB of weights", done.stderr), done.stderr


def test_the_example_in_docs_models_md_passes_check_config(
    tmp_path: Path, model_cache_dir: Path
) -> None:
    text = (REPO / "docs" / "models.md").read_text()
    example = text.split("## Example: three models", 1)[1].split("```yaml\n", 1)[1]
    data = yaml.safe_load(example.split("```", 1)[0])
    assert [m["name"] for m in data["models"]] == ["coder", "chat", "embedder"]
    data["paths"] = {"cache_dir": str(model_cache_dir)}
    done = check_config(write(tmp_path, yaml.safe_dump(data)))
    assert done.returncode == 0, done.stderr
    # At a budget below the float32 model but above the others, it still checks out
    # (only a budget below the smallest model is an error).
    data["memory"]["budget_mb"] = 300
    assert check_config(write(tmp_path, yaml.safe_dump(data))).returncode == 0

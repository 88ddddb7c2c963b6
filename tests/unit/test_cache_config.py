"""The prefix cache keys: the bound in MiB or as a fraction of RAM, the deprecated
`prefix_cache_mb`, `use_paged_cache`, their flags, and errors at file:line."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_mlx.cli.main import build_parser, main
from vllm_mlx.cli.serve_flags import serve_overrides
from vllm_mlx.config.errors import ConfigError
from vllm_mlx.config.file import load_settings
from vllm_mlx.config.sections import EngineSettings
from vllm_mlx.engine.scheduler_state import scheduler_config

RAM = 16 * 2**30


def issues_of(path: Path) -> list[tuple[int | None, str, str]]:
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    return [(i.line, i.key_path, i.message) for i in caught.value.issues]


def engine_from(tmp_path: Path, text: str) -> EngineSettings:
    path = tmp_path / "vllm-mlx.yaml"
    path.write_text(text)
    return load_settings(path).engine


def test_the_bound_in_each_spelling(tmp_path: Path) -> None:
    assert EngineSettings().prefix_cache_bytes(RAM) == 512 * 2**20  # the default
    mb = engine_from(tmp_path, "engine:\n  cache_memory_mb: 64\n")
    assert mb.prefix_cache_bytes(RAM) == 64 * 2**20
    percent = engine_from(tmp_path, "engine:\n  cache_memory_percent: 0.05\n")
    assert percent.prefix_cache_bytes(RAM) == int(0.05 * RAM)
    legacy = engine_from(tmp_path, "engine:\n  prefix_cache_mb: 0\n")  # old files still load
    assert legacy.prefix_cache_bytes(RAM) == 0
    config = scheduler_config(engine_from(tmp_path, "engine:\n  use_paged_cache: false\n"))
    assert (config.prefix_cache_bytes, config.paged_cache) == (512 * 2**20, False)
    assert scheduler_config(EngineSettings()).paged_cache is True


@pytest.mark.parametrize(
    ("yaml_text", "line", "key", "words"),
    [
        ("engine:\n  cache_memory_percent: 20\n", 2, "engine.cache_memory_percent", "less than"),
        ("engine:\n  cache_memory_percent: 0\n", 2, "engine.cache_memory_percent", "greater"),
        ("engine:\n  cache_memory_mb: -1\n", 2, "engine.cache_memory_mb", "greater"),
        ("engine:\n  cache_memory_mb: lots\n", 2, "engine.cache_memory_mb", "integer"),
        ("engine:\n  use_paged_cache: maybe\n", 2, "engine.use_paged_cache", "boolean"),
        (
            "engine:\n  cache_memory_mb: 256\n  cache_memory_percent: 0.1\n",
            3,
            "engine.cache_memory_percent",
            "set one prefix cache bound, not cache_memory_mb and cache_memory_percent",
        ),
        (
            "engine:\n  prefix_cache_mb: 256\n  cache_memory_mb: 128\n",
            2,
            "engine.prefix_cache_mb",
            "deprecated name of cache_memory_mb",
        ),
    ],
)
def test_bad_values_are_located(
    tmp_path: Path, yaml_text: str, line: int, key: str, words: str
) -> None:
    path = tmp_path / "vllm-mlx.yaml"
    path.write_text(yaml_text)
    ((at, key_path, message),) = issues_of(path)
    assert (at, key_path) == (line, key) and words in message


def test_flags_set_the_keys_and_replace_the_files_bound(tmp_path: Path) -> None:
    path = tmp_path / "vllm-mlx.yaml"
    path.write_text("engine:\n  cache_memory_mb: 256\n")
    argv = ["serve", "--config", str(path), "--cache-memory-percent", "0.1", "--no-use-paged-cache"]
    settings = load_settings(path, serve_overrides(build_parser().parse_args(argv)))
    assert settings.engine.cache_memory_percent == 0.1 and settings.engine.cache_memory_mb is None
    assert settings.engine.use_paged_cache is False
    argv = ["serve", "--cache-memory-mb", "32", "--use-paged-cache"]
    engine = load_settings(None, serve_overrides(build_parser().parse_args(argv))).engine
    assert engine.prefix_cache_bytes(RAM) == 32 * 2**20 and engine.use_paged_cache is True


def test_a_bad_flag_names_itself(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--cache-memory-percent", "1.5"])
    err = capsys.readouterr().err
    assert "command line (--cache-memory-percent): engine.cache_memory_percent" in err

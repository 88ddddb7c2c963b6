"""A model's kv_cache section: defaults, what reaches the engine, errors at file:line."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_mlx.cli.main import main
from vllm_mlx.config.errors import ConfigError
from vllm_mlx.config.file import load_settings

MODEL = "models:\n  - name: smol\n    source: builtin:smollm2-135m-instruct\n"


def issues_of(path: Path) -> list[tuple[int | None, str, str]]:
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    return [(i.line, i.key_path, i.message) for i in caught.value.issues]


def test_unset_is_full_precision_and_a_section_reaches_the_model(tmp_path: Path) -> None:
    path = tmp_path / "vllm-mlx.yaml"
    path.write_text(MODEL)
    assert load_settings(path).models[0].kv_cache.bits is None
    path.write_text(MODEL + "    kv_cache: {bits: 4, group_size: 32, quantized_after: 256}\n")
    kv = load_settings(path).models[0].kv_cache
    assert (kv.bits, kv.group_size, kv.quantized_after) == (4, 32, 256)


@pytest.mark.parametrize(
    ("section", "line", "key", "words"),
    [
        ("    kv_cache:\n      bits: 3\n", 5, "models[0].kv_cache.bits", "4 or 8"),
        ("    kv_cache:\n      group_size: 48\n", 5, "models[0].kv_cache.group_size", "32 or 64"),
        (
            "    kv_cache:\n      quantized_after: -1\n",
            5,
            "models[0].kv_cache.quantized_after",
            "greater than or equal to 0",
        ),
        ("    kv_cache:\n      bitz: 8\n", 5, "models[0].kv_cache.bitz", "unknown key"),
        (
            "    task: embed\n    kv_cache:\n      bits: 8\n",
            6,
            "models[0].kv_cache.bits",
            "applies to generation models",
        ),
    ],
)
def test_a_bad_section_is_named_at_its_line(
    tmp_path: Path, section: str, line: int, key: str, words: str
) -> None:
    path = tmp_path / "vllm-mlx.yaml"
    path.write_text(MODEL + section)
    ((at, key_path, message),) = issues_of(path)
    assert (at, key_path) == (line, key)
    assert words in message


def test_check_config_reports_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "vllm-mlx.yaml"
    path.write_text(MODEL + "    kv_cache:\n      bits: 2\n")
    with pytest.raises(SystemExit) as exited:
        main(["check-config", str(path)])
    assert exited.value.code == 1
    assert f"{path}:5:7: models[0].kv_cache.bits: Input should be 4 or 8" in capsys.readouterr().err

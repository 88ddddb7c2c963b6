"""Embedding models in the config: `task: embed`, the default model list, --embedding-model."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_mlx.cli.main import build_parser
from vllm_mlx.cli.serve_flags import serve_overrides, with_embedding_model
from vllm_mlx.config.errors import ConfigError
from vllm_mlx.config.file import LoadedConfig, load_config
from vllm_mlx.config.model import ModelSettings
from vllm_mlx.config.settings import Settings
from vllm_mlx.models.embedding import (
    EmbeddingModelError,
    check_embedding_dir,
    max_length_of,
    pooling_of,
)
from vllm_mlx.models.sources import builtin_path


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no ./vllm-mlx.yaml
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("VLLM_MLX_CONFIG", raising=False)


def serve(argv: list[str]) -> LoadedConfig:
    args = build_parser().parse_args(["serve", *argv])
    loaded = load_config(None, serve_overrides(args))
    return with_embedding_model(loaded, args.embedding_model)


def test_defaults_serve_the_chat_the_embedding_and_the_speech_model() -> None:
    models = Settings().models
    assert [(m.name, m.task) for m in models] == [
        ("smollm2-135m-instruct", "generate"),
        ("all-minilm-l6-v2", "embed"),
        ("whisper-tiny-en", "transcribe"),
    ]


def test_embedding_model_flag_adds_one_beside_the_model() -> None:
    settings = serve(
        ["builtin:smollm2-135m-instruct", "--embedding-model", "builtin:all-minilm-l6-v2"]
    ).settings
    assert [(m.name, m.task) for m in settings.models] == [
        ("smollm2-135m-instruct", "generate"),
        ("all-minilm-l6-v2", "embed"),
    ]


def test_embedding_model_flag_is_idempotent_with_the_defaults() -> None:
    settings = serve(["--embedding-model", "builtin:all-minilm-l6-v2"]).settings
    assert [m.name for m in settings.models] == [
        "smollm2-135m-instruct",
        "all-minilm-l6-v2",
        "whisper-tiny-en",
    ]


def test_embedding_model_flag_with_a_bad_source_names_the_flag() -> None:
    with pytest.raises(ConfigError) as raised:
        serve(["builtin:smollm2-135m-instruct", "--embedding-model", "/nope/model"])
    (issue,) = raised.value.issues
    assert issue.origin == "command line (--embedding-model)"
    assert issue.key_path.startswith("models[1]") and "does not exist" in issue.message


def test_task_must_be_known() -> None:
    with pytest.raises(ValueError, match="task"):
        ModelSettings(name="x", source="builtin:all-minilm-l6-v2", task="classify")  # type: ignore[arg-type]


def test_the_bundled_folder_reads_as_a_mean_pooled_bert() -> None:
    folder = builtin_path("all-minilm-l6-v2")
    config = check_embedding_dir(folder)
    assert pooling_of(folder, None) == "mean" and pooling_of(folder, "cls") == "cls"
    assert max_length_of(folder, config, None) == 256
    assert max_length_of(folder, config, 10_000) == 512  # never past the position table


def test_a_folder_that_is_not_bert_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(EmbeddingModelError, match="llama"):
        check_embedding_dir(tmp_path)

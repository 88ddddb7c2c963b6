"""Settings: precedence, file discovery, and errors that name file, line and key path."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vllm_mlx.config.errors import ConfigError
from vllm_mlx.config.file import CONFIG_ENV_VAR, find_config_file, load_config, load_settings
from vllm_mlx.config.settings import Settings

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "config" / "vllm-mlx.yaml"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(__import__("os").environ):
        if name.startswith("VLLM_MLX_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no ./vllm-mlx.yaml unless a test writes one
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))


def write(tmp_path: Path, text: str, name: str = "vllm-mlx.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def issues_of(path: Path) -> list[tuple[int | None, str, str]]:
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    for issue in caught.value.issues:
        assert issue.origin == str(path)
    return [(i.line, i.key_path, i.message) for i in caught.value.issues]


def test_precedence_cli_over_env_over_file_over_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, "server:\n  port: 9001\n  timeout: 30\ndefaults:\n  max_tokens: 7\n")
    monkeypatch.setenv("VLLM_MLX_SERVER__PORT", "9002")
    monkeypatch.setenv("VLLM_MLX_DEFAULTS__TOP_K", "5")
    settings = load_settings(path, {"server": {"port": 9003}})
    assert settings.server.port == 9003  # CLI beats env and file
    assert settings.defaults.top_k == 5  # env beats default
    assert settings.server.timeout == 30  # file beats default
    assert settings.defaults.max_tokens == 7
    assert settings.server.host == "127.0.0.1"  # default
    assert load_settings(path).server.port == 9002  # env beats file


def test_defaults_equal_the_shipped_reference_config() -> None:
    assert load_settings(REFERENCE) == Settings()


def test_every_key_is_in_the_reference_config() -> None:
    from vllm_mlx.config.json_schema import leaf_keys

    data = yaml.safe_load(REFERENCE.read_text())
    for key in leaf_keys():
        node = data
        for part in key.replace("[]", ".0").split("."):
            node = node[int(part)] if part.isdigit() else node[part]  # KeyError names it


def test_reference_config_names_its_schema() -> None:
    first = REFERENCE.read_text().splitlines()[0]
    assert first == "# yaml-language-server: $schema=../schemas/vllm-mlx.schema.json"


def test_committed_schema_is_fresh() -> None:
    from vllm_mlx.config.json_schema import render_schema

    committed = (REPO / "schemas" / "vllm-mlx.schema.json").read_text()
    assert committed == render_schema(), "run: python -m vllm_mlx.config.json_schema"


def test_docs_list_every_key() -> None:
    from vllm_mlx.config.json_schema import leaf_keys

    docs = (REPO / "docs" / "configuration.md").read_text()
    missing = [key for key in leaf_keys() if f"`{key}`" not in docs]
    assert not missing, f"docs/configuration.md lacks {missing}"


def test_yaml_syntax_error_has_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "server:\n  port: 8000\n  host: [unclosed\nlogging: {}\n")
    ((line, key, message),) = issues_of(path)
    assert line == 4 and key == "" and "YAML syntax error" in message


def test_unknown_key_is_an_error_at_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "server:\n  port: 8000\n  prot: 8001\n")
    assert issues_of(path) == [(3, "server.prot", issues_of(path)[0][2])]
    assert "unknown key" in issues_of(path)[0][2]


def test_wrong_type_and_out_of_range_are_all_reported(tmp_path: Path) -> None:
    path = write(tmp_path, "server:\n  port: 99999\nengine:\n  max_batch_size: lots\n")
    found = issues_of(path)
    assert [(line, key) for line, key, _ in found] == [
        (2, "server.port"),
        (4, "engine.max_batch_size"),
    ]
    assert "65535" in found[0][2]
    assert "integer" in found[1][2]


def test_missing_local_model_path(tmp_path: Path) -> None:
    path = write(tmp_path, "models:\n  - name: a\n    source: ./nowhere/model.gguf\n")
    ((line, key, message),) = issues_of(path)
    assert (line, key) == (3, "models[0].source") and "does not exist" in message


def test_unknown_builtin_lists_valid_names(tmp_path: Path) -> None:
    path = write(tmp_path, "models:\n  - name: a\n    source: builtin:gpt-5\n")
    ((line, key, message),) = issues_of(path)
    assert (line, key) == (3, "models[0].source")
    assert "builtin:smollm2-135m-instruct" in message


def test_missing_required_model_field_points_at_the_item(tmp_path: Path) -> None:
    path = write(tmp_path, "models:\n  - name: a\n")
    ((line, key, message),) = issues_of(path)
    assert (line, key) == (2, "models[0].source") and "required" in message.lower()


def test_duplicate_key_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "server:\n  port: 1\n  port: 2\n")
    ((line, key, message),) = issues_of(path)
    assert (line, key, message) == (3, "server.port", "duplicate key")


def test_duplicate_model_ids_are_an_error(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "models:\n  - name: a\n    source: builtin:smollm2-135m-instruct\n"
        "  - name: b\n    source: builtin:smollm2-135m-instruct\n    aliases: [a]\n",
    )
    ((line, key, message),) = issues_of(path)
    assert (line, key) == (6, "models[1].aliases[0]") and "'a'" in message


def test_root_must_be_a_mapping(tmp_path: Path) -> None:
    path = write(tmp_path, "- just\n- a list\n")
    ((line, _, message),) = issues_of(path)
    assert line == 1 and "mapping" in message


def test_env_errors_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_MLX_SERVER__PORT", "eighty")
    with pytest.raises(ConfigError) as caught:
        load_settings(None)
    (issue,) = caught.value.issues
    assert issue.origin == "environment variable VLLM_MLX_SERVER__PORT"
    assert issue.key_path == "server.port"


def test_cli_errors_name_the_command_line() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(None, {"server": {"port": 0}})
    assert caught.value.issues[0].origin == "command line"


def test_empty_file_means_defaults(tmp_path: Path) -> None:
    assert load_settings(write(tmp_path, "")) == Settings()


def test_discovery_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert find_config_file() is None
    xdg = tmp_path / "xdg" / "vllm-mlx"
    xdg.mkdir(parents=True)
    user = write(xdg, "{}\n")
    assert find_config_file() == user
    cwd = write(tmp_path, "{}\n")
    assert find_config_file() == cwd
    env_file = write(tmp_path, "{}\n", "from-env.yaml")
    monkeypatch.setenv(CONFIG_ENV_VAR, str(env_file))
    assert find_config_file() == env_file
    explicit = write(tmp_path, "{}\n", "explicit.yaml")
    assert find_config_file(explicit) == explicit


def test_named_file_that_is_missing_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path / "absent.yaml")
    assert "does not exist" in str(caught.value)


def test_check_config_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from vllm_mlx.cli.main import main

    good = write(tmp_path, "server:\n  port: 8123\n", "good.yaml")
    assert main(["check-config", str(good), "--print"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["server"]["port"] == 8123 and printed["models"][0]["aliases"] == ["default"]
    bad = write(tmp_path, "server:\n  port: x\n", "bad.yaml")
    with pytest.raises(SystemExit) as exited:
        main(["check-config", str(bad)])
    assert exited.value.code == 1
    assert f"{bad}:2:3: server.port:" in capsys.readouterr().err


def test_serve_flags_become_overrides() -> None:
    from vllm_mlx.cli.main import build_parser
    from vllm_mlx.cli.serve_flags import serve_overrides

    args = build_parser().parse_args(
        [
            "serve",
            "builtin:smollm2-135m-instruct",
            "--port",
            "9100",
            "--no-continuous-batching",
            "--max-tokens",
            "64",
            "--served-model-name",
            "tiny",
            "--stream-interval",
            "4",
        ]
    )
    overrides = serve_overrides(args)
    settings = load_settings(None, overrides)
    assert settings.server.port == 9100
    assert settings.engine.continuous_batching is False
    assert settings.engine.stream_interval == 4
    assert settings.defaults.max_tokens == 64
    assert [(m.name, m.source, m.aliases) for m in settings.models] == [
        ("tiny", "builtin:smollm2-135m-instruct", ["default"])
    ]


def test_structured_outputs_backend_is_checked(tmp_path: Path) -> None:
    model = "models:\n  - name: a\n    source: builtin:smollm2-135m-instruct\n"
    good = write(tmp_path, model + "    structured_outputs: off\n")  # YAML reads false
    assert load_settings(good).models[0].structured_outputs == "off"
    bad = write(tmp_path, model + "    structured_outputs: xgrammar\n")
    ((line, key, message),) = issues_of(bad)
    assert (line, key) == (4, "models[0].structured_outputs") and "llguidance" in message

"""Config and CLI mistakes become messages naming the file and line, the environment
variable or the flag (never a traceback), and check-config runs every check serve runs
before loading weights."""

from __future__ import annotations

import _ctypes
import os
import struct
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from vllm_mlx.cli.main import main
from vllm_mlx.config.errors import ConfigError, ConfigIssue
from vllm_mlx.config.file import load_config, load_settings
from vllm_mlx.models.sources import builtin_path

BUILTIN = "builtin:smollm2-135m-instruct"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.upper().startswith("VLLM_MLX_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))


def issues(config: Path | None = None) -> list[ConfigIssue]:
    with pytest.raises(ConfigError) as caught:
        load_settings(config)
    return caught.value.issues


def check_config(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Exit status and stderr of `vllm-mlx check-config PATH`."""
    try:
        code = main(["check-config", str(path)])
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


# --- the file itself --------------------------------------------------------------------


def test_non_utf8_bytes_are_located(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"server:\n  host: caf\xe9\n")
    (issue,) = issues(path)
    assert (issue.origin, issue.line, issue.column) == (str(path), 2, 12)
    assert "UTF-8" in issue.message and "0xe9" in issue.message


def test_a_nul_byte_is_located(tmp_path: Path) -> None:
    path = tmp_path / "nul.yaml"
    path.write_bytes(b"server:\n  port: 80\x00\n")
    (issue,) = issues(path)
    assert (issue.origin, issue.line, issue.column) == (str(path), 2, 11)
    assert "U+0000 is not allowed" in issue.message


def test_a_directory_as_the_config_is_called_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path)
    assert "is a directory" in str(caught.value) and "does not exist" not in str(caught.value)


def test_duplicate_model_name_and_alias_are_reported_at_their_own_line(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    models = f"models:\n  - name: a\n    source: {BUILTIN}\n  - name: b\n    source: {BUILTIN}\n"
    path.write_text(models + "    aliases: [x, a]\n")
    (issue,) = issues(path)
    assert (issue.line, issue.column, issue.key_path) == (6, 18, "models[1].aliases[1]")
    assert "'a'" in issue.message
    path.write_text(models + f"  - name: b\n    source: {BUILTIN}\n")
    (issue,) = issues(path)
    assert (issue.line, issue.column, issue.key_path) == (6, 5, "models[2].name")


# --- environment variables ---------------------------------------------------------------


def test_a_list_variable_that_is_not_json_names_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VLLM_MLX_AUTH__API_KEYS", "abc")
    monkeypatch.setenv("VLLM_MLX_AUTH__RATE_LIMIT", "5")  # fine: not blamed
    (issue,) = issues()
    assert issue.origin == "environment variable VLLM_MLX_AUTH__API_KEYS"
    assert issue.key_path == "auth.api_keys" and "JSON" in issue.message


def test_a_section_variable_that_is_not_json_names_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VLLM_MLX_SERVER__HOST", "localhost")  # a string, never JSON
    monkeypatch.setenv("VLLM_MLX_SERVER__CORS_ORIGINS", "https://a.example")
    (issue,) = issues()
    assert issue.origin == "environment variable VLLM_MLX_SERVER__CORS_ORIGINS"


# --- command-line flags --------------------------------------------------------------------


def serve(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """stderr of a `serve` that must refuse its flags before starting anything."""
    with pytest.raises(SystemExit) as exited:
        main(["serve", *argv])
    assert exited.value.code == 1
    return capsys.readouterr().err


def test_auto_tool_choice_without_a_parser_names_the_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = serve(["--enable-auto-tool-choice"], capsys)
    assert "command line (--enable-auto-tool-choice)" in err and "tool_call_parser" in err
    err = serve([BUILTIN, "--enable-auto-tool-choice"], capsys)
    assert "command line (--enable-auto-tool-choice)" in err and "tool_call_parser" in err


def test_flag_errors_name_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert "command line (--port): server.port:" in serve(["--port", "99999"], capsys)
    err = serve(["--api-key", "has space"], capsys)
    assert "command line (--api-key): auth.api_keys" in err
    err = serve(["/nonexistent/model.gguf"], capsys)
    assert "command line (MODEL): models[0].source:" in err


def test_served_model_name_cannot_duplicate_an_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "two.yaml"
    path.write_text(
        f"models:\n  - {{name: a, source: '{BUILTIN}'}}\n"
        f"  - {{name: b, source: '{BUILTIN}', aliases: [bee]}}\n"
    )
    for taken in ("b", "bee"):
        err = serve(["--config", str(path), "--served-model-name", taken], capsys)
        assert "--served-model-name" in err and f"'{taken}' is already" in err


def test_served_model_name_default_with_a_model_argument_is_allowed() -> None:
    from vllm_mlx.cli.main import build_parser
    from vllm_mlx.cli.serve_flags import serve_overrides

    args = build_parser().parse_args(["serve", BUILTIN, "--served-model-name", "default"])
    (model,) = load_settings(None, serve_overrides(args)).models
    assert (model.name, model.aliases) == ("default", [])


# --- check-config runs serve's checks ------------------------------------------------------


def gguf_text(value: str) -> bytes:
    return struct.pack("<Q", len(value)) + value.encode()


def gguf_header(architecture: str, keys: Sequence[str] = (), tensor: str = "") -> bytes:
    """A GGUF file: the architecture, u32 metadata `keys`, and one tensor named `tensor`."""
    kv = gguf_text("general.architecture") + struct.pack("<I", 8) + gguf_text(architecture)
    kv += b"".join(gguf_text(key) + struct.pack("<II", 4, 1) for key in keys)
    count = 1 if tensor else 0
    info = gguf_text(tensor) + struct.pack("<IQIQ", 1, 4, 0, 0) if tensor else b""
    return b"GGUF" + struct.pack("<IQQ", 3, count, 1 + len(keys)) + kv + info + bytes(64)


LLAMA_KEYS = [
    "llama.embedding_length",
    "llama.attention.head_count",
    "llama.feed_forward_length",
    "llama.block_count",
    "llama.attention.layer_norm_rms_epsilon",
    "llama.context_length",
]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"hello, not a model\n", "is not a GGUF file"),
        (gguf_header("gpt2"), "unsupported GGUF architecture 'gpt2'"),
        (b"GGUF" + struct.pack("<I", 7) + bytes(16), "unsupported GGUF version 7"),
        ("truncated", "truncated"),
        (gguf_header("llama", LLAMA_KEYS[1:]), "lacks llama.embedding_length"),
        (gguf_header("llama", [*LLAMA_KEYS, "llama.rope.scaling.type"]), "rope scaling"),
        (gguf_header("llama", LLAMA_KEYS, "blk.0.mystery.weight"), "unexpected GGUF tensor"),
    ],
    ids=["not-gguf", "architecture", "version", "truncated", "metadata", "rope", "tensor"],
)
def test_check_config_reads_the_gguf_header(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | str, expected: str
) -> None:
    model = tmp_path / "model.gguf"
    if content == "truncated":  # the real file cut inside its tensor data
        with builtin_path("smollm2-135m-instruct").open("rb") as real:
            content = real.read(4 << 20)
    assert isinstance(content, bytes)
    model.write_bytes(content)
    config = tmp_path / "vllm-mlx.yaml"
    config.write_text(f"models:\n  - name: m\n    source: {model}\n")
    code, err = check_config(config, capsys)
    assert code == 1
    assert f"{config}:3:5: models[0].source:" in err and expected in err


def test_check_config_accepts_the_real_gguf(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "vllm-mlx.yaml"
    real = builtin_path("smollm2-135m-instruct")
    config.write_text(f"models:\n  - name: m\n    source: {real}\n")
    assert check_config(config, capsys)[0] == 0


@pytest.mark.skipif(sys.platform == "darwin", reason="engine.blas is ignored on macOS")
def test_check_config_checks_the_blas_library(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "vllm-mlx.yaml"
    not_a_library = tmp_path / "notes.txt"
    not_a_library.write_text("hello\n")
    cases = [
        (tmp_path / "absent.so", "does not exist"),
        (not_a_library, "cannot load"),
        (tmp_path, "is a directory"),
        (Path(_ctypes.__file__), "not a CBLAS library"),  # a shared library, no CBLAS
    ]
    for path, expected in cases:
        config.write_text(f"engine:\n  blas: {path}\n")
        code, err = check_config(config, capsys)
        assert code == 1 and f"{config}:2:3: engine.blas:" in err and expected in err


# --- secrets in a readable file ------------------------------------------------------------


def test_check_config_warns_when_api_keys_are_readable_by_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "vllm-mlx.yaml"
    config.write_text("auth:\n  api_keys: [secret-key]\n")
    config.chmod(0o644)
    code, err = check_config(config, capsys)
    assert code == 0 and "warning:" in err and "chmod 600" in err and "everyone" in err
    config.chmod(0o600)
    code, err = check_config(config, capsys)
    assert code == 0 and "warning" not in err
    config.write_text("server:\n  port: 8001\n")  # no keys in it: readable is fine
    config.chmod(0o644)
    assert "warning" not in check_config(config, capsys)[1]


@pytest.mark.parametrize(
    "text",
    # Tabs on a blank line are YAML whitespace; PyYAML alone calls them a syntax error.
    ["", "  \n\n", "# only comments\n# here\n", "{}\n", "\t\n", "\n \t# indented\r\n\t"],
)
def test_an_empty_file_is_ok_with_a_warning_that_defaults_apply(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    config = tmp_path / "vllm-mlx.yaml"
    config.write_text(text)
    code, err = check_config(config, capsys)
    assert code == 0 and f"warning: {config} is empty" in err and "default" in err


def test_a_tab_before_a_setting_is_still_a_syntax_error(tmp_path: Path) -> None:
    path = tmp_path / "tabbed.yaml"
    path.write_text("server:\n\tport: 8000\n")
    (issue,) = issues(path)
    assert "YAML syntax error" in issue.message and issue.line == 2


def test_a_host_name_is_refused_at_its_line(tmp_path: Path) -> None:
    # The listener binds IP literals only: `serve` failed with a traceback here.
    path = tmp_path / "host.yaml"
    path.write_text("server:\n  host: localhost\n")
    (issue,) = issues(path)
    assert (issue.line, issue.key_path) == (2, "server.host") and "IP address" in issue.message
    path.write_text("server:\n  host: '::1'\n")
    assert load_settings(path).server.host == "::1"


def test_a_minimal_llama_header_passes(tmp_path: Path) -> None:
    # The control for the refusals above: the same file with a known tensor name is fine.
    from vllm_mlx.models.gguf_header import read_gguf_header

    model = tmp_path / "ok.gguf"
    model.write_bytes(gguf_header("llama", LLAMA_KEYS, "blk.0.attn_q.weight"))
    header = read_gguf_header(model)
    assert (header.architecture, header.tensor_count) == ("llama", 1)


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"config.json": "{not json"}, "not readable JSON"),
        ({"config.json": "{}"}, "no model_type"),
        ({"config.json": '{"model_type": "llama"}', "pytorch_model.bin": ""}, "no *.safetensors"),
    ],
    ids=["bad-json", "no-model-type", "no-safetensors"],
)
def test_check_config_checks_a_model_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], files: dict[str, str], expected: str
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    for name, text in files.items():
        (model / name).write_text(text)
    config = tmp_path / "vllm-mlx.yaml"
    config.write_text(f"models:\n  - name: m\n    source: {model}\n")
    code, err = check_config(config, capsys)
    assert code == 1 and f"{config}:3:5: models[0].source:" in err and expected in err


def test_serve_and_check_config_refuse_the_same_files_the_same_way(tmp_path: Path) -> None:
    """Both commands, as processes: same exit status, same problem lines."""
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"hello\n")
    bad = {
        "gguf": f"models:\n  - name: m\n    source: {not_gguf}\n",
        "blas": "engine:\n  blas: /nonexistent/libopenblas.so.0\n",
        "host": "server:\n  host: localhost\n",
    }
    for name, text in bad.items():
        config = tmp_path / f"{name}.yaml"
        config.write_text(text)
        outputs = []
        for command in (["check-config", str(config)], ["serve", "--config", str(config)]):
            done = subprocess.run(
                [sys.executable, "-m", "vllm_mlx.cli", *command],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 1, (name, command, done.stderr[-2000:])
            outputs.append(done.stderr)
        assert outputs[0] == outputs[1] and f"{config}:" in outputs[0], name


def test_models_resolve_offline_is_one_line_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty hub cache
    config = tmp_path / "vllm-mlx.yaml"
    config.write_text("models:\n  - name: m\n    source: example-org/not-cached\n")
    assert main(["models", "--config", str(config), "--resolve"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: example-org/not-cached is not in the Hugging Face cache")

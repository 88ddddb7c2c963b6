"""`service install --env KEY=VALUE`: values never land in a file others can read."""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from vllm_mlx.cli.service import cmd_service
from vllm_mlx.runtime import service
from vllm_mlx.runtime.service import Launchd, Systemd, build_spec, env_file_text

SECRET = "hf_s3cr3t-token"


def ok(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    code = 3 if "is-active" in argv else 0  # not running yet
    return subprocess.CompletedProcess(list(argv), code, stdout="", stderr="")


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "vllm-mlx.yaml"
    path.write_text(f"paths: {{cache_dir: '{tmp_path / 'cache'}'}}\n")
    return path


def install(manager: service.ServiceManager, config: Path, *env: str, dry: bool = False) -> int:
    args = argparse.Namespace(
        action="install", scope="user", config=str(config), env=list(env), dry_run=dry
    )
    return cmd_service(args, manager)


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_systemd_keeps_env_values_in_a_private_file_the_unit_reads(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manager = Systemd("user", tmp_path / "xdg", ok)
    assert install(manager, config, f"HF_TOKEN={SECRET}") == 0
    unit = manager.unit_path.read_text()
    assert SECRET not in unit
    assert f"EnvironmentFile={manager.secrets_path}\n" in unit
    assert manager.secrets_path == tmp_path / "xdg" / "vllm-mlx" / "service.env"
    assert mode(manager.secrets_path) == 0o600
    assert f"HF_TOKEN='{SECRET}'" in manager.secrets_path.read_text().splitlines()
    assert str(manager.secrets_path) in capsys.readouterr().out

    # Reinstalling without --env leaves no old value behind; uninstall removes the file.
    assert install(manager, config) == 0
    assert "EnvironmentFile" not in manager.unit_path.read_text()
    assert not manager.secrets_path.exists()
    assert install(manager, config, f"HF_TOKEN={SECRET}") == 0
    manager.uninstall()
    assert not manager.secrets_path.exists()


def test_an_existing_readable_env_file_is_replaced_by_a_private_one(
    config: Path, tmp_path: Path
) -> None:
    manager = Systemd("user", tmp_path / "xdg", ok)
    manager.secrets_path.parent.mkdir(parents=True)
    manager.secrets_path.write_text("OLD=1\n")
    manager.secrets_path.chmod(0o644)
    assert install(manager, config, f"KEY={SECRET}") == 0
    assert mode(manager.secrets_path) == 0o600 and "OLD" not in manager.secrets_path.read_text()


def test_dry_run_names_the_keys_never_the_values(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manager = Systemd("user", tmp_path / "xdg", ok)
    assert install(manager, config, f"HF_TOKEN={SECRET}", dry=True) == 0
    out = capsys.readouterr()
    assert SECRET not in out.out + out.err and "HF_TOKEN" in out.err
    assert not manager.secrets_path.exists()


def test_launchd_writes_the_plist_0600_when_it_holds_env_values(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manager = Launchd("user", tmp_path / "home", 501, ok)
    assert install(manager, config, f"HF_TOKEN={SECRET}") == 0
    assert mode(manager.unit_path) == 0o600 and SECRET in manager.unit_path.read_text()
    assert "launchd has no environment files" in capsys.readouterr().out
    assert install(manager, config) == 0
    assert mode(manager.unit_path) == 0o644


def test_env_file_quoting_keeps_values_literal() -> None:
    text = env_file_text({"A": "x $HOME y", "B": 'it\'s "q" \\ $x', "C": ""})
    lines = text.splitlines()
    assert lines[0].startswith("#")
    assert lines[1:] == ["A='x $HOME y'", 'B="it\'s \\"q\\" \\\\ \\$x"', "C=''"]


@pytest.mark.parametrize(
    "item", ["A=line\nExecStartPre=/bin/evil", "BAD KEY=1", "=1", "NOVALUE", "A=x\rB"]
)
def test_env_items_that_could_inject_unit_lines_are_refused(config: Path, item: str) -> None:
    with pytest.raises(service.ServiceError, match="--env"):
        build_spec("user", config, [item])


def test_install_warns_when_the_config_holds_keys_others_can_read(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config.write_text("auth:\n  api_keys: [k1]\n")
    config.chmod(0o640)
    assert install(Systemd("user", tmp_path / "xdg", ok), config) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and "its group" in err and f"chmod 600 {config}" in err

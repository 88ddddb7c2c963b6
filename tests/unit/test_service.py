"""Rendered launchd/systemd units and the service manager calls, on any platform."""

from __future__ import annotations

import argparse
import plistlib
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from vllm_mlx.cli import service as service_cli
from vllm_mlx.cli.service import cmd_service
from vllm_mlx.runtime import service
from vllm_mlx.runtime.service import (
    LABEL,
    UNIT,
    Launchd,
    ServiceSpec,
    Systemd,
    build_spec,
    render_plist,
    render_unit,
    systemd_quote,
)


class FakeRunner:
    """Records launchctl/systemctl calls; answers with the given exit codes."""

    def __init__(self, codes: dict[str, int] | None = None) -> None:
        self.calls: list[list[str]] = []
        self.codes = codes or {}

    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        code = next((c for word, c in self.codes.items() if word in argv), 0)
        return subprocess.CompletedProcess(list(argv), code, stdout="state = running\n", stderr="")


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "etc & more" / "vllm-mlx.yaml"  # a space and an XML special
    path.parent.mkdir()
    path.write_text(
        f"server: {{drain_timeout: 42.5}}\npaths: {{cache_dir: '{tmp_path / 'cache'}'}}\n"
    )
    return path


def spec_for(config: Path, scope: service.Scope = "system") -> ServiceSpec:
    return build_spec(scope, config, ["HF_HUB_OFFLINE=1"])


def unit_for(spec: ServiceSpec) -> str:
    return render_unit(spec, Path("/etc/vllm-mlx/service.env"))


def test_spec_reads_the_config(config: Path, tmp_path: Path) -> None:
    spec = spec_for(config)
    assert spec.drain_timeout == 42.5
    assert spec.stop_timeout > spec.drain_timeout
    assert tmp_path / "cache" in spec.writable
    assert spec.argv[-3:] == ["serve", "--config", str(config)]
    assert Path(spec.argv[0]).is_file()  # this install's own vllm-mlx (or python)
    assert spec.environment["HF_HUB_OFFLINE"] == "1"


def test_spec_refuses_an_invalid_config(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("server: {prot: 1}\n")
    with pytest.raises(service.ServiceError, match=r"bad.yaml:1:\d+: server.prot"):
        build_spec("user", bad)


def test_spec_refuses_malformed_env(config: Path) -> None:
    with pytest.raises(service.ServiceError, match="KEY=VALUE"):
        build_spec("user", config, ["NOVALUE"])


def test_plist_round_trips_with_required_keys_and_types(config: Path, tmp_path: Path) -> None:
    spec = spec_for(config)
    data = plistlib.loads(render_plist(spec, tmp_path / "logs").encode())
    assert data["Label"] == LABEL
    assert data["ProgramArguments"] == spec.argv
    assert all(isinstance(arg, str) for arg in data["ProgramArguments"])
    assert data["RunAtLoad"] is True
    assert data["KeepAlive"] == {"SuccessfulExit": False}  # restart on crash only
    assert isinstance(data["ThrottleInterval"], int) and data["ThrottleInterval"] > 0
    assert isinstance(data["ExitTimeOut"], int) and data["ExitTimeOut"] > spec.drain_timeout
    assert data["StandardOutPath"] == str(tmp_path / "logs" / "vllm-mlx.out.log")
    assert data["StandardErrorPath"] == str(tmp_path / "logs" / "vllm-mlx.err.log")
    assert data["EnvironmentVariables"] == spec.environment
    assert data["WorkingDirectory"] == str(spec.home)


def test_systemd_quote() -> None:
    assert systemd_quote("/usr/bin/vllm-mlx") == "/usr/bin/vllm-mlx"
    assert systemd_quote("/a b/c") == '"/a b/c"'
    assert systemd_quote("100%") == "100%%"
    assert systemd_quote('say "hi" $X') == '"say \\"hi\\" $$X"'


def unit_lines(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def test_system_unit_has_reload_stop_timeout_and_hardening(config: Path, tmp_path: Path) -> None:
    spec = spec_for(config)
    lines = unit_lines(unit_for(spec))
    assert lines["Restart"] == ["on-failure"]
    assert lines["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert int(lines["TimeoutStopSec"][0]) > spec.drain_timeout
    assert lines["NoNewPrivileges"] == ["yes"]
    assert lines["ProtectSystem"] == ["strict"]
    assert f"-{tmp_path / 'cache'}" in lines["ReadWritePaths"]
    assert lines["ReadOnlyPaths"] == [f'-"{config.parent}"']
    assert lines["StandardOutput"] == ["journal"]
    assert lines["WantedBy"] == ["multi-user.target"]
    assert lines["ExecStart"][0].endswith(f'serve --config "{config}"')


def test_user_unit_leaves_out_namespace_hardening(config: Path) -> None:
    lines = unit_lines(unit_for(spec_for(config, "user")))
    assert "ProtectSystem" not in lines and lines["NoNewPrivileges"] == ["yes"]
    assert lines["WantedBy"] == ["default.target"]


def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        # install.sh --dev installs it on Debian/Ubuntu (apt-get install systemd).
        pytest.fail("systemd-analyze is missing: run ./install.sh --dev (apt-get install systemd)")
    return path


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="systemd is Linux-only")
@pytest.mark.parametrize("scope", ["system", "user"])
def test_systemd_analyze_verify_passes(config: Path, tmp_path: Path, scope: service.Scope) -> None:
    unit = tmp_path / UNIT
    unit.write_text(unit_for(spec_for(config, scope)))
    result = subprocess.run(
        [systemd_analyze(), "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        check=False,
    )
    # verify exits 0 on mere warnings, so a clean run also means no output about it.
    assert result.returncode == 0, result.stderr
    assert str(unit) not in result.stdout + result.stderr, result.stderr


def test_systemd_analyze_catches_a_broken_unit(config: Path, tmp_path: Path) -> None:
    # The check above can fail: a unit with a bad key does produce output.
    if not sys.platform.startswith("linux"):
        pytest.skip("systemd is Linux-only")
    unit = tmp_path / UNIT
    unit.write_text(unit_for(spec_for(config)).replace("KillMode=mixed", "KillMode=bogus"))
    result = subprocess.run(
        [systemd_analyze(), "verify", "--man=no", str(unit)], capture_output=True, text=True
    )
    assert str(unit) in result.stdout + result.stderr


def test_systemd_user_install_writes_unit_and_enables(config: Path, tmp_path: Path) -> None:
    run = FakeRunner({"is-active": 3})
    manager = Systemd("user", tmp_path / "xdg-config", run)
    manager.install(manager.render(spec_for(config, "user")))
    assert manager.unit_path == tmp_path / "xdg-config" / "systemd" / "user" / UNIT
    assert "ExecStart=" in manager.unit_path.read_text()
    assert run.calls == [
        ["systemctl", "--user", "daemon-reload"],
        ["systemctl", "--user", "is-active", "--quiet", UNIT],
        ["systemctl", "--user", "enable", "--now", UNIT],
    ]


def test_systemd_reinstall_restarts_a_running_service(config: Path, tmp_path: Path) -> None:
    run = FakeRunner()  # is-active answers 0: running
    manager = Systemd("system", tmp_path, run, root=tmp_path / "root")
    manager.install(manager.render(spec_for(config)))
    assert manager.unit_path == tmp_path / "root" / "etc" / "systemd" / "system" / UNIT
    assert run.calls[-2:] == [["systemctl", "enable", UNIT], ["systemctl", "restart", UNIT]]


def test_systemd_install_failure_is_reported(config: Path, tmp_path: Path) -> None:
    manager = Systemd("user", tmp_path, FakeRunner({"daemon-reload": 1}))
    with pytest.raises(service.ServiceError, match="daemon-reload"):
        manager.install("unit text")


def test_systemd_uninstall(config: Path, tmp_path: Path) -> None:
    run = FakeRunner()
    manager = Systemd("user", tmp_path, run)
    manager.install("x")
    run.calls.clear()
    manager.uninstall()
    assert not manager.unit_path.exists()
    assert run.calls == [
        ["systemctl", "--user", "disable", "--now", UNIT],
        ["systemctl", "--user", "daemon-reload"],
    ]


def test_launchd_agent_install_boots_out_then_bootstraps(config: Path, tmp_path: Path) -> None:
    run = FakeRunner({"bootout": 3})  # not loaded yet: bootout fails, install goes on
    manager = Launchd("user", tmp_path / "home", 501, run)
    manager.install(manager.render(spec_for(config, "user")))
    plist = tmp_path / "home" / "Library" / "LaunchAgents" / f"{LABEL}.plist"
    assert manager.unit_path == plist
    assert plistlib.loads(plist.read_bytes())["Label"] == LABEL
    assert (tmp_path / "home" / "Library" / "Logs" / "vllm-mlx").is_dir()
    assert run.calls == [
        ["launchctl", "bootout", f"gui/501/{LABEL}"],
        ["launchctl", "bootstrap", "gui/501", str(plist)],
    ]


def test_launchd_daemon_paths_and_uninstall(config: Path, tmp_path: Path) -> None:
    run = FakeRunner()
    manager = Launchd("system", tmp_path, 0, run, root=tmp_path / "root")
    manager.install(manager.render(spec_for(config)))
    assert manager.unit_path == tmp_path / "root" / "Library" / "LaunchDaemons" / f"{LABEL}.plist"
    assert ["launchctl", "bootstrap", "system", str(manager.unit_path)] in run.calls
    manager.uninstall()
    assert not manager.unit_path.exists()
    assert run.calls[-1] == ["launchctl", "bootout", f"system/{LABEL}"]
    assert manager.status().args == ["launchctl", "print", f"system/{LABEL}"]


def test_make_manager_by_platform(tmp_path: Path) -> None:
    assert isinstance(service.make_manager("user", "darwin", tmp_path), Launchd)
    assert isinstance(service.make_manager("user", "linux", tmp_path), Systemd)
    with pytest.raises(service.ServiceError):
        service.make_manager("user", "win32", tmp_path)


def args(action: str, **extra: object) -> argparse.Namespace:
    base: dict[str, object] = {"scope": "user", "config": None, "env": [], "dry_run": False}
    return argparse.Namespace(action=action, **{**base, **extra})


def test_cli_install_status_uninstall(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = FakeRunner({"is-active": 3})
    manager = Systemd("user", tmp_path / "cfg", run)
    assert cmd_service(args("status"), manager) == 3
    assert "not installed" in capsys.readouterr().out
    assert cmd_service(args("install", config=str(config)), manager) == 0
    assert str(config) in manager.unit_path.read_text()
    assert cmd_service(args("status"), manager) == 0
    assert "state = running" in capsys.readouterr().out
    assert cmd_service(args("uninstall"), manager) == 0
    assert not manager.unit_path.exists()


def test_cli_dry_run_changes_nothing(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = FakeRunner()
    manager = Systemd("user", tmp_path / "cfg", run)
    assert cmd_service(args("install", config=str(config), dry_run=True), manager) == 0
    assert "ExecStart=" in capsys.readouterr().out
    assert run.calls == [] and not manager.unit_path.exists()


def test_cli_install_creates_a_config_when_none_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("VLLM_MLX_CONFIG", raising=False)
    created = tmp_path / "xdg" / "vllm-mlx" / "vllm-mlx.yaml"
    monkeypatch.setattr(
        service_cli, "platform_config_paths", lambda: [created, tmp_path / "system.yaml"]
    )
    monkeypatch.setattr(service_cli, "find_config_file", lambda explicit=None: None)
    manager = Systemd("user", tmp_path / "cfg", FakeRunner({"is-active": 3}))
    assert cmd_service(args("install"), manager) == 0
    assert created.is_file() and "server:" in created.read_text()
    assert created.stat().st_mode & 0o777 == 0o600
    assert f"created {created}" in capsys.readouterr().out
    assert str(created) in manager.unit_path.read_text()


def test_cli_reports_errors_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manager = Systemd("user", tmp_path, FakeRunner())
    assert cmd_service(args("install", config=str(tmp_path / "missing.yaml")), manager) == 1
    assert "does not exist" in capsys.readouterr().err


def test_service_home_and_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pwd

    assert service.service_home("system") == Path(pwd.getpwuid(0).pw_dir)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert service.service_home("user") == tmp_path
    default_cache = service.caches(tmp_path, None, {})
    assert default_cache[1] == tmp_path / ".cache" / "huggingface"
    assert default_cache[0].is_relative_to(tmp_path)
    assert service.caches(tmp_path, Path("~/models"), {"HF_HOME": "/hf"}) == (
        tmp_path / "models",
        Path("/hf"),
    )

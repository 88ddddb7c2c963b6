"""`vllm-mlx service install|uninstall|status`: the daemon as a launchd or systemd service.

The unit is rendered from launchd/vllm-mlx.plist.template or
systemd/vllm-mlx.service.template with this install's paths and config. Everything
that touches the system goes through a `ServiceManager`, whose launchctl/systemctl
calls are plain subprocess calls made through one injected `Runner`, so rendering and
the command sequence are tested on any platform.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from string import Template
from typing import Literal, Protocol
from xml.sax.saxutils import escape

from vllm_mlx.configfile import ConfigError, find_config_file, load_config, platform_config_paths

Scope = Literal["user", "system"]
Runner = Callable[[Sequence[str]], subprocess.CompletedProcess[str]]

LABEL = "org.vllm-mlx.daemon"  # launchd job label
UNIT = "vllm-mlx.service"  # systemd unit name
# The stop timeout a service manager gets: the drain, then ABORT_GRACE_S (daemon.py)
# for aborted streams to end, then stopping the engines.
STOP_GRACE_S = 15
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
ROOT = Path("/")  # system unit paths hang off it; tests pass a temporary directory


def run_command(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """The real Runner: run, capture output, never raise on a non-zero exit."""
    return subprocess.run(list(argv), capture_output=True, text=True, check=False)


@dataclass(frozen=True)
class ServiceSpec:
    """What a rendered unit says: how to start this install's daemon, and where."""

    scope: Scope
    program: tuple[str, ...]  # argv that runs `vllm-mlx`
    config: Path
    drain_timeout: float
    writable: tuple[Path, ...]  # model caches the daemon writes
    home: Path
    environment: dict[str, str] = field(default_factory=dict)

    @property
    def stop_timeout(self) -> int:
        return math.ceil(self.drain_timeout) + STOP_GRACE_S

    @property
    def argv(self) -> list[str]:
        return [*self.program, "serve", "--config", str(self.config)]


def template_text(name: str) -> str:
    return resources.files("vllm_mlx").joinpath("templates", name).read_text(encoding="utf-8")


def _plist_string(value: str, indent: str) -> str:
    return f"{indent}<string>{escape(value)}</string>"


def render_plist(spec: ServiceSpec, log_dir: Path) -> str:
    env = "\n".join(
        f"    <key>{escape(k)}</key>\n{_plist_string(v, '    ')}"
        for k, v in sorted(spec.environment.items())
    )
    return Template(template_text("vllm-mlx.plist.template")).substitute(
        label=escape(LABEL),
        program_arguments="\n".join(_plist_string(arg, "    ") for arg in spec.argv),
        working_directory=escape(str(spec.home)),
        exit_timeout=spec.stop_timeout,
        stdout_path=escape(str(log_dir / "vllm-mlx.out.log")),
        stderr_path=escape(str(log_dir / "vllm-mlx.err.log")),
        environment=env,
    )


def systemd_quote(value: str) -> str:
    """One ExecStart/Environment word: `%` and `$` are systemd specials; quote spaces."""
    value = value.replace("%", "%%").replace("$", "$$")
    if any(c.isspace() for c in value) or '"' in value or "\\" in value:
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return value


# Needs a system manager (or, for user units, unprivileged user namespaces, which not
# every distribution allows): only system units get it.
SYSTEM_HARDENING = """\
ProtectSystem=strict
ProtectHome=read-only
PrivateTmp=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectControlGroups=yes
RestrictSUIDSGID=yes
LockPersonality=yes
RestrictRealtime=yes
"""


def render_unit(spec: ServiceSpec) -> str:
    hardening = ""
    if spec.scope == "system":
        writable = "".join(f"ReadWritePaths=-{systemd_quote(str(p))}\n" for p in spec.writable)
        config_dir = systemd_quote(str(spec.config.parent))
        hardening = f"{SYSTEM_HARDENING}{writable}ReadOnlyPaths=-{config_dir}\n"
    env = "".join(
        f"Environment={systemd_quote(f'{k}={v}')}\n" for k, v in sorted(spec.environment.items())
    )
    return Template(template_text("vllm-mlx.service.template")).substitute(
        exec_start=" ".join(systemd_quote(arg) for arg in spec.argv),
        stop_timeout=spec.stop_timeout,
        working_directory=systemd_quote(str(spec.home)),
        environment=env,
        hardening=hardening,
        wanted_by="multi-user.target" if spec.scope == "system" else "default.target",
    )


class ServiceManager(Protocol):
    """One service manager: where its unit goes and the calls that (un)load it."""

    unit_path: Path

    def render(self, spec: ServiceSpec) -> str: ...

    def install(self, text: str) -> None: ...

    def uninstall(self) -> None: ...

    def status(self) -> subprocess.CompletedProcess[str]: ...


class ServiceError(Exception):
    pass


def _checked(result: subprocess.CompletedProcess[str]) -> None:
    if result.returncode != 0:
        output = (result.stderr or result.stdout).strip()
        raise ServiceError(f"`{shlex.join(result.args)}` failed ({result.returncode}): {output}")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    path.chmod(0o644)


class Launchd:
    def __init__(
        self, scope: Scope, home: Path, uid: int, run: Runner = run_command, root: Path = ROOT
    ) -> None:
        self.scope = scope
        self.run = run
        if scope == "user":
            self.unit_path = home / "Library" / "LaunchAgents" / f"{LABEL}.plist"
            self.domain = f"gui/{uid}"
            self.log_dir = home / "Library" / "Logs" / "vllm-mlx"
        else:
            self.unit_path = root / "Library" / "LaunchDaemons" / f"{LABEL}.plist"
            self.domain = "system"
            self.log_dir = root / "Library" / "Logs" / "vllm-mlx"

    def render(self, spec: ServiceSpec) -> str:
        return render_plist(spec, self.log_dir)

    def install(self, text: str) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        _write(self.unit_path, text)
        # A job already loaded keeps its old definition: unload first (an error here
        # only means it was not loaded).
        self.run(["launchctl", "bootout", f"{self.domain}/{LABEL}"])
        _checked(self.run(["launchctl", "bootstrap", self.domain, str(self.unit_path)]))

    def uninstall(self) -> None:
        self.run(["launchctl", "bootout", f"{self.domain}/{LABEL}"])
        self.unit_path.unlink(missing_ok=True)

    def status(self) -> subprocess.CompletedProcess[str]:
        return self.run(["launchctl", "print", f"{self.domain}/{LABEL}"])


class Systemd:
    def __init__(
        self, scope: Scope, config_home: Path, run: Runner = run_command, root: Path = ROOT
    ) -> None:
        self.scope = scope
        self.run = run
        if scope == "user":
            self.unit_path = config_home / "systemd" / "user" / UNIT
        else:
            self.unit_path = root / "etc" / "systemd" / "system" / UNIT
        self.systemctl = ["systemctl", "--user"] if scope == "user" else ["systemctl"]

    def render(self, spec: ServiceSpec) -> str:
        return render_unit(spec)

    def install(self, text: str) -> None:
        _write(self.unit_path, text)
        _checked(self.run([*self.systemctl, "daemon-reload"]))
        active = self.run([*self.systemctl, "is-active", "--quiet", UNIT]).returncode == 0
        if active:  # enable --now would leave the old definition running
            _checked(self.run([*self.systemctl, "enable", UNIT]))
            _checked(self.run([*self.systemctl, "restart", UNIT]))
        else:
            _checked(self.run([*self.systemctl, "enable", "--now", UNIT]))

    def uninstall(self) -> None:
        self.run([*self.systemctl, "disable", "--now", UNIT])
        self.unit_path.unlink(missing_ok=True)
        self.run([*self.systemctl, "daemon-reload"])

    def status(self) -> subprocess.CompletedProcess[str]:
        return self.run([*self.systemctl, "status", "--no-pager", "--lines=5", UNIT])


def make_manager(
    scope: Scope,
    platform: str = sys.platform,
    home: Path | None = None,
    run: Runner = run_command,
) -> ServiceManager:
    home = home or Path.home()
    if platform == "darwin":
        return Launchd(scope, home, os.getuid(), run)
    if platform.startswith("linux"):
        config_home = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
        return Systemd(scope, config_home, run)
    raise ServiceError(f"services are supported on macOS (launchd) and Linux, not {platform}")


def program_argv() -> tuple[str, ...]:
    """How the service starts this install: its `vllm-mlx` script, else `python -m`."""
    # The venv's interpreter path as is: resolving its symlink would leave the venv.
    python = Path(os.path.abspath(sys.executable))
    script = python.parent / "vllm-mlx"
    if script.is_file() and os.access(script, os.X_OK):
        return (str(script),)
    return (str(python), "-m", "vllm_mlx.cli")


def default_scope() -> Scope:
    return "system" if os.geteuid() == 0 else "user"


def _reference_config() -> str:
    """The commented reference config from a source checkout, else a minimal file."""
    reference = Path(__file__).resolve().parents[2] / "config" / "vllm-mlx.yaml"
    if reference.is_file():
        text = reference.read_text(encoding="utf-8")
        # Its schema comment is relative to the repository; the copy lives elsewhere.
        return "\n".join(line for line in text.splitlines() if "$schema=" not in line) + "\n"
    return (
        "# vllm-mlx configuration: every key is described in docs/configuration.md.\n"
        "server:\n  host: 127.0.0.1\n  port: 8000\n"
    )


def service_config(scope: Scope, explicit: str | None) -> tuple[Path, bool]:
    """The config file the service runs with, and whether it was just created.

    A named file is kept as named (a symlink stays a symlink); with none found, the
    platform's per-user or system config file is created from the reference config.
    """
    if explicit:
        path = Path(os.path.abspath(Path(explicit).expanduser()))
        if not path.is_file():
            raise ServiceError(f"config file {path} does not exist")
        private_tmp = path.is_relative_to("/tmp") or path.is_relative_to("/var/tmp")
        if scope == "system" and sys.platform.startswith("linux") and private_tmp:
            # The system unit has PrivateTmp=yes: it would see an empty /tmp.
            raise ServiceError(f"{path} is in a temporary directory the service cannot see")
        return path, False
    found = find_config_file()
    if found is not None:
        return found, False
    user_path, system_path = platform_config_paths()
    path = user_path if scope == "user" else system_path
    _write(path, _reference_config())
    path.chmod(0o600)  # API keys will go in here; the service runs as its owner
    return path, True


def build_spec(scope: Scope, config: Path, extra_env: Sequence[str] = ()) -> ServiceSpec:
    """The spec for this install, checking the config exactly as `serve` will."""
    try:
        settings = load_config(config).settings
    except ConfigError as exc:
        raise ServiceError(f"invalid configuration:\n{exc}") from exc
    from huggingface_hub import constants

    home = Path.home()
    program = program_argv()
    environment = {
        # HOME pinned: the daemon then finds the same default cache dirs as this check.
        "HOME": str(home),
        "PATH": f"{Path(program[0]).parent}:{DEFAULT_PATH}",
        "PYTHONUNBUFFERED": "1",
    }
    for item in extra_env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ServiceError(f"--env wants KEY=VALUE, got {item!r}")
        environment[key] = value
    return ServiceSpec(
        scope=scope,
        program=program,
        config=config,
        drain_timeout=settings.server.drain_timeout,
        writable=(settings.resolved_cache_dir(), Path(constants.HF_HOME)),
        home=home,
        environment=environment,
    )


def add_service_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    service = commands.add_parser(
        "service", help="install, remove or inspect the launchd/systemd service"
    )
    service.add_argument("action", choices=["install", "uninstall", "status"])
    scope = service.add_mutually_exclusive_group()
    for name, what in (
        ("user", "per-user LaunchAgent / systemd user unit (default unless root)"),
        ("system", "system LaunchDaemon / systemd system unit (default as root)"),
    ):
        scope.add_argument(f"--{name}", dest="scope", action="store_const", const=name, help=what)
    service.add_argument("--config", help="config file the service runs with (install)")
    service.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="extra environment"
    )
    service.add_argument(
        "--dry-run", action="store_true", help="print the rendered unit, change nothing"
    )


def cmd_service(args: argparse.Namespace, manager: ServiceManager | None = None) -> int:
    scope: Scope = args.scope or default_scope()
    try:
        manager = manager or make_manager(scope)
        if scope == "system" and os.geteuid() != 0 and not args.dry_run:
            raise ServiceError("a system service needs root: run it with sudo")
        handler = {"install": _install, "uninstall": _uninstall, "status": _status}
        return handler[args.action](args, scope, manager)
    except ServiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _install(args: argparse.Namespace, scope: Scope, manager: ServiceManager) -> int:
    if args.dry_run:
        config = Path(args.config) if args.config else find_config_file()
        spec = build_spec(scope, Path(os.path.abspath(config or "vllm-mlx.yaml")), args.env)
        print(manager.render(spec), end="")
        print(f"# would write {manager.unit_path}", file=sys.stderr)
        return 0
    config, created = service_config(scope, args.config)
    if created:
        print(f"created {config} from the reference config")
    text = manager.render(build_spec(scope, config, args.env))
    manager.install(text)
    print(f"installed {manager.unit_path} (config: {config}) and started it")
    if isinstance(manager, Systemd) and scope == "user":
        print("to keep it running after you log out: loginctl enable-linger $USER")
    return 0


def _uninstall(args: argparse.Namespace, scope: Scope, manager: ServiceManager) -> int:
    existed = manager.unit_path.exists()
    manager.uninstall()
    print(f"removed {manager.unit_path}" if existed else f"not installed: {manager.unit_path}")
    return 0


def _status(args: argparse.Namespace, scope: Scope, manager: ServiceManager) -> int:
    if not manager.unit_path.exists():
        print(f"not installed ({scope}): {manager.unit_path} does not exist")
        return 3
    print(f"installed ({scope}): {manager.unit_path}")
    result = manager.status()
    print((result.stdout or result.stderr).rstrip())
    return result.returncode

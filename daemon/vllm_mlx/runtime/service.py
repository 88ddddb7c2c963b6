"""The daemon as a launchd or systemd service: unit rendering and the managers' calls.

The unit is rendered from launchd/vllm-mlx.plist.template or
systemd/vllm-mlx.service.template with this install's paths and config. Everything
that touches the system goes through a `ServiceManager`, whose launchctl/systemctl
calls are plain subprocess calls made through one injected `Runner`, so rendering and
the command sequence are tested on any platform. The command line is cli/service.py.
"""

from __future__ import annotations

import math
import os
import pwd
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from string import Template
from typing import Literal, Protocol
from xml.sax.saxutils import escape

from vllm_mlx.config.errors import ConfigError
from vllm_mlx.config.file import load_config

Scope = Literal["user", "system"]
Runner = Callable[[Sequence[str]], subprocess.CompletedProcess[str]]

LABEL = "org.vllm-mlx.daemon"  # launchd job label
UNIT = "vllm-mlx.service"  # systemd unit name
ENV_FILE = "service.env"  # the --env values of a systemd unit, beside the config (0600)
ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
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
    # The --env keys: their values may be secrets (API keys, hub tokens), so systemd
    # units read them from a 0600 file instead of holding them (see env_file_text).
    secret_keys: frozenset[str] = frozenset()
    warnings: tuple[str, ...] = ()  # about the config file (e.g. keys readable by others)

    @property
    def secrets(self) -> dict[str, str]:
        return {k: v for k, v in self.environment.items() if k in self.secret_keys}

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


def render_unit(spec: ServiceSpec, env_file: Path) -> str:
    """The systemd unit; the --env values stay out of it, in `env_file` (0600)."""
    hardening = ""
    if spec.scope == "system":
        writable = "".join(f"ReadWritePaths=-{systemd_quote(str(p))}\n" for p in spec.writable)
        config_dir = systemd_quote(str(spec.config.parent))
        hardening = f"{SYSTEM_HARDENING}{writable}ReadOnlyPaths=-{config_dir}\n"
    env = "".join(
        f"Environment={systemd_quote(f'{k}={v}')}\n"
        for k, v in sorted(spec.environment.items())
        if k not in spec.secret_keys
    )
    if spec.secret_keys:
        env += f"EnvironmentFile={systemd_quote(str(env_file))}\n"
    return Template(template_text("vllm-mlx.service.template")).substitute(
        exec_start=" ".join(systemd_quote(arg) for arg in spec.argv),
        stop_timeout=spec.stop_timeout,
        working_directory=systemd_quote(str(spec.home)),
        environment=env,
        hardening=hardening,
        wanted_by="multi-user.target" if spec.scope == "system" else "default.target",
    )


def env_file_text(secrets: Mapping[str, str]) -> str:
    """A systemd EnvironmentFile: single quotes keep a value literal ($, \\, spaces);
    a value holding a single quote goes in double quotes with systemd's escapes."""
    lines = ["# Written by `vllm-mlx service install --env`; mode 0600: it holds secrets."]
    for key, value in sorted(secrets.items()):
        if "'" not in value:
            lines.append(f"{key}='{value}'")
        else:
            escaped = "".join("\\" + c if c in '"\\`$' else c for c in value)
            lines.append(f'{key}="{escaped}"')
    return "\n".join(lines) + "\n"


class ServiceManager(Protocol):
    """One service manager: where its unit goes and the calls that (un)load it."""

    unit_path: Path
    secrets_path: Path  # where the --env values are written (mode 0600)

    def render(self, spec: ServiceSpec) -> str: ...

    def install(self, text: str, secrets: Mapping[str, str] | None = None) -> None: ...

    def uninstall(self) -> None: ...

    def status(self) -> subprocess.CompletedProcess[str]: ...


class ServiceError(Exception):
    pass


def _checked(result: subprocess.CompletedProcess[str]) -> None:
    if result.returncode != 0:
        output = (result.stderr or result.stdout).strip()
        raise ServiceError(f"`{shlex.join(result.args)}` failed ({result.returncode}): {output}")


def write_file(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    path.chmod(0o644)


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read, never readable by others even for a moment:
    created 0600 beside the target, then renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # O_CREAT's mode does not apply to a file left over
        os.write(fd, text.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)


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
        # launchd has no environment files: the plist holds the values, so it is 0600.
        self.secrets_path = self.unit_path

    def render(self, spec: ServiceSpec) -> str:
        return render_plist(spec, self.log_dir)

    def install(self, text: str, secrets: Mapping[str, str] | None = None) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if secrets:
            write_private(self.unit_path, text)
        else:
            write_file(self.unit_path, text)
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
            self.secrets_path = config_home / "vllm-mlx" / ENV_FILE
        else:
            self.unit_path = root / "etc" / "systemd" / "system" / UNIT
            self.secrets_path = root / "etc" / "vllm-mlx" / ENV_FILE
        self.systemctl = ["systemctl", "--user"] if scope == "user" else ["systemctl"]

    def render(self, spec: ServiceSpec) -> str:
        return render_unit(spec, self.secrets_path)

    def install(self, text: str, secrets: Mapping[str, str] | None = None) -> None:
        if secrets:
            write_private(self.secrets_path, env_file_text(secrets))
        else:  # values from an earlier install must not linger
            self.secrets_path.unlink(missing_ok=True)
        write_file(self.unit_path, text)
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
        self.secrets_path.unlink(missing_ok=True)
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


def service_home(scope: Scope) -> Path:
    """The daemon's HOME: yours for a user service, root's for a system one."""
    return Path.home() if scope == "user" else Path(pwd.getpwuid(0).pw_dir)


def caches(home: Path, configured: Path | None, environment: dict[str, str]) -> tuple[Path, ...]:
    """The directories the daemon writes, as it will see them under the unit's
    environment (HOME pinned, no XDG_CACHE_HOME): GGUF imports and the HF hub cache."""
    if configured is not None:
        text = str(configured)
        cache = home / text[2:] if text.startswith("~/") else configured
    elif sys.platform == "darwin":
        cache = home / "Library" / "Caches" / "vllm-mlx"
    else:
        cache = home / ".cache" / "vllm-mlx"
    hub = Path(environment.get("HF_HOME") or home / ".cache" / "huggingface")
    return cache, hub


def build_spec(scope: Scope, config: Path, extra_env: Sequence[str] = ()) -> ServiceSpec:
    """The spec for this install, checking the config exactly as `serve` will."""
    try:
        loaded = load_config(config)
    except ConfigError as exc:
        raise ServiceError(f"invalid configuration:\n{exc}") from exc
    home = service_home(scope)
    program = program_argv()
    environment = {
        "HOME": str(home),
        "PATH": f"{Path(program[0]).parent}:{DEFAULT_PATH}",
        "PYTHONUNBUFFERED": "1",
    }
    secret_keys = set()
    for item in extra_env:
        key, sep, value = item.partition("=")
        if not sep or not ENV_KEY.match(key):
            raise ServiceError(f"--env wants KEY=VALUE (KEY: letters, digits, _), got {item!r}")
        if any(c in value for c in "\n\r\0"):
            # A line break would end the unit's line: the rest would become directives.
            raise ServiceError(f"--env {key}: the value must be one line")
        environment[key] = value
        secret_keys.add(key)
    return ServiceSpec(
        scope=scope,
        program=program,
        config=config,
        drain_timeout=loaded.settings.server.drain_timeout,
        writable=caches(home, loaded.settings.paths.cache_dir, environment),
        home=home,
        environment=environment,
        secret_keys=frozenset(secret_keys),
        warnings=loaded.warnings,
    )

"""`vllm-mlx service install|uninstall|status [--user|--system]`: argument wiring and
the install flow over runtime/service.py's managers."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from vllm_mlx.config.file import find_config_file, platform_config_paths
from vllm_mlx.runtime.service import (
    Scope,
    ServiceError,
    ServiceManager,
    Systemd,
    build_spec,
    make_manager,
    write_file,
)


def default_scope() -> Scope:
    return "system" if os.geteuid() == 0 else "user"


def _reference_config() -> str:
    """The commented reference config from a source checkout, else a minimal file."""
    reference = Path(__file__).resolve().parents[3] / "config" / "vllm-mlx.yaml"
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
    write_file(path, _reference_config())
    path.chmod(0o600)  # API keys will go in here; the service runs as its owner
    return path, True


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
        if spec.secret_keys:
            keys = ", ".join(sorted(spec.secret_keys))
            print(f"# {keys} would go in {manager.secrets_path} (mode 0600)", file=sys.stderr)
        return 0
    config, created = service_config(scope, args.config)
    if created:
        print(f"created {config} from the reference config")
    spec = build_spec(scope, config, args.env)
    for warning in spec.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    manager.install(manager.render(spec), spec.secrets)
    print(f"installed {manager.unit_path} (config: {config}) and started it")
    if spec.secret_keys:
        where = (
            "the plist (launchd has no environment files), so it is"
            if manager.secrets_path == manager.unit_path
            else "an environment file the unit reads,"
        )
        print(f"the --env values are in {where} readable by its owner only: {manager.secrets_path}")
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

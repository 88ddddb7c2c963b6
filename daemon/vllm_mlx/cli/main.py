"""Command line: argument wiring only. `vllm-mlx serve | check-config | models | reload |
service`."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from vllm_mlx import __version__
from vllm_mlx.cli.preflight import choose_blas, exit_on_config_error, load_or_exit
from vllm_mlx.cli.serve_flags import (
    add_serve_flags,
    apply_served_name,
    name_flags,
    serve_overrides,
    with_embedding_model,
)
from vllm_mlx.config.errors import ConfigError, format_key_path
from vllm_mlx.config.file import CONFIG_ENV_VAR, LoadedConfig, load_config
from vllm_mlx.config.sections import LoggingSettings
from vllm_mlx.config.settings import Settings
from vllm_mlx.logging import configure_logging


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm-mlx", description="LLM inference daemon on MLX")
    parser.add_argument("--version", action="version", version=f"vllm-mlx {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the daemon")
    add_serve_flags(serve)
    check = commands.add_parser("check-config", help="validate a config file and exit")
    check.add_argument("path", nargs="?", help="the file (default: the one serve would use)")
    check.add_argument("--print", action="store_true", help="print the effective merged config")
    check.add_argument("--mcp-config", help="also check this JSON file of MCP servers")
    from vllm_mlx.cli.models import add_models_parser

    add_models_parser(commands)
    reload = commands.add_parser(
        "reload", help="make the running daemon reload its config, models included (SIGHUP)"
    )
    reload.add_argument("--config", help="the daemon's config file (to find its port)")
    reload.add_argument("--port", type=int, help="the daemon's port (default: from the config)")
    reload.add_argument("--pid", type=int, help="signal this process instead of looking it up")
    from vllm_mlx.cli.service import add_service_parser

    add_service_parser(commands)
    from vllm_mlx.cli.keys import add_keys_parser

    add_keys_parser(commands)
    return parser


def _config_source(explicit: str | None, loaded: LoadedConfig) -> Path | None:
    """The config file as named, symlinks not followed: a reload reads through a link
    that now points elsewhere."""
    named = explicit or os.environ.get(CONFIG_ENV_VAR)
    if named:
        return Path(os.path.abspath(Path(named).expanduser()))
    return loaded.path


def cmd_serve(args: argparse.Namespace) -> int:
    overrides = serve_overrides(args)
    try:
        loaded = apply_served_name(
            load_config(args.config, overrides), args.served_model_name, bool(args.model), args
        )
        loaded = with_embedding_model(loaded, args.embedding_model)
    except ConfigError as exc:
        exit_on_config_error(name_flags(exc))
    source = _config_source(args.config, loaded)
    choose_blas(loaded.settings.engine.blas)
    distributed = loaded.settings.distributed.enabled
    if distributed:  # the parent runs the group; a follower rank follows; rank 0 serves
        from vllm_mlx.distributed.launcher import enter_group, leave_group

        code = enter_group(loaded.settings)
        if code is not None:
            return code

    def reload_config() -> Settings:
        # Exactly what serve did: the same file, environment and flags.
        fresh = load_config(source, overrides)
        fresh = apply_served_name(fresh, args.served_model_name, bool(args.model), args)
        return with_embedding_model(fresh, args.embedding_model).settings

    from vllm_mlx.runtime.daemon import run

    code = run(loaded, reload_config, source)
    return leave_group(code) if distributed else code


def cmd_reload(args: argparse.Namespace) -> int:
    from vllm_mlx.runtime.lifecycle import find_daemon_pid

    pid = args.pid
    if pid is None:
        settings = load_or_exit(args.config).settings
        port = args.port or settings.server.port
        try:
            pid = find_daemon_pid(settings.resolved_cache_dir(), port)
        except LookupError as exc:
            print(f"error: {exc} (is it running? pass --pid or --port)", file=sys.stderr)
            return 1
    try:
        os.kill(pid, signal.SIGHUP)
    except OSError as exc:
        print(f"error: cannot signal pid {pid}: {exc.strerror}", file=sys.stderr)
        return 1
    print(f"reload requested (SIGHUP sent to pid {pid}); the daemon logs the result")
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    mcp_file = args.mcp_config and os.path.abspath(Path(args.mcp_config).expanduser())
    loaded = load_or_exit(args.path, {"mcp": {"config_file": mcp_file}} if mcp_file else None)
    where = str(loaded.path) if loaded.path else "built-in defaults (no config file found)"
    for warning in loaded.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if args.print:
        print(yaml.safe_dump(loaded.settings.model_dump(mode="json"), sort_keys=False), end="")
    memory = loaded.settings.memory
    if memory.budget_mb is not None or memory.budget_percent is not None:
        choose_blas(loaded.settings.engine.blas)  # sizes depend on the dtype served
        from vllm_mlx.models.estimate import budget_problem

        problem = budget_problem(loaded.settings)
        if problem is not None:
            key = "memory.budget_mb" if memory.budget_mb is not None else "memory.budget_percent"
            print(f"error: {where}: {key}: {problem}", file=sys.stderr)
            return 1
    models = loaded.settings.models
    if any(model.adapters or model.speculative.draft_model for model in models):
        problems = adapter_problems(loaded)
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        if problems:
            return 1
    print(f"ok: {where}", file=sys.stderr)
    return 0


def adapter_problems(loaded: LoadedConfig) -> list[str]:
    """Adapters that do not fit their base model's shape, and draft models without
    their target's tokenizer, each at its file:line."""
    choose_blas(loaded.settings.engine.blas)  # a bundled GGUF may be imported to read it
    from vllm_mlx.config.file import read_config_file
    from vllm_mlx.models.adapter_fit import adapter_fit_problems
    from vllm_mlx.models.draft_fit import draft_tokenizer_problems

    settings = loaded.settings
    found = list(adapter_fit_problems(settings))
    found += draft_tokenizer_problems(settings.models, settings.resolved_cache_dir())
    if not found:
        return []
    positions = read_config_file(loaded.path)[1] if loaded.path else None
    out = []
    for key, message in found:
        mark = positions.locate(key) if positions is not None else None
        where = str(loaded.path or "built-in defaults")
        if mark is not None:
            where += f":{mark[0]}:{mark[1]}"
        out.append(f"{where}: {format_key_path(key)}: {message}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from vllm_mlx.cli.keys import cmd_keys
    from vllm_mlx.cli.models import cmd_models
    from vllm_mlx.cli.service import cmd_service

    if args.command != "serve":
        configure_logging(LoggingSettings(format="console"), to_stderr=True)

    handlers = {
        "serve": cmd_serve,
        "check-config": cmd_check_config,
        "models": cmd_models,
        "reload": cmd_reload,
        "service": cmd_service,
        "keys": cmd_keys,
    }
    return handlers[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())

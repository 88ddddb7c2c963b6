"""What a command does before its work: read the config (exiting with its problems listed)
and pick MLX's BLAS. Shared by `serve`, `check-config`, `reload` and `models`."""

from __future__ import annotations

import sys
from typing import Any, NoReturn

from vllm_mlx.config.errors import ConfigError
from vllm_mlx.config.file import LoadedConfig, load_config


def exit_on_config_error(exc: ConfigError) -> NoReturn:
    print(f"error: invalid configuration ({len(exc.issues)} problem(s)):", file=sys.stderr)
    for issue in exc.issues:
        print(f"  {issue}", file=sys.stderr)
    raise SystemExit(1) from exc


def load_or_exit(path: str | None, overrides: dict[str, Any] | None = None) -> LoadedConfig:
    try:
        return load_config(path, overrides)
    except ConfigError as exc:
        exit_on_config_error(exc)


def choose_blas(mode: str) -> None:
    """Pick MLX's BLAS before anything imports mlx (see vllm_mlx.models.cpu.blas for why
    it must)."""
    from vllm_mlx.models.cpu import blas

    try:
        blas.configure(mode)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc

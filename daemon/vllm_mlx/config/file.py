"""Find, parse and validate `vllm-mlx.yaml`, with errors that name file, line and key path.

`load_settings` is the one place a Settings object is built; `serve`, `check-config` and
the hot reloader all go through it, so they agree on what a file means.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_origin

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_settings import SettingsError

from vllm_mlx.config.errors import (
    ConfigError,
    ConfigIssue,
    KeyPath,
    KeyPositions,
    format_key_path,
)
from vllm_mlx.config.fields import LocatedError, current_file_data
from vllm_mlx.config.mcp_file import with_mcp_file
from vllm_mlx.config.settings import ENV_NESTED_DELIMITER, ENV_PREFIX, Settings

CONFIG_FILE_NAME = "vllm-mlx.yaml"
CONFIG_ENV_VAR = "VLLM_MLX_CONFIG"


def platform_config_paths() -> list[Path]:
    """Per-user then system locations searched after ./vllm-mlx.yaml."""
    home = Path.home()
    if sys.platform == "darwin":
        return [
            home / "Library" / "Application Support" / "vllm-mlx" / CONFIG_FILE_NAME,
            Path("/Library/Application Support/vllm-mlx") / CONFIG_FILE_NAME,
        ]
    xdg = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
    return [xdg / "vllm-mlx" / CONFIG_FILE_NAME, Path("/etc/vllm-mlx") / CONFIG_FILE_NAME]


def find_config_file(explicit: str | Path | None = None) -> Path | None:
    """--config, then $VLLM_MLX_CONFIG, then ./vllm-mlx.yaml, then the platform paths.

    An explicitly named file must exist; the searched locations are optional.
    """
    named = explicit or os.environ.get(CONFIG_ENV_VAR)
    if named:
        path = Path(named).expanduser()
        if not path.is_file():
            origin = "--config" if explicit else f"environment variable {CONFIG_ENV_VAR}"
            what = (
                "is a directory, not a file"
                if path.is_dir()
                else "is not a regular file"
                if path.exists()
                else "does not exist"
            )
            raise ConfigError([ConfigIssue("", f"config file {path} {what}", origin)])
        return path.resolve()
    for candidate in [Path.cwd() / CONFIG_FILE_NAME, *platform_config_paths()]:
        if candidate.is_file():
            return candidate.resolve()
    return None


def _line_column(text: str, offset: int) -> tuple[int, int]:
    before = text[:offset]
    return before.count("\n") + 1, offset - (before.rfind("\n") + 1) + 1


def _read_text(path: Path) -> str:
    """The file as UTF-8 text; unreadable or non-UTF-8 files name the place."""
    origin = str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError([ConfigIssue("", f"cannot read: {exc.strerror}", origin)]) from exc
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        # Everything before the first bad byte is valid UTF-8: count characters there.
        before = raw[: exc.start].decode("utf-8")
        line, column = _line_column(before, len(before))
        message = f"not UTF-8 text (byte 0x{raw[exc.start]:02x}); save the file as UTF-8"
        raise ConfigError([ConfigIssue("", message, origin, line, column)]) from exc


# Blank lines (spaces, tabs) and comments only: nothing a YAML parser could read as a key.
_BLANK_OR_COMMENT = re.compile(r"(?:[ \t\r]*(?:#[^\n]*)?(?:\n|\Z))*")


def read_config_file(path: Path) -> tuple[dict[str, Any], KeyPositions]:
    """Parse the YAML file; syntax errors and a non-mapping root become ConfigErrors."""
    origin = str(path)
    text = _read_text(path)
    positions = KeyPositions()
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        if _BLANK_OR_COMMENT.fullmatch(text.removeprefix("\ufeff")):
            # YAML allows tabs on a blank line, PyYAML refuses them ("found character
            # '\t' that cannot start any token"): such a file is empty, not broken.
            return {}, positions
        mark = exc.problem_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (None, None)
        message = f"YAML syntax error: {exc.problem or exc}"
        raise ConfigError([ConfigIssue("", message, origin, line, column)]) from exc
    except yaml.reader.ReaderError as exc:  # a NUL or other control character
        line, column = _line_column(text, exc.position)
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)
        message = f"character U+{code:04X} is not allowed in YAML (is this a text file?)"
        raise ConfigError([ConfigIssue("", message, origin, line, column)]) from exc
    except RecursionError as exc:
        message = "YAML nesting is too deep"
        raise ConfigError([ConfigIssue("", message, origin)]) from exc
    if data is None:
        return {}, positions
    if not isinstance(data, dict):
        raise ConfigError([ConfigIssue("", "the file must be a mapping of keys", origin, 1, 1)])
    if node is not None:
        positions.walk(node, ())
    if positions.duplicates:
        raise ConfigError(
            [
                ConfigIssue(format_key_path(p), "duplicate key", origin, line, col)
                for p, line, col in positions.duplicates
            ]
        )
    return data, positions


def _env_var_for(path: KeyPath) -> str | None:
    """The environment variable that set this key, if one did."""
    for end in range(len(path), 0, -1):
        parts = [str(p) for p in path[:end] if isinstance(p, str)]
        name = ENV_PREFIX + ENV_NESTED_DELIMITER.join(parts).upper()
        if name in os.environ:
            return name
    return None


def _in_mapping(data: Mapping[str, Any], path: KeyPath) -> bool:
    current: Any = data
    for part in path:
        if isinstance(current, Mapping) and part in current:
            current = current[part]
        elif isinstance(current, list) and isinstance(part, int) and part < len(current):
            current = current[part]
        else:
            return False
    return True


def _issues_from(
    exc: ValidationError,
    file_path: Path | None,
    positions: KeyPositions,
    cli: Mapping[str, Any],
) -> list[ConfigIssue]:
    issues = []
    for error in exc.errors(include_url=False):
        path: KeyPath = tuple(error["loc"])
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, LocatedError):
            path = (*path, *cause.loc)
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown key (check the spelling; see docs/configuration.md)"
        key = format_key_path(path)
        if cli and _in_mapping(cli, path[:1]) and _in_mapping(cli, path[:2]):
            issues.append(ConfigIssue(key, message, "command line"))
            continue
        env_var = _env_var_for(path)
        if env_var is not None:
            issues.append(ConfigIssue(key, message, f"environment variable {env_var}"))
            continue
        where = positions.locate(path) if file_path else None
        origin = str(file_path) if file_path else "built-in defaults"
        line, column = where if where else (None, None)
        issues.append(ConfigIssue(key, message, origin, line, column))
    return issues


def _is_complex(parts: Sequence[str]) -> bool:
    """Whether pydantic-settings reads this env variable's value as JSON (a list, a
    mapping or a whole section)."""
    model: type[BaseModel] = Settings
    for index, part in enumerate(parts):
        info = model.model_fields.get(part)
        if info is None:
            return False
        annotation = info.annotation
        last = index == len(parts) - 1
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
            if last:
                return True
            continue
        return last and get_origin(annotation) in (list, dict)
    return False


def _env_json_issues(exc: SettingsError) -> list[ConfigIssue]:
    """The VLLM_MLX_* variables whose value should be JSON and is not."""
    match = re.search(r'field "(\w+)"', str(exc))
    prefix = ENV_PREFIX + (match.group(1).upper() if match else "")
    issues = []
    for name, value in sorted(os.environ.items()):
        upper = name.upper()
        if upper != prefix and not upper.startswith(prefix + ENV_NESTED_DELIMITER):
            continue
        parts = upper.removeprefix(ENV_PREFIX).lower().split(ENV_NESTED_DELIMITER)
        if not _is_complex(parts):
            continue
        try:
            json.loads(value)
        except ValueError:
            message = 'not valid JSON; lists and mappings are written as JSON, e.g. ["a", "b"]'
            issues.append(ConfigIssue(".".join(parts), message, f"environment variable {name}"))
    return issues or [ConfigIssue("", str(exc), "environment variables")]


@dataclass(frozen=True)
class LoadedConfig:
    settings: Settings
    path: Path | None
    warnings: tuple[str, ...] = ()  # logged by serve, printed by check-config


def _secret_warnings(path: Path | None, data: Mapping[str, Any]) -> tuple[str, ...]:
    """A file that holds API keys should be readable by its owner only."""
    auth = data.get("auth")
    if path is None or not isinstance(auth, Mapping) or not auth.get("api_keys"):
        return ()
    try:
        mode = path.stat().st_mode & 0o777
    except OSError:
        return ()
    if not mode & 0o044:
        return ()
    who = " and ".join(w for w, bit in (("its group", 0o040), ("everyone", 0o004)) if mode & bit)
    return (
        f"{path} holds auth.api_keys but is readable by {who} (mode {mode:04o}); "
        f"restrict it with: chmod 600 {path}",
    )


def load_config(
    config_path: str | Path | None = None,
    cli_overrides: Mapping[str, Any] | None = None,
) -> LoadedConfig:
    """Build Settings from file, environment and CLI; raise ConfigError listing every issue."""
    path = find_config_file(config_path)
    data, positions = read_config_file(path) if path else ({}, KeyPositions())
    cli = dict(cli_overrides or {})
    token = current_file_data.set(data)
    try:
        settings = Settings(**cli)
    except ValidationError as exc:
        raise ConfigError(_issues_from(exc, path, positions, cli)) from exc
    except SettingsError as exc:  # pydantic-settings could not decode an env variable
        raise ConfigError(_env_json_issues(exc)) from exc
    finally:
        current_file_data.reset(token)
    if settings.mcp.config_file is not None:
        settings = with_mcp_file(settings, path.parent if path else Path.cwd())
    return LoadedConfig(
        settings, path, _empty_file_warnings(path, data) + _secret_warnings(path, data)
    )


def _empty_file_warnings(path: Path | None, data: dict[str, Any]) -> tuple[str, ...]:
    # An empty (or comments-only) file is valid, but rarely meant: say so, rather than
    # a plain "ok" that reads as if the settings in it were understood.
    if path is None or data:
        return ()
    return (f"{path} is empty (no settings in it): every setting has its default",)


def load_settings(
    config_path: str | Path | None = None,
    cli_overrides: Mapping[str, Any] | None = None,
) -> Settings:
    return load_config(config_path, cli_overrides).settings

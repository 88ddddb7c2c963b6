"""`vllm-mlx serve`'s flags: how each sets a settings key (above the file and the
environment), and how an error in one is reported under the flag's own name."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from vllm_mlx.config.errors import ConfigError, ConfigIssue, format_key_path
from vllm_mlx.config.fields import LocatedError
from vllm_mlx.config.file import LoadedConfig
from vllm_mlx.config.model import ModelSettings
from vllm_mlx.config.model_checks import check_unique_model_ids
from vllm_mlx.parsers.reasoning import reasoning_parser_names
from vllm_mlx.parsers.tool_calls import tool_call_parser_names

# serve's flags that set one key: (key path, argparse dest); the flag is --dest.
FLAG_KEYS = (
    ("server.host", "host"),
    ("server.port", "port"),
    ("server.timeout", "timeout"),
    ("defaults.max_tokens", "max_tokens"),
    ("defaults.temperature", "default_temperature"),
    ("defaults.top_p", "default_top_p"),
    ("limits.max_request_tokens", "max_request_tokens"),
    ("engine.stream_interval", "stream_interval"),
    ("engine.continuous_batching", "continuous_batching"),
    ("engine.cache_memory_mb", "cache_memory_mb"),
    ("engine.cache_memory_percent", "cache_memory_percent"),
    ("engine.use_paged_cache", "use_paged_cache"),
    ("auth.api_keys", "api_key"),
    ("auth.rate_limit", "rate_limit"),
    ("metrics.enabled", "enable_metrics"),
)


def serve_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """CLI flags as a nested settings mapping (only the flags actually given)."""
    result: dict[str, Any] = {}
    for key_path, dest in FLAG_KEYS:
        value = getattr(args, dest)
        if value is not None:
            section, key = key_path.split(".")
            result.setdefault(section, {})[key] = value
    _one_cache_bound(args, result)
    if args.mcp_config:
        mcp_file = os.path.abspath(Path(args.mcp_config).expanduser())
        result.setdefault("mcp", {})["config_file"] = mcp_file
    if args.model:
        name = args.served_model_name or Path(args.model.rstrip("/")).name.removesuffix(".gguf")
        if args.model.startswith("builtin:"):
            name = args.served_model_name or args.model.removeprefix("builtin:")
        aliases = ["default"] if name != "default" else []
        model = {"name": name, "source": args.model, "aliases": aliases}
        result["models"] = [{**model, **_model_flags(args)}]
    return result


def _one_cache_bound(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """A cache bound flag replaces whichever bound the file sets (one may be set)."""
    keys = ("cache_memory_mb", "cache_memory_percent", "prefix_cache_mb")
    if args.cache_memory_mb is not None or args.cache_memory_percent is not None:
        engine = result.setdefault("engine", {})
        for key in keys:
            engine.setdefault(key, None)


def _model_flags(args: argparse.Namespace) -> dict[str, Any]:
    """Per-model flags that were given (parser names are checked by argparse choices)."""
    flags = {
        "enable_auto_tool_choice": args.enable_auto_tool_choice,
        "tool_call_parser": args.tool_call_parser,
        "reasoning_parser": args.reasoning_parser,
    }
    return {key: value for key, value in flags.items() if value is not None}


# The flag that sets each per-model key (for errors about a flag's value).
MODEL_FLAGS = {
    "name": "--served-model-name",
    "enable_auto_tool_choice": "--enable-auto-tool-choice",
    "tool_call_parser": "--tool-call-parser",
    "reasoning_parser": "--reasoning-parser",
}


def apply_served_name(
    loaded: LoadedConfig, served_name: str | None, had_model: bool, args: argparse.Namespace
) -> LoadedConfig:
    """Without MODEL, --served-model-name and the parser flags apply to the first model.

    Raises ConfigError naming the flag when the result is invalid (a parser missing, an
    id another model already uses).
    """
    updates = _model_flags(args)
    if served_name:
        updates["name"] = served_name
    if not updates or had_model:
        return loaded
    settings = loaded.settings
    taken = {i: m.name for m in settings.models[1:] for i in (m.name, *m.aliases)}
    if served_name in taken:
        message = f"{served_name!r} is already the name or an alias of model {taken[served_name]!r}"
        raise ConfigError(
            [ConfigIssue("models[0].name", message, "command line (--served-model-name)")]
        )
    try:
        first = ModelSettings.model_validate({**settings.models[0].model_dump(), **updates})
        models = [first, *settings.models[1:]]
        check_unique_model_ids(models)
    except ValidationError as exc:
        raise ConfigError([_flag_issue(e["loc"], e["msg"], updates) for e in exc.errors()]) from exc
    except LocatedError as exc:
        raise ConfigError([_flag_issue(exc.loc[1:], str(exc), updates)]) from exc
    renamed = settings.model_copy(update={"models": models})
    return LoadedConfig(renamed, loaded.path, loaded.warnings)


def _flag_issue(loc: Sequence[str | int], message: str, given: dict[str, Any]) -> ConfigIssue:
    keys = [str(loc[0])] if loc and str(loc[0]) in MODEL_FLAGS else list(given)
    flags = ", ".join(MODEL_FLAGS[key] for key in keys if key in MODEL_FLAGS)
    text = message.removeprefix("Value error, ")
    return ConfigIssue(format_key_path(["models", 0, *loc]), text, f"command line ({flags})")


def with_embedding_model(loaded: LoadedConfig, source: str | None) -> LoadedConfig:
    """--embedding-model: serve this embedding model too (unless one with its source is)."""
    settings = loaded.settings
    if source is None or any(m.source == source for m in settings.models):
        return loaded
    name = source.removeprefix("builtin:") if source.startswith("builtin:") else source
    name = Path(name.rstrip("/")).name
    origin = "command line (--embedding-model)"
    taken = {i for m in settings.models for i in (m.name, *m.aliases)}
    if name in taken:
        message = f"the model id {name!r} is already used"
        raise ConfigError([ConfigIssue(f"models[{len(settings.models)}].name", message, origin)])
    try:
        model = ModelSettings(name=name, source=source, task="embed")
    except ValidationError as exc:
        issues = [
            ConfigIssue(format_key_path(["models", len(settings.models), *e["loc"]]),
                        e["msg"].removeprefix("Value error, "), origin)
            for e in exc.errors()
        ]  # fmt: skip
        raise ConfigError(issues) from exc
    updated = settings.model_copy(update={"models": [*settings.models, model]})
    return LoadedConfig(updated, loaded.path, loaded.warnings)


def add_serve_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", help="serve only this model (any `source` form)")
    parser.add_argument("--config", help="path to vllm-mlx.yaml")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--served-model-name", help="the id clients use for the model")
    parser.add_argument(
        "--embedding-model",
        help="also serve this embedding model on /v1/embeddings (any `source` form, e.g. "
        "builtin:all-minilm-l6-v2 or a sentence-transformers folder of a BERT model)",
    )
    parser.add_argument("--max-tokens", type=int, help="default max_tokens")
    parser.add_argument(
        "--max-request-tokens", type=int, help="most new tokens one request may ask for"
    )
    parser.add_argument("--default-temperature", type=float)
    parser.add_argument("--default-top-p", type=float)
    parser.add_argument("--stream-interval", type=int, help="tokens per streamed chunk")
    parser.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        default=None,
        help="parse tool calls from the output (needs --tool-call-parser)",
    )
    parser.add_argument("--tool-call-parser", choices=tool_call_parser_names())
    parser.add_argument("--reasoning-parser", choices=reasoning_parser_names())
    parser.add_argument("--timeout", type=float, help="request timeout in seconds")
    parser.add_argument(
        "--api-key",
        action="append",
        help="require this API key on /v1 routes (repeat for several; replaces auth.api_keys)",
    )
    parser.add_argument(
        "--rate-limit", type=int, help="requests per minute per client on /v1 routes (0 = off)"
    )
    parser.add_argument(
        "--enable-metrics",
        action="store_true",
        default=None,
        help="serve Prometheus metrics at /metrics",
    )
    parser.add_argument(
        "--mcp-config",
        help="JSON file of MCP servers (the seed's shape or `mcpServers`); see docs/mcp.md",
    )
    parser.add_argument("--cache-memory-mb", type=int, help="prefix cache bound per model, MiB")
    parser.add_argument(
        "--cache-memory-percent", type=float, help="the same bound as a fraction of RAM (0.05)"
    )
    parser.add_argument(
        "--use-paged-cache",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="prefix cache in shared token blocks (default: on; docs/caching.md)",
    )
    parser.add_argument(
        "--continuous-batching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="batch concurrent requests (default: on)",
    )


def _flag_for(issue: ConfigIssue) -> str:
    """The flag behind a "command line" issue: `--port`, `--tool-call-parser`, MODEL."""
    for key, dest in FLAG_KEYS:
        if issue.key_path.startswith(key):
            return "--" + dest.replace("_", "-")
    for field, flag in MODEL_FLAGS.items():
        if issue.key_path.startswith(f"models[0].{field}"):
            return flag
    if issue.key_path == "models[0]" and "enable_auto_tool_choice" in issue.message:
        return MODEL_FLAGS["enable_auto_tool_choice"]
    return "MODEL"


def name_flags(exc: ConfigError) -> ConfigError:
    issues = [
        replace(issue, origin=f"command line ({_flag_for(issue)})")
        if issue.origin == "command line"
        else issue
        for issue in exc.issues
    ]
    return ConfigError(issues)

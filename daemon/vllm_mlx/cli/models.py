"""`vllm-mlx models [load|unload ID]`: the configured models, and what a running daemon
holds of them (state, memory, idle time); load or unload one in the running daemon.

The daemon is found the way `reload` finds it: the config file's server.host and
server.port (or --url), with its first API key (or --api-key).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import httpx

from vllm_mlx.cli.preflight import choose_blas, load_or_exit
from vllm_mlx.config.settings import Settings

TIMEOUT_S = 3.0
LOAD_TIMEOUT_S = 600.0  # a load reads the weights: minutes for a large model on a slow disk


def add_models_parser(commands: Any) -> None:
    models = commands.add_parser(
        "models",
        help="list models (with the running daemon's state, memory and idle time); "
        "`models load|unload ID` in the running daemon",
    )
    models.add_argument("action", nargs="?", choices=("list", "load", "unload"), default="list")
    models.add_argument("model_id", nargs="?", help="the model to load or unload")
    models.add_argument("--config", help="path to vllm-mlx.yaml")
    models.add_argument("--json", action="store_true", help="machine-readable output")
    models.add_argument(
        "--resolve", action="store_true", help="download/import models that are missing"
    )
    models.add_argument("--url", help="the daemon's base URL (default: from the config)")
    models.add_argument("--api-key", help="API key (default: the config's first auth key)")


def daemon_url(settings: Settings, explicit: str | None) -> str:
    if explicit:
        return explicit.rstrip("/")
    host = settings.server.host
    host = "127.0.0.1" if host in ("0.0.0.0", "") else "[::1]" if host == "::" else host
    return f"http://{host}:{settings.server.port}"


def _headers(settings: Settings, explicit: str | None) -> dict[str, str]:
    key = explicit or (settings.auth.api_keys[0] if settings.auth.api_keys else None)
    return {"Authorization": f"Bearer {key}"} if key else {}


def live_models(settings: Settings, args: argparse.Namespace) -> dict[str, dict[str, Any]] | None:
    """Each served model's state and residency by name; None when no daemon answers."""
    url = daemon_url(settings, args.url)
    try:
        response = httpx.get(
            f"{url}/v1/status", headers=_headers(settings, args.api_key), timeout=TIMEOUT_S
        )
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        print(f"warning: {url}/v1/status answered {response.status_code}", file=sys.stderr)
        return None
    return {
        block["model"]: {"state": block["state"], **block.get("residency", {})}
        for block in response.json().get("models", [])
    }


def control(settings: Settings, args: argparse.Namespace) -> int:
    """POST /v1/models/{id}/load|unload to the running daemon."""
    if not args.model_id:
        print(f"error: `vllm-mlx models {args.action}` needs a model id", file=sys.stderr)
        return 2
    url = daemon_url(settings, args.url)
    try:
        response = httpx.post(
            f"{url}/v1/models/{args.model_id}/{args.action}",
            headers=_headers(settings, args.api_key),
            timeout=LOAD_TIMEOUT_S,
        )
    except httpx.HTTPError as exc:
        print(f"error: no daemon answers at {url} ({exc}); is it running?", file=sys.stderr)
        return 1
    body = response.json()
    if response.status_code != 200:
        message = body.get("error", {}).get("message", response.text)
        print(f"error: {response.status_code}: {message}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(body, indent=2))
    else:
        done = "done" if body["changed"] else "nothing to do"
        print(f"{body['id']}: {args.action} {done}; now {body['state']}, "
              f"{body['memory_mb']:.0f} MiB")  # fmt: skip
    return 0


def print_rows(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        aliases = f" (aliases: {', '.join(row['aliases'])})" if row["aliases"] else ""
        directory = row["directory"] or "(not downloaded yet)"
        print(
            f"{row['name']}{aliases}\n  task: {row['task']}\n  source: {row['source']}\n"
            f"  directory: {directory}"
        )
        if row.get("vision"):
            print("  accepts images: yes (vision-language model)")
        if row.get("path"):
            print(f"  path: {row['path']} ({row['path_reason']})")
        live = row.get("daemon")
        if live:
            idle = "busy or not loaded" if live["idle_s"] is None else f"{live['idle_s']:.0f} s"
            print(
                f"  state: {live['state']}, memory: {live['memory_mb']:.0f} MiB, idle: {idle}, "
                f"keep_alive: {live['keep_alive']}, pinned: {live['pinned']}"
            )


def cmd_models(args: argparse.Namespace) -> int:
    loaded = load_or_exit(args.config)
    if args.action != "list":
        return control(loaded.settings, args)
    # The BLAS decides whether float32 is worth it, as in `serve` (`path` below); it must
    # be chosen before the loader imports mlx.
    choose_blas(loaded.settings.engine.blas)
    from vllm_mlx.models.loader import ModelUnavailableError, describe_models

    try:
        rows = describe_models(loaded.settings, resolve=args.resolve)
    except (ModelUnavailableError, ValueError, OSError) as exc:  # not cached, bad import
        print(f"error: {exc}", file=sys.stderr)
        return 1
    live = live_models(loaded.settings, args)
    if live is None:
        print(f"note: no daemon answers at {daemon_url(loaded.settings, args.url)}: "
              "showing the configuration only", file=sys.stderr)  # fmt: skip
    for row in rows:
        row["daemon"] = (live or {}).get(row["name"])
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print_rows(rows)
    return 0

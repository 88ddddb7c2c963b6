"""`vllm-mlx keys new NAME`: a fresh random key, printed once, and its YAML entry
(`vllm-mlx keys usage`, the usage table, is in keys_usage.py).

The entry holds only the key's SHA-256, so the config file never holds a usable
secret; the key itself is shown this once and kept nowhere by vllm-mlx.
"""

from __future__ import annotations

import argparse
import hashlib
import secrets
import sys
from typing import Any

import yaml

from vllm_mlx.cli.keys_usage import add_usage_parser, cmd_usage
from vllm_mlx.config.auth import KEY_NAME, SCOPES

KEY_PREFIX = "sk-vllm-mlx-"


def add_keys_parser(commands: Any) -> None:
    keys = commands.add_parser("keys", help="make API keys for auth.keys")
    actions = keys.add_subparsers(dest="keys_command", required=True)
    new = actions.add_parser("new", help="print a new random key once, and its auth.keys entry")
    new.add_argument("name", help="the key's name (in logs and /v1/status; never the key)")
    new.add_argument(
        "--scopes",
        default="inference",
        help=f"comma-separated, of {', '.join(SCOPES)} (default: inference)",
    )
    new.add_argument("--models", help="comma-separated model names or aliases (default: all)")
    add_usage_parser(actions)


def _listed(value: str | None) -> list[str]:
    return [part.strip() for part in (value or "").split(",") if part.strip()]


def new_key_entry(name: str, scopes: list[str], models: list[str]) -> tuple[str, dict[str, Any]]:
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    entry: dict[str, Any] = {
        "name": name,
        "key_sha256": hashlib.sha256(key.encode()).hexdigest(),
        "scopes": scopes,
    }
    if models:
        entry["models"] = models
    return key, entry


def cmd_keys(args: argparse.Namespace) -> int:
    if args.keys_command == "usage":
        return cmd_usage(args)
    return _cmd_new(args)


def _cmd_new(args: argparse.Namespace) -> int:
    if not KEY_NAME.fullmatch(args.name):
        print(
            f"vllm-mlx keys: {args.name!r} is not a key name (letters, digits and . _ -)",
            file=sys.stderr,
        )
        return 2
    scopes = _listed(args.scopes)
    unknown = [s for s in scopes if s not in SCOPES]
    if unknown or not scopes:
        print(
            f"vllm-mlx keys: unknown scopes {unknown}; choose from {', '.join(SCOPES)}",
            file=sys.stderr,
        )
        return 2
    key, entry = new_key_entry(args.name, scopes, _listed(args.models))
    print(f"API key for '{args.name}' (shown once; vllm-mlx keeps only its hash):\n\n  {key}\n")
    print("Add this under auth.keys in vllm-mlx.yaml (saving the file applies it):\n")
    print(yaml.safe_dump({"auth": {"keys": [entry]}}, sort_keys=False), end="")
    return 0

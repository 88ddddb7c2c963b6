"""`vllm-mlx keys usage`: what each key spent, as a table.

From the running daemon's GET /v1/usage when one answers (it needs an admin key:
`--api-key` or $VLLM_MLX_ADMIN_KEY), else straight from the usage database under
`paths.state_dir` (the daemon stopped: the file is only read).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from vllm_mlx.cli.models import TIMEOUT_S, daemon_url
from vllm_mlx.cli.preflight import load_or_exit
from vllm_mlx.config.settings import Settings
from vllm_mlx.usage.store import (
    COUNTERS,
    DATABASE_NAME,
    DEFAULT_DAYS,
    UsageFilter,
    query,
    totals,
)

ADMIN_KEY_ENV = "VLLM_MLX_ADMIN_KEY"
RELATIVE_DAYS = re.compile(r"(\d{1,5})d")
COLUMNS = ("day", "key", "model", "route", *COUNTERS)
HEADINGS = ("day", "key", "model", "route", "requests", "errors", "prompt", "cached",
            "completion", "gen_s")  # fmt: skip


def add_usage_parser(actions: Any) -> None:
    usage = actions.add_parser(
        "usage", help="print each key's usage (from the running daemon, or its database)"
    )
    usage.add_argument(
        "--since",
        help=f"first day: YYYY-MM-DD, or Nd for the last N days (default: {DEFAULT_DAYS}d)",
    )
    usage.add_argument("--until", help="last day, YYYY-MM-DD (default: today)")
    usage.add_argument("--key", help="only this key's name")
    usage.add_argument("--model", help="only this model")
    usage.add_argument("--json", action="store_true", help="machine-readable output")
    usage.add_argument("--config", help="path to vllm-mlx.yaml")
    usage.add_argument("--url", help="the daemon's base URL (default: from the config)")
    usage.add_argument("--api-key", help=f"an admin key (default: ${ADMIN_KEY_ENV})")


def day_argument(value: str | None, today: datetime) -> str | None:
    """YYYY-MM-DD as given, or `Nd`: the day N-1 days before today (7d: a week)."""
    if value is None:
        return None
    relative = RELATIVE_DAYS.fullmatch(value)
    if relative:
        return (today.date() - timedelta(days=max(1, int(relative[1])) - 1)).isoformat()
    return datetime.strptime(value, "%Y-%m-%d").date().isoformat()


def _from_daemon(settings: Settings, args: argparse.Namespace, where: UsageFilter) -> Any:
    """The report, or None when no daemon answers; raises SystemExit on a refusal."""
    url = daemon_url(settings, args.url)
    key = args.api_key or os.environ.get(ADMIN_KEY_ENV)
    params = {k: v for k, v in vars(where).items() if v is not None}
    try:
        response = httpx.get(
            f"{url}/v1/usage",
            params=params,
            headers={"Authorization": f"Bearer {key}"} if key else {},
            timeout=TIMEOUT_S,
        )
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:200]
        print(f"error: {url}/v1/usage answered {response.status_code}: {message}",
              file=sys.stderr)  # fmt: skip
        raise SystemExit(1)
    return response.json()


def _from_database(settings: Settings, where: UsageFilter) -> dict[str, Any]:
    rows = query(settings.resolved_state_dir() / DATABASE_NAME, where)
    return {"object": "usage.report", "data": rows, "totals": totals(rows)}


def print_table(rows: list[dict[str, Any]], total: dict[str, Any]) -> None:
    cells = [[str(row[c]) if row[c] != "" else "-" for c in COLUMNS] for row in rows]
    cells.append(["total", "", "", "", *(str(total[c]) for c in COUNTERS)])
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(HEADINGS)]
    for line in (list(HEADINGS), *cells):
        # The four names left-aligned, the numbers right-aligned.
        pairs = enumerate(zip(line, widths, strict=True))
        padded = [v.ljust(w) if i < 4 else v.rjust(w) for i, (v, w) in pairs]
        print("  ".join(padded).rstrip())


def cmd_usage(args: argparse.Namespace) -> int:
    loaded = load_or_exit(args.config)
    today = datetime.now(UTC)
    try:
        since = day_argument(args.since or f"{DEFAULT_DAYS}d", today)
        until = day_argument(args.until, today)
    except ValueError:
        print("error: --since and --until take YYYY-MM-DD (or Nd for --since)", file=sys.stderr)
        return 2
    where = UsageFilter(args.key, args.model, None, since, until)
    report = _from_daemon(loaded.settings, args, where)
    if report is None:
        path = loaded.settings.resolved_state_dir() / DATABASE_NAME
        print(f"note: no daemon answers; reading {path}", file=sys.stderr)
        report = _from_database(loaded.settings, where)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report["data"], report["totals"])
    return 0

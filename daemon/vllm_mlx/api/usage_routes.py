"""GET /v1/usage: what each key spent, from the usage database (admin scope).

    GET /v1/usage[?key=NAME][&model=NAME][&route=/v1/...][&since=YYYY-MM-DD][&until=...]

Rows are per UTC day, key, model and route, oldest first; `totals` sums them; `keys`
says where each named key stands against its quotas. What the last quarter second
counted is written first, so the answer includes every finished request. The shape is
documented in docs/operations.md ("Usage accounting").
"""

from __future__ import annotations

import asyncio
from datetime import date, timedelta
from typing import Any

from litestar import Request, Router, get
from litestar.params import FromQuery

from vllm_mlx.api.error_shapes import openai_error_response
from vllm_mlx.api.errors import APIError, bad_request
from vllm_mlx.api.state import request_settings, server_state
from vllm_mlx.config.auth import NamedKey
from vllm_mlx.usage.ledger import UsageLedger
from vllm_mlx.usage.store import DEFAULT_DAYS, UsageFilter, query, totals

MAX_ROWS = 10_000  # past this the answer says `truncated`; narrow it with the filters


def _day(value: str | None, name: str) -> str | None:
    if value is None:
        return None
    try:
        return date.fromisoformat(value).isoformat()
    except ValueError as exc:
        message = f"'{name}' must be a day as YYYY-MM-DD, not {value[:40]!r}"
        raise bad_request(message, name) from exc


def _key_block(ledger: UsageLedger, key: NamedKey) -> dict[str, Any]:
    state = ledger.quota(key.name)
    return {
        "name": key.name,
        "tokens_today": state.used_today,
        "tokens_this_month": state.used_month,
        "tokens_per_day": key.quota.tokens_per_day,
        "tokens_per_month": key.quota.tokens_per_month,
        "day_resets_at": state.day_resets_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "month_resets_at": state.month_resets_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


@get("/v1/usage")
async def usage_report(
    request: Request[Any, Any, Any],
    key: FromQuery[str | None] = None,
    model: FromQuery[str | None] = None,
    route: FromQuery[str | None] = None,
    since: FromQuery[str | None] = None,
    until: FromQuery[str | None] = None,
) -> dict[str, Any]:
    state = server_state(request)
    ledger = state.usage
    if ledger is None or not request_settings(request).usage.enabled:
        raise APIError(
            503, "usage accounting is off (usage.enabled)", "unavailable", code="usage_off"
        )
    first = _day(since, "since") or (ledger.today() - timedelta(days=DEFAULT_DAYS - 1)).isoformat()
    where = UsageFilter(key, model, route, first, _day(until, "until"))
    await asyncio.to_thread(ledger.flush)
    rows = await asyncio.to_thread(query, ledger.path, where, MAX_ROWS + 1)
    keys = request_settings(request).auth.keys
    return {
        "object": "usage.report",
        "since": where.since,
        "until": where.until,
        "data": rows[:MAX_ROWS],
        "truncated": len(rows) > MAX_ROWS,
        "totals": totals(rows[:MAX_ROWS]),
        "keys": [_key_block(ledger, k) for k in keys if key is None or k.name == key],
    }


def make_usage_router() -> Router:
    return Router(
        path="/",
        route_handlers=[usage_report],
        exception_handlers={Exception: openai_error_response},
    )

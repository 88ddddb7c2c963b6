"""Token limits of a named key: tokens per minute and the daily and monthly quotas.

Both are checked when a request arrives and charged when it ends (its tokens are not
known before), so they bound what a key starts, and one large request may overdraw.
The refusals are 429s, in each protocol's error shape, naming the limit and when it
frees up.
"""

from __future__ import annotations

import math
from datetime import datetime

from vllm_mlx.api.edge.limits import TokenRateLimiter, client_id, retry_after_header
from vllm_mlx.api.errors import APIError
from vllm_mlx.api.principal import Principal
from vllm_mlx.usage.ledger import QuotaState, UsageLedger


def token_rate_refusal(limiter: TokenRateLimiter, principal: Principal) -> APIError | None:
    per_minute = principal.tokens_per_minute or 0
    wait = limiter.admit(client_id(principal.name, None), per_minute)
    if wait is None:
        return None
    retry = retry_after_header(wait)
    return APIError(
        429,
        f"the API key '{principal.name}' is over its rate limit of {per_minute} tokens per "
        f"minute; retry in {retry} s.",
        "rate_limit",
        code="rate_limit_exceeded",
        headers={"Retry-After": retry},
    )


def quota_refusal(ledger: UsageLedger | None, principal: Principal) -> APIError | None:
    day_quota, month_quota = principal.tokens_per_day, principal.tokens_per_month
    if ledger is None or (day_quota is None and month_quota is None):
        return None
    state = ledger.quota(principal.name)
    if day_quota is not None and state.used_today >= day_quota:
        return _spent(principal, "daily", day_quota, state.used_today, state.day_resets_at, state)
    if month_quota is not None and state.used_month >= month_quota:
        resets = state.month_resets_at
        return _spent(principal, "monthly", month_quota, state.used_month, resets, state)
    return None


def _spent(
    principal: Principal, which: str, quota: int, used: int, resets: datetime, state: QuotaState
) -> APIError:
    stamp = resets.strftime("%Y-%m-%dT%H:%M:%SZ")
    seconds = max(1, math.ceil((resets - state.checked_at).total_seconds()))
    return APIError(
        429,
        f"the API key '{principal.name}' has used its {which} quota of {quota} tokens "
        f"({used} used); it resets at {stamp}.",
        "rate_limit",
        code="insufficient_quota",
        headers={"Retry-After": str(seconds)},
    )

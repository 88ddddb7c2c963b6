"""Per-client rate limits: a token bucket per client, in bounded memory.

A client is its API key when it sent a valid one, else its peer address. Each gets
`rate` requests a minute, refilled continuously, with bursts of up to `rate`; a named
key's tokens per minute are a bucket of the same kind that may go into debt. The rate
is passed on every call, so a hot-reloaded limit applies to the next request.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable

DEFAULT_MAX_CLIENTS = 10_000


def client_id(key_name: str | None, peer: str | None) -> str:
    """The key's name when one was presented (never the key), else the peer address."""
    if key_name is not None:
        return "key:" + key_name
    return "peer:" + (peer or "unknown")


class _Buckets:
    """Token buckets for the most recently seen clients (least recent evicted first).

    Eviction forgets a client's debt, so the bound trades exactness for memory: an
    evicted client starts again with a full bucket. With the default bound, that needs
    ten thousand other clients to have come by since its last request.
    """

    def __init__(
        self,
        max_clients: int = DEFAULT_MAX_CLIENTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_clients = max_clients
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, at

    def __len__(self) -> int:
        return len(self._buckets)

    def _level(self, client: str, per_minute: int, now: float) -> float:
        """What client's bucket holds now (taken out: _keep puts it back, most recent)."""
        tokens, last = self._buckets.pop(client, (float(per_minute), now))
        return min(float(per_minute), tokens + (now - last) * per_minute / 60.0)

    def _keep(self, client: str, tokens: float, now: float) -> None:
        self._buckets[client] = (tokens, now)
        while len(self._buckets) > self._max_clients:
            self._buckets.popitem(last=False)


class RateLimiter(_Buckets):
    """Requests per minute: one token per request, refilled continuously."""

    def acquire(self, client: str, per_minute: int) -> float | None:
        """Take one request from client's bucket: None if allowed, else seconds to wait."""
        if per_minute <= 0:
            return None
        now = self._clock()
        tokens = self._level(client, per_minute, now)
        wait: float | None = None
        if tokens >= 1.0:
            tokens -= 1.0
        else:
            wait = (1.0 - tokens) * 60.0 / per_minute
        self._keep(client, tokens, now)
        return wait


def retry_after_header(wait: float) -> str:
    """Whole seconds, rounded up, at least 1 (the header takes no fractions)."""
    return str(max(1, math.ceil(wait)))


class TokenRateLimiter(_Buckets):
    """Tokens per minute per key: a bucket that refills continuously and may go into
    debt, because a request's tokens are known only once it has ended.

    A key is admitted while its bucket holds anything; `spend` takes what a finished
    request used.
    """

    def admit(self, client: str, per_minute: int) -> float | None:
        """None when the key may start a request, else seconds until it may."""
        if per_minute <= 0:
            return None
        now = self._clock()
        tokens = self._level(client, per_minute, now)
        self._keep(client, tokens, now)
        if tokens > 0:
            return None
        return (1.0 - tokens) * 60.0 / per_minute

    def spend(self, client: str, per_minute: int, used: int) -> None:
        if per_minute <= 0 or used <= 0:
            return
        now = self._clock()
        self._keep(client, self._level(client, per_minute, now) - used, now)

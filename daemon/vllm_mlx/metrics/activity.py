"""The last minutes of activity, for the status page's charts and its error list.

Prometheus keeps history for those who run it; the page a person opens needs the last
ten minutes without one. Tokens arrive from the engine threads (once per step),
finished requests and errors from the event loop, so one lock guards the ring; each
call is a few additions under it. Memory is fixed: HISTORY_S / BUCKET_S buckets and
MAX_ERRORS errors, however busy the daemon.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

BUCKET_S = 5
HISTORY_S = 600
MAX_ERRORS = 20
MAX_ERROR_TEXT = 300


@dataclass
class _Bucket:
    start: int  # epoch seconds, a multiple of BUCKET_S
    prompt_tokens: int = 0
    generated_tokens: int = 0
    requests: int = 0
    ttft_total_s: float = 0.0
    ttft_count: int = 0


class Activity:
    def __init__(self, clock: Any = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: deque[_Bucket] = deque(maxlen=HISTORY_S // BUCKET_S)
        self._errors: deque[dict[str, Any]] = deque(maxlen=MAX_ERRORS)

    def _bucket(self) -> _Bucket:
        """The current bucket (under the lock); empty buckets are made for quiet spans
        only when the next event comes, so the ring never holds more than its length."""
        start = int(self._clock()) // BUCKET_S * BUCKET_S
        if not self._buckets or self._buckets[-1].start != start:
            self._buckets.append(_Bucket(start))
        return self._buckets[-1]

    def tokens(self, prompt_tokens: int, generated_tokens: int) -> None:
        """One engine step's tokens (called on an engine thread)."""
        with self._lock:
            bucket = self._bucket()
            bucket.prompt_tokens += prompt_tokens
            bucket.generated_tokens += generated_tokens

    def finished(self, ttft_s: float | None) -> None:
        """One generation request ended (its first token's wait, when it got one)."""
        with self._lock:
            bucket = self._bucket()
            bucket.requests += 1
            if ttft_s is not None:
                bucket.ttft_total_s += ttft_s
                bucket.ttft_count += 1

    def error(self, status: int, route: str, message: str | None, model: str | None) -> None:
        """A 4xx or 5xx answer: what the page lists under recent errors."""
        entry = {
            "at": round(self._clock(), 3),
            "status": status,
            "route": route[:MAX_ERROR_TEXT],
            "message": (message or "")[:MAX_ERROR_TEXT],
            "model": model[:MAX_ERROR_TEXT] if model else None,
        }
        with self._lock:
            self._errors.append(entry)

    def snapshot(self) -> dict[str, Any]:
        """Buckets of the last HISTORY_S seconds, oldest first, quiet ones included."""
        now = int(self._clock()) // BUCKET_S * BUCKET_S
        first = now - HISTORY_S + BUCKET_S
        with self._lock:
            seen = {b.start: b for b in self._buckets if b.start >= first}
            errors = list(self._errors)
        buckets = []
        for start in range(first, now + BUCKET_S, BUCKET_S):
            b = seen.get(start) or _Bucket(start)
            buckets.append(
                {
                    "start": start,
                    "prompt_tokens": b.prompt_tokens,
                    "generated_tokens": b.generated_tokens,
                    "requests": b.requests,
                    "ttft_avg_s": round(b.ttft_total_s / b.ttft_count, 4) if b.ttft_count else None,
                }
            )
        return {"bucket_s": BUCKET_S, "buckets": buckets, "errors": errors[::-1]}

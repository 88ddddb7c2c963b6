"""Usage in memory: what has not been written yet, and the quota counters.

`record` is called on the event loop once per request and costs one lock and a dict
update; a writer thread moves what has gathered into SQLite every FLUSH_INTERVAL_S, so
a SIGKILL loses at most that much. The quota counters (tokens per key today and this
month) are read back from the database at start-up, so a restart does not hand a key
a fresh quota.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import structlog

from vllm_mlx.usage.record import RequestUsage
from vllm_mlx.usage.store import Counters, UsageKey, UsageStore

log = structlog.get_logger(__name__)

FLUSH_INTERVAL_S = 0.25  # the most usage a SIGKILL can take (the issue allows a second)
NO_KEY = "-"  # the key column when the API is open: not a valid key name, so never a clash


def utc_now() -> datetime:
    return datetime.now(UTC)


def month_start(day: date) -> date:
    return day.replace(day=1)


def next_month(day: date) -> date:
    return (day.replace(day=28) + timedelta(days=4)).replace(day=1)


@dataclass(frozen=True)
class QuotaState:
    used_today: int
    used_month: int
    day_resets_at: datetime
    month_resets_at: datetime
    checked_at: datetime


class UsageLedger:
    def __init__(
        self,
        path: Path,
        retention_days: Callable[[], int],
        clock: Callable[[], datetime] = utc_now,
        flush_interval_s: float = FLUSH_INTERVAL_S,
    ) -> None:
        self._clock = clock
        self._interval = flush_interval_s
        self._retention_days = retention_days
        self._store = UsageStore(path)
        self.path = path
        self._lock = threading.Lock()
        self._pending: dict[UsageKey, Counters] = {}
        self._day = clock().date()
        self._write_lock = threading.Lock()  # one use of the store at a time
        self._pruned_on: date | None = None
        self._prune()
        self._today = self._store.tokens_by_key(self._day.isoformat())
        self._month = self._store.tokens_by_key(month_start(self._day).isoformat())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="usage-writer", daemon=True)
        self._thread.start()

    # --- the request path (event loop) -----------------------------------------------

    def record(self, key: str, route: str, usage: RequestUsage, error: bool) -> None:
        now = self._clock()
        spent = Counters(
            requests=1,
            errors=int(error),
            prompt_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens,
            completion_tokens=usage.completion_tokens,
            generation_seconds=usage.generation_seconds,
        )
        where = UsageKey(now.date().isoformat(), key, usage.model, route)
        with self._lock:
            self._roll(now.date())
            self._pending.setdefault(where, Counters()).add(spent)
            if usage.tokens:
                self._today[key] = self._today.get(key, 0) + usage.tokens
                self._month[key] = self._month.get(key, 0) + usage.tokens

    def today(self) -> date:
        return self._clock().date()

    def quota(self, key: str) -> QuotaState:
        now = self._clock()
        with self._lock:
            self._roll(now.date())
            today, month = self._today.get(key, 0), self._month.get(key, 0)
        midnight = datetime.combine(now.date() + timedelta(days=1), datetime.min.time(), UTC)
        first = datetime.combine(next_month(now.date()), datetime.min.time(), UTC)
        return QuotaState(today, month, midnight, first, now)

    def _roll(self, day: date) -> None:
        """A new UTC day (or month) starts its counters at zero. Holds self._lock."""
        if day == self._day:
            return
        if month_start(day) != month_start(self._day):
            self._month = {}
        self._today = {}
        self._day = day

    # --- the writer thread -----------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.flush()
                if self._pruned_on != self._clock().date():
                    self._prune()
            except Exception as exc:  # a full disk must not end accounting for good
                log.error("usage database write failed", path=str(self.path), error=str(exc))

    def flush(self) -> None:
        """Write what has gathered (any thread; /v1/usage calls it before reading)."""
        with self._write_lock:
            with self._lock:
                batch, self._pending = self._pending, {}
            if not batch:
                return
            try:
                self._store.add(batch)
            except Exception:
                with self._lock:  # keep it for the next try, added to what came since
                    for where, counters in batch.items():
                        self._pending.setdefault(where, Counters()).add(counters)
                raise

    def _prune(self) -> None:
        today = self._clock().date()
        first_kept = today - timedelta(days=self._retention_days() - 1)
        with self._write_lock:
            removed = self._store.prune(first_kept.isoformat())
        if removed:
            log.info("usage pruned", rows=removed, before=first_kept.isoformat())
        self._pruned_on = today

    def close(self) -> None:
        """Stop the writer and write the rest (daemon shutdown)."""
        self._stop.set()
        self._thread.join()
        try:
            self.flush()
        finally:
            self._store.close()

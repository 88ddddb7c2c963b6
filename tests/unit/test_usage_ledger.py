"""The usage ledger and its SQLite file: batching, quota counters across a reopen, UTC
day and month boundaries, retention, a failed write kept for the next, and the token
rate limiter."""

from __future__ import annotations

import sqlite3
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from vllm_mlx.api.edge.limits import TokenRateLimiter
from vllm_mlx.usage.ledger import UsageLedger, next_month
from vllm_mlx.usage.record import RequestUsage
from vllm_mlx.usage.store import DATABASE_NAME, UsageFilter, query, totals


class Clock:
    def __init__(self, at: datetime) -> None:
        self.at = at

    def __call__(self) -> datetime:
        return self.at


def _spent(model: str = "m", prompt: int = 10, completion: int = 5) -> RequestUsage:
    return RequestUsage(model, prompt, 4, completion, 0.5)


@pytest.fixture
def clock() -> Clock:
    return Clock(datetime(2026, 12, 31, 23, 59, 30, tzinfo=UTC))


def _ledger(tmp_path: Path, clock: Clock, retention: int = 400) -> UsageLedger:
    # The writer thread never wakes by itself here: the tests flush when they mean to.
    return UsageLedger(tmp_path / DATABASE_NAME, lambda: retention, clock, 3600.0)


def test_requests_add_up_per_day_key_model_and_route(tmp_path: Path, clock: Clock) -> None:
    ledger = _ledger(tmp_path, clock)
    try:
        for _ in range(3):
            ledger.record("app", "/v1/chat/completions", _spent(), error=False)
        ledger.record("app", "/v1/chat/completions", RequestUsage("m"), error=True)
        ledger.record("ops", "/v1/models", RequestUsage(), error=False)
        ledger.flush()
        rows = query(ledger.path, UsageFilter())
    finally:
        ledger.close()
    assert [(r["key"], r["model"], r["route"]) for r in rows] == [
        ("app", "m", "/v1/chat/completions"),
        ("ops", "", "/v1/models"),
    ]
    chat = rows[0]
    assert chat["day"] == "2026-12-31" and chat["requests"] == 4 and chat["errors"] == 1
    assert (chat["prompt_tokens"], chat["cached_tokens"], chat["completion_tokens"]) == (30, 12, 15)
    assert chat["generation_seconds"] == 1.5
    assert totals(rows)["requests"] == 5
    assert query(ledger.path, UsageFilter(key="ops"))[0]["route"] == "/v1/models"
    assert query(ledger.path, UsageFilter(since="2027-01-01")) == []


def test_quota_counters_survive_a_reopen_and_reset_at_utc_midnight(
    tmp_path: Path, clock: Clock
) -> None:
    ledger = _ledger(tmp_path, clock)
    ledger.record("app", "/v1/completions", _spent(), error=False)
    ledger.close()  # writes the rest

    reopened = _ledger(tmp_path, clock)
    try:
        state = reopened.quota("app")
        assert (state.used_today, state.used_month) == (15, 15)
        assert state.day_resets_at == datetime(2027, 1, 1, tzinfo=UTC)
        assert state.month_resets_at == datetime(2027, 1, 1, tzinfo=UTC)
        assert reopened.quota("other").used_today == 0

        clock.at += timedelta(minutes=1)  # 2027-01-01 00:00:30: a new day and month
        assert (reopened.quota("app").used_today, reopened.quota("app").used_month) == (0, 0)
        reopened.record("app", "/v1/completions", _spent(), error=False)
        clock.at += timedelta(days=1)  # a new day in the same month
        state = reopened.quota("app")
        assert (state.used_today, state.used_month) == (0, 15)
        assert state.day_resets_at == datetime(2027, 1, 3, tzinfo=UTC)
        assert state.month_resets_at == datetime(2027, 2, 1, tzinfo=UTC)
    finally:
        reopened.close()


def test_next_month_across_lengths() -> None:
    assert next_month(datetime(2027, 1, 31).date()).isoformat() == "2027-02-01"
    assert next_month(datetime(2028, 2, 29).date()).isoformat() == "2028-03-01"
    assert next_month(datetime(2026, 12, 1).date()).isoformat() == "2027-01-01"


def test_old_days_are_pruned_at_start(tmp_path: Path, clock: Clock) -> None:
    ledger = _ledger(tmp_path, clock)
    ledger.record("app", "/v1/completions", _spent(), error=False)
    ledger.close()
    clock.at += timedelta(days=10)
    kept = _ledger(tmp_path, clock, retention=11)
    kept.close()
    assert len(query(tmp_path / DATABASE_NAME, UsageFilter())) == 1
    pruned = _ledger(tmp_path, clock, retention=10)
    pruned.close()
    assert query(tmp_path / DATABASE_NAME, UsageFilter()) == []


def test_a_failed_write_is_kept_for_the_next(tmp_path: Path, clock: Clock) -> None:
    ledger = _ledger(tmp_path, clock)
    try:
        ledger.record("app", "/v1/completions", _spent(), error=False)
        blocker = sqlite3.connect(ledger.path, timeout=0)
        blocker.execute("BEGIN EXCLUSIVE")  # the writer cannot get the database
        ledger._store._db.execute("PRAGMA busy_timeout = 0")  # fail at once, not in 5 s
        with pytest.raises(sqlite3.OperationalError):
            ledger.flush()
        ledger.record("app", "/v1/completions", _spent(), error=False)
        blocker.rollback()
        blocker.close()
        ledger.flush()
        assert query(ledger.path, UsageFilter())[0]["requests"] == 2
    finally:
        ledger.close()


def test_a_database_from_a_newer_version_is_refused(tmp_path: Path, clock: Clock) -> None:
    path = tmp_path / DATABASE_NAME
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version = 99")
    with pytest.raises(RuntimeError, match="newer vllm-mlx"):
        _ledger(tmp_path, clock)


def test_the_database_is_wal_and_private(tmp_path: Path, clock: Clock) -> None:
    ledger = _ledger(tmp_path, clock)
    ledger.close()
    with sqlite3.connect(ledger.path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert ledger.path.stat().st_mode & 0o077 == 0


def test_token_rate_limiter_admits_until_the_minute_is_spent() -> None:
    now = [0.0]
    limiter = TokenRateLimiter(clock=lambda: now[0])
    assert limiter.admit("key:a", 60) is None
    limiter.spend("key:a", 60, 90)  # overdrawn by 30
    wait = limiter.admit("key:a", 60)
    assert wait is not None and wait == pytest.approx(31.0)
    assert limiter.admit("key:b", 60) is None  # keys are apart
    now[0] += 31.0
    assert limiter.admit("key:a", 60) is None
    assert limiter.admit("key:a", 0) is None  # 0: no limit


def test_the_writer_thread_writes_without_being_asked(tmp_path: Path, clock: Clock) -> None:
    ledger = UsageLedger(tmp_path / DATABASE_NAME, lambda: 400, clock)  # the real interval
    try:
        ledger.record("app", "/v1/completions", _spent(), error=False)
        deadline = time.monotonic() + 30
        while not query(ledger.path, UsageFilter()):  # a condition, polled
            assert time.monotonic() < deadline, "the writer never wrote"
            time.sleep(0.02)
    finally:
        ledger.close()

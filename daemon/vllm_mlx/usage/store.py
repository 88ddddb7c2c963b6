"""The usage database: one SQLite file, one row per (UTC day, key, model, route).

WAL mode with `synchronous=NORMAL`: a committed batch survives the process being
killed (the WAL is in the operating system's hands once written), only a power loss
can take the last batches, and readers (`/v1/usage`, `vllm-mlx keys usage` while the
daemon runs) never block the writer. Counters are added with an upsert, so a batch is
one transaction however many requests it sums.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping
from contextlib import closing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

DATABASE_NAME = "usage.sqlite3"
SCHEMA_VERSION = 1
DEFAULT_DAYS = 31  # a report without a first day: the last month

COUNTERS = (
    "requests",
    "errors",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "generation_seconds",
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    day TEXT NOT NULL,
    key TEXT NOT NULL,
    model TEXT NOT NULL,
    route TEXT NOT NULL,
    requests INTEGER NOT NULL DEFAULT 0,
    errors INTEGER NOT NULL DEFAULT 0,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    cached_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    generation_seconds REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (day, key, model, route)
) WITHOUT ROWID
"""

_UPSERT = f"""
INSERT INTO usage (day, key, model, route, {", ".join(COUNTERS)})
VALUES (?, ?, ?, ?, {", ".join("?" for _ in COUNTERS)})
ON CONFLICT (day, key, model, route) DO UPDATE SET
{", ".join(f"{c} = {c} + excluded.{c}" for c in COUNTERS)}
"""


@dataclass(frozen=True)
class UsageKey:
    day: str  # YYYY-MM-DD, UTC
    key: str  # the key's name; "-" when the API has no keys
    model: str  # "" for routes that name no model
    route: str  # the route template, e.g. /v1/chat/completions


@dataclass
class Counters:
    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    generation_seconds: float = 0.0

    def add(self, other: Counters) -> None:
        for name in COUNTERS:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def values(self) -> tuple[int | float, ...]:
        return tuple(getattr(self, name) for name in COUNTERS)


@dataclass(frozen=True)
class UsageFilter:
    key: str | None = None
    model: str | None = None
    route: str | None = None
    since: str | None = None  # first day included, YYYY-MM-DD
    until: str | None = None  # last day included

    def where(self) -> tuple[str, list[str]]:
        clauses: list[str] = []
        params: list[str] = []
        for column in ("key", "model", "route"):
            value = getattr(self, column)
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if self.since is not None:
            clauses.append("day >= ?")
            params.append(self.since)
        if self.until is not None:
            clauses.append("day <= ?")
            params.append(self.until)
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def _connect(path: Path, read_only: bool = False) -> sqlite3.Connection:
    if read_only:
        connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5.0)
    else:
        # Opened on the event loop, used by the ledger's writer: one at a time (its lock).
        connection = sqlite3.connect(path, timeout=5.0, check_same_thread=False)
    connection.execute("PRAGMA busy_timeout = 5000")
    return connection


class UsageStore:
    """The file and its writer connection; one caller at a time (the ledger's lock)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        # Key names and what they did: the owner's business (SQLite gives its -wal and
        # -shm files the same mode).
        path.touch(mode=0o600, exist_ok=True)
        self._db = _connect(path)
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA synchronous = NORMAL")
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            self._db.close()
            raise RuntimeError(
                f"{path} was written by a newer vllm-mlx (schema {version}, this one reads "
                f"{SCHEMA_VERSION}); move it aside or upgrade"
            )
        with self._db:
            self._db.execute(_SCHEMA)
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def add(self, batch: Mapping[UsageKey, Counters]) -> None:
        rows = [(k.day, k.key, k.model, k.route, *c.values()) for k, c in batch.items()]
        with self._db:  # one transaction
            self._db.executemany(_UPSERT, rows)

    def prune(self, before_day: str) -> int:
        """Delete the days before `before_day`; how many rows went."""
        with self._db:
            return self._db.execute("DELETE FROM usage WHERE day < ?", (before_day,)).rowcount

    def tokens_by_key(self, since_day: str) -> dict[str, int]:
        """Prompt + completion tokens per key from `since_day` on (quota counters)."""
        cursor = self._db.execute(
            "SELECT key, SUM(prompt_tokens + completion_tokens) FROM usage "
            "WHERE day >= ? GROUP BY key",
            (since_day,),
        )
        return {key: int(total) for key, total in cursor}

    def close(self) -> None:
        self._db.close()


def query(path: Path, where: UsageFilter, limit: int = -1) -> list[dict[str, Any]]:
    """The rows matching `where` (at most `limit`), oldest day first, from any thread or
    process."""
    if not path.exists():
        return []
    clause, params = where.where()
    sql = (
        f"SELECT day, key, model, route, {', '.join(COUNTERS)} FROM usage{clause} "
        "ORDER BY day, key, model, route LIMIT ?"
    )
    with closing(_connect(path, read_only=True)) as db:
        db.row_factory = sqlite3.Row
        return [_row(dict(row)) for row in db.execute(sql, [*params, limit])]


def _row(row: dict[str, Any]) -> dict[str, Any]:
    row["generation_seconds"] = round(float(row["generation_seconds"]), 3)
    return row


def totals(rows: Iterable[Mapping[str, Any]]) -> dict[str, int | float]:
    total = Counters()
    for row in rows:
        total.add(Counters(**{name: row[name] for name in COUNTERS}))
    out = asdict(total)
    out["generation_seconds"] = round(out["generation_seconds"], 3)
    return out

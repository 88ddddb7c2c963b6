"""What the HTTP side knows about the distributed group (no mlx here: api/ reads it).

Rank 0 keeps one GroupStatus: the ranks, their hosts, per-rank step and
communication times (gathered from every rank every few steps), and whether the
group has failed. /health turns a failed group into a 503; /v1/status shows it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RankTimes:
    steps: int = 0
    step_seconds: float = 0.0  # wall time of the model steps
    sync_seconds: float = 0.0  # time in the step-sync exchanges (rank 0's broadcasts)


@dataclass
class GroupStatus:
    rank: int
    size: int
    backend: str
    strategy: str
    hosts: list[str] = field(default_factory=list)
    state: str = "starting"  # starting -> serving (-> reloading -> serving) -> failed | stopped
    error: str | None = None
    failed_at: float | None = None
    times: list[RankTimes] = field(default_factory=list)
    weight_bytes: list[int] = field(default_factory=list)  # per rank, after sharding
    models: list[str] = field(default_factory=list)  # per rank: "name source" it loaded
    loads: int = 0  # models sharded so far (1 + reloads)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.times = [RankTimes() for _ in range(self.size)]
        self.weight_bytes = [0] * self.size

    @property
    def failed(self) -> bool:
        return self.state == "failed"

    def fail(self, message: str) -> bool:
        """Mark the group failed; True the first time."""
        with self._lock:
            if self.state == "failed":
                return False
            self.state, self.error, self.failed_at = "failed", message, time.time()
            return True

    def update_times(self, rows: list[tuple[float, float, float]]) -> None:
        """One window per rank; an idle window (heartbeats only) keeps the last busy one."""
        with self._lock:
            self.times = [
                RankTimes(int(s), t, c) if s > 0 else old
                for (s, t, c), old in zip(rows, self.times, strict=True)
            ]

    def metric_rows(self) -> tuple[list[tuple[int, str, float, float, int]], bool]:
        """For metrics.watch_group: per rank (rank, host, step s, sync s, bytes), up."""
        rows = []
        for rank, times in enumerate(self.times):
            steps = max(1, times.steps)
            host = self.hosts[rank] if rank < len(self.hosts) else ""
            step, sync = times.step_seconds / steps, times.sync_seconds / steps
            rows.append((rank, host, step, sync, self.weight_bytes[rank]))
        return rows, not self.failed

    def describe(self) -> dict[str, Any]:
        """The `distributed` block of /v1/status."""
        ranks = []
        for rank in range(self.size):
            times = self.times[rank]
            steps = max(1, times.steps)
            ranks.append(
                {
                    "rank": rank,
                    "host": self.hosts[rank] if rank < len(self.hosts) else None,
                    "state": self.state,
                    "steps": times.steps,
                    "step_ms": round(1000 * times.step_seconds / steps, 3),
                    "sync_ms": round(1000 * times.sync_seconds / steps, 3),
                    "weight_bytes": self.weight_bytes[rank],
                    "model": self.models[rank] if rank < len(self.models) else None,
                }
            )
        return {
            "backend": self.backend,
            "strategy": self.strategy,
            "size": self.size,
            "state": self.state,
            "error": self.error,
            "loads": self.loads,
            "ranks": ranks,
        }


_current: GroupStatus | None = None


def current() -> GroupStatus | None:
    """This process's group, when it is rank 0 of one (set once at start-up)."""
    return _current


def set_current(status: GroupStatus | None) -> None:
    global _current
    _current = status

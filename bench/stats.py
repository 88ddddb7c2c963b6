"""Statistics over request results: percentiles, throughput, per-scenario summaries.

Pure functions over plain records so they are unit-tested without a server.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class RequestResult:
    """One streamed request as the client saw it (times from time.perf_counter())."""

    started: float
    first_token: float | None = None
    finished: float | None = None
    # Arrival time of every chunk that carried generated text.
    chunk_times: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.finished is not None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.started

    def inter_token_latencies(self) -> list[float]:
        """Gaps between text chunks, divided by tokens per chunk when chunks batch tokens."""
        times = self.chunk_times
        if len(times) < 2:
            return []
        per_chunk = max(1.0, (self.completion_tokens - 1) / (len(times) - 1))
        return [(b - a) / per_chunk for a, b in itertools.pairwise(times)]

    def decode_rate(self) -> float | None:
        """Tokens per second after the first token (the stream's own speed)."""
        if self.first_token is None or self.finished is None or self.completion_tokens < 2:
            return None
        span = self.finished - self.first_token
        return (self.completion_tokens - 1) / span if span > 0 else None


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    if not values:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside [0, 100]")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Distribution:
    p50: float
    p90: float
    p99: float
    mean: float
    count: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        mean = sum(values) / len(values) if values else math.nan
        return cls(
            percentile(values, 50),
            percentile(values, 90),
            percentile(values, 99),
            mean,
            len(values),
        )


@dataclass(frozen=True)
class Summary:
    """One scenario (server x prompt set x concurrency) in numbers."""

    requests: int
    errors: int
    completion_tokens: int
    wall_s: float
    aggregate_tok_s: float  # every generated token / the scenario's wall time
    per_request_tok_s: Distribution  # each stream's decode rate
    ttft_s: Distribution
    itl_s: Distribution
    error_samples: tuple[str, ...] = ()


def summarize(results: Sequence[RequestResult]) -> Summary:
    ok = [r for r in results if r.ok]
    errors = [r.error or "unfinished" for r in results if not r.ok]
    tokens = sum(r.completion_tokens for r in ok)
    wall = _wall(results)
    return Summary(
        requests=len(results),
        errors=len(errors),
        completion_tokens=tokens,
        wall_s=wall,
        aggregate_tok_s=tokens / wall if wall > 0 else 0.0,
        per_request_tok_s=Distribution.of([x for r in ok if (x := r.decode_rate()) is not None]),
        ttft_s=Distribution.of([x for r in ok if (x := r.ttft) is not None]),
        itl_s=Distribution.of([x for r in ok for x in r.inter_token_latencies()]),
        error_samples=tuple(sorted(set(errors)))[:3],
    )


def _wall(results: Sequence[RequestResult]) -> float:
    if not results:
        return 0.0
    start = min(r.started for r in results)
    ends = [r.finished for r in results if r.finished is not None]
    return (max(ends) - start) if ends else 0.0


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either side is missing or zero."""
    if not numerator or not denominator or math.isnan(numerator) or math.isnan(denominator):
        return None
    return numerator / denominator

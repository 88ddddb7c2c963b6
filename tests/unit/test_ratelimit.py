"""The per-client token bucket (api/limits.py), on a fake clock."""

from __future__ import annotations

from vllm_mlx.api.edge.limits import RateLimiter, client_id, retry_after_header


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_allows_the_rate_then_refuses_with_the_wait() -> None:
    clock = Clock()
    limiter = RateLimiter(clock=clock)
    assert [limiter.acquire("a", 3) for _ in range(3)] == [None, None, None]
    wait = limiter.acquire("a", 3)
    assert wait is not None and abs(wait - 20.0) < 1e-9  # one request per 20 s at 3/min
    clock.now += 20.0
    assert limiter.acquire("a", 3) is None
    assert limiter.acquire("a", 3) is not None


def test_refused_requests_do_not_dig_the_hole_deeper() -> None:
    clock = Clock()
    limiter = RateLimiter(clock=clock)
    limiter.acquire("a", 1)
    first = limiter.acquire("a", 1)
    second = limiter.acquire("a", 1)
    assert first == second == 60.0


def test_clients_are_independent() -> None:
    limiter = RateLimiter(clock=Clock())
    assert limiter.acquire("a", 1) is None
    assert limiter.acquire("a", 1) is not None
    assert limiter.acquire("b", 1) is None


def test_zero_means_off() -> None:
    limiter = RateLimiter(clock=Clock())
    assert all(limiter.acquire("a", 0) is None for _ in range(100))
    assert len(limiter) == 0


def test_memory_is_bounded_least_recent_first() -> None:
    limiter = RateLimiter(max_clients=3, clock=Clock())
    for client in ("a", "b", "c"):
        limiter.acquire(client, 1)
    limiter.acquire("a", 1)  # a is now the most recent (and refused)
    limiter.acquire("d", 1)  # evicts b, the least recently seen
    assert len(limiter) == 3
    assert limiter.acquire("a", 1) is not None  # a's debt was kept
    assert limiter.acquire("b", 1) is None  # b was forgotten: a full bucket again


def test_a_lowered_rate_applies_to_existing_buckets() -> None:
    limiter = RateLimiter(clock=Clock())
    limiter.acquire("a", 100)
    assert limiter.acquire("a", 1) is None  # 99 left, clamped to the new capacity of 1
    assert limiter.acquire("a", 1) is not None


def test_client_ids_and_retry_after() -> None:
    # Keyed by the key's name (the edge never passes the key itself), else the address.
    assert client_id("laptop", "10.0.0.1") == "key:laptop"
    assert client_id("a", None) != client_id("b", None)
    assert client_id(None, "10.0.0.1") == "peer:10.0.0.1"
    assert retry_after_header(0.2) == "1"
    assert retry_after_header(20.0) == "20"
    assert retry_after_header(20.1) == "21"

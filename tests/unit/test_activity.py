"""The status page's last ten minutes: buckets, bounds and the error list."""

from __future__ import annotations

import threading

from vllm_mlx.metrics.activity import BUCKET_S, HISTORY_S, MAX_ERROR_TEXT, MAX_ERRORS, Activity


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_tokens_and_requests_land_in_their_bucket() -> None:
    clock = Clock(1_000_000.0)
    activity = Activity(clock)
    activity.tokens(100, 1)
    activity.tokens(0, 4)
    activity.finished(0.5)
    activity.finished(1.5)
    activity.finished(None)  # no first token (failed early): counted, no TTFT
    clock.now += BUCKET_S
    activity.tokens(0, 7)
    snapshot = activity.snapshot()
    buckets = snapshot["buckets"]
    assert snapshot["bucket_s"] == BUCKET_S
    assert len(buckets) == HISTORY_S // BUCKET_S
    assert [b["start"] for b in buckets] == sorted(b["start"] for b in buckets)
    previous, last = buckets[-2], buckets[-1]
    assert previous == {
        "start": previous["start"],
        "prompt_tokens": 100,
        "generated_tokens": 5,
        "requests": 3,
        "ttft_avg_s": 1.0,
    }
    assert last["generated_tokens"] == 7 and last["ttft_avg_s"] is None
    assert all(b["generated_tokens"] == 0 for b in buckets[:-2])  # quiet spans are zeros


def test_old_buckets_fall_out_and_memory_stays_bounded() -> None:
    clock = Clock(2_000_000.0)
    activity = Activity(clock)
    for _ in range(3 * HISTORY_S // BUCKET_S):
        activity.tokens(1, 1)
        clock.now += BUCKET_S
    assert len(activity._buckets) == HISTORY_S // BUCKET_S
    clock.now += HISTORY_S  # ten quiet minutes: nothing of the busy time is shown
    assert sum(b["generated_tokens"] for b in activity.snapshot()["buckets"]) == 0


def test_errors_newest_first_bounded_and_cut() -> None:
    clock = Clock(3_000_000.0)
    activity = Activity(clock)
    for status in range(400, 400 + MAX_ERRORS + 5):
        activity.error(status, "/v1/chat/completions", "x" * 2000, "m" * 2000)
        clock.now += 1
    errors = activity.snapshot()["errors"]
    assert len(errors) == MAX_ERRORS
    assert errors[0]["status"] == 400 + MAX_ERRORS + 4
    assert len(errors[0]["message"]) == MAX_ERROR_TEXT and len(errors[0]["model"]) == MAX_ERROR_TEXT
    activity.error(500, "/v1/embeddings", None, None)
    assert activity.snapshot()["errors"][0] == {
        "at": clock.now,
        "status": 500,
        "route": "/v1/embeddings",
        "message": "",
        "model": None,
    }


def test_engine_threads_and_the_loop_count_together() -> None:
    activity = Activity(Clock(4_000_000.0))

    def steps() -> None:
        for _ in range(10_000):
            activity.tokens(0, 1)

    threads = [threading.Thread(target=steps) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert activity.snapshot()["buckets"][-1]["generated_tokens"] == 40_000

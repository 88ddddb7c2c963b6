"""The prefill pacer: chunk sizes from measured step and token costs."""

from __future__ import annotations

import pytest

from vllm_mlx.engine.prefill_pacing import SMALLEST_CHUNK, STEP_WINDOW, PrefillPacer


def test_nothing_decoding_takes_the_whole_step_size() -> None:
    pacer = PrefillPacer(step_size=512, max_stall=1.0)
    assert pacer.chunk(decoding=False, prompts=1) == 512
    pacer.observe(0.05, 0, 0.05)
    pacer.observe(2.0, 512, None)
    assert pacer.chunk(decoding=False, prompts=3) == 512


def test_unmeasured_costs_start_with_the_smallest_chunk() -> None:
    pacer = PrefillPacer(step_size=512, max_stall=1.0)
    assert pacer.chunk(decoding=True, prompts=1) == SMALLEST_CHUNK
    pacer.observe(0.05, 0, 0.05)  # a step, but no token cost yet
    assert pacer.chunk(decoding=True, prompts=1) == SMALLEST_CHUNK


def test_chunk_takes_about_max_stall_decode_steps() -> None:
    pacer = PrefillPacer(step_size=512, max_stall=1.0)
    pacer.observe(0.060, 0, 0.060)  # a 60 ms decode step
    pacer.observe(0.060 + 16 * 0.002, 16, 0.060)  # 2 ms a prompt token
    # 60 ms of budget / 2 ms a token = 30 tokens: the ladder (4, 8, ..., 28, 32, 64) gives 28.
    assert pacer.chunk(decoding=True, prompts=1) == 28
    pacer.max_stall = 2.5  # 150 ms: 75 tokens -> 64
    assert pacer.chunk(decoding=True, prompts=1) == 64
    assert pacer.chunk(decoding=True, prompts=4) == 16  # shared by prompts: 18.75 each


def test_chunks_stay_within_the_ladder_and_the_step_size() -> None:
    pacer = PrefillPacer(step_size=100, max_stall=50.0)
    pacer.observe(1.0, 0, 1.0)
    pacer.observe(1.0 + 0.001, 1, 1.0)
    assert pacer.chunk(decoding=True, prompts=1) == 100
    slow = PrefillPacer(step_size=512, max_stall=0.1)
    slow.observe(0.01, 0, 0.01)
    slow.observe(10.0, 16, 0.01)
    assert slow.chunk(decoding=True, prompts=16) == SMALLEST_CHUNK  # always some progress


def test_token_cost_follows_a_growing_offset() -> None:
    pacer = PrefillPacer(step_size=512, max_stall=1.0)
    pacer.observe(0.1, 0, 0.1)
    pacer.observe(0.1 + 64 * 0.001, 64, 0.1)
    first = pacer.chunk(decoding=True, prompts=1)
    for _ in range(10):  # attention over more cached positions: tokens cost 4x
        pacer.observe(0.1 + 64 * 0.004, 64, 0.1)
    assert pacer.chunk(decoding=True, prompts=1) < first


@pytest.mark.parametrize("seconds", [0.0, -1.0])
def test_non_positive_times_are_ignored(seconds: float) -> None:
    pacer = PrefillPacer(step_size=512, max_stall=1.0)
    pacer.observe(seconds, 16, 0.05)
    assert pacer.token_seconds is None and pacer.step_seconds is None


def test_a_timer_that_gives_the_chunk_nothing_never_makes_a_token_free() -> None:
    pacer = PrefillPacer(step_size=512, max_stall=1.0)
    pacer.observe(0.2, 32, 0.2)  # the decode step took the whole step
    assert pacer.token_seconds == pytest.approx(0.2 / 10 / 32)


def test_the_decode_step_measured_beside_a_chunk_follows_the_streams() -> None:
    """Streams whose contexts grow while a prompt is read: their step, measured apart in
    the chunk's steps, sets the budget; the prompt's tokens are not charged for it."""
    pacer = PrefillPacer(step_size=512, max_stall=1.0)
    pacer.observe(0.040, 0, 0.040)
    pacer.observe(0.040 + 8 * 0.005, 8, 0.040)
    before = pacer.chunk(decoding=True, prompts=1)
    for _ in range(20):  # the streams' step grows to 80 ms; a token still costs 5 ms
        pacer.observe(0.080 + 8 * 0.005, 8, 0.080)
    assert pacer.token_seconds == pytest.approx(0.005)
    assert pacer.step_seconds == pytest.approx(0.080)
    assert pacer.chunk(decoding=True, prompts=1) > before


def test_chunk_sizes_settle_where_a_chunk_takes_the_budget() -> None:
    """A chunk's cost with a fixed part (a + b k), measured as a per-token cost: the sizes
    grow from the smallest and settle within one ladder step below the largest that fits
    max_stall decode steps (the ladder's floor stops the approach one step early)."""
    pacer = PrefillPacer(step_size=512, max_stall=1.0)
    step, fixed, per_token = 0.050, 0.020, 0.001  # budget 50 ms: 30 tokens fit
    pacer.observe(step, 0, step)
    sizes = []
    for _ in range(30):
        sizes.append(pacer.chunk(decoding=True, prompts=1))
        pacer.observe(step + fixed + per_token * sizes[-1], sizes[-1], step)
    assert sizes[0] == SMALLEST_CHUNK
    assert sizes[-5:] == [sizes[-1]] * 5 and 24 <= sizes[-1] <= 28


def test_a_rare_slow_step_does_not_widen_the_budget() -> None:
    """A collection or the host stalls one decode step: the next chunks stay as they
    were (a moving average took it as a larger budget, and the chunks after it made the
    streams' worst gaps)."""
    pacer = PrefillPacer(step_size=512, max_stall=1.0)
    for _ in range(5):
        pacer.observe(0.050 + 4 * 0.010, 4, 0.050)  # 50 ms steps, 10 ms tokens
    steady = pacer.chunk(decoding=True, prompts=1)
    pacer.observe(0.250 + 4 * 0.010, 4, 0.250)  # one step took 5x
    assert pacer.chunk(decoding=True, prompts=1) == steady == SMALLEST_CHUNK
    for _ in range(STEP_WINDOW):  # but a lasting change is followed
        pacer.observe(0.100 + 4 * 0.010, 4, 0.100)
    assert pacer.chunk(decoding=True, prompts=1) == 8

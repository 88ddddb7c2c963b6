"""The prefill pacer: chunk sizes from measured step and token costs."""

from __future__ import annotations

import pytest

from vllm_mlx.engine.prefill_pacing import SMALLEST_CHUNK, PrefillPacer


def test_nothing_decoding_takes_the_whole_step_size() -> None:
    pacer = PrefillPacer(step_size=512, max_stall=1.0)
    assert pacer.chunk(decoding=False, prompts=1) == 512
    pacer.observe(0.05, 0, decoded=True)
    pacer.observe(2.0, 512, decoded=False)
    assert pacer.chunk(decoding=False, prompts=3) == 512


def test_unmeasured_costs_start_with_the_smallest_chunk() -> None:
    pacer = PrefillPacer(step_size=512, max_stall=1.0)
    assert pacer.chunk(decoding=True, prompts=1) == SMALLEST_CHUNK
    pacer.observe(0.05, 0, decoded=True)  # a step, but no token cost yet
    assert pacer.chunk(decoding=True, prompts=1) == SMALLEST_CHUNK


def test_chunk_takes_about_max_stall_decode_steps() -> None:
    pacer = PrefillPacer(step_size=512, max_stall=1.0)
    pacer.observe(0.060, 0, decoded=True)  # a 60 ms decode step
    pacer.observe(0.060 + 16 * 0.002, 16, decoded=True)  # 2 ms a prompt token
    # 60 ms of budget / 2 ms a token = 30 tokens: the ladder (4, 8, ..., 28, 32, 64) gives 28.
    assert pacer.chunk(decoding=True, prompts=1) == 28
    pacer.max_stall = 2.5  # 150 ms: 75 tokens -> 64
    assert pacer.chunk(decoding=True, prompts=1) == 64
    assert pacer.chunk(decoding=True, prompts=4) == 16  # shared by prompts: 18.75 each


def test_chunks_stay_within_the_ladder_and_the_step_size() -> None:
    pacer = PrefillPacer(step_size=100, max_stall=50.0)
    pacer.observe(1.0, 0, decoded=True)
    pacer.observe(1.0 + 0.001, 1, decoded=True)
    assert pacer.chunk(decoding=True, prompts=1) == 100
    slow = PrefillPacer(step_size=512, max_stall=0.1)
    slow.observe(0.01, 0, decoded=True)
    slow.observe(10.0, 16, decoded=True)
    assert slow.chunk(decoding=True, prompts=16) == SMALLEST_CHUNK  # always some progress


def test_token_cost_follows_a_growing_offset() -> None:
    pacer = PrefillPacer(step_size=512, max_stall=1.0)
    pacer.observe(0.1, 0, decoded=True)
    pacer.observe(0.1 + 64 * 0.001, 64, decoded=True)
    first = pacer.chunk(decoding=True, prompts=1)
    for _ in range(10):  # attention over more cached positions: tokens cost 4x
        pacer.observe(0.1 + 64 * 0.004, 64, decoded=True)
    assert pacer.chunk(decoding=True, prompts=1) < first


@pytest.mark.parametrize("seconds", [0.0, -1.0])
def test_non_positive_times_are_ignored(seconds: float) -> None:
    pacer = PrefillPacer(step_size=512, max_stall=1.0)
    pacer.observe(seconds, 16, decoded=True)
    assert pacer.token_seconds is None and pacer.step_seconds is None


def test_a_noisy_step_average_never_makes_a_token_free() -> None:
    pacer = PrefillPacer(step_size=512, max_stall=1.0)
    pacer.observe(1.0, 0, decoded=True)  # an outlier step
    pacer.observe(0.2, 32, decoded=True)  # less than the average step
    assert pacer.token_seconds == pytest.approx(0.2 / 10 / 32)

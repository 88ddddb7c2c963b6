"""Memory stays bounded: finished requests leave only what the prefix cache may keep."""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import mlx.core as mx
import pytest

from tests.engine.test_engine import complete, request
from vllm_mlx.config.model import ModelSettings
from vllm_mlx.engine.engine import Engine
from vllm_mlx.engine.scheduler import SchedulerConfig
from vllm_mlx.models.loaded import LoadedModel
from vllm_mlx.models.loader import load_model

CACHE_BOUND = 8 * 2**20
# Live arrays outside the cache once idle (the last sampled tokens, a PRNG key): tiny.
SLACK = 4 * 2**20


def _active_after_gc() -> int:
    gc.collect()
    return int(mx.get_active_memory())


def _serve(engine: Engine, prompts: list[str]) -> None:
    """The prompts at once, four tokens each, until every one has finished."""

    async def together() -> None:
        await asyncio.gather(
            *(
                complete(engine, request(engine, f"m{i}", p, max_tokens=4))
                for i, p in enumerate(prompts)
            )
        )

    asyncio.run(together())


def _warmed_baseline(loaded: LoadedModel, config: SchedulerConfig) -> int:
    """Active memory once this process has served a request on a throwaway engine: what a
    process sets up once (compiled samplers, the kernels' first buffers) is not held by
    finished requests, and where tests run in several workers (pytest-xdist) this test
    may be a process's first to run the model."""
    mx.eval(loaded.model.parameters())
    engine = Engine(loaded, config)
    engine.start()
    try:
        _serve(engine, ["Warm up."])
    finally:
        engine.stop()
    del engine
    return _active_after_gc()


def _held_after_serving(cache_dir: Path, paged: bool) -> tuple[int, int, int]:
    """In a fresh process: the active memory finished requests leave behind, with the
    prefix cache's entries and bytes."""
    settings = ModelSettings(name="smol", source="builtin:smollm2-135m-instruct")
    loaded = load_model(settings, cache_dir)
    assert isinstance(loaded, LoadedModel)
    config = SchedulerConfig(max_batch_size=8, prefix_cache_bytes=CACHE_BOUND, paged_cache=paged)
    before = _warmed_baseline(loaded, config)
    engine = Engine(loaded, config)
    engine.start()
    # Short prompts: the first wave's prefill is most of the test's time, and a leaked
    # batch is its whole KV buffer (~80 MiB here), however short the prompts.
    system = "You are a careful assistant who answers briefly. " * 3
    try:
        for start in range(0, 18, 6):
            _serve(engine, [f"{system} Question {i}?" for i in range(start, start + 6)])
        # The engine thread posts a request's last event before it drops that step's
        # arrays: count once it is between steps and MLX has finished what it queued.
        engine.scheduler.call(mx.synchronize).result(60)
        cache = engine.scheduler.prefix_cache
        return _active_after_gc() - before, cache.entries, cache.nbytes
    finally:
        engine.stop()


@pytest.mark.parametrize("paged", [False, True], ids=["whole-prompt", "paged"])
def test_finished_requests_hold_no_more_than_the_cache_bound(
    model_cache_dir: Path, paged: bool
) -> None:
    """Before the fix, each cache entry held a whole batch's KV buffers alive: 32 streams
    for 5 minutes grew the daemon to 15.8 GiB with the cache at '220 MB'. Paged blocks
    must own their buffers too (a view of a finished batch would keep it alive).

    Measured in a process of its own: MLX's active memory is the whole process's, and in
    a pytest-xdist worker whatever earlier modules left there counts too (round 19's CI
    saw 18.8 and 26.5 MiB where this test alone sees well under the bound)."""
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=spawn) as pool:
        measured = pool.submit(_held_after_serving, model_cache_dir, paged)
        held, entries, nbytes = measured.result(timeout=600)
    assert entries >= 1 and nbytes <= CACHE_BOUND
    assert held <= CACHE_BOUND + SLACK, f"{held / 2**20:.1f} MiB held after the requests ended"

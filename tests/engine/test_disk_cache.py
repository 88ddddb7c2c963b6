"""The paged cache's disk tier on the bundled model: a fresh engine (a restart) reads a
prefix seen before from disk, with greedy output identical to a cold run; truncated and
bit-flipped files are dropped and counted, never served; the directory stays in its
bound; two models never share a directory."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import mlx.core as mx
import pytest

from tests.engine.test_prefix_cache import run, started, tokens
from vllm_mlx.engine.cache.disk import SUFFIX, DiskBlockStore, as_disk_block, model_identity
from vllm_mlx.engine.cache.paged import BLOCK_TOKENS, PagedPrefixCache, block_keys
from vllm_mlx.engine.engine import Engine

QUESTION = "What is the capital of France?"


def disk_engine(engine: Engine, directory: Path, mb: int = 64) -> Engine:
    return started(
        engine,
        prefix_cache_bytes=64 * 2**20,
        paged_cache=True,
        disk_cache_bytes=mb * 2**20,
        disk_cache_dir=directory,
    )


def cache_of(target: Engine) -> PagedPrefixCache:
    cache = target.scheduler.prefix_cache
    assert isinstance(cache, PagedPrefixCache) and cache.disk is not None
    return cache


@pytest.fixture(scope="module")
def cold(engine: Engine) -> list[int]:
    """The greedy answer with no cache at all."""
    fresh = started(engine, prefix_cache_bytes=0)
    try:
        return asyncio.run(run(fresh, tokens(engine, QUESTION), "cold"))[1]
    finally:
        fresh.stop()


def test_a_restart_reads_the_prefix_from_disk_with_identical_output(
    engine: Engine, cold: list[int], tmp_path: Path
) -> None:
    prompt = tokens(engine, QUESTION)
    first = disk_engine(engine, tmp_path)
    try:
        assert asyncio.run(run(first, prompt, "a"))[1] == cold
    finally:
        first.stop()  # the writer's queue is drained before the engine thread ends
    files = list(tmp_path.rglob(f"*{SUFFIX}"))
    assert len(files) >= len(prompt) // BLOCK_TOKENS
    restarted = disk_engine(engine, tmp_path)  # memory empty, as after a restart
    try:
        cached, out, _ = asyncio.run(run(restarted, prompt, "b"))
        summary = cache_of(restarted).summary()
    finally:
        restarted.stop()
    assert cached >= (len(prompt) - 1) // BLOCK_TOKENS * BLOCK_TOKENS
    assert out == cold
    assert summary["disk"]["reads"] >= len(prompt) // BLOCK_TOKENS - 1
    assert summary["disk"]["hit_tokens"] == (len(prompt) - 1) // BLOCK_TOKENS * BLOCK_TOKENS
    assert summary["disk"]["corrupt"] == 0


def test_truncated_and_bit_flipped_files_are_dropped_and_counted(
    engine: Engine, cold: list[int], tmp_path: Path
) -> None:
    prompt = tokens(engine, QUESTION)
    first = disk_engine(engine, tmp_path)
    try:
        asyncio.run(run(first, prompt, "a"))
        keys = block_keys(prompt, 2)  # the chain's first two blocks: read first
    finally:
        first.stop()
    (directory,) = {path.parent for path in tmp_path.rglob(f"*{SUFFIX}")}
    truncated, flipped = (directory / f"{key.hex()}{SUFFIX}" for key in keys)
    whole = truncated.read_bytes()
    truncated.write_bytes(whole[:-100])
    data = bytearray(flipped.read_bytes())
    data[-7] ^= 0x10
    flipped.write_bytes(bytes(data))
    # The truncated block first: the lookup stops there and serves nothing from disk.
    second = disk_engine(engine, tmp_path)
    try:
        cached, out, _ = asyncio.run(run(second, prompt, "b"))
        corrupt_after_first = cache_of(second).disk.stats.corrupt  # type: ignore[union-attr]
    finally:
        second.stop()
    assert cached == 0 and out == cold
    # Dropped, then written again whole by that run's own store.
    assert corrupt_after_first == 1 and truncated.read_bytes() == whole
    # That run rewrote the first block (it stored the prompt again); the flipped second
    # block is read next, dropped, and the lookup stops after one block from disk.
    third = disk_engine(engine, tmp_path)
    try:
        cached, out, _ = asyncio.run(run(third, prompt, "c"))
        stats = cache_of(third).disk.stats  # type: ignore[union-attr]
    finally:
        third.stop()
    assert out == cold
    assert cached == BLOCK_TOKENS and stats.corrupt == 1
    assert flipped.read_bytes() != bytes(data)  # dropped, then written again whole


def _block(seed: int) -> Any:
    keys = mx.random.normal((30, 1, 3, BLOCK_TOKENS, 64), key=mx.random.key(seed))
    block = as_disk_block(keys, keys * 2, b"", tuple(range(seed, seed + BLOCK_TOKENS)))
    mx.eval(block.keys, block.values)
    return block


def test_the_directory_stays_in_its_bound_under_a_soak(tmp_path: Path) -> None:
    one = 30 * 3 * BLOCK_TOKENS * 64 * 4 * 2  # bytes of one block's float32 arrays
    store = DiskBlockStore(tmp_path, max_bytes=5 * one + 5 * 4096)  # five blocks and headers
    for seed in range(40):
        store.put(seed.to_bytes(16, "big"), _block(seed))
    store.close()
    on_disk = sum(path.stat().st_size for path in tmp_path.glob(f"*{SUFFIX}"))
    assert store.nbytes == on_disk <= store.max_bytes
    assert store.stats.writes + store.stats.dropped == 40
    assert store.stats.evictions == store.stats.writes - store.entries > 0
    # What survived reads back exactly; a restart finds the same files.
    reopened = DiskBlockStore(tmp_path, store.max_bytes)
    assert reopened.entries == store.entries
    newest = 39
    block = reopened.get(newest.to_bytes(16, "big"), tuple(range(newest, newest + BLOCK_TOKENS)))
    assert block is not None
    expected = mx.random.normal((30, 1, 3, BLOCK_TOKENS, 64), key=mx.random.key(newest))
    assert mx.array_equal(block.keys, expected) and mx.array_equal(block.values, expected * 2)
    # Another prefix under the same key is never served.
    assert reopened.get(newest.to_bytes(16, "big"), tuple(range(BLOCK_TOKENS))) is None
    reopened.close()


def test_two_models_never_share_a_directory(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"weights" * 1000)

    def model(dtype: Any) -> Any:
        return SimpleNamespace(parameters=lambda: {"w": mx.zeros((4, 4), dtype=dtype)})

    quantized, float32 = model(mx.uint32), model(mx.float32)
    assert model_identity(str(tmp_path), quantized) != model_identity(str(tmp_path), float32)
    before = model_identity(str(tmp_path), float32)
    (tmp_path / "model.safetensors").write_bytes(b"tuned!!" * 1000)  # same size, new weights
    assert model_identity(str(tmp_path), float32) != before
